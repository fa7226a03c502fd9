import type { Client } from '@temporalio/client';
import { startOnce } from '../platform/workflow-start.ts';
import type { Sql } from '../db/client.ts';
import { withSystemScope } from '../db/tenant.ts';
import { fanOutEvents } from '../db/webhooks.ts';
import { TASK_QUEUES } from '../workflows/shared/task-queues.ts';
import { WEBHOOK_DELIVERY_WORKFLOW, webhookDeliveryWorkflowId, type WebhookDeliveryInput } from '../workflows/shared/webhooks.ts';

/** A delivery recorded this long ago and still not started is started again by the next pass. */
const STRANDED_AFTER_MS = 5_000;

export interface DispatchResult {
  events: number;
  deliveries: number;
  started: number;
  failed: number;
}

/**
 * One pass of the webhook dispatcher: claims undispatched events, creates their deliveries and
 * records each delivery's workflow in the outbox, in one transaction; then starts the workflows
 * (ID = event + endpoint, USE_EXISTING). A delivery recorded but not started (a start that failed,
 * or a dispatcher that died after its commit) is started by a later pass once it is 5 s old, and by
 * the outbox relay as a last resort; a start that happens twice joins the first run.
 */
export async function dispatchWebhookEvents(deps: { sql: Sql; temporal: Client }, options: { batchSize: number }): Promise<DispatchResult> {
  const { events, starts: fresh } = await withSystemScope(deps.sql, async (tx) => {
    const fanned = await fanOutEvents(tx, { limit: options.batchSize });
    const starts = fanned.deliveries.map((delivery) => ({
      workflowId: webhookDeliveryWorkflowId(delivery.eventId, delivery.endpointId),
      input: {
        companyId: delivery.companyId,
        environment: delivery.environment,
        eventId: delivery.eventId,
        endpointId: delivery.endpointId,
      } satisfies WebhookDeliveryInput,
    }));
    if (starts.length > 0) {
      await tx`
        insert into outbox (company_id, workflow_type, workflow_id, task_queue, payload)
        select company_id, ${WEBHOOK_DELIVERY_WORKFLOW}, workflow_id, ${TASK_QUEUES.core}, payload::jsonb
        from unnest(${starts.map((s) => s.input.companyId)}::text[], ${starts.map((s) => s.workflowId)}::text[],
                    ${starts.map((s) => JSON.stringify(s.input))}::text[]) as t(company_id, workflow_id, payload)
        on conflict (workflow_id) do nothing`;
    }
    return { events: fanned.events, starts };
  });
  const starts = [...fresh];
  // Deliveries a dispatcher recorded but did not start (it died between its commit and the starts,
  // or Temporal refused): started again here within seconds rather than by the minutely outbox relay.
  const stranded = await withSystemScope(deps.sql, (tx) => tx<{ workflow_id: string; payload: WebhookDeliveryInput }[]>`
    select workflow_id, payload from outbox
    where workflow_type = ${WEBHOOK_DELIVERY_WORKFLOW} and dispatched_at is null
      and created_at < now() - ${STRANDED_AFTER_MS} * interval '1 millisecond'
    order by created_at limit ${options.batchSize}`);
  starts.push(...stranded.map((row) => ({ workflowId: row.workflow_id, input: row.payload })));
  const outcomes = await Promise.allSettled(
    starts.map((start) =>
      startOnce(deps.temporal, WEBHOOK_DELIVERY_WORKFLOW, { workflowId: start.workflowId, taskQueue: TASK_QUEUES.core, args: [start.input] }),
    ),
  );
  const startedIds = starts.filter((_, index) => outcomes[index]!.status === 'fulfilled').map((start) => start.workflowId);
  if (startedIds.length > 0) {
    await withSystemScope(deps.sql, (tx) => tx`
      update outbox set dispatched_at = now(), attempts = attempts + 1
      where workflow_id = any (${startedIds}::text[]) and dispatched_at is null`);
  }
  return { events, deliveries: starts.length, started: startedIds.length, failed: starts.length - startedIds.length };
}
