import { HOUR_MS, MINUTE_MS, SECOND_MS } from './durations.ts';

/**
 * When each delivery attempt is made, as a delay after the previous one: at once, then 5 s, 5 min,
 * 30 min, 2 h, 5 h, 10 h and 10 h, the Standard Webhooks schedule the issue names. The delays add up
 * to 27 h 35 min (DESIGN 8 says "about three days"; the explicit list wins). An endpoint whose
 * delivery fails all eight attempts is disabled.
 */
export const WEBHOOK_RETRY_DELAYS_MS: readonly number[] = [
  0,
  5 * SECOND_MS,
  5 * MINUTE_MS,
  30 * MINUTE_MS,
  2 * HOUR_MS,
  5 * HOUR_MS,
  10 * HOUR_MS,
  10 * HOUR_MS,
];

export const WEBHOOK_DELIVERY_WORKFLOW = 'webhookDeliveryWorkflow';
export const WEBHOOK_RESEND_WORKFLOW = 'webhookResendWorkflow';

/** One delivery per (event, endpoint): its workflow ID is that pair, so a second start joins the first. */
export function webhookDeliveryWorkflowId(eventId: string, endpointId: string): string {
  return `webhook:${eventId}:${endpointId}`;
}

export interface WebhookDeliveryInput {
  companyId: string;
  environment: 'sandbox' | 'live';
  eventId: string;
  endpointId: string;
}

export type WebhookDeliveryStatus = 'succeeded' | 'failed' | 'canceled';

export interface WebhookDeliveryResult {
  status: WebhookDeliveryStatus;
  /** Attempts this run made. */
  attempts: number;
  /** Set when the failed delivery disabled its endpoint. */
  endpointDisabled?: boolean;
}

/** A manual resend: one attempt, outside the schedule, keyed by the request's idempotency key. */
export interface WebhookResendInput extends WebhookDeliveryInput {
  resendId: string;
}

/** What an attempt came to. `gone`: the endpoint was deleted or disabled, or the event is not its to get. */
export type AttemptOutcome =
  | { kind: 'delivered'; statusCode: number }
  | { kind: 'failed'; statusCode: number | null; error: string }
  | { kind: 'gone'; reason: string };

export interface AttemptInput {
  eventId: string;
  endpointId: string;
  trigger: 'scheduled' | 'manual';
  /** Unique per delivery: `scheduled:<n>` or `manual:<resend id>`. */
  attemptKey: string;
}

/** Every event type an endpoint can subscribe to. */
export const EVENT_TYPES = [
  'transfer.pending',
  'transfer.processing',
  'transfer.settled',
  'transfer.failed',
  'transfer.canceled',
  'transfer.returned',
  'webhook_endpoint.enabled',
  'webhook_endpoint.disabled',
] as const;
export type EventType = (typeof EVENT_TYPES)[number];
