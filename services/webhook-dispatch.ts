import type { Client } from '@temporalio/client';
import { startOnce } from '../platform/workflow-start.ts';
import type { Sql } from '../db/client.ts';
import { findStrandedOutboxEntries, insertOutboxEntries, markOutboxEntriesDispatched, recordOutboxFailures } from '../db/outbox.ts';
import { withSystemScope } from '../db/tenant.ts';
import { fanOutEvents } from '../db/webhooks.ts';
import { TASK_QUEUES } from '../workflows/shared/task-queues.ts';
import { WEBHOOK_DELIVERY_WORKFLOW, webhookDeliveryWorkflowId, type WebhookDeliveryInput } from '../workflows/shared/webhooks.ts';

/** A delivery recorded this long ago and still not started is started again by a pass that looks for them. */
const STRANDED_AFTER_MS = 5_000;

export interface DispatchResult {
  events: number;
  /** Deliveries this pass fanned out (their workflows recorded in the outbox now). */
  deliveries: number;
  /** Deliveries recorded by an earlier pass and not started then, started again now. */
  restarted: number;
  /** Starts handed to Temporal (new and restarted). */
  started: number;
  /** Starts Temporal refused or did not answer; recorded on their outbox rows, tried again later. */
  failed: number;
}

interface DeliveryStart {
  workflowId: string;
  input: WebhookDeliveryInput;
}

/**
 * One pass of the webhook dispatcher: claims undispatched events, creates their deliveries and
 * records each delivery's workflow in the outbox, in one transaction; then starts the workflows
 * (ID = event + endpoint, USE_EXISTING). A delivery recorded but not started (a start that failed,
 * or a dispatcher that died after its commit) is started by a later pass that looks for stranded
 * ones (`restartStranded`, the default; the dispatcher loop asks every few seconds) once it is 5 s
 * old, and by the outbox relay as a last resort; a start that happens twice joins the first run.
 */
export async function dispatchWebhookEvents(
  deps: { sql: Sql; temporal: Client },
  options: { batchSize: number; restartStranded?: boolean },
): Promise<DispatchResult> {
  const { events, fresh } = await withSystemScope(deps.sql, async (tx) => {
    const fanned = await fanOutEvents(tx, { limit: options.batchSize });
    const fresh: DeliveryStart[] = fanned.deliveries.map((delivery) => ({
      workflowId: webhookDeliveryWorkflowId(delivery.eventId, delivery.endpointId),
      input: {
        companyId: delivery.companyId,
        environment: delivery.environment,
        eventId: delivery.eventId,
        endpointId: delivery.endpointId,
      },
    }));
    await insertOutboxEntries(
      tx,
      fresh.map((start) => ({
        companyId: start.input.companyId,
        workflowType: WEBHOOK_DELIVERY_WORKFLOW,
        workflowId: start.workflowId,
        taskQueue: TASK_QUEUES.core,
        payload: start.input,
      })),
    );
    return { events: fanned.events, fresh };
  });
  // Deliveries a dispatcher recorded but did not start (it died between its commit and the starts,
  // or Temporal refused): started again here within seconds rather than by the minutely outbox relay.
  const stranded: DeliveryStart[] = [];
  if (options.restartStranded ?? true) {
    const freshIds = new Set(fresh.map((start) => start.workflowId));
    const entries = await withSystemScope(deps.sql, (tx) =>
      findStrandedOutboxEntries(tx, {
        olderThan: new Date(Date.now() - STRANDED_AFTER_MS),
        limit: options.batchSize,
        workflowType: WEBHOOK_DELIVERY_WORKFLOW,
      }),
    );
    for (const entry of entries) {
      if (!freshIds.has(entry.workflowId)) stranded.push({ workflowId: entry.workflowId, input: entry.payload as WebhookDeliveryInput });
    }
  }
  const starts = [...fresh, ...stranded];
  if (starts.length === 0) return { events, deliveries: 0, restarted: 0, started: 0, failed: 0 };
  const outcomes = await Promise.allSettled(
    starts.map((start) =>
      startOnce(deps.temporal, WEBHOOK_DELIVERY_WORKFLOW, { workflowId: start.workflowId, taskQueue: TASK_QUEUES.core, args: [start.input] }),
    ),
  );
  const startedIds: string[] = [];
  const failures: { workflowId: string; error: string }[] = [];
  outcomes.forEach((outcome, index) => {
    const { workflowId } = starts[index]!;
    if (outcome.status === 'fulfilled') startedIds.push(workflowId);
    else failures.push({ workflowId, error: String(outcome.reason) });
  });
  await withSystemScope(deps.sql, async (tx) => {
    await markOutboxEntriesDispatched(tx, startedIds, new Date());
    await recordOutboxFailures(tx, failures);
  });
  return { events, deliveries: fresh.length, restarted: stranded.length, started: startedIds.length, failed: failures.length };
}
