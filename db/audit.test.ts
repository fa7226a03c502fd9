import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import canonicalize from 'canonicalize';
import postgres from 'postgres';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { AUDIT_EVENTS, type AuditEventName } from '../workflows/shared/audit-events.ts';
import { AUDIT_DATA_BYTES_MAX, appendAuditEvent, listAuditEvents, verifyAuditChain, type AppendAuditEventInput } from './audit.ts';
import type { Sql, TransactionSql } from './client.ts';

async function createCompany(sql: Sql): Promise<string> {
  const id = `co_${randomBytes(16).toString('hex')}`;
  await sql`insert into companies (id, name) values (${id}, ${`Company ${id.slice(-6)}`})`;
  return id;
}

/** Runs `fn` the way application code does: in a transaction scoped to one company. */
async function inCompany<T>(sql: Sql, companyId: string, fn: (tx: TransactionSql) => Promise<T>): Promise<T> {
  return sql.begin(async (tx) => {
    await tx`select set_config('app.company_id', ${companyId}, true)`;
    return fn(tx);
  }) as Promise<T>;
}

function event(companyId: string, index: number, overrides: Partial<AppendAuditEventInput> = {}): AppendAuditEventInput {
  return {
    companyId,
    event: 'operator.updated',
    actor: { type: 'operator', id: `op_${'a'.repeat(32)}` },
    object: { type: 'operator', id: `op_${'b'.repeat(32)}` },
    data: { index, role: { from: 'viewer', to: 'admin' } },
    ip: '203.0.113.7',
    requestId: `req-${index}`,
    ...overrides,
  };
}

async function appendMany(sql: Sql, companyId: string, count: number) {
  for (let index = 1; index <= count; index += 1) {
    await inCompany(sql, companyId, (tx) => appendAuditEvent(tx, event(companyId, index)));
  }
}

/** Edits audit rows as the superuser, with the append-only trigger switched off for this transaction. */
async function tamper(sql: Sql, edit: (tx: TransactionSql) => Promise<unknown>) {
  await sql.begin(async (tx) => {
    await tx`set local session_replication_role = replica`;
    await edit(tx);
  });
}

describe('audit trail', () => {
  let database: TestDatabase;
  before(async () => {
    database = await createTestDatabase({ poolMax: 8 });
  });
  after(async () => database.drop());

  it('numbers appended events 1..n and verifies the chain', async () => {
    const companyId = await createCompany(database.sql);
    assert.deepEqual(await verifyAuditChain(database.sql, companyId), { ok: true, events: 0, headHash: '0'.repeat(64) });

    const links = [];
    for (let index = 1; index <= 5; index += 1) {
      links.push(await inCompany(database.sql, companyId, (tx) => appendAuditEvent(tx, event(companyId, index))));
    }
    assert.deepEqual(links.map((link) => link.seq), [1n, 2n, 3n, 4n, 5n]);
    assert.ok(links.every((link) => /^[0-9a-f]{64}$/.test(link.hash)));
    assert.deepEqual(await verifyAuditChain(database.sql, companyId), { ok: true, events: 5, headHash: links[4]!.hash });
  });

  it('hashes the documented canonical form, and occurredAt round-trips exactly', async () => {
    const companyId = await createCompany(database.sql);
    const occurredAt = new Date('2024-02-29T12:34:56.789Z');
    const link = await inCompany(database.sql, companyId, (tx) =>
      appendAuditEvent(tx, { companyId, event: 'company.created', actor: { type: 'system' }, data: { b: 1, a: 'é' }, occurredAt }),
    );
    const canonical = canonicalize({
      v: 1, companyId, seq: 1, event: 'company.created', actorType: 'system', actorId: null, objectType: null,
      objectId: null, data: { a: 'é', b: 1 }, ip: null, requestId: null, occurredAt: '2024-02-29T12:34:56.789Z',
    })!;
    const expected = createHash('sha256').update(Buffer.alloc(32)).update(canonical, 'utf8').digest('hex');
    assert.equal(link.hash, expected);
    assert.deepEqual(await verifyAuditChain(database.sql, companyId), { ok: true, events: 1, headHash: expected });

    const [listed] = await inCompany(database.sql, companyId, (tx) => listAuditEvents(tx, companyId, { limit: 10 }));
    assert.equal(listed!.occurredAt.toISOString(), occurredAt.toISOString());
    assert.deepEqual(listed!.actor, { type: 'system', id: null });
    assert.equal(listed!.object, null);
    assert.equal(listed!.prevHash, '0'.repeat(64));
  });

  it('lists events newest first, a page at a time', async () => {
    const companyId = await createCompany(database.sql);
    await appendMany(database.sql, companyId, 5);
    const first = await inCompany(database.sql, companyId, (tx) => listAuditEvents(tx, companyId, { limit: 2 }));
    assert.deepEqual(first.map((row) => row.seq), [5n, 4n]);
    assert.deepEqual(first[0]!.data, { index: 5, role: { from: 'viewer', to: 'admin' } });
    assert.deepEqual(first[0]!.object, { type: 'operator', id: `op_${'b'.repeat(32)}` });
    assert.equal(first[0]!.prevHash, first[1]!.hash);
    const second = await inCompany(database.sql, companyId, (tx) =>
      listAuditEvents(tx, companyId, { limit: 2, before: first[1]!.seq }),
    );
    assert.deepEqual(second.map((row) => row.seq), [3n, 2n]);
  });

  it('verifies across page boundaries', async () => {
    const companyId = await createCompany(database.sql);
    await appendMany(database.sql, companyId, 7);
    for (const pageSize of [1, 2, 3, 7, 8]) {
      assert.equal((await verifyAuditChain(database.sql, companyId, { pageSize })).ok, true, `page size ${pageSize}`);
    }
    // A gap right after a page boundary (page size 3: rows 1-3, then 5-7) is still seen.
    await tamper(database.sql, (tx) => tx`delete from audit_events where company_id = ${companyId} and seq = 4`);
    assert.deepEqual(await verifyAuditChain(database.sql, companyId, { pageSize: 3 }), {
      ok: false, events: 3, brokenAtSeq: 4n, reason: 'sequence gap',
    });
  });

  it('detects an edited event', async () => {
    const companyId = await createCompany(database.sql);
    await appendMany(database.sql, companyId, 5);
    await tamper(database.sql, (tx) => tx`
      update audit_events set data = '{"index": 3, "role": {"from": "viewer", "to": "owner"}}'
      where company_id = ${companyId} and seq = 3`);
    assert.deepEqual(await verifyAuditChain(database.sql, companyId), {
      ok: false, events: 2, brokenAtSeq: 3n, reason: 'hash mismatch',
    });
  });

  it('detects a changed occurred_at, and the database refuses one finer than the hashed milliseconds', async () => {
    const companyId = await createCompany(database.sql);
    await appendMany(database.sql, companyId, 2);
    await assert.rejects(
      tamper(database.sql, (tx) => tx`
        update audit_events set occurred_at = occurred_at + interval '1 microsecond'
        where company_id = ${companyId} and seq = 2`),
      /audit_events_occurred_at_check/,
    );
    await tamper(database.sql, (tx) => tx`
      update audit_events set occurred_at = occurred_at + interval '1 millisecond'
      where company_id = ${companyId} and seq = 2`);
    assert.deepEqual(await verifyAuditChain(database.sql, companyId), {
      ok: false, events: 1, brokenAtSeq: 2n, reason: 'hash mismatch',
    });
  });

  it('detects a rewritten prev_hash', async () => {
    const companyId = await createCompany(database.sql);
    await appendMany(database.sql, companyId, 3);
    await tamper(database.sql, (tx) => tx`
      update audit_events set prev_hash = ${Buffer.alloc(32, 1)} where company_id = ${companyId} and seq = 2`);
    assert.deepEqual(await verifyAuditChain(database.sql, companyId), {
      ok: false, events: 1, brokenAtSeq: 2n, reason: 'prev_hash mismatch',
    });
  });

  it('detects a deleted middle event', async () => {
    const companyId = await createCompany(database.sql);
    await appendMany(database.sql, companyId, 5);
    await tamper(database.sql, (tx) => tx`delete from audit_events where company_id = ${companyId} and seq = 3`);
    assert.deepEqual(await verifyAuditChain(database.sql, companyId), {
      ok: false, events: 2, brokenAtSeq: 3n, reason: 'sequence gap',
    });
  });

  it('detects a deleted last event and a rewritten head', async () => {
    const companyId = await createCompany(database.sql);
    await appendMany(database.sql, companyId, 4);
    await tamper(database.sql, (tx) => tx`delete from audit_events where company_id = ${companyId} and seq = 4`);
    assert.deepEqual(await verifyAuditChain(database.sql, companyId), {
      ok: false, events: 3, brokenAtSeq: 4n, reason: 'head mismatch',
    });

    const other = await createCompany(database.sql);
    await appendMany(database.sql, other, 2);
    await database.sql`update audit_chain_heads set hash = ${Buffer.alloc(32, 7)} where company_id = ${other}`;
    assert.deepEqual(await verifyAuditChain(database.sql, other), {
      ok: false, events: 2, brokenAtSeq: 2n, reason: 'head mismatch',
    });
  });

  it('refuses UPDATE, DELETE and TRUNCATE on audit_events, even for the owner', async () => {
    const companyId = await createCompany(database.sql);
    await appendMany(database.sql, companyId, 1);
    await assert.rejects(database.sql`update audit_events set ip = '198.51.100.1' where company_id = ${companyId}`, /append-only/);
    await assert.rejects(database.sql`delete from audit_events where company_id = ${companyId}`, /append-only/);
    await assert.rejects(database.sql`truncate audit_events`, /append-only/);
    assert.deepEqual(await verifyAuditChain(database.sql, companyId), { ok: true, events: 1, headHash: await headHash(database.sql, companyId) });
  });

  it('serialises 20 concurrent appends into one contiguous chain, independent per company', async () => {
    const [first, second] = [await createCompany(database.sql), await createCompany(database.sql)];
    // Each append is its own transaction; the pool has 8 connections, so they really contend.
    const append = (companyId: string, index: number) =>
      inCompany(database.sql, companyId, (tx) => appendAuditEvent(tx, event(companyId, index)));
    const [firstLinks, secondLinks] = await Promise.all([
      Promise.all(Array.from({ length: 20 }, (_, index) => append(first, index))),
      Promise.all(Array.from({ length: 10 }, (_, index) => append(second, index))),
    ]);
    const sortedSeqs = (links: { seq: bigint }[]) => links.map((link) => link.seq).sort((a, b) => (a < b ? -1 : 1));
    assert.deepEqual(sortedSeqs(firstLinks), Array.from({ length: 20 }, (_, index) => BigInt(index + 1)));
    assert.deepEqual(sortedSeqs(secondLinks), Array.from({ length: 10 }, (_, index) => BigInt(index + 1)));
    assert.deepEqual(await verifyAuditChain(database.sql, first), { ok: true, events: 20, headHash: await headHash(database.sql, first) });
    assert.deepEqual(await verifyAuditChain(database.sql, second), { ok: true, events: 10, headHash: await headHash(database.sql, second) });
  });

  it('keeps event names to the closed list, which matches the code exactly', async () => {
    const rows = await database.sql<{ name: string }[]>`select name from audit_event_types`;
    assert.deepEqual(rows.map((row) => row.name).sort(), [...AUDIT_EVENTS].sort());
    assert.equal(new Set(AUDIT_EVENTS).size, AUDIT_EVENTS.length);

    const companyId = await createCompany(database.sql);
    await assert.rejects(
      database.sql`
        insert into audit_events (company_id, seq, event, actor_type, occurred_at, prev_hash, hash)
        values (${companyId}, 1, 'payment.teleported', 'system', date_trunc('milliseconds', now()), ${Buffer.alloc(32)}, ${Buffer.alloc(32)})`,
      /audit_events_event_fkey/,
    );
    await assert.rejects(
      inCompany(database.sql, companyId, (tx) =>
        appendAuditEvent(tx, event(companyId, 1, { event: 'payment.teleported' as AuditEventName })),
      ),
      /Invalid option/,
    );
  });

  it('refuses malformed input before it reaches the chain', async () => {
    const companyId = await createCompany(database.sql);
    const attempt = (input: AppendAuditEventInput) => inCompany(database.sql, companyId, (tx) => appendAuditEvent(tx, input));
    await assert.rejects(attempt(event(companyId, 1, { actor: { type: 'operator' } })), /needs its id/);
    await assert.rejects(attempt(event(companyId, 1, { data: { blob: 'x'.repeat(AUDIT_DATA_BYTES_MAX) } })), /exceeds/);
    await assert.rejects(attempt(event(companyId, 1, { occurredAt: new Date(Number.NaN) })), /Invalid/);
    await assert.rejects(attempt(event('co_not-a-company', 1)), /Invalid string/);
    assert.deepEqual(await verifyAuditChain(database.sql, companyId), { ok: true, events: 0, headHash: '0'.repeat(64) });
  });

  it('isolates companies under the application role', async () => {
    const [ownCompany, otherCompany] = [await createCompany(database.sql), await createCompany(database.sql)];
    await appendMany(database.sql, otherCompany, 2);
    const app = postgres(database.url, {
      max: 2,
      onnotice: () => undefined,
      connection: { role: 'payments_app' },
      types: { bigint: postgres.BigInt },
    });
    try {
      const [whoami] = await app<{ role: string }[]>`select current_user as role`;
      assert.equal(whoami!.role, 'payments_app');

      const link = await inCompany(app, ownCompany, (tx) => appendAuditEvent(tx, event(ownCompany, 1)));
      assert.equal(link.seq, 1n);
      const visible = await inCompany(app, ownCompany, (tx) => tx<{ company_id: string }[]>`select company_id from audit_events`);
      assert.deepEqual(visible.map((row) => row.company_id), [ownCompany]);
      assert.deepEqual(await inCompany(app, ownCompany, (tx) => listAuditEvents(tx, otherCompany, { limit: 10 })), []);
      const heads = await inCompany(app, ownCompany, (tx) => tx`select company_id from audit_chain_heads where company_id = ${otherCompany}`);
      assert.equal(heads.length, 0);

      await assert.rejects(
        inCompany(app, ownCompany, (tx) => appendAuditEvent(tx, event(otherCompany, 3))),
        /row-level security/,
      );
      await assert.rejects(
        inCompany(app, ownCompany, (tx) => tx`
          insert into audit_events (company_id, seq, event, actor_type, occurred_at, prev_hash, hash)
          values (${otherCompany}, 3, 'auth.logout', 'system', now(), ${Buffer.alloc(32)}, ${Buffer.alloc(32)})`),
        /row-level security/,
      );
      // Without a company for the transaction nothing is visible and nothing can be appended.
      await assert.rejects(app.begin((tx) => appendAuditEvent(tx, event(ownCompany, 2))), /row-level security/);

      // The verifier scopes its own transaction, so it works on an application connection.
      assert.deepEqual(await verifyAuditChain(app, ownCompany), { ok: true, events: 1, headHash: link.hash });
      assert.equal((await verifyAuditChain(database.sql, otherCompany)).ok, true);
    } finally {
      await app.end({ timeout: 5 });
    }
  });
});

async function headHash(sql: Sql, companyId: string): Promise<string> {
  const [head] = await sql<{ hash: Buffer }[]>`select hash from audit_chain_heads where company_id = ${companyId}`;
  return head!.hash.toString('hex');
}
