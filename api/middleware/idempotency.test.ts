import assert from 'node:assert/strict';
import { request as httpRequest } from 'node:http';
import { randomBytes } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import type { Context } from 'koa';
import { pino } from 'pino';
import { z } from 'zod';
import { createHttpApp } from '../app.ts';
import { problems } from '../problem.ts';
import { defineRoute } from '../route.ts';
import { closeServer, listen } from '../server.ts';
import type { Sql } from '../../db/client.ts';
import { completeIdempotencyKey, findIdempotencyKey, type IdempotencyRecord } from '../../db/idempotency.ts';
import { insertOutboxEntry } from '../../db/outbox.ts';
import { withSystemScope, withTenant } from '../../db/tenant.ts';
import { createAppRoleSql, createTestDatabase, type TestDatabase } from '../../test-support/db.ts';
import { DomainError } from '../../workflows/shared/errors.ts';
import {
  createIdempotency,
  requestFingerprint,
  type ClaimInTransaction,
  type Idempotency,
  type IdempotencyScope,
} from './idempotency.ts';
import type { ReplayCacheOptions } from './replay-cache.ts';

const DAY_MS = 24 * 60 * 60 * 1000;
const COMPANY_A = `co_${randomBytes(16).toString('hex')}`;
const COMPANY_B = `co_${randomBytes(16).toString('hex')}`;
const serverLimits = {
  host: '127.0.0.1',
  port: 0,
  requestTimeoutMs: 10_000,
  headersTimeoutMs: 10_000,
  keepAliveTimeoutMs: 1_000,
};

const ZProbeBody = z.strictObject({
  mode: z.enum([
    'ok',
    'slow',
    'crash-once',
    'domain-error',
    'not-found',
    'hot-path',
    'hot-path-crash-once',
    'lease-lost-once',
    'lease-taken-over',
    'replay-body',
  ]),
  note: z.string().max(100).optional(),
});
type TProbeBody = z.infer<typeof ZProbeBody>;

/** Executions per idempotency key (or per request without one), across every app instance. */
const executions = new Map<string, number>();
const attempts = new Map<string, number>();
let probeNumber = 0;

function countExecution(key: string): number {
  executions.set(key, (executions.get(key) ?? 0) + 1);
  probeNumber += 1;
  return probeNumber;
}

/**
 * The probe operation: writes an outbox row for its company (through the app pool, under row-level
 * security) and answers 201 with a Location, or fails the way `mode` says.
 */
async function probe(
  appSql: Sql,
  ctx: Context,
  scope: IdempotencyScope,
  body: TProbeBody,
  ownerSql: Sql,
): Promise<void> {
  const { mode } = body;
  const key = ctx.get('Idempotency-Key') || `keyless-${randomBytes(4).toString('hex')}`;
  const attempt = (attempts.get(key) ?? 0) + 1;
  attempts.set(key, attempt);
  if (mode === 'crash-once' && attempt === 1) throw new Error('connection reset by peer');
  if (mode === 'domain-error')
    throw new DomainError('unprocessable', 'INSUFFICIENT_FUNDS', 'The source account lacks funds.');
  if (mode === 'not-found') throw problems.notFound('No account acc_123.');
  const number = countExecution(key);
  const id = `probe_${number}`;
  const entry = {
    companyId: scope.companyId,
    workflowType: 'probe',
    workflowId: `probe-${process.pid}-${number}`,
    taskQueue: 'payments-core',
    payload: { key },
  };
  if (mode === 'hot-path' || mode === 'hot-path-crash-once' || mode === 'lease-lost-once') {
    if (mode === 'lease-lost-once' && attempt === 1) await loseLease(ownerSql, key, 'released');
    await withTenant(appSql, scope.companyId, async (tx) => {
      await insertOutboxEntry(tx, entry);
      await ctx.state.idempotency!.recordResponse(tx, {
        status: 201,
        body: { id, recorded: true },
        location: `/v1/probes/${id}`,
      });
      if (mode === 'hot-path-crash-once' && attempt === 1)
        throw new Error('ledger constraint violated after recording');
    });
    ctx.status = 200;
    ctx.body = { ignored: 'run sends the recorded response' };
    return;
  }
  await withTenant(appSql, scope.companyId, (tx) => insertOutboxEntry(tx, entry));
  if (mode === 'slow') await delay(300);
  ctx.status = 201;
  ctx.set('Location', `/v1/probes/${id}`);
  ctx.body = { id, object: 'probe', amount: '10.00', note: body.note ?? null, text: 'ünïcode ✓' };
  if (mode === 'replay-body') {
    ctx.body = { id, secret: `secret-${key}` };
    ctx.state.idempotentReplayBody = { id, secret: null };
  }
}

/**
 * Another request takes this one's key over (its lease "expired"): 'released' → that request then
 * failed and released the key (the row is gone); 'running' → it still holds the key, under its own lease.
 */
async function loseLease(ownerSql: Sql, key: string, how: 'released' | 'running'): Promise<void> {
  await withSystemScope(ownerSql, (tx) =>
    how === 'released'
      ? tx`delete from idempotency_keys where key = ${key}`
      : tx`update idempotency_keys set locked_until = date_trunc('milliseconds', now() + interval '1 minute')
           where key = ${key}`,
  );
}

/**
 * The probe under claimInTransaction: the key is claimed by the first statement of the probe's own
 * transaction, and the response recorded in a second one, as the Shape A payout does.
 */
async function claimedProbe(
  appSql: Sql,
  ctx: Context,
  scope: IdempotencyScope,
  body: TProbeBody,
  claim: ClaimInTransaction,
  ownerSql: Sql,
): Promise<void> {
  const { mode } = body;
  const key = ctx.get('Idempotency-Key');
  let attempt = 0;
  const number = await withTenant(appSql, scope.companyId, async (tx) => {
    await claim(tx);
    // Counted once the claim holds: a request whose key exists stops at the claim.
    attempt = (attempts.get(key) ?? 0) + 1;
    attempts.set(key, attempt);
    if (mode === 'domain-error')
      throw new DomainError('unprocessable', 'INSUFFICIENT_FUNDS', 'The source account lacks funds.');
    if (mode === 'crash-once' && attempt === 1) throw new Error('connection reset by peer');
    const executed = countExecution(key);
    await insertOutboxEntry(tx, {
      companyId: scope.companyId,
      workflowType: 'probe',
      workflowId: `probe-${process.pid}-${executed}`,
      taskQueue: 'payments-core',
      payload: { key },
    });
    return executed;
  });
  if (mode === 'slow') await delay(300);
  // The write committed; meanwhile another request took the key over (and released it, or holds it).
  if (mode === 'lease-lost-once' && attempt === 1) await loseLease(ownerSql, key, 'released');
  if (mode === 'lease-taken-over') await loseLease(ownerSql, key, 'running');
  const id = `probe_${number}`;
  await withTenant(appSql, scope.companyId, (tx) =>
    ctx.state.idempotency!.recordResponse(tx, {
      status: 201,
      body: { id, claimed: true },
      location: `/v1/claimed-probes/${id}`,
    }),
  );
}

interface TestServer {
  url: string;
  appSql: Sql;
  idempotency: Idempotency;
  close(): Promise<void>;
}

/** The real middleware stack on a real listener; its own pool connects as payments_app (RLS). */
async function startServer(database: TestDatabase, replayCache?: ReplayCacheOptions): Promise<TestServer> {
  const ownerSql = database.sql;
  const appSql = createAppRoleSql(database.url, { applicationName: 'payments-test-idempotency', poolMax: 10 });
  const idempotency = createIdempotency({
    sql: appSql,
    options: { ttlMs: DAY_MS, leaseMs: 60_000, ...(replayCache ? { replayCache } : {}) },
  });
  // The company comes from a test header here; in the service it comes from authentication.
  const scopeOf = (companyHeader: string, environment: IdempotencyScope['environment']): IdempotencyScope => ({
    companyId: companyHeader === 'b' ? COMPANY_B : COMPANY_A,
    environment,
  });
  /** A POST route on `path` whose handler gets the scope its X-Test-Company header names. */
  const probeRoute = (
    path: string,
    operationId: string,
    environment: IdempotencyScope['environment'],
    handle: (ctx: Context, scope: IdempotencyScope, body: TProbeBody) => Promise<void>,
  ) =>
    defineRoute({
      method: 'POST',
      path,
      operationId,
      summary: 'probe',
      tags: ['test'],
      auth: { kind: 'public' },
      body: ZProbeBody,
      responses: { 201: 'created' },
      handler: (ctx, input) => handle(ctx, scopeOf(ctx.get('X-Test-Company'), environment), input.body),
    });
  const routes = [
    probeRoute('/v1/probes', 'createProbe', 'sandbox', (ctx, scope, body) =>
      idempotency.run(ctx, scope, { required: true }, () => probe(appSql, ctx, scope, body, ownerSql)),
    ),
    probeRoute('/v1/claimed-probes', 'createClaimedProbe', 'sandbox', (ctx, scope, body) =>
      idempotency.run(ctx, scope, { required: true, deferred: true }, () =>
        ctx.state.deferredIdempotency!.claimInTransaction((claim) =>
          claimedProbe(appSql, ctx, scope, body, claim, ownerSql),
        ),
      ),
    ),
    probeRoute('/admin/probes', 'createAdminProbe', 'admin', (ctx, scope, body) =>
      idempotency.run(ctx, scope, { required: false }, () => probe(appSql, ctx, scope, body, ownerSql)),
    ),
  ];
  const app = createHttpApp({ logger: pino({ level: 'silent' }), limits: { bodyLimitBytes: 16 * 1024 } }, routes);
  const { server, url } = await listen(app.koa, serverLimits);
  return {
    url,
    appSql,
    idempotency,
    async close() {
      await closeServer(server);
      await appSql.end({ timeout: 5 });
    },
  };
}

interface Reply {
  status: number;
  headers: Headers;
  bytes: Buffer;
  json: Record<string, unknown>;
}

async function send(
  url: string,
  path: string,
  options: { key?: string; body?: unknown; rawBody?: string; company?: 'a' | 'b' },
): Promise<Reply> {
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'x-test-company': options.company ?? 'a',
  };
  if (options.key !== undefined) headers['idempotency-key'] = options.key;
  const response = await fetch(url + path, {
    method: 'POST',
    headers,
    body: options.rawBody ?? JSON.stringify(options.body),
  });
  const bytes = Buffer.from(await response.arrayBuffer());
  return {
    status: response.status,
    headers: response.headers,
    bytes,
    json: bytes.length > 0 ? (JSON.parse(bytes.toString('utf8')) as Record<string, unknown>) : {},
  };
}

const newKey = (label: string) => `${label}-${randomBytes(8).toString('hex')}`;
const replayed = (reply: Reply) => reply.headers.get('idempotent-replayed') === 'true';

// Every answer is the same with the replay cache (api/main.ts's default) as without it (a retry
// that reaches another process): the whole suite runs both ways.
const CACHE = { ttlMs: 300_000, maxBytes: 1024 * 1024 } satisfies ReplayCacheOptions;
for (const replayCache of [undefined, CACHE]) {
  describe(`idempotency middleware (${replayCache ? 'with' : 'without'} the replay cache)`, () => {
    let database: TestDatabase;
    let server: TestServer;

    before(async () => {
      database = await createTestDatabase();
      await withSystemScope(database.sql, async (tx) => {
        await tx`insert into companies (id, name) values (${COMPANY_A}, 'Company A'), (${COMPANY_B}, 'Company B')`;
      });
      server = await startServer(database, replayCache);
    });
    after(async () => {
      await server.close();
      await database.drop();
    });

    const row = (companyId: string, key: string, environment: IdempotencyScope['environment'] = 'sandbox') =>
      withTenant(server.appSql, companyId, (tx) => findIdempotencyKey(tx, { companyId, environment, key }));
    const outboxRows = async (key: string) => {
      const [result] = await withSystemScope(
        database.sql,
        (tx) => tx<{ count: number }[]>`
      select count(*)::int as count from outbox where payload->>'key' = ${key}`,
      );
      return result!.count;
    };

    it('executes once under 20 concurrent requests with one key, then replays the response byte for byte', async () => {
      const key = newKey('concurrent');
      const body = { mode: 'slow', note: 'twenty at once' };
      const replies = await Promise.all(
        Array.from({ length: 20 }, () => send(server.url, '/v1/probes', { key, body })),
      );

      const originals = replies.filter((reply) => reply.status === 201 && !replayed(reply));
      assert.equal(originals.length, 1, `statuses: ${replies.map((reply) => reply.status).join(',')}`);
      const original = originals[0]!;
      assert.equal(original.headers.get('idempotent-replayed'), null);
      for (const reply of replies) {
        if (reply === original) continue;
        if (reply.status === 409) {
          assert.equal(reply.headers.get('retry-after'), '1');
          assert.equal(reply.json.code, 'IDEMPOTENCY_REQUEST_IN_PROGRESS');
          assert.match(reply.headers.get('content-type') ?? '', /^application\/problem\+json/);
        } else {
          assert.equal(reply.status, 201);
          assert.ok(replayed(reply));
          assert.ok(reply.bytes.equals(original.bytes));
        }
      }
      assert.equal(executions.get(key), 1);
      assert.equal(await outboxRows(key), 1);

      // The same request later, with its JSON keys reordered and spaced differently: the same request.
      const later = await send(server.url, '/v1/probes', {
        key,
        rawBody: '{ "note": "twenty at once",\n "mode": "slow" }',
      });
      assert.equal(later.status, 201);
      assert.ok(replayed(later));
      assert.ok(later.bytes.equals(original.bytes), 'the replayed body is byte for byte the first one');
      assert.equal(later.headers.get('content-type'), original.headers.get('content-type'));
      assert.equal(later.headers.get('location'), original.headers.get('location'));
      assert.equal(executions.get(key), 1);

      const stored = await row(COMPANY_A, key);
      assert.equal(stored?.status, 'completed');
      assert.ok(stored.status === 'completed' && stored.response.body.equals(original.bytes));
      assert.ok(stored.expiresAt.getTime() - stored.createdAt.getTime() >= DAY_MS);
      // Row-level security: the app pool sees the key only inside its own company's transaction.
      assert.equal((await server.appSql`select current_user as role`)[0]!.role, 'payments_app');
      assert.equal((await server.appSql`select count(*)::int as count from idempotency_keys`)[0]!.count, 0);
      assert.equal(await row(COMPANY_B, key), undefined);
    });

    it('answers 422 when the key is reused for a different body or path', async () => {
      const key = newKey('mismatch');
      assert.equal((await send(server.url, '/v1/probes', { key, body: { mode: 'ok', note: 'first' } })).status, 201);
      const otherBody = await send(server.url, '/v1/probes', { key, body: { mode: 'ok', note: 'second' } });
      assert.equal(otherBody.status, 422);
      assert.equal(otherBody.json.code, 'IDEMPOTENCY_KEY_REUSED');
      const otherQuery = await send(server.url, '/v1/probes?dry_run=true', {
        key,
        body: { mode: 'ok', note: 'first' },
      });
      assert.equal(otherQuery.status, 422);
      assert.equal(executions.get(key), 1);
    });

    it('replays from the database after a process restart', async () => {
      const key = newKey('restart');
      const body = { mode: 'ok', note: 'before the restart' };
      const first = await startServer(database, replayCache);
      const original = await send(first.url, '/v1/probes', { key, body });
      assert.equal(original.status, 201);
      await first.close();

      const second = await startServer(database, replayCache);
      try {
        const replay = await send(second.url, '/v1/probes', { key, body });
        assert.equal(replay.status, 201);
        assert.ok(replayed(replay));
        assert.ok(replay.bytes.equals(original.bytes));
        assert.equal(replay.headers.get('location'), original.headers.get('location'));
        assert.equal(executions.get(key), 1);
      } finally {
        await second.close();
      }
    });

    it('answers 409 while a lease is live and lets exactly one request take over an expired lease', async () => {
      const body = { mode: 'ok', note: 'the first process died' };
      const hash = requestFingerprint('POST', '/v1/probes', body);
      const insertRunning = (key: string, lockedUntil: string) =>
        withTenant(
          server.appSql,
          COMPANY_A,
          (tx) => tx`
        insert into idempotency_keys (company_id, environment, key, request_method, request_path, request_hash, status,
                                      locked_until, expires_at)
        values (${COMPANY_A}, 'sandbox', ${key}, 'POST', '/v1/probes', ${hash}, 'running',
                date_trunc('milliseconds', now() + ${lockedUntil}::interval), now() + interval '25 hours')`,
        );

      const liveKey = newKey('live-lease');
      await insertRunning(liveKey, '1 minute');
      const busy = await send(server.url, '/v1/probes', { key: liveKey, body });
      assert.equal(busy.status, 409);
      assert.equal(busy.headers.get('retry-after'), '1');
      assert.equal(executions.get(liveKey), undefined);

      const deadKey = newKey('expired-lease');
      await insertRunning(deadKey, '-1 second');
      const deadLease = ((await row(COMPANY_A, deadKey)) as Extract<IdempotencyRecord, { status: 'running' }>)
        .lockedUntil;
      const replies = await Promise.all(
        Array.from({ length: 10 }, () => send(server.url, '/v1/probes', { key: deadKey, body })),
      );
      const originals = replies.filter((reply) => reply.status === 201 && !replayed(reply));
      assert.equal(originals.length, 1, `statuses: ${replies.map((reply) => reply.status).join(',')}`);
      for (const reply of replies) assert.ok(reply === originals[0] || reply.status === 409 || replayed(reply));
      assert.equal(executions.get(deadKey), 1);
      assert.equal((await row(COMPANY_A, deadKey))?.status, 'completed');

      // The dead request's lease no longer completes the row (fencing).
      const stale = await withTenant(server.appSql, COMPANY_A, (tx) =>
        completeIdempotencyKey(tx, {
          companyId: COMPANY_A,
          environment: 'sandbox',
          key: deadKey,
          lease: deadLease,
          response: { status: 500, headers: {}, body: Buffer.alloc(0) },
        }),
      );
      assert.equal(stale, false);
    });

    it('claims the key in the handler’s own transaction (claimInTransaction) with the classic answers', async () => {
      const path = '/v1/claimed-probes';
      // Twenty at once: one execution, the others 409 or the replay.
      const key = newKey('claimed');
      const body = { mode: 'slow', note: 'claimed in the transaction' };
      const replies = await Promise.all(Array.from({ length: 20 }, () => send(server.url, path, { key, body })));
      const originals = replies.filter((reply) => reply.status === 201 && !replayed(reply));
      assert.equal(originals.length, 1, `statuses: ${replies.map((reply) => reply.status).join(',')}`);
      for (const reply of replies) {
        assert.ok(
          reply === originals[0] ||
            reply.status === 409 ||
            (replayed(reply) && reply.bytes.equals(originals[0]!.bytes)),
        );
      }
      assert.equal(executions.get(key), 1);
      assert.equal(await outboxRows(key), 1);
      assert.equal((await row(COMPANY_A, key))?.status, 'completed');
      const later = await send(server.url, path, { key, body });
      assert.ok(replayed(later) && later.bytes.equals(originals[0]!.bytes));
      assert.equal((await send(server.url, path, { key, body: { mode: 'ok' } })).status, 422);

      // A refusal inside the claiming transaction rolls the claim back; it is stored completed and replayed.
      const refusedKey = newKey('claimed-refusal');
      const refused = await send(server.url, path, { key: refusedKey, body: { mode: 'domain-error' } });
      assert.equal(refused.status, 422);
      assert.equal(refused.json.code, 'INSUFFICIENT_FUNDS');
      const refusedAgain = await send(server.url, path, { key: refusedKey, body: { mode: 'domain-error' } });
      assert.ok(replayed(refusedAgain) && refusedAgain.bytes.equals(refused.bytes));
      assert.equal(attempts.get(refusedKey), 1, 'the operation ran once');
      assert.equal((await row(COMPANY_A, refusedKey))?.status, 'completed');

      // An unexpected error inside it leaves no key: the retry executes.
      const crashKey = newKey('claimed-crash');
      const crashed = await send(server.url, path, { key: crashKey, body: { mode: 'crash-once' } });
      assert.equal(crashed.status, 500);
      assert.equal(await row(COMPANY_A, crashKey), undefined);
      const retried = await send(server.url, path, { key: crashKey, body: { mode: 'crash-once' } });
      assert.equal(retried.status, 201);
      assert.ok(!replayed(retried));
      assert.equal(executions.get(crashKey), 1);

      // A running row whose request died: the classic flow takes it over and runs without a claim.
      const deadKey = newKey('claimed-dead');
      const deadBody = { mode: 'ok' };
      const hash = requestFingerprint('POST', path, deadBody);
      await withTenant(
        server.appSql,
        COMPANY_A,
        (tx) => tx`
      insert into idempotency_keys (company_id, environment, key, request_method, request_path, request_hash, status,
                                    locked_until, expires_at)
      values (${COMPANY_A}, 'sandbox', ${deadKey}, 'POST', ${path}, ${hash}, 'running',
              date_trunc('milliseconds', now() - interval '1 second'), now() + interval '25 hours')`,
      );
      const takenOver = await send(server.url, path, { key: deadKey, body: deadBody });
      assert.equal(takenOver.status, 201);
      assert.ok(!replayed(takenOver));
      assert.equal(executions.get(deadKey), 1);
      assert.equal((await row(COMPANY_A, deadKey))?.status, 'completed');
    });

    it('releases the key after an unexpected error, so that a retry executes', async () => {
      const key = newKey('crash');
      const body = { mode: 'crash-once' };
      const failed = await send(server.url, '/v1/probes', { key, body });
      assert.equal(failed.status, 500);
      assert.equal(failed.json.code, 'INTERNAL_ERROR');
      assert.equal(await row(COMPANY_A, key), undefined);

      const retried = await send(server.url, '/v1/probes', { key, body });
      assert.equal(retried.status, 201);
      assert.ok(!replayed(retried));
      assert.equal(executions.get(key), 1);
      const replay = await send(server.url, '/v1/probes', { key, body });
      assert.ok(replayed(replay) && replay.bytes.equals(retried.bytes));
    });

    it('stores a decided 4xx problem (DomainError or HttpProblem) and replays it', async () => {
      for (const [mode, status, code] of [
        ['domain-error', 422, 'INSUFFICIENT_FUNDS'],
        ['not-found', 404, 'NOT_FOUND'],
      ] as const) {
        const key = newKey(mode);
        const first = await send(server.url, '/v1/probes', { key, body: { mode } });
        assert.equal(first.status, status);
        assert.equal(first.json.code, code);
        assert.match(first.headers.get('content-type') ?? '', /^application\/problem\+json/);
        const again = await send(server.url, '/v1/probes', { key, body: { mode } });
        assert.equal(again.status, status);
        assert.ok(replayed(again));
        assert.ok(again.bytes.equals(first.bytes));
        assert.equal(again.headers.get('content-type'), first.headers.get('content-type'));
        assert.equal(attempts.get(key), 1, 'the operation ran once');
      }
    });

    it('requires a well-formed key on /v1 and takes it as optional on /admin', async () => {
      const body = { mode: 'ok' };
      const missing = await send(server.url, '/v1/probes', { body });
      assert.equal(missing.status, 400);
      assert.equal(missing.json.code, 'IDEMPOTENCY_KEY_REQUIRED');
      for (const key of ['', 'x'.repeat(256), 'clé']) {
        const invalid = await send(server.url, '/v1/probes', { key, body });
        assert.equal(invalid.status, 400, JSON.stringify(key));
        assert.equal(invalid.json.code, 'IDEMPOTENCY_KEY_INVALID');
      }
      // The header twice: Node would join the two keys into one, "a, b".
      const twice = await new Promise<{ status: number; code: string }>((resolve, reject) => {
        const payload = JSON.stringify(body);
        const request = httpRequest(
          `${server.url}/v1/probes`,
          {
            method: 'POST',
            headers: {
              'content-type': 'application/json',
              'x-test-company': 'a',
              'idempotency-key': ['key-a', 'key-b'],
            },
          },
          (response) => {
            let text = '';
            response.on('data', (chunk: Buffer) => (text += chunk.toString('utf8')));
            response.on('end', () =>
              resolve({
                status: response.statusCode ?? 0,
                code: text ? (JSON.parse(text) as { code: string }).code : text,
              }),
            );
          },
        );
        request.on('error', reject);
        request.end(payload);
      });
      assert.deepEqual(twice, { status: 400, code: 'IDEMPOTENCY_KEY_INVALID' });
      const longest = `${'k'.repeat(230)}${randomBytes(12).toString('hex')}`;
      assert.equal((await send(server.url, '/v1/probes', { key: longest, body })).status, 201);

      const before = probeNumber;
      assert.equal((await send(server.url, '/admin/probes', { body })).status, 201);
      assert.equal((await send(server.url, '/admin/probes', { body })).status, 201);
      assert.equal(probeNumber, before + 2, 'without a key each admin write executes');
      const adminKey = newKey('admin');
      const adminFirst = await send(server.url, '/admin/probes', { key: adminKey, body });
      const adminAgain = await send(server.url, '/admin/probes', { key: adminKey, body });
      assert.ok(!replayed(adminFirst) && replayed(adminAgain));
      assert.equal(executions.get(adminKey), 1);
    });

    it('scopes keys to company and environment', async () => {
      const key = newKey('shared');
      const body = { mode: 'ok', note: 'same key everywhere' };
      const inA = await send(server.url, '/v1/probes', { key, body, company: 'a' });
      const inB = await send(server.url, '/v1/probes', { key, body, company: 'b' });
      const inAdmin = await send(server.url, '/admin/probes', { key, body, company: 'a' });
      for (const reply of [inA, inB, inAdmin]) assert.ok(reply.status === 201 && !replayed(reply));
      assert.equal(executions.get(key), 3);
      assert.notEqual(inA.json.id, inB.json.id);
      const againB = await send(server.url, '/v1/probes', { key, body, company: 'b' });
      assert.ok(replayed(againB) && againB.bytes.equals(inB.bytes));
      assert.equal((await row(COMPANY_B, key))?.status, 'completed');
      assert.equal((await row(COMPANY_A, key, 'admin'))?.status, 'completed');
    });

    it('lets a handler store the response in its own transaction (ctx.state.idempotency)', async () => {
      const key = newKey('hot-path');
      const first = await send(server.url, '/v1/probes', { key, body: { mode: 'hot-path' } });
      assert.equal(first.status, 201);
      assert.equal(first.json.recorded, true, 'run sends the recorded response, not ctx.body');
      assert.equal(first.headers.get('location'), `/v1/probes/${String(first.json.id)}`);
      const again = await send(server.url, '/v1/probes', { key, body: { mode: 'hot-path' } });
      assert.ok(replayed(again) && again.bytes.equals(first.bytes));
      assert.equal(executions.get(key), 1);

      // Recorded, then the handler's transaction failed: recording and business write roll back together.
      const crashKey = newKey('hot-path-crash');
      const failed = await send(server.url, '/v1/probes', { key: crashKey, body: { mode: 'hot-path-crash-once' } });
      assert.equal(failed.status, 500);
      assert.equal(await row(COMPANY_A, crashKey), undefined);
      assert.equal(await outboxRows(crashKey), 0);
      const retried = await send(server.url, '/v1/probes', { key: crashKey, body: { mode: 'hot-path-crash-once' } });
      assert.equal(retried.status, 201);
      assert.ok(!replayed(retried));
      assert.equal(await outboxRows(crashKey), 1);
      assert.equal((await row(COMPANY_A, crashKey))?.status, 'completed');
    });

    it('never stores its own 409 as the answer when claimInTransaction loses its lease after the write', async () => {
      const path = '/v1/claimed-probes';
      // Review reproduction: the write committed, then the key was taken over by a retry that failed
      // and released it. Recording finds no row under this lease: the caller gets 409 and nothing is stored.
      const key = newKey('claimed-lease-lost');
      const body = { mode: 'lease-lost-once' };
      const lost = await send(server.url, path, { key, body });
      assert.equal(lost.status, 409);
      assert.equal(lost.json.code, 'IDEMPOTENCY_REQUEST_IN_PROGRESS');
      assert.equal(lost.headers.get('retry-after'), '1');
      assert.ok(!replayed(lost));
      assert.equal(executions.get(key), 1, 'the write committed');
      assert.equal(await row(COMPANY_A, key), undefined, 'no 409 stored as the key’s answer');
      // The retry executes (a real handler finds its committed write by the key) and its answer is kept.
      const retried = await send(server.url, path, { key, body });
      assert.equal(retried.status, 201);
      assert.ok(!replayed(retried));
      assert.equal((await row(COMPANY_A, key))?.status, 'completed');
      const replay = await send(server.url, path, { key, body });
      assert.ok(replayed(replay) && replay.bytes.equals(retried.bytes));

      // Taken over by a request that still runs: its running row is left alone, and a retry waits for it.
      const heldKey = newKey('claimed-taken-over');
      const held = await send(server.url, path, { key: heldKey, body: { mode: 'lease-taken-over' } });
      assert.equal(held.status, 409);
      assert.equal(held.json.code, 'IDEMPOTENCY_REQUEST_IN_PROGRESS');
      assert.ok(!replayed(held));
      assert.equal((await row(COMPANY_A, heldKey))?.status, 'running');
      const busy = await send(server.url, path, { key: heldKey, body: { mode: 'lease-taken-over' } });
      assert.equal(busy.status, 409);
      assert.ok(!replayed(busy));
      assert.equal(executions.get(heldKey), 1);
    });

    it('answers 409 and stores nothing when recordResponse (classic flow) finds its lease lost', async () => {
      const key = newKey('hot-path-lease-lost');
      const body = { mode: 'lease-lost-once' };
      const lost = await send(server.url, '/v1/probes', { key, body });
      assert.equal(lost.status, 409);
      assert.equal(lost.json.code, 'IDEMPOTENCY_REQUEST_IN_PROGRESS');
      assert.ok(!replayed(lost));
      assert.equal(await row(COMPANY_A, key), undefined);
      assert.equal(await outboxRows(key), 0, 'the lost lease aborted the handler’s transaction');
      const retried = await send(server.url, '/v1/probes', { key, body });
      assert.equal(retried.status, 201);
      assert.ok(!replayed(retried));
      assert.equal(await outboxRows(key), 1);
      assert.equal((await row(COMPANY_A, key))?.status, 'completed');
    });

    it('stores and replays ctx.state.idempotentReplayBody instead of the body first sent', async () => {
      const key = newKey('replay-body');
      const body = { mode: 'replay-body' };
      const first = await send(server.url, '/v1/probes', { key, body });
      assert.equal(first.status, 201);
      assert.equal(first.json.secret, `secret-${key}`);
      assert.ok(!replayed(first));
      const stored = await row(COMPANY_A, key);
      assert.ok(stored?.status === 'completed');
      assert.equal(stored.response.body.includes(`secret-${key}`), false, 'the secret is not stored');
      const replay = await send(server.url, '/v1/probes', { key, body });
      assert.equal(replay.status, 201);
      assert.ok(replayed(replay));
      assert.deepEqual(replay.json, { id: first.json.id, secret: null });
      assert.equal(replay.headers.get('content-type'), first.headers.get('content-type'));
      assert.equal(replay.headers.get('location'), first.headers.get('location'));
      assert.equal(executions.get(key), 1);
    });

    // What only the cache does: answers without the row, and forgets on demand.
    if (replayCache) {
      /** Deletes the key's row: what answers afterwards can only come from the cache. */
      const dropRow = (key: string) =>
        withSystemScope(database.sql, (tx) => tx`delete from idempotency_keys where key = ${key}`);

      it('answers a retry from memory: the stored bytes, or 422 for another request, without the row', async () => {
        const key = newKey('cached');
        const body = { mode: 'ok', note: 'cached' };
        const original = await send(server.url, '/v1/probes', { key, body });
        assert.equal(original.status, 201);
        await dropRow(key);

        const replay = await send(server.url, '/v1/probes', { key, rawBody: '{"note":"cached","mode":"ok"}' });
        assert.equal(replay.status, 201);
        assert.ok(replayed(replay));
        assert.ok(replay.bytes.equals(original.bytes));
        assert.equal(replay.headers.get('location'), original.headers.get('location'));
        const other = await send(server.url, '/v1/probes', { key, body: { mode: 'ok', note: 'another' } });
        assert.equal(other.status, 422);
        assert.equal(other.json.code, 'IDEMPOTENCY_KEY_REUSED');
        assert.equal(executions.get(key), 1);

        // Per company: company B's request under the same key is its own, executed once and cached for B.
        const b = await send(server.url, '/v1/probes', { key, body, company: 'b' });
        assert.equal(b.status, 201);
        assert.ok(!replayed(b));
        assert.equal(executions.get(key), 2);
        assert.ok(replayed(await send(server.url, '/v1/probes', { key, body, company: 'b' })));
        assert.equal(executions.get(key), 2);

        // Forgotten (as once the key's retention has ended): the request is new again.
        server.idempotency.clearReplayCache();
        const again = await send(server.url, '/v1/probes', { key, body });
        assert.equal(again.status, 201);
        assert.ok(!replayed(again));
        assert.equal(executions.get(key), 3);
      });

      it('keeps a decided refusal, and never the 409 of a lost lease', async () => {
        const refusedKey = newKey('cached-refusal');
        const refusal = await send(server.url, '/v1/probes', { key: refusedKey, body: { mode: 'domain-error' } });
        assert.equal(refusal.status, 422);
        await dropRow(refusedKey);
        const again = await send(server.url, '/v1/probes', { key: refusedKey, body: { mode: 'domain-error' } });
        assert.equal(again.status, 422);
        assert.ok(replayed(again));
        assert.ok(again.bytes.equals(refusal.bytes));

        // A lease lost before the response was recorded: answered 409, never cached; the retry executes.
        const lostKey = newKey('cached-lease-lost');
        const lost = await send(server.url, '/v1/probes', { key: lostKey, body: { mode: 'lease-lost-once' } });
        assert.equal(lost.status, 409);
        const afterLost = await send(server.url, '/v1/probes', { key: lostKey, body: { mode: 'lease-lost-once' } });
        assert.equal(afterLost.status, 201);
        assert.ok(!replayed(afterLost));
      });
    }
  });
}
