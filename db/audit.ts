// Security audit trail: one hash chain per company over `audit_events`, anchored by the row in
// `audit_chain_heads` (migration 00002).
//
// Each event's hash is sha256(prev_hash || canonical_bytes), where canonical_bytes is the RFC 8785
// canonical JSON (UTF-8) of
//   { v: 1, companyId, seq, event, actorType, actorId, objectType, objectId, data, ip, requestId, occurredAt }
// with null for every absent field, `seq` as a JSON number and `occurredAt` as an ISO-8601 string with
// milliseconds. The first event of a company chains from 32 zero bytes. This format is persisted in
// every hash: change it only by bumping `v` and teaching the verifier both versions.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import { z } from 'zod';
import {
  ZAuditActorType,
  ZAuditEventName,
  type AuditActorType,
  type AuditEventName,
} from '../workflows/shared/audit-events.ts';
import type { Sql, TransactionSql } from './client.ts';

const HASH_FORMAT_VERSION = 1;
const HASH_BYTES = 32;
const GENESIS_HASH = Buffer.alloc(HASH_BYTES);
/** Canonical JSON of an event's `data`, in UTF-8 bytes. */
export const AUDIT_DATA_BYTES_MAX = 16 * 1024;
/** Events read per query while verifying a chain (the default and the maximum). */
export const AUDIT_VERIFY_PAGE_SIZE = 1000;
export const AUDIT_PAGE_SIZE_MAX = 200;

const ZAppendAuditEventInput = z
  .object({
    companyId: z.string().regex(/^co_[0-9a-f]{32}$/),
    event: ZAuditEventName,
    actor: z.object({ type: ZAuditActorType, id: z.string().min(1).max(100).optional() }),
    object: z.object({ type: z.string().min(1).max(100), id: z.string().min(1).max(200) }).optional(),
    data: z.record(z.string(), z.unknown()).optional(),
    ip: z.string().min(1).max(64).optional(),
    requestId: z.string().min(1).max(200).optional(),
    occurredAt: z.date().optional(),
  })
  .refine((input) => input.actor.id !== undefined || input.actor.type === 'system' || input.actor.type === 'anonymous', {
    message: 'an operator or API key actor needs its id',
    path: ['actor', 'id'],
  });

export interface AppendAuditEventInput {
  companyId: string;
  event: AuditEventName;
  actor: { type: AuditActorType; id?: string };
  object?: { type: string; id: string };
  /** JSON-serialisable details; stored and hashed in their canonical JSON form. */
  data?: Record<string, unknown>;
  ip?: string;
  requestId?: string;
  /** Defaults to now. JavaScript dates carry milliseconds, which timestamptz keeps exactly. */
  occurredAt?: Date;
}

export interface AuditChainLink {
  seq: bigint;
  /** SHA-256, lowercase hex. */
  hash: string;
}

export interface AuditEvent {
  id: bigint;
  companyId: string;
  seq: bigint;
  event: AuditEventName;
  actor: { type: AuditActorType; id: string | null };
  object: { type: string; id: string } | null;
  data: Record<string, unknown>;
  ip: string | null;
  requestId: string | null;
  occurredAt: Date;
  prevHash: string;
  hash: string;
}

interface AuditEventRow {
  id: bigint;
  company_id: string;
  seq: bigint;
  event: string;
  actor_type: string;
  actor_id: string | null;
  object_type: string | null;
  object_id: string | null;
  data: Record<string, unknown>;
  ip: string | null;
  request_id: string | null;
  occurred_at: Date;
  prev_hash: Buffer;
  hash: Buffer;
}

/** Throws when the database holds an event or actor name this code does not know (schema drift). */
function toAuditEvent(row: AuditEventRow): AuditEvent {
  return {
    id: row.id,
    companyId: row.company_id,
    seq: row.seq,
    event: ZAuditEventName.parse(row.event),
    actor: { type: ZAuditActorType.parse(row.actor_type), id: row.actor_id },
    object: row.object_type === null || row.object_id === null ? null : { type: row.object_type, id: row.object_id },
    data: row.data,
    ip: row.ip,
    requestId: row.request_id,
    occurredAt: row.occurred_at,
    prevHash: row.prev_hash.toString('hex'),
    hash: row.hash.toString('hex'),
  };
}

interface HashedFields {
  companyId: string;
  seq: bigint;
  event: string;
  actorType: string;
  actorId: string | null;
  objectType: string | null;
  objectId: string | null;
  data: unknown;
  ip: string | null;
  requestId: string | null;
  occurredAt: Date;
}

function canonicalJson(value: unknown): string {
  const text = canonicalize(value);
  assert.ok(text !== undefined, 'audit data must be JSON-serialisable');
  return text;
}

function chainHash(prevHash: Buffer, fields: HashedFields): Buffer {
  assert.ok(fields.seq <= BigInt(Number.MAX_SAFE_INTEGER), 'audit seq beyond 2^53 cannot be hashed as a JSON number');
  const canonical = canonicalJson({
    v: HASH_FORMAT_VERSION,
    companyId: fields.companyId,
    seq: Number(fields.seq),
    event: fields.event,
    actorType: fields.actorType,
    actorId: fields.actorId,
    objectType: fields.objectType,
    objectId: fields.objectId,
    data: fields.data,
    ip: fields.ip,
    requestId: fields.requestId,
    occurredAt: fields.occurredAt.toISOString(),
  });
  return createHash('sha256').update(prevHash).update(canonical, 'utf8').digest();
}

/**
 * Appends one event to the company's chain. Call it inside the transaction that makes the change it
 * records, after `select set_config('app.company_id', <company>, true)` (or in system scope): row-level
 * security refuses any other company. It locks the company's chain head until that transaction ends,
 * so appends for one company are serialised and their seq is contiguous. Run the transaction at READ
 * COMMITTED (the default); at REPEATABLE READ or above a concurrent append fails with a serialisation
 * error the caller must retry.
 */
export async function appendAuditEvent(tx: TransactionSql, input: AppendAuditEventInput): Promise<AuditChainLink> {
  const parsed = ZAppendAuditEventInput.parse(input);
  // Hash and store the JSON form of `data` (dates as strings, undefined dropped), so the jsonb read back
  // re-canonicalises to the same bytes.
  const dataText = canonicalJson(parsed.data ?? {});
  assert.ok(Buffer.byteLength(dataText, 'utf8') <= AUDIT_DATA_BYTES_MAX, `audit data exceeds ${AUDIT_DATA_BYTES_MAX} bytes`);
  const fields: HashedFields = {
    companyId: parsed.companyId,
    seq: 0n,
    event: parsed.event,
    actorType: parsed.actor.type,
    actorId: parsed.actor.id ?? null,
    objectType: parsed.object?.type ?? null,
    objectId: parsed.object?.id ?? null,
    data: JSON.parse(dataText) as Record<string, unknown>,
    ip: parsed.ip ?? null,
    requestId: parsed.requestId ?? null,
    occurredAt: new Date(parsed.occurredAt ?? Date.now()),
  };

  // Creates the head on first use; the no-op update takes the row lock either way.
  const [head] = await tx<{ seq: bigint; hash: Buffer }[]>`
    insert into audit_chain_heads (company_id, seq, hash)
    values (${fields.companyId}, 0, ${GENESIS_HASH})
    on conflict (company_id) do update set company_id = excluded.company_id
    returning seq, hash`;
  assert.ok(head, 'audit chain head upsert returned no row');
  fields.seq = head.seq + 1n;
  const hash = chainHash(head.hash, fields);

  const data = tx.json(fields.data as Parameters<typeof tx.json>[0]);
  await tx`
    insert into audit_events (company_id, seq, event, actor_type, actor_id, object_type, object_id, data, ip,
                              request_id, occurred_at, prev_hash, hash)
    values (${fields.companyId}, ${fields.seq.toString()}::bigint, ${fields.event}, ${fields.actorType},
            ${fields.actorId}, ${fields.objectType}, ${fields.objectId}, ${data}, ${fields.ip},
            ${fields.requestId}, ${fields.occurredAt}, ${head.hash}, ${hash})`;
  const advanced = await tx`
    update audit_chain_heads set seq = ${fields.seq.toString()}::bigint, hash = ${hash}
    where company_id = ${fields.companyId} and seq = ${head.seq.toString()}::bigint`;
  assert.equal(advanced.count, 1, 'audit chain head moved while locked');
  return { seq: fields.seq, hash: hash.toString('hex') };
}

export type AuditChainBreak = 'hash mismatch' | 'sequence gap' | 'prev_hash mismatch' | 'head mismatch';

export type AuditChainVerification =
  | { ok: true; events: number; headHash: string }
  /** `events` counts the events that verified before the break. */
  | { ok: false; events: number; brokenAtSeq: bigint; reason: AuditChainBreak };

interface ChainRow extends HashedFields {
  prevHash: Buffer;
  hash: Buffer;
  occurredAtWholeMs: boolean;
}

/**
 * Recomputes a company's whole chain from the stored fields, `pageSize` (default and maximum
 * `AUDIT_VERIFY_PAGE_SIZE`) events at a time, so memory stays bounded however long the chain.
 * Opens its own read-only REPEATABLE READ transaction on `sql` (so the events and the head come from
 * one snapshot while appends go on) and sets `app.company_id` to `companyId` in it, so it works on an
 * application connection under row-level security as well as on an owner or system one.
 *
 * On a break, `brokenAtSeq` is: the first missing seq ('sequence gap'); the event whose prev_hash or
 * hash does not match ('prev_hash mismatch', 'hash mismatch'); the first seq where head and events
 * disagree ('head mismatch').
 */
export async function verifyAuditChain(
  sql: Sql,
  companyId: string,
  options: { pageSize?: number } = {},
): Promise<AuditChainVerification> {
  const pageSize = options.pageSize ?? AUDIT_VERIFY_PAGE_SIZE;
  assert.ok(Number.isInteger(pageSize) && pageSize >= 1 && pageSize <= AUDIT_VERIFY_PAGE_SIZE, 'pageSize out of range');
  return sql.begin('isolation level repeatable read read only', async (tx) => {
    await tx`select set_config('app.company_id', ${companyId}, true)`;
    return walkAuditChain(tx, companyId, pageSize);
  });
}

async function walkAuditChain(tx: TransactionSql, companyId: string, pageSize: number): Promise<AuditChainVerification> {
  let lastSeq = 0n;
  let lastHash: Buffer = GENESIS_HASH;
  let events = 0;
  for (;;) {
    const rows = await tx<ChainRow[]>`
      select company_id as "companyId", seq, event, actor_type as "actorType", actor_id as "actorId",
             object_type as "objectType", object_id as "objectId", data, ip, request_id as "requestId",
             occurred_at as "occurredAt", occurred_at = date_trunc('milliseconds', occurred_at) as "occurredAtWholeMs",
             prev_hash as "prevHash", hash
      from audit_events
      where company_id = ${companyId} and seq > ${lastSeq.toString()}::bigint
      order by seq
      limit ${pageSize}`;
    for (const row of rows) {
      if (row.seq !== lastSeq + 1n) return { ok: false, events, brokenAtSeq: lastSeq + 1n, reason: 'sequence gap' };
      if (!row.prevHash.equals(lastHash)) return { ok: false, events, brokenAtSeq: row.seq, reason: 'prev_hash mismatch' };
      // A sub-millisecond occurred_at cannot be the value that was hashed.
      if (!row.occurredAtWholeMs || !chainHash(row.prevHash, row).equals(row.hash)) {
        return { ok: false, events, brokenAtSeq: row.seq, reason: 'hash mismatch' };
      }
      lastSeq = row.seq;
      lastHash = row.hash;
      events += 1;
    }
    if (rows.length < pageSize) break;
  }

  const [head] = await tx<{ seq: bigint; hash: Buffer }[]>`
    select seq, hash from audit_chain_heads where company_id = ${companyId}`;
  const headSeq = head?.seq ?? 0n;
  const headHash = head?.hash ?? GENESIS_HASH;
  if (headSeq !== lastSeq || !headHash.equals(lastHash)) {
    const brokenAtSeq = headSeq === lastSeq ? lastSeq : (headSeq < lastSeq ? headSeq : lastSeq) + 1n;
    return { ok: false, events, brokenAtSeq, reason: 'head mismatch' };
  }
  return { ok: true, events, headHash: headHash.toString('hex') };
}

/**
 * A company's events, newest first (by seq), at most `limit` of them; `before` is the seq of the last
 * event of the previous page. Run in a transaction that has set `app.company_id`.
 */
export async function listAuditEvents(
  tx: TransactionSql | Sql,
  companyId: string,
  options: { limit: number; before?: bigint },
): Promise<AuditEvent[]> {
  assert.ok(Number.isInteger(options.limit) && options.limit >= 1 && options.limit <= AUDIT_PAGE_SIZE_MAX, 'limit out of range');
  const before = options.before === undefined ? tx`` : tx`and seq < ${options.before.toString()}::bigint`;
  const rows = await tx<AuditEventRow[]>`
    select id, company_id, seq, event, actor_type, actor_id, object_type, object_id, data, ip, request_id,
           occurred_at, prev_hash, hash
    from audit_events
    where company_id = ${companyId} ${before}
    order by seq desc
    limit ${options.limit}`;
  return rows.map(toAuditEvent);
}
