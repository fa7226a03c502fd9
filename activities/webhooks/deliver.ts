import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { Webhook } from 'standardwebhooks';
import type { Sql } from '../../db/client.ts';
import { withSystemScope } from '../../db/tenant.ts';
import {
  closeAttempt,
  concludeDelivery,
  disableFailingEndpoint,
  lockDeliveryContext,
  openAttempt,
  signingSecrets,
  type DeliveryContext,
} from '../../db/webhooks.ts';
import { renderEvent } from '../../services/events.ts';
import type { TransferSigner } from '../../api/v1/resources.ts';
import type { AttemptInput, AttemptOutcome } from '../../workflows/shared/webhooks.ts';
import type { WebhookSender } from './http.ts';

export interface WebhookDeliveryLimits {
  /** One HTTP attempt, connect to last byte. */
  attemptTimeoutMs: number;
  /** Attempts in flight at once per endpoint; more wait (the activity retries with backoff). */
  maxInFlightPerEndpoint: number;
  /** A larger rendered event is not sent; its delivery is canceled with the reason recorded. */
  maxPayloadBytes: number;
}

/** Well inside the workflow's 5 s heartbeat timeout. */
const HEARTBEAT_INTERVAL_MS = 1_000;

const WEBHOOK_LIMITS_DEFAULT: WebhookDeliveryLimits = {
  attemptTimeoutMs: 15_000,
  maxInFlightPerEndpoint: 10,
  maxPayloadBytes: 256 * 1024,
};

export interface WebhookActivityDeps {
  sql: Sql;
  sender: WebhookSender;
  signer: TransferSigner;
  limits?: Partial<WebhookDeliveryLimits>;
}

/** Standard Webhooks headers; during a secret rotation both secrets sign (space-separated). */
function webhookHeaders(secrets: string[], msgId: string, at: Date, payload: string): Record<string, string> {
  return {
    'webhook-id': msgId,
    'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
    'webhook-signature': secrets.map((secret) => new Webhook(secret).sign(msgId, at, payload)).join(' '),
  };
}

function gone(context: DeliveryContext | undefined, trigger: AttemptInput['trigger']): string | undefined {
  if (!context) return 'no such delivery';
  if (context.endpoint.deletedAt) return 'the endpoint was deleted';
  if (context.endpoint.status !== 'enabled') return 'the endpoint is disabled';
  if (trigger === 'scheduled' && context.delivery.status === 'canceled') return 'the delivery was canceled';
  return undefined;
}

export function createWebhookActivities(deps: WebhookActivityDeps) {
  const limits = { ...WEBHOOK_LIMITS_DEFAULT, ...deps.limits };
  // The event is rendered (a transfer in it signed) inside the attempt's transaction. Only a signer's
  // first signature waits for the database (it loads the key, then serves it from memory, refreshed
  // in the background: services/signing.ts); waiting there for a pool connection while holding one
  // could deadlock a busy pool, so the signer is warmed before the first transaction.
  let signerLoaded: Promise<void> | undefined;
  const loadSigner = () =>
    (signerLoaded ??= deps.signer.warm().catch((error: unknown) => {
      signerLoaded = undefined;
      throw error;
    }));
  /**
   * One attempt: the endpoint's current URL and secrets, the event's own ID as webhook-id (the same
   * on every attempt and every resend), a fresh timestamp and signature. The attempt is recorded
   * before the request (as the in-flight lease) and closed with its answer.
   */
  async function attempt(activityAttempt: number, input: AttemptInput): Promise<AttemptOutcome> {
    await loadSigner();
    const prepared = await withSystemScope(deps.sql, async (tx) => {
      const context = await lockDeliveryContext(tx, input.eventId, input.endpointId);
      const goneReason = gone(context, input.trigger);
      if (goneReason || !context) return { kind: 'gone' as const, reason: goneReason ?? 'no such delivery' };
      if (input.trigger === 'scheduled' && context.delivery.status === 'succeeded') {
        return { kind: 'delivered' as const, statusCode: 200 }; // an earlier try of this activity got through
      }
      const payload = JSON.stringify(await renderEvent(context.event, deps.signer));
      const opened = await openAttempt(tx, {
        deliveryId: context.delivery.id,
        companyId: context.delivery.companyId,
        endpointId: context.endpoint.id,
        eventId: context.event.id,
        attemptKey: `${input.attemptKey}#${activityAttempt}`,
        supersedes: input.attemptKey,
        trigger: input.trigger,
        url: context.endpoint.url,
        leaseMs: limits.attemptTimeoutMs + 5_000,
        maxInFlight: limits.maxInFlightPerEndpoint,
      });
      return { kind: 'opened' as const, context, payload, opened };
    });
    if (prepared.kind !== 'opened') return prepared;
    const { context, payload, opened } = prepared;
    if (opened === 'busy') {
      throw ApplicationFailure.retryable(
        `endpoint ${context.endpoint.id} has ${limits.maxInFlightPerEndpoint} attempts in flight`,
        'WEBHOOK_ENDPOINT_BUSY',
      );
    }
    const bytes = Buffer.byteLength(payload);
    const tooLarge = bytes > limits.maxPayloadBytes;
    const tooLargeError = `payload of ${bytes} bytes exceeds the ${limits.maxPayloadBytes}-byte limit`;
    const at = new Date();
    const result = tooLarge
      ? { ok: false, statusCode: null, latencyMs: 0, error: tooLargeError, responseBody: '' }
      : await deps.sender.send({
          url: context.endpoint.url,
          headers: webhookHeaders(signingSecrets(context.endpoint, at), context.event.id, at, payload),
          body: payload,
          timeoutMs: limits.attemptTimeoutMs,
        });
    await withSystemScope(deps.sql, (tx) =>
      closeAttempt(tx, opened.attemptId, { id: context.delivery.id, endpointId: context.endpoint.id }, result),
    );
    if (result.ok) return { kind: 'delivered', statusCode: result.statusCode ?? 200 };
    // Too large now is too large on every retry: the delivery ends, with the reason recorded.
    if (tooLarge) return { kind: 'gone', reason: tooLargeError };
    return { kind: 'failed', statusCode: result.statusCode, error: result.error ?? 'failed' };
  }

  return {
    /** One attempt (see `attempt`), heartbeating from start to end. */
    attemptWebhookDelivery: async (input: AttemptInput): Promise<AttemptOutcome> => {
      const activity = Context.current();
      // Heartbeats for the whole attempt, its database work too: a worker that dies mid-attempt is
      // noticed within the heartbeat timeout and the attempt is made again (same webhook-id) by
      // another worker, while one that only waits (for a lock, a pool connection, a slow receiver)
      // keeps its attempt: were the heartbeats to stop there, a second try would start beside the
      // first and the receiver would get the event twice.
      const beat = setInterval(() => activity.heartbeat(), HEARTBEAT_INTERVAL_MS);
      try {
        return await attempt(activity.info.attempt, input);
      } finally {
        clearInterval(beat);
      }
    },

    /** Ends a delivery; a failed one disables its endpoint unless it has succeeded since the delivery began. */
    concludeWebhookDelivery: async (input: {
      eventId: string;
      endpointId: string;
      status: 'failed' | 'canceled';
    }): Promise<{ endpointDisabled: boolean }> =>
      withSystemScope(deps.sql, async (tx) => {
        const delivery = await concludeDelivery(tx, input.eventId, input.endpointId, input.status);
        if (!delivery || input.status !== 'failed') return { endpointDisabled: false };
        const endpointDisabled = await disableFailingEndpoint(
          tx,
          { endpointId: input.endpointId, createdAt: delivery.createdAt },
          `Every attempt to deliver ${input.eventId} failed; re-enable the endpoint once it answers 2xx.`,
        );
        return { endpointDisabled };
      }),
  };
}

export type WebhookActivities = ReturnType<typeof createWebhookActivities>;
