import type { Sql, TransactionSql } from './client.ts';
import { withSystemScope } from './tenant.ts';

// Queries on `idempotency_keys` (migration 00002). Every function but the purge takes a transaction
// opened by `withTenant` for the row's company: row-level security then shows and accepts that
// company's rows only. Leases are measured on the database clock, so application servers whose
// clocks disagree still agree on when a lease has expired.
//
// The lease's `locked_until` doubles as a fencing token: it is truncated to milliseconds so that it
// survives the round trip through a JS Date exactly, and completing or releasing a running row
// requires the token of the lease that is held. A request whose lease expired and was taken over
// can therefore no longer complete or delete the row of the request that took it over.

export type IdempotencyEnvironment = 'sandbox' | 'live' | 'admin';
export type IdempotencyMethod = 'POST' | 'PUT' | 'PATCH' | 'DELETE';

/** The primary key: a key is scoped to one company and one environment. */
export interface IdempotencyKeyId {
  companyId: string;
  environment: IdempotencyEnvironment;
  key: string;
}

/** A response exactly as it is replayed: status, a few headers (lower-case names) and body bytes. */
export interface StoredResponse {
  status: number;
  headers: Record<string, string>;
  body: Buffer;
}

/**
 * Where a key stands: its first request still running under a lease (the fencing token, and whether
 * it has expired on the database clock), or completed with the response every replay gets.
 */
export type IdempotencyKeyState =
  | { status: 'running'; lockedUntil: Date; leaseExpired: boolean }
  | { status: 'completed'; response: StoredResponse };

export type IdempotencyRecord = IdempotencyKeyId & {
  requestMethod: IdempotencyMethod;
  requestPath: string;
  requestHash: Buffer;
  createdAt: Date;
  expiresAt: Date;
} & (
    | Extract<IdempotencyKeyState, { status: 'running' }>
    | (Extract<IdempotencyKeyState, { status: 'completed' }> & { completedAt: Date })
  );

interface IdempotencyRow {
  company_id: string;
  environment: IdempotencyEnvironment;
  key: string;
  request_method: IdempotencyMethod;
  request_path: string;
  request_hash: Buffer;
  status: 'running' | 'completed';
  locked_until: Date | null;
  lease_expired: boolean | null;
  response_status: number | null;
  response_headers: Record<string, string> | null;
  response_body: Buffer | null;
  created_at: Date;
  completed_at: Date | null;
  expires_at: Date;
}

/** The columns a key's state is read from: a row of the table, or the hot path's claim outcome. */
type KeyStateColumns = Pick<IdempotencyRow, 'locked_until' | 'lease_expired' | 'response_status' | 'response_headers' | 'response_body'>;

function keyStateOf(status: 'running' | 'completed', row: KeyStateColumns): IdempotencyKeyState {
  if (status === 'running') return { status: 'running', lockedUntil: row.locked_until!, leaseExpired: row.lease_expired === true };
  return {
    status: 'completed',
    response: {
      status: row.response_status!,
      headers: row.response_headers ?? {},
      body: row.response_body ?? Buffer.alloc(0),
    },
  };
}

function toRecord(row: IdempotencyRow): IdempotencyRecord {
  const base = {
    companyId: row.company_id,
    environment: row.environment,
    key: row.key,
    requestMethod: row.request_method,
    requestPath: row.request_path,
    requestHash: row.request_hash,
    createdAt: row.created_at,
    expiresAt: row.expires_at,
  };
  const state = keyStateOf(row.status, row);
  return state.status === 'running' ? { ...base, ...state } : { ...base, ...state, completedAt: row.completed_at! };
}

/**
 * What a write that claims its key in its own statement (the ledger hot path, migration 00006) sends
 * along: the key, the request's fingerprint, how long to keep it, and the response to store.
 */
export type IdempotencyClaim = IdempotencyKeyId & {
  requestMethod: IdempotencyMethod;
  requestPath: string;
  requestHash: Buffer;
  ttlMs: number;
  response: StoredResponse;
};

/**
 * The result of a claim-and-write statement: the write happened and the response is stored
 * ('created'), the key exists ('existing': nothing was written; the key's state as IdempotencyRecord
 * has it, and whether this same request claimed it: the statement compares the fingerprints instead
 * of returning the stored one), or the row vanished between the statement's insert and its read
 * ('retry': nothing was written, try again).
 */
export type ClaimOutcome =
  | { kind: 'created' }
  | { kind: 'existing'; existing: IdempotencyKeyState & { sameRequest: boolean } }
  | { kind: 'retry' };

export interface ClaimOutcomeRow {
  outcome: 'created' | 'existing' | 'retry';
  key_status: 'running' | 'completed' | null;
  same_request: boolean | null;
  locked_until: Date | null;
  lease_expired: boolean | null;
  response_status: number | null;
  response_headers: Record<string, string> | null;
  response_body: Buffer | null;
}

export function claimOutcomeOf(row: ClaimOutcomeRow): ClaimOutcome {
  if (row.outcome !== 'existing') return { kind: row.outcome };
  return { kind: 'existing', existing: { ...keyStateOf(row.key_status!, row), sameRequest: row.same_request === true } };
}

/** The lease end `leaseMs` from now on the database clock, truncated so it round-trips as a Date. */
const leaseEnd = (tx: TransactionSql, leaseMs: number) =>
  tx`date_trunc('milliseconds', clock_timestamp() + ${leaseMs}::double precision * interval '1 millisecond')`;

/**
 * Inserts the key as 'running' with a lease unless a row for it exists. Returns the lease (the
 * fencing token for complete/release) when this call inserted the row, undefined when it existed.
 */
export async function insertRunningIdempotencyKey(
  tx: TransactionSql,
  entry: IdempotencyKeyId & {
    requestMethod: IdempotencyMethod;
    requestPath: string;
    requestHash: Buffer;
    leaseMs: number;
    ttlMs: number;
  },
): Promise<Date | undefined> {
  const [row] = await tx<{ locked_until: Date }[]>`
    insert into idempotency_keys
      (company_id, environment, key, request_method, request_path, request_hash, status, locked_until, expires_at)
    values (${entry.companyId}, ${entry.environment}, ${entry.key}, ${entry.requestMethod}, ${entry.requestPath},
            ${entry.requestHash}, 'running', ${leaseEnd(tx, entry.leaseMs)},
            now() + ${entry.ttlMs}::double precision * interval '1 millisecond')
    on conflict (company_id, environment, key) do nothing
    returning locked_until`;
  return row?.locked_until;
}

export async function findIdempotencyKey(tx: TransactionSql, id: IdempotencyKeyId): Promise<IdempotencyRecord | undefined> {
  const [row] = await tx<IdempotencyRow[]>`
    select company_id, environment, key, request_method, request_path, request_hash, status, locked_until,
           locked_until <= clock_timestamp() as lease_expired,
           response_status, response_headers, response_body, created_at, completed_at, expires_at
    from idempotency_keys
    where company_id = ${id.companyId} and environment = ${id.environment} and key = ${id.key}`;
  return row ? toRecord(row) : undefined;
}

/**
 * When the key's row was created, in microseconds since the epoch (whatever the session's time
 * zone): what tells one claim of a key from a later claim of the same key after the first row was
 * purged.
 */
export async function idempotencyKeyCreatedAt(tx: TransactionSql, id: IdempotencyKeyId): Promise<string> {
  const [row] = await tx<{ created_at: string }[]>`
    select (extract(epoch from created_at) * 1000000)::bigint::text as created_at from idempotency_keys
    where company_id = ${id.companyId} and environment = ${id.environment} and key = ${id.key}`;
  if (!row) throw new Error(`idempotency key ${id.key} is not claimed`);
  return row.created_at;
}

/**
 * Takes over a running row whose lease has expired (its request died mid-flight) for a request with
 * the same fingerprint, with a fresh lease. Atomic: of concurrent takers, the row lock lets exactly
 * one see the expired lease; the others re-check the updated row, find a live lease, and get
 * undefined.
 */
export async function takeOverExpiredIdempotencyKey(
  tx: TransactionSql,
  id: IdempotencyKeyId & { requestHash: Buffer; leaseMs: number },
): Promise<Date | undefined> {
  const [row] = await tx<{ locked_until: Date }[]>`
    update idempotency_keys set locked_until = ${leaseEnd(tx, id.leaseMs)}
    where company_id = ${id.companyId} and environment = ${id.environment} and key = ${id.key}
      and status = 'running' and locked_until <= clock_timestamp() and request_hash = ${id.requestHash}
    returning locked_until`;
  return row?.locked_until;
}

/**
 * Stores the response and completes the row, if the caller still holds the lease `lease`. Returns
 * false when it does not (the row was completed, released or taken over meanwhile).
 */
export async function completeIdempotencyKey(
  tx: TransactionSql,
  id: IdempotencyKeyId & { lease: Date; response: StoredResponse },
): Promise<boolean> {
  const rows = await tx`
    update idempotency_keys
    set status = 'completed', locked_until = null, completed_at = now(),
        response_status = ${id.response.status}, response_headers = ${tx.json(id.response.headers)},
        response_body = ${id.response.body}
    where company_id = ${id.companyId} and environment = ${id.environment} and key = ${id.key}
      and status = 'running' and locked_until = ${id.lease}
    returning 1`;
  return rows.length === 1;
}

/**
 * Deletes a running row whose request failed without a decided outcome, so that a retry with the
 * same key executes. Only with the lease held; returns false otherwise.
 */
export async function releaseIdempotencyKey(tx: TransactionSql, id: IdempotencyKeyId & { lease: Date }): Promise<boolean> {
  const rows = await tx`
    delete from idempotency_keys
    where company_id = ${id.companyId} and environment = ${id.environment} and key = ${id.key}
      and status = 'running' and locked_until = ${id.lease}
    returning 1`;
  return rows.length === 1;
}

/**
 * Inserts the key already completed with its response, unless a row for it exists: for an answer
 * decided without a running row (a refusal of the single-statement hot path). True when inserted.
 */
export async function insertCompletedIdempotencyKey(tx: TransactionSql, entry: IdempotencyClaim): Promise<boolean> {
  const rows = await tx`
    insert into idempotency_keys
      (company_id, environment, key, request_method, request_path, request_hash, status, locked_until,
       response_status, response_headers, response_body, completed_at, expires_at)
    values (${entry.companyId}, ${entry.environment}, ${entry.key}, ${entry.requestMethod}, ${entry.requestPath},
            ${entry.requestHash}, 'completed', null, ${entry.response.status}, ${tx.json(entry.response.headers)},
            ${entry.response.body}, now(), now() + ${entry.ttlMs}::double precision * interval '1 millisecond')
    on conflict (company_id, environment, key) do nothing
    returning 1`;
  return rows.length === 1;
}

/**
 * Deletes at most `limit` rows of every company whose retention ended before `asOf` (a running row
 * that old belongs to a request that died long ago), in one system-scope transaction. Rows locked
 * by a request in flight are skipped, not waited for. Returns how many it deleted.
 *
 * The batch is a MATERIALIZED CTE on purpose: as `where (...) in (select ... limit n for update skip
 * locked)` the planner may pick a nested loop that re-runs the subquery per outer row, and each rerun
 * skips the rows this statement already deleted and locks the next ones, so the limit stops holding.
 */
export async function purgeExpiredIdempotencyKeys(sql: Sql, options: { asOf: Date; limit: number }): Promise<number> {
  return withSystemScope(sql, async (tx) => {
    const rows = await tx`
      with batch as materialized (
        select company_id, environment, key from idempotency_keys
        where expires_at <= ${options.asOf}
        order by expires_at
        limit ${options.limit}
        for update skip locked
      )
      delete from idempotency_keys k
      using batch
      where k.company_id = batch.company_id and k.environment = batch.environment and k.key = batch.key
      returning 1`;
    return rows.length;
  });
}
