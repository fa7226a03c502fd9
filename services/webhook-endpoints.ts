import { createHash, randomBytes } from 'node:crypto';
import type { Client } from '@temporalio/client';
import { startOnce } from '../platform/workflow-start.ts';
import type { Sql } from '../db/client.ts';
import type { Environment } from '../db/ledger.ts';
import { idempotencyKeyCreatedAt, type IdempotencyKeyId } from '../db/idempotency.ts';
import { insertOutboxEntry, markOutboxDispatched } from '../db/outbox.ts';
import { withTenant } from '../db/tenant.ts';
import {
  countLiveEndpoints,
  ensureDelivery,
  findEvent,
  insertWebhookEndpoint,
  lockEndpointsOf,
  lockWebhookEndpoint,
  rotateWebhookSecret,
  softDeleteWebhookEndpoint,
  updateWebhookEndpoint,
  type EndpointChanges,
  type WebhookEndpoint,
} from '../db/webhooks.ts';
import { checkWebhookUrl } from '../activities/webhooks/url-policy.ts';
import { newId } from '../platform/ids.ts';
import type { Logger } from '../platform/logger.ts';
import { DomainError, notFound } from '../workflows/shared/errors.ts';
import { TASK_QUEUES } from '../workflows/shared/task-queues.ts';
import { WEBHOOK_RESEND_WORKFLOW, type WebhookResendInput } from '../workflows/shared/webhooks.ts';

export interface WebhookEndpointPolicy {
  /** ALLOW_PRIVATE_WEBHOOK_URLS=1: loopback and private targets accepted (local development only). */
  allowPrivateUrls: boolean;
  /** Live endpoints per company and environment. */
  maxEndpoints: number;
  /** DNS resolution for the registration check (tests inject one; default: the system resolver). */
  lookup?: (hostname: string) => Promise<string[]>;
}

type Scope = { companyId: string; environment: Environment };

/** A Standard Webhooks secret: `whsec_` and 32 random bytes in base64. */
export function generateWebhookSecret(): string {
  return `whsec_${randomBytes(32).toString('base64')}`;
}

async function checkedUrl(url: string, scope: Scope, policy: WebhookEndpointPolicy): Promise<string> {
  const check = await checkWebhookUrl(url, {
    allowPrivate: policy.allowPrivateUrls,
    environment: scope.environment,
    ...(policy.lookup ? { lookup: policy.lookup } : {}),
  });
  if (!check.ok) throw new DomainError('invalid', check.code, check.message, { field: 'url' });
  return check.url;
}

/** `*` (or nothing) subscribes to every type, stored as an empty list. */
function normalizeEventTypes(events: readonly string[] | undefined): string[] {
  if (!events || events.includes('*')) return [];
  return [...new Set(events)].sort();
}

export async function createWebhookEndpoint(
  sql: Sql,
  scope: Scope,
  request: { url: string; events?: readonly string[]; description?: string },
  policy: WebhookEndpointPolicy,
): Promise<WebhookEndpoint> {
  const url = await checkedUrl(request.url, scope, policy);
  return withTenant(sql, scope.companyId, async (tx) => {
    await lockEndpointsOf(tx, scope);
    if ((await countLiveEndpoints(tx, scope)) >= policy.maxEndpoints) {
      throw new DomainError(
        'unprocessable',
        'WEBHOOK_ENDPOINT_LIMIT',
        `At most ${policy.maxEndpoints} webhook endpoints per environment; delete one first.`,
      );
    }
    return insertWebhookEndpoint(tx, {
      ...scope,
      id: newId('we'),
      url,
      description: request.description ?? '',
      eventTypes: normalizeEventTypes(request.events),
      secret: generateWebhookSecret(),
    });
  });
}

export async function changeWebhookEndpoint(
  sql: Sql,
  scope: Scope,
  id: string,
  request: { url?: string; events?: readonly string[]; description?: string; enabled?: boolean },
  policy: WebhookEndpointPolicy,
): Promise<WebhookEndpoint> {
  const url = request.url === undefined ? undefined : await checkedUrl(request.url, scope, policy);
  return withTenant(sql, scope.companyId, async (tx) => {
    const current = await lockWebhookEndpoint(tx, scope, id);
    if (!current) throw notFound('webhook endpoint');
    const changes: EndpointChanges = {
      ...(url !== undefined ? { url } : {}),
      ...(request.description !== undefined ? { description: request.description } : {}),
      ...(request.events !== undefined ? { eventTypes: normalizeEventTypes(request.events) } : {}),
      ...(request.enabled !== undefined
        ? {
            status: request.enabled ? ('enabled' as const) : ('disabled' as const),
            disabledReason: request.enabled ? null : 'Disabled through the API.',
          }
        : {}),
    };
    return updateWebhookEndpoint(tx, current, changes);
  });
}

export async function deleteWebhookEndpoint(sql: Sql, scope: Scope, id: string): Promise<WebhookEndpoint> {
  return withTenant(sql, scope.companyId, async (tx) => {
    const current = await lockWebhookEndpoint(tx, scope, id);
    if (!current) throw notFound('webhook endpoint');
    await softDeleteWebhookEndpoint(tx, current);
    return current;
  });
}

export const ROTATION_OVERLAP_MAX_S = 7 * 24 * 3600;

/** A new secret signs from now on; the old one also signs for `overlapSeconds` (0: retired at once). */
export async function rotateWebhookEndpointSecret(
  sql: Sql,
  scope: Scope,
  id: string,
  overlapSeconds: number,
): Promise<WebhookEndpoint> {
  return withTenant(sql, scope.companyId, async (tx) => {
    const current = await lockWebhookEndpoint(tx, scope, id);
    if (!current) throw notFound('webhook endpoint');
    return rotateWebhookSecret(tx, current, {
      secret: generateWebhookSecret(),
      previousExpiresAt: overlapSeconds > 0 ? new Date(Date.now() + overlapSeconds * 1000) : null,
    });
  });
}

export interface ResendDeps {
  sql: Sql;
  temporal: Client;
  logger: Logger;
}

/**
 * Sends an event to an endpoint once more, now (outside its schedule): works for an event the
 * endpoint never got (created before it, or filtered then) too. The resend's ID derives from the
 * request's idempotency key, so a retried request resends once. The workflow is recorded in the
 * outbox with the delivery, then started; if the start fails the outbox relay starts it.
 */
export async function resendWebhookEvent(
  deps: ResendDeps,
  scope: Scope,
  request: { endpointId: string; eventId: string; idempotencyKey: IdempotencyKeyId },
): Promise<{ resendId: string; workflowId: string; deliveryId: string }> {
  const { input, deliveryId, resendId, workflowId } = await withTenant(deps.sql, scope.companyId, async (tx) => {
    const endpoint = await lockWebhookEndpoint(tx, scope, request.endpointId);
    if (!endpoint) throw notFound('webhook endpoint');
    if (endpoint.status !== 'enabled') {
      throw new DomainError(
        'conflict',
        'WEBHOOK_ENDPOINT_DISABLED',
        'The endpoint is disabled; enable it before resending.',
      );
    }
    const event = await findEvent(tx, scope, request.eventId);
    if (!event)
      throw new DomainError('not_found', 'EVENT_NOT_FOUND', `No event ${request.eventId} in this environment.`, {
        field: 'event',
      });
    const delivery = await ensureDelivery(tx, event, endpoint.id);
    // The key names one request only while the idempotency layer keeps it (IDEMPOTENCY_TTL_HOURS);
    // after that a client may use it again, for another resend of another event or of the same
    // one. The endpoint, the event and the time this request claimed the key are part of the ID,
    // so a reused key starts a workflow of its own instead of being refused by Temporal as a
    // duplicate of the old one (REJECT_DUPLICATE) while the API says queued; a request that runs
    // again under its own claim (its first run died) gets the same ID and resends once.
    const claimedAt = await idempotencyKeyCreatedAt(tx, request.idempotencyKey);
    const resendId = `rs_${createHash('sha256')
      .update(
        [
          scope.companyId,
          scope.environment,
          request.endpointId,
          request.eventId,
          request.idempotencyKey.key,
          claimedAt,
        ].join('\u0000'),
      )
      .digest('hex')
      .slice(0, 32)}`;
    const workflowId = `webhook-resend:${request.endpointId}:${resendId}`;
    const input: WebhookResendInput = { ...scope, eventId: event.id, endpointId: endpoint.id, resendId };
    await insertOutboxEntry(tx, {
      companyId: scope.companyId,
      workflowType: WEBHOOK_RESEND_WORKFLOW,
      workflowId,
      taskQueue: TASK_QUEUES.core,
      payload: input,
    });
    return { input, deliveryId: delivery.id, resendId, workflowId };
  });
  try {
    await deps.temporal.connection.withDeadline(Date.now() + 5_000, () =>
      startOnce(deps.temporal, WEBHOOK_RESEND_WORKFLOW, { workflowId, taskQueue: TASK_QUEUES.core, args: [input] }),
    );
    await withTenant(deps.sql, scope.companyId, (tx) => markOutboxDispatched(tx, workflowId, new Date()));
  } catch (error) {
    deps.logger.warn({ err: error, workflowId }, 'resend not started now; the outbox relay will start it');
  }
  return { resendId, workflowId, deliveryId };
}
