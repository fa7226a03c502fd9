import type { Environment, LedgerTransfer, TransferStatus } from '../db/ledger.ts';
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

/** Snapshot members are JSON scalars (transfer_snapshot() and webhook_endpoint_snapshot() build them). */
const str = (value: unknown): string => (typeof value === 'string' ? value : JSON.stringify(value));
const optStr = (value: unknown): string | null => (value === null || value === undefined ? null : str(value));
const optBig = (value: unknown): bigint | null => (value === null || value === undefined ? null : BigInt(str(value)));

/** The transfer row as the events trigger wrote it (transfer_snapshot()): big numbers as strings. */
export function transferFromSnapshot(snapshot: Record<string, unknown>): LedgerTransfer {
  const outAmount = optBig(snapshot.out_amount);
  const feeAmount = optBig(snapshot.fee_amount);
  const externalAccountId = optStr(snapshot.destination_external_account_id);
  const outCurrency = optStr(snapshot.out_currency);
  const fxRate = optStr(snapshot.fx_rate);
  return {
    id: str(snapshot.id),
    companyId: str(snapshot.company_id),
    environment: str(snapshot.environment) as Environment,
    idempotencyKey: str(snapshot.idempotency_key),
    rail: str(snapshot.rail) as LedgerTransfer['rail'],
    status: str(snapshot.status) as TransferStatus,
    amount: BigInt(str(snapshot.amount)),
    currency: str(snapshot.currency),
    sourceAccountId: str(snapshot.source_account_id),
    destinationAccountId: optStr(snapshot.destination_account_id),
    payout:
      externalAccountId && outAmount !== null && outCurrency && feeAmount !== null && fxRate
        ? { externalAccountId, outAmount, outCurrency, feeAmount, fxRate }
        : null,
    failureReason: optStr(snapshot.failure_reason),
    workflowId: optStr(snapshot.workflow_id),
    version: Number(snapshot.version),
    createdAt: new Date(str(snapshot.created_at)),
    updatedAt: new Date(str(snapshot.updated_at)),
  };
}

type EndpointView = Pick<
  WebhookEndpoint,
  'id' | 'url' | 'description' | 'eventTypes' | 'status' | 'disabledReason' | 'createdAt' | 'updatedAt'
> & { previousSecretExpiresAt?: Date | null };

function endpointFromSnapshot(snapshot: Record<string, unknown>): EndpointView {
  return {
    id: str(snapshot.id),
    url: str(snapshot.url),
    description: str(snapshot.description),
    eventTypes: Array.isArray(snapshot.event_types) ? snapshot.event_types.map(str) : [],
    status: str(snapshot.status) as WebhookEndpoint['status'],
    disabledReason: optStr(snapshot.disabled_reason),
    createdAt: new Date(str(snapshot.created_at)),
    updatedAt: new Date(str(snapshot.updated_at)),
  };
}

/** An endpoint as the API shows it (never its secret: that is shown once, at creation or rotation). */
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
    ...(endpoint.previousSecretExpiresAt ? { previous_secret_expires_at: endpoint.previousSecretExpiresAt.toISOString() } : {}),
    created_at: endpoint.createdAt.toISOString(),
    updated_at: endpoint.updatedAt.toISOString(),
  };
}
