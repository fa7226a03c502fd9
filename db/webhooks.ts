import type { Sql, TransactionSql } from './client.ts';
import type { Environment } from './ledger.ts';

type Tx = TransactionSql | Sql;

export interface Scope {
  companyId: string;
  environment: Environment;
}

// ---------------------------------------------------------------------------------------------
// Endpoints

export type EndpointStatus = 'enabled' | 'disabled';

export interface WebhookEndpoint {
  id: string;
  companyId: string;
  environment: Environment;
  url: string;
  description: string;
  eventTypes: string[];
  status: EndpointStatus;
  disabledReason: string | null;
  secret: string;
  previousSecret: string | null;
  previousSecretExpiresAt: Date | null;
  lastSuccessAt: Date | null;
  version: number;
  createdAt: Date;
  updatedAt: Date;
  deletedAt: Date | null;
}

interface EndpointRow {
  id: string;
  company_id: string;
  environment: Environment;
  url: string;
  description: string;
  event_types: string[];
  status: EndpointStatus;
  disabled_reason: string | null;
  secret: string;
  previous_secret: string | null;
  previous_secret_expires_at: Date | null;
  last_success_at: Date | null;
  version: number;
  created_at: Date;
  updated_at: Date;
  deleted_at: Date | null;
}

function toEndpoint(row: EndpointRow): WebhookEndpoint {
  return {
    id: row.id,
    companyId: row.company_id,
    environment: row.environment,
    url: row.url,
    description: row.description,
    eventTypes: row.event_types,
    status: row.status,
    disabledReason: row.disabled_reason,
    secret: row.secret,
    previousSecret: row.previous_secret,
    previousSecretExpiresAt: row.previous_secret_expires_at,
    lastSuccessAt: row.last_success_at,
    version: row.version,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    deletedAt: row.deleted_at,
  };
}

/** The secrets that sign a delivery made at `at`: the current one, and the previous one until it expires. */
export function signingSecrets(endpoint: Pick<WebhookEndpoint, 'secret' | 'previousSecret' | 'previousSecretExpiresAt'>, at: Date): string[] {
  return endpoint.previousSecret && endpoint.previousSecretExpiresAt && endpoint.previousSecretExpiresAt > at
    ? [endpoint.secret, endpoint.previousSecret]
    : [endpoint.secret];
}

/**
 * Serializes the endpoint writes of one company and environment (the per-company limit is counted
 * under this lock), for the rest of the caller's transaction.
 */
export async function lockEndpointsOf(tx: TransactionSql, scope: Scope): Promise<void> {
  await tx`select pg_advisory_xact_lock(hashtextextended(${`webhook_endpoints:${scope.companyId}:${scope.environment}`}, 0))`;
}

export async function countLiveEndpoints(tx: Tx, scope: Scope): Promise<number> {
  const [row] = await tx<{ count: number }[]>`
    select count(*)::int as count from webhook_endpoints
    where company_id = ${scope.companyId} and environment = ${scope.environment} and deleted_at is null`;
  return row!.count;
}

export async function insertWebhookEndpoint(
  tx: Tx,
  endpoint: Scope & { id: string; url: string; description: string; eventTypes: string[]; secret: string },
): Promise<WebhookEndpoint> {
  const [row] = await tx<EndpointRow[]>`
    insert into webhook_endpoints (id, company_id, environment, url, description, event_types, secret)
    values (${endpoint.id}, ${endpoint.companyId}, ${endpoint.environment}, ${endpoint.url}, ${endpoint.description},
            ${endpoint.eventTypes}::text[], ${endpoint.secret})
    returning *`;
  return toEndpoint(row!);
}

export async function findWebhookEndpoint(tx: Tx, scope: Scope, id: string): Promise<WebhookEndpoint | undefined> {
  const [row] = await tx<EndpointRow[]>`
    select * from webhook_endpoints
    where id = ${id} and company_id = ${scope.companyId} and environment = ${scope.environment} and deleted_at is null`;
  return row ? toEndpoint(row) : undefined;
}

export async function lockWebhookEndpoint(tx: TransactionSql, scope: Scope, id: string): Promise<WebhookEndpoint | undefined> {
  const [row] = await tx<EndpointRow[]>`
    select * from webhook_endpoints
    where id = ${id} and company_id = ${scope.companyId} and environment = ${scope.environment} and deleted_at is null
    for update`;
  return row ? toEndpoint(row) : undefined;
}

export async function listWebhookEndpoints(tx: Tx, scope: Scope, page: { limit: number; after?: { id: string } }): Promise<WebhookEndpoint[]> {
  const rows = await tx<EndpointRow[]>`
    select * from webhook_endpoints
    where company_id = ${scope.companyId} and environment = ${scope.environment} and deleted_at is null
      ${page.after ? tx`and id < ${page.after.id}` : tx``}
    order by id desc limit ${page.limit}`;
  return rows.map(toEndpoint);
}

export interface EndpointChanges {
  url?: string;
  description?: string;
  eventTypes?: string[];
  status?: EndpointStatus;
  disabledReason?: string | null;
}

/** Applies the changes to a locked endpoint; a status change bumps the version (and emits its event). */
export async function updateWebhookEndpoint(tx: TransactionSql, current: WebhookEndpoint, changes: EndpointChanges): Promise<WebhookEndpoint> {
  const status = changes.status ?? current.status;
  const statusChanged = status !== current.status;
  const disabledReason = status === 'enabled' ? null : statusChanged ? (changes.disabledReason ?? null) : current.disabledReason;
  const [row] = await tx<EndpointRow[]>`
    update webhook_endpoints set
      url = ${changes.url ?? current.url},
      description = ${changes.description ?? current.description},
      event_types = ${changes.eventTypes ?? current.eventTypes}::text[],
      status = ${status},
      disabled_reason = ${disabledReason},
      version = version + ${statusChanged ? 1 : 0},
      updated_at = now()
    where id = ${current.id}
    returning *`;
  return toEndpoint(row!);
}

export async function rotateWebhookSecret(
  tx: TransactionSql,
  current: WebhookEndpoint,
  rotation: { secret: string; previousExpiresAt: Date | null },
): Promise<WebhookEndpoint> {
  const [row] = await tx<EndpointRow[]>`
    update webhook_endpoints set
      secret = ${rotation.secret},
      previous_secret = ${rotation.previousExpiresAt ? current.secret : null},
      previous_secret_expires_at = ${rotation.previousExpiresAt},
      updated_at = now()
    where id = ${current.id}
    returning *`;
  return toEndpoint(row!);
}

export async function softDeleteWebhookEndpoint(tx: TransactionSql, current: WebhookEndpoint): Promise<void> {
  await tx`update webhook_endpoints set deleted_at = now(), updated_at = now() where id = ${current.id}`;
}

// ---------------------------------------------------------------------------------------------
// Events

export interface StoredEvent {
  id: string;
  companyId: string;
  environment: Environment;
  type: string;
  objectType: 'transfer' | 'webhook_endpoint';
  objectId: string;
  objectVersion: number;
  snapshot: Record<string, unknown>;
  createdAt: Date;
}

interface EventRow {
  id: string;
  company_id: string;
  environment: Environment;
  type: string;
  object_type: 'transfer' | 'webhook_endpoint';
  object_id: string;
  object_version: number;
  snapshot: Record<string, unknown>;
  created_at: Date;
}

const EVENT_COLUMNS = 'id, company_id, environment, type, object_type, object_id, object_version, snapshot, created_at';

function toEvent(row: EventRow): StoredEvent {
  return {
    id: row.id,
    companyId: row.company_id,
    environment: row.environment,
    type: row.type,
    objectType: row.object_type,
    objectId: row.object_id,
    objectVersion: row.object_version,
    snapshot: row.snapshot,
    createdAt: row.created_at,
  };
}

export async function findEvent(tx: Tx, scope: Scope, id: string): Promise<StoredEvent | undefined> {
  const [row] = await tx<EventRow[]>`
    select ${tx.unsafe(EVENT_COLUMNS)} from events
    where id = ${id} and company_id = ${scope.companyId} and environment = ${scope.environment}`;
  return row ? toEvent(row) : undefined;
}

export interface EventFilters {
  type?: string;
  objectId?: string;
}

export async function listEvents(tx: Tx, scope: Scope, page: { limit: number; after?: { id: string } }, filters: EventFilters = {}): Promise<StoredEvent[]> {
  const rows = await tx<EventRow[]>`
    select ${tx.unsafe(EVENT_COLUMNS)} from events
    where company_id = ${scope.companyId} and environment = ${scope.environment}
      ${page.after ? tx`and id < ${page.after.id}` : tx``}
      ${filters.type ? tx`and type = ${filters.type}` : tx``}
      ${filters.objectId ? tx`and object_id = ${filters.objectId}` : tx``}
    order by id desc limit ${page.limit}`;
  return rows.map(toEvent);
}

export interface NewDelivery {
  deliveryId: string;
  companyId: string;
  environment: Environment;
  eventId: string;
  endpointId: string;
}

/**
 * Claims a batch of undispatched events (SKIP LOCKED: dispatchers never wait on each other) and fans
 * each out to the endpoints that are enabled and subscribed to its type now (at dispatch, usually
 * within a poll interval of the event) and were created before it. Marks the events dispatched and
 * returns their deliveries, all in the caller's (system-scope) transaction; the caller records
 * their workflow starts in the outbox in the same transaction.
 *
 * A delivery that already exists is returned too: a manual resend of an event not yet dispatched
 * creates its delivery first (ensureDelivery), and that delivery still needs its scheduled workflow,
 * or a failed resend would never be retried. The workflow ID (event + endpoint) differs from the
 * resend's, and a delivery the resend already completed ends its first scheduled attempt without
 * sending again.
 */
export async function fanOutEvents(tx: TransactionSql, options: { limit: number }): Promise<{ events: number; deliveries: NewDelivery[] }> {
  const claimed = await tx<{ id: string }[]>`
    select id from events where dispatched_at is null
    order by created_at limit ${options.limit} for update skip locked`;
  if (claimed.length === 0) return { events: 0, deliveries: [] };
  const ids = claimed.map((row) => row.id);
  const deliveries = await tx<{ id: string; company_id: string; environment: Environment; event_id: string; endpoint_id: string }[]>`
    insert into webhook_deliveries (company_id, environment, event_id, endpoint_id)
    select e.company_id, e.environment, e.id, w.id
    from events e
    join webhook_endpoints w
      on w.company_id = e.company_id and w.environment = e.environment
     and w.status = 'enabled' and w.deleted_at is null and w.created_at <= e.created_at
     and (cardinality(w.event_types) = 0 or e.type = any (w.event_types))
    where e.id = any (${ids}::text[])
    order by e.created_at, w.id
    on conflict (event_id, endpoint_id) do update set event_id = excluded.event_id
    returning id, company_id, environment, event_id, endpoint_id`;
  await tx`update events set dispatched_at = now() where id = any (${ids}::text[])`;
  return {
    events: ids.length,
    deliveries: deliveries.map((row) => ({
      deliveryId: row.id,
      companyId: row.company_id,
      environment: row.environment,
      eventId: row.event_id,
      endpointId: row.endpoint_id,
    })),
  };
}

// ---------------------------------------------------------------------------------------------
// Deliveries and attempts

export type DeliveryStatus = 'pending' | 'succeeded' | 'failed' | 'canceled';

export interface WebhookDelivery {
  id: string;
  companyId: string;
  environment: Environment;
  eventId: string;
  endpointId: string;
  status: DeliveryStatus;
  attempts: number;
  createdAt: Date;
  completedAt: Date | null;
}

interface DeliveryRow {
  id: string;
  company_id: string;
  environment: Environment;
  event_id: string;
  endpoint_id: string;
  status: DeliveryStatus;
  attempts: number;
  created_at: Date;
  completed_at: Date | null;
}

function toDelivery(row: DeliveryRow): WebhookDelivery {
  return {
    id: row.id,
    companyId: row.company_id,
    environment: row.environment,
    eventId: row.event_id,
    endpointId: row.endpoint_id,
    status: row.status,
    attempts: row.attempts,
    createdAt: row.created_at,
    completedAt: row.completed_at,
  };
}

/** Finds or creates the delivery of an event to an endpoint (manual sends create it on demand). */
export async function ensureDelivery(tx: TransactionSql, event: StoredEvent, endpointId: string): Promise<WebhookDelivery> {
  const [row] = await tx<DeliveryRow[]>`
    insert into webhook_deliveries (company_id, environment, event_id, endpoint_id)
    values (${event.companyId}, ${event.environment}, ${event.id}, ${endpointId})
    on conflict (event_id, endpoint_id) do update set event_id = excluded.event_id
    returning *`;
  return toDelivery(row!);
}

export interface DeliveryContext {
  delivery: WebhookDelivery;
  event: StoredEvent;
  endpoint: WebhookEndpoint;
}

/**
 * What one attempt needs, read in the attempt's own transaction: the delivery, its event, and its
 * endpoint (deleted or not) locked FOR UPDATE, so the in-flight count openAttempt takes next is
 * taken under that lock and the endpoint cannot change between the checks and the attempt. One
 * statement; the delivery's and the event's columns are named apart from the endpoint's.
 */
export async function lockDeliveryContext(tx: TransactionSql, eventId: string, endpointId: string): Promise<DeliveryContext | undefined> {
  const [row] = await tx<
    (EndpointRow & {
      d_id: string;
      d_company_id: string;
      d_environment: Environment;
      d_status: DeliveryStatus;
      d_attempts: number;
      d_created_at: Date;
      d_completed_at: Date | null;
      e_company_id: string;
      e_environment: Environment;
      e_type: string;
      e_object_type: EventRow['object_type'];
      e_object_id: string;
      e_object_version: number;
      e_snapshot: Record<string, unknown>;
      e_created_at: Date;
    })[]
  >`
    select w.*,
           d.id as d_id, d.company_id as d_company_id, d.environment as d_environment, d.status as d_status,
           d.attempts as d_attempts, d.created_at as d_created_at, d.completed_at as d_completed_at,
           e.company_id as e_company_id, e.environment as e_environment, e.type as e_type, e.object_type as e_object_type,
           e.object_id as e_object_id, e.object_version as e_object_version, e.snapshot as e_snapshot, e.created_at as e_created_at
    from webhook_deliveries d
    join events e on e.id = d.event_id
    join webhook_endpoints w on w.id = d.endpoint_id
    where d.event_id = ${eventId} and d.endpoint_id = ${endpointId}
    for update of w`;
  if (!row) return undefined;
  return {
    endpoint: toEndpoint(row),
    delivery: toDelivery({
      id: row.d_id,
      company_id: row.d_company_id,
      environment: row.d_environment,
      event_id: eventId,
      endpoint_id: endpointId,
      status: row.d_status,
      attempts: row.d_attempts,
      created_at: row.d_created_at,
      completed_at: row.d_completed_at,
    }),
    event: toEvent({
      id: eventId,
      company_id: row.e_company_id,
      environment: row.e_environment,
      type: row.e_type,
      object_type: row.e_object_type,
      object_id: row.e_object_id,
      object_version: row.e_object_version,
      snapshot: row.e_snapshot,
      created_at: row.e_created_at,
    }),
  };
}

export interface AttemptStart {
  deliveryId: string;
  companyId: string;
  endpointId: string;
  eventId: string;
  /** `<logical attempt>#<activity try>`. */
  attemptKey: string;
  /** The logical attempt (`scheduled:3`, `manual:rs_…`): its earlier tries still in flight are closed as lost. */
  supersedes: string;
  trigger: 'scheduled' | 'manual';
  url: string;
  leaseMs: number;
  maxInFlight: number;
}

/**
 * Opens an attempt if the endpoint has a free in-flight slot: the attempt row is the lease (it
 * expires by itself if the worker dies), counted under the endpoint's row lock, which the caller
 * took in this transaction with lockDeliveryContext. Earlier tries of the same attempt that a lost
 * worker left in flight are closed as failed first. Returns 'busy' when the endpoint is at its
 * limit; an attempt key already used returns the existing attempt's id.
 */
export async function openAttempt(tx: TransactionSql, start: AttemptStart): Promise<{ attemptId: string } | 'busy'> {
  // Earlier tries of this same attempt (same key before `#`) are dead: Temporal only retries an
  // activity whose previous try failed or timed out. Other attempts (a manual resend running at
  // the same time) are left alone.
  await tx`
    update webhook_attempts set state = 'failed', finished_at = now(), error = 'the worker was lost during the attempt'
    where delivery_id = ${start.deliveryId} and state = 'in_flight'
      and attempt_key like ${`${start.supersedes}#%`} and attempt_key <> ${start.attemptKey}`;
  const [existing] = await tx<{ id: string }[]>`
    select id from webhook_attempts where delivery_id = ${start.deliveryId} and attempt_key = ${start.attemptKey}`;
  if (existing) return { attemptId: existing.id };
  const [busy] = await tx<{ count: number }[]>`
    select count(*)::int as count from webhook_attempts
    where endpoint_id = ${start.endpointId} and state = 'in_flight' and lease_until > now()`;
  if (busy!.count >= start.maxInFlight) return 'busy';
  const [row] = await tx<{ id: string }[]>`
    insert into webhook_attempts (company_id, delivery_id, endpoint_id, event_id, attempt_key, trigger, url, lease_until)
    values (${start.companyId}, ${start.deliveryId}, ${start.endpointId}, ${start.eventId}, ${start.attemptKey},
            ${start.trigger}, ${start.url}, now() + ${start.leaseMs} * interval '1 millisecond')
    returning id`;
  return { attemptId: row!.id };
}

/** How stale an endpoint's last_success_at may be: it is rewritten at most this often. */
const LAST_SUCCESS_GRANULARITY_S = 60;

export interface AttemptResult {
  ok: boolean;
  statusCode: number | null;
  latencyMs: number;
  error: string | null;
  responseBody: string;
}

/** Closes an attempt and, on success, the delivery; counts it on the delivery. */
export async function closeAttempt(tx: TransactionSql, attemptId: string, delivery: { id: string; endpointId: string }, result: AttemptResult): Promise<void> {
  await tx`
    update webhook_attempts set
      state = ${result.ok ? 'succeeded' : 'failed'}, status_code = ${result.statusCode}, latency_ms = ${result.latencyMs},
      error = ${result.error?.slice(0, 500) ?? null}, response_body = ${result.responseBody}, finished_at = now()
    where id = ${attemptId} and state = 'in_flight'`;
  if (result.ok) {
    await tx`
      update webhook_deliveries set attempts = attempts + 1, status = 'succeeded', completed_at = coalesce(completed_at, now())
      where id = ${delivery.id}`;
    // Recorded at most once a minute: each write fires webhook_endpoints_guard and contends for the
    // endpoint's row lock with every attempt being opened. disableFailingEndpoint allows for it.
    await tx`
      update webhook_endpoints set last_success_at = now()
      where id = ${delivery.endpointId} and deleted_at is null
        and (last_success_at is null or last_success_at < now() - ${LAST_SUCCESS_GRANULARITY_S} * interval '1 second')`;
  } else {
    await tx`update webhook_deliveries set attempts = attempts + 1 where id = ${delivery.id}`;
  }
}

/**
 * Ends a delivery that will not be tried again (schedule exhausted, or its endpoint gone), if it is
 * still pending (a resend may have got it through meanwhile). Returns the delivery's ID and start
 * whatever its status, or undefined when there is no such delivery.
 */
export async function concludeDelivery(
  tx: TransactionSql,
  eventId: string,
  endpointId: string,
  status: 'failed' | 'canceled',
): Promise<{ id: string; createdAt: Date } | undefined> {
  const [row] = await tx<{ id: string; created_at: Date }[]>`
    with delivery as (
      select id, created_at, status from webhook_deliveries where event_id = ${eventId} and endpoint_id = ${endpointId}
    ), concluded as (
      update webhook_deliveries set status = ${status}, completed_at = now()
      where id = (select id from delivery) and status = 'pending'
    )
    select id, created_at from delivery`;
  return row ? { id: row.id, createdAt: row.created_at } : undefined;
}

export interface WebhookAttempt {
  id: string;
  deliveryId: string;
  endpointId: string;
  eventId: string;
  trigger: 'scheduled' | 'manual';
  state: 'in_flight' | 'succeeded' | 'failed';
  url: string;
  statusCode: number | null;
  latencyMs: number | null;
  error: string | null;
  responseBody: string | null;
  startedAt: Date;
  finishedAt: Date | null;
}

interface AttemptRow {
  id: string;
  delivery_id: string;
  endpoint_id: string;
  event_id: string;
  trigger: 'scheduled' | 'manual';
  state: 'in_flight' | 'succeeded' | 'failed';
  url: string;
  status_code: number | null;
  latency_ms: number | null;
  error: string | null;
  response_body: string | null;
  started_at: Date;
  finished_at: Date | null;
}

export async function listAttempts(
  tx: Tx,
  endpointId: string,
  page: { limit: number; after?: { id: string } },
  filters: { eventId?: string } = {},
): Promise<WebhookAttempt[]> {
  const rows = await tx<AttemptRow[]>`
    select id, delivery_id, endpoint_id, event_id, trigger, state, url, status_code, latency_ms, error, response_body,
           started_at, finished_at
    from webhook_attempts
    where endpoint_id = ${endpointId}
      ${page.after ? tx`and id < ${page.after.id}` : tx``}
      ${filters.eventId ? tx`and event_id = ${filters.eventId}` : tx``}
    order by id desc limit ${page.limit}`;
  return rows.map((row) => ({
    id: row.id,
    deliveryId: row.delivery_id,
    endpointId: row.endpoint_id,
    eventId: row.event_id,
    trigger: row.trigger,
    state: row.state,
    url: row.url,
    statusCode: row.status_code,
    latencyMs: row.latency_ms,
    error: row.error,
    responseBody: row.response_body,
    startedAt: row.started_at,
    finishedAt: row.finished_at,
  }));
}

/**
 * After a delivery exhausted its schedule: disables its endpoint unless the endpoint succeeded with
 * anything since the delivery began (then it is not "failing", just this message). The status change
 * writes the `webhook_endpoint.disabled` event that tells the company. Returns whether it disabled.
 *
 * last_success_at is only moved when it is more than LAST_SUCCESS_GRANULARITY_S old (closeAttempt),
 * so after a success at S it is at least S minus that much. Comparing it with the delivery's start
 * minus the same margin therefore never disables an endpoint that succeeded since the delivery
 * began; the price is that a success in the minute before the delivery began counts too (the
 * endpoint then stays enabled, and the next delivery that exhausts its schedule disables it).
 */
export async function disableFailingEndpoint(tx: TransactionSql, delivery: { endpointId: string; createdAt: Date }, reason: string): Promise<boolean> {
  const rows = await tx`
    update webhook_endpoints set status = 'disabled', disabled_reason = ${reason}, version = version + 1, updated_at = now()
    where id = ${delivery.endpointId} and status = 'enabled' and deleted_at is null
      and (last_success_at is null
           or last_success_at < ${delivery.createdAt}::timestamptz - ${LAST_SUCCESS_GRANULARITY_S} * interval '1 second')
    returning id`;
  return rows.length > 0;
}
