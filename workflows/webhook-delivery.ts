import { ActivityFailure, log, proxyActivities, sleep, upsertSearchAttributes } from '@temporalio/workflow';
import type { WebhookActivities } from '../activities/webhooks/deliver.ts';
import { SEARCH_ATTRIBUTES } from './shared/search-attributes.ts';
import {
  WEBHOOK_RETRY_DELAYS_MS,
  type AttemptOutcome,
  type WebhookDeliveryInput,
  type WebhookDeliveryResult,
  type WebhookResendInput,
} from './shared/webhooks.ts';

// One attempt is one HTTP request (its own timeout is at most 30 s) plus two short transactions. The
// receiver's answer (2xx, another status, no answer in time) is returned, never thrown, so every
// failure of the activity is ours: the endpoint's in-flight limit is reached, the database is
// unreachable or the answer could not be recorded, or the worker died mid-attempt (same webhook-id
// every time). None of those is the receiver failing, so the activity never gives up on them: an
// attempt that gave up would count as one of the eight failures, and on the last one fail the
// delivery and disable an endpoint that was never asked, or that answered 2xx.
const { attemptWebhookDelivery } = proxyActivities<WebhookActivities>({
  startToCloseTimeout: '1 minute',
  heartbeatTimeout: '5 seconds',
  retry: { initialInterval: '2 seconds', backoffCoefficient: 2, maximumInterval: '1 minute' },
});

// Bookkeeping after the last attempt: must happen, so it never gives up. A run that failed here would
// leave the delivery pending and the failing endpoint enabled for good: its workflow ID is never
// started again (REJECT_DUPLICATE) and its outbox row is done.
const { concludeWebhookDelivery } = proxyActivities<WebhookActivities>({
  startToCloseTimeout: '30 seconds',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '5 minutes' },
});

function publish(input: WebhookDeliveryInput, status: string): void {
  upsertSearchAttributes([
    { key: SEARCH_ATTRIBUTES.companyId, value: input.companyId },
    { key: SEARCH_ATTRIBUTES.objectId, value: input.eventId },
    { key: SEARCH_ATTRIBUTES.environment, value: input.environment },
    { key: SEARCH_ATTRIBUTES.objectStatus, value: status },
  ]);
}

async function attempt(
  input: WebhookDeliveryInput,
  trigger: 'scheduled' | 'manual',
  attemptKey: string,
): Promise<AttemptOutcome> {
  try {
    return await attemptWebhookDelivery({ eventId: input.eventId, endpointId: input.endpointId, trigger, attemptKey });
  } catch (error) {
    // Only a non-retryable failure gets here (the activity never gives up on retryable ones).
    if (error instanceof ActivityFailure) {
      log.warn('webhook attempt could not be made', { attemptKey, error: error.cause?.message ?? error.message });
      return { kind: 'failed', statusCode: null, error: error.cause?.message ?? error.message };
    }
    throw error;
  }
}

/**
 * Delivers one event to one endpoint (workflow ID `webhook:<event>:<endpoint>`): an attempt at once,
 * then after each delay of the schedule, until the endpoint answers 2xx. Exhausting the schedule
 * fails the delivery and disables an endpoint that has not succeeded since the delivery began.
 */
export async function webhookDeliveryWorkflow(input: WebhookDeliveryInput): Promise<WebhookDeliveryResult> {
  publish(input, 'pending');
  let attempts = 0;
  for (const [index, delayMs] of WEBHOOK_RETRY_DELAYS_MS.entries()) {
    if (delayMs > 0) await sleep(delayMs);
    const outcome = await attempt(input, 'scheduled', `scheduled:${index + 1}`);
    attempts += 1;
    if (outcome.kind === 'delivered') {
      publish(input, 'succeeded');
      return { status: 'succeeded', attempts };
    }
    if (outcome.kind === 'gone') {
      await concludeWebhookDelivery({ eventId: input.eventId, endpointId: input.endpointId, status: 'canceled' });
      publish(input, 'canceled');
      return { status: 'canceled', attempts };
    }
  }
  const { endpointDisabled } = await concludeWebhookDelivery({
    eventId: input.eventId,
    endpointId: input.endpointId,
    status: 'failed',
  });
  publish(input, 'failed');
  return { status: 'failed', attempts, endpointDisabled };
}

/** A delivery made again by hand: one attempt, now, with the event's own webhook-id. */
export async function webhookResendWorkflow(input: WebhookResendInput): Promise<AttemptOutcome> {
  publish(input, 'resending');
  const outcome = await attempt(input, 'manual', `manual:${input.resendId}`);
  publish(input, outcome.kind === 'delivered' ? 'succeeded' : outcome.kind === 'gone' ? 'canceled' : 'failed');
  return outcome;
}
