import { transferFromSnapshot } from '../db/ledger.ts';
import type { StoredEvent, WebhookEndpoint } from '../db/webhooks.ts';
import { signed, transferResource, type TransferSigner } from '../api/v1/resources.ts';

/**
 * Events as the API and the webhooks show them: `{ id, object: "event", type, created_at, data: {
 * object, version } }`. The object is rendered from the event's snapshot by the same code that
 * renders the live object (a transfer is signed), so an event says what GET said at that version.
 */
export async function renderEvent(event: StoredEvent, signer: TransferSigner) {
  return {
    id: event.id,
    object: 'event' as const,
    type: event.type,
    livemode: event.environment === 'live',
    created_at: event.createdAt.toISOString(),
    data: { object: await renderSnapshot(event, signer), version: event.objectVersion },
  };
}

async function renderSnapshot(event: StoredEvent, signer: TransferSigner): Promise<Record<string, unknown>> {
  switch (event.objectType) {
    case 'transfer':
      return signed(signer, transferResource(transferFromSnapshot(event.snapshot)));
    case 'webhook_endpoint':
      return webhookEndpointResource(endpointFromSnapshot(event.snapshot));
  }
}

/** A live endpoint has `previousSecretExpiresAt`; an event's snapshot does not record it (undefined). */
type EndpointView = Pick<
  WebhookEndpoint,
  'id' | 'url' | 'description' | 'eventTypes' | 'status' | 'disabledReason' | 'createdAt' | 'updatedAt'
> & { previousSecretExpiresAt?: Date | null };

/** An endpoint from its event snapshot (webhook_endpoint_snapshot() in migration 00005). */
function endpointFromSnapshot(snapshot: Record<string, unknown>): EndpointView {
  const row = snapshot as { id: string; url: string; description: string; event_types: string[]; status: WebhookEndpoint['status'] };
  return {
    id: row.id,
    url: row.url,
    description: row.description,
    eventTypes: row.event_types,
    status: row.status,
    disabledReason: (snapshot.disabled_reason as string | null) ?? null,
    createdAt: new Date(snapshot.created_at as string),
    updatedAt: new Date(snapshot.updated_at as string),
  };
}

/**
 * An endpoint as the API shows it (never its secret: that is shown once, at creation or rotation).
 * The one place `previous_secret_expires_at` is written: on a live endpoint always (null outside a
 * rotation's overlap), on an event's object never (the snapshot does not record it).
 */
export function webhookEndpointResource(endpoint: EndpointView) {
  return {
    id: endpoint.id,
    object: 'webhook_endpoint' as const,
    url: endpoint.url,
    description: endpoint.description,
    events: endpoint.eventTypes.length === 0 ? ['*'] : endpoint.eventTypes,
    enabled: endpoint.status === 'enabled',
    status: endpoint.status,
    disabled_reason: endpoint.disabledReason,
    ...(endpoint.previousSecretExpiresAt !== undefined
      ? { previous_secret_expires_at: endpoint.previousSecretExpiresAt?.toISOString() ?? null }
      : {}),
    created_at: endpoint.createdAt.toISOString(),
    updated_at: endpoint.updatedAt.toISOString(),
  };
}
