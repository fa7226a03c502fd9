import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, beforeEach, describe, it } from 'node:test';
import canonicalize from 'canonicalize';
import { base64url, CompactSign, compactVerify, importJWK } from 'jose';
import { pino } from 'pino';
import { createHttpApp } from '../api/app.ts';
import { closeServer, listen } from '../api/server.ts';
import { getJwks } from '../api/well-known/get-jwks.ts';
import { APP_ROLE, createSql, type Sql } from '../db/client.ts';
import { waitFor } from '../test-support/wait.ts';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { createTransferSigner, type SigningPublicJwk } from './signing.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const KID = /^tsk_[A-Za-z0-9_-]{24}$/;
const CLI_TIMEOUT_MS = 120_000;

const transfer = {
  id: 'tr_0123456789abcdef0123456789abcdef',
  object: 'transfer',
  amount: '125.50',
  currency: 'USD',
  status: 'settled',
  source: { type: 'wallet', id: 'wal_1' },
  target: { type: 'account', id: 'acc_2' },
  metadata: { note: 'Grüße – 💸', tags: ['a', 'b'] },
  fee: null,
  created_at: '2025-01-02T03:04:05.000Z',
};

function headerOf(signature: string): Record<string, unknown> {
  return JSON.parse(new TextDecoder().decode(base64url.decode(signature.split('.')[0]!))) as Record<string, unknown>;
}

/** Verifies with jose alone, from the published JWKS: no code of the signer is involved. */
async function verifyIndependently(keys: SigningPublicJwk[], object: Record<string, unknown>, signature: string) {
  const [header, payload, value] = signature.split('.');
  assert.equal(payload, '');
  const kid = headerOf(signature).kid;
  const jwk = keys.find((key) => key.kid === kid);
  assert.ok(jwk, `kid ${String(kid)} is published`);
  const { signature: _ignored, ...unsigned } = object;
  const canonical = canonicalize(unsigned)!;
  const result = await compactVerify(
    `${header}.${base64url.encode(canonical)}.${value}`,
    await importJWK(jwk, 'EdDSA'),
    { algorithms: ['EdDSA'] },
  );
  assert.equal(new TextDecoder().decode(result.payload), canonical);
  return result.protectedHeader;
}

async function keyRows(sql: Sql) {
  return sql<{ kid: string; status: string; retired_at: Date | null }[]>`
    select kid, status, retired_at from signing_keys order by created_at, kid`;
}

async function activeKids(sql: Sql): Promise<string[]> {
  const rows = await sql<{ kid: string }[]>`select kid from signing_keys where status = 'active'`;
  return rows.map((row) => row.kid);
}

function pool(database: TestDatabase, role?: string): Sql {
  return createSql({
    url: database.url,
    poolMax: 3,
    connectTimeoutS: 10,
    idleTimeoutS: 5,
    statementTimeoutMs: 10_000,
    applicationName: 'payments-test-signing',
    ...(role ? { role } : {}),
  });
}

describe('transfer signer', { timeout: 120_000 }, () => {
  let database: TestDatabase;
  let sql: Sql;

  before(async () => {
    database = await createTestDatabase();
    sql = database.sql;
  });
  after(async () => database?.drop());
  beforeEach(async () => {
    await sql`delete from signing_keys`;
  });

  it('signs as a compact detached JWS with alg EdDSA and the active kid, and verifies', async () => {
    const signer = createTransferSigner({ sql });
    const signature = await signer.sign(transfer);
    assert.match(signature, /^[A-Za-z0-9_-]+\.\.[A-Za-z0-9_-]+$/);
    assert.equal(signature.split('.').length, 3);
    const header = headerOf(signature);
    assert.deepEqual(Object.keys(header).sort(), ['alg', 'kid']);
    assert.equal(header.alg, 'EdDSA');
    assert.match(String(header.kid), KID);
    assert.deepEqual(await activeKids(sql), [header.kid]);
    assert.equal(await signer.verify(transfer, signature), true);
    // Another instance (no shared cache) verifies it too.
    assert.equal(await createTransferSigner({ sql }).verify(transfer, signature), true);
  });

  it('signs exactly as jose would: the same bytes as CompactSign with the stored private key', async () => {
    const signer = createTransferSigner({ sql });
    const signature = await signer.sign(transfer);
    const [row] = await sql<{ kid: string; private_jwk: Record<string, string> }[]>`
      select kid, private_jwk from signing_keys where status = 'active'`;
    const jws = await new CompactSign(new TextEncoder().encode(canonicalize(transfer)))
      .setProtectedHeader({ alg: 'EdDSA', kid: row!.kid })
      .sign(await importJWK(row!.private_jwk, 'EdDSA'));
    const [header, , value] = jws.split('.');
    assert.equal(signature, `${header}..${value}`);
  });

  it('signs the canonical JSON: member order does not matter', async () => {
    const signer = createTransferSigner({ sql });
    const signature = await signer.sign(transfer);
    const reordered = Object.fromEntries(Object.entries(transfer).reverse()) as typeof transfer;
    reordered.source = { id: 'wal_1', type: 'wallet' };
    assert.notEqual(JSON.stringify(reordered), JSON.stringify(transfer));
    assert.equal(await signer.verify(reordered, signature), true);
    // Ed25519 is deterministic: the same canonical payload gives the same signature.
    assert.equal(await signer.sign(reordered), signature);
  });

  it('refuses any change to the object, and any altered or malformed signature', async () => {
    const signer = createTransferSigner({ sql });
    const signature = await signer.sign(transfer);
    const { fee: _fee, ...withoutFee } = transfer;
    const changed: Record<string, unknown>[] = [
      { ...transfer, amount: '125.51' },
      { ...transfer, amount: 125.5 },
      { ...transfer, status: 'failed' },
      { ...transfer, target: { type: 'account', id: 'acc_3' } },
      { ...transfer, metadata: { ...transfer.metadata, tags: ['b', 'a'] } },
      { ...transfer, extra: true },
      { ...transfer, fee: '0.00' },
      withoutFee,
    ];
    for (const object of changed) assert.equal(await signer.verify(object, signature), false, JSON.stringify(object));

    const [header, , value] = signature.split('.') as [string, string, string];
    const middle = Math.floor(value.length / 2);
    const flipped = `${value.slice(0, middle)}${value[middle] === 'A' ? 'B' : 'A'}${value.slice(middle + 1)}`;
    const foreignKid = base64url.encode(JSON.stringify({ alg: 'EdDSA', kid: 'tsk_AAAAAAAAAAAAAAAAAAAAAAAA' }));
    const otherAlg = base64url.encode(JSON.stringify({ alg: 'HS256', kid: headerOf(signature).kid }));
    const extraHeader = base64url.encode(JSON.stringify({ ...headerOf(signature), b64: false, crit: ['b64'] }));
    const attached = `${header}.${base64url.encode(canonicalize(transfer)!)}.${value}`;
    const malformed = [
      `${header}..${flipped}`,
      `${header}..${value.slice(0, -2)}`,
      `${foreignKid}..${value}`,
      `${otherAlg}..${value}`,
      `${extraHeader}..${value}`,
      attached,
      `${header}.${value}`,
      `..${value}`,
      `${header}..`,
      '',
      'not a jws',
      `${'A'.repeat(2000)}..${value}`,
      `${base64url.encode('not json')}..${value}`,
    ];
    for (const candidate of malformed) assert.equal(await signer.verify(transfer, candidate), false, candidate);
    assert.equal(await signer.verify(transfer, signature), true);
  });

  it('signs an object that already carries a signature without that member', async () => {
    const signer = createTransferSigner({ sql });
    const signature = await signer.sign(transfer);
    const carrying = { ...transfer, signature: 'stale..value' };
    assert.equal(await signer.sign(carrying), signature);
    const published = { ...transfer, signature };
    assert.equal(await signer.verify(published, signature), true);
    assert.equal(await signer.verify({ ...published, amount: '1.00' }, signature), false);
  });

  it('refuses to sign what is not a JSON object', async () => {
    const signer = createTransferSigner({ sql });
    await assert.rejects(signer.sign([1, 2]), TypeError);
    await assert.rejects(signer.sign({ amount: Number.NaN }), /NaN/);
    assert.equal(await signer.verify({ amount: Number.NaN }, await signer.sign(transfer)), false);
  });

  it('verifies with an independent implementation from the JWKS and the RFC 8785 bytes', async () => {
    const signer = createTransferSigner({ sql });
    const object = { b: 1, a: 'x', nested: { z: true, y: null, w: [3, 'é'] }, n: 1e21, f: 0.000001 };
    const signature = await signer.sign(object);
    const [header, , value] = signature.split('.') as [string, string, string];
    // Written out by hand from RFC 8785: sorted members, no whitespace, ECMAScript number form.
    const canonical = '{"a":"x","b":1,"f":0.000001,"n":1e+21,"nested":{"w":[3,"é"],"y":null,"z":true}}';
    const { keys } = await signer.jwks();
    assert.equal(keys.length, 1);
    const jwk = keys[0]!;
    assert.deepEqual(Object.keys(jwk).sort(), ['alg', 'crv', 'kid', 'kty', 'use', 'x']);
    assert.equal(jwk.kty, 'OKP');
    assert.equal(jwk.crv, 'Ed25519');
    assert.equal(jwk.alg, 'EdDSA');
    assert.equal(jwk.use, 'sig');
    const result = await compactVerify(
      `${header}.${base64url.encode(canonical)}.${value}`,
      await importJWK(jwk, 'EdDSA'),
      { algorithms: ['EdDSA'] },
    );
    assert.equal(result.protectedHeader.kid, jwk.kid);
    await verifyIndependently(keys, { ...object, signature }, signature);
  });

  it('rotates: old signatures keep verifying, new ones use the new kid, the JWKS lists every key', async () => {
    const signer = createTransferSigner({ sql });
    const before = await signer.sign(transfer);
    const first = headerOf(before).kid as string;

    const rotated = await signer.rotate();
    assert.match(rotated.kid, KID);
    assert.equal(rotated.retired, first);
    const after = await signer.sign(transfer);
    assert.equal(headerOf(after).kid, rotated.kid);
    assert.notEqual(after, before);
    assert.equal(await signer.verify(transfer, before), true);
    assert.equal(await signer.verify(transfer, after), true);
    const { keys } = await signer.jwks();
    assert.deepEqual(
      keys.map((key) => key.kid),
      [rotated.kid, first],
    );
    await verifyIndependently(keys, transfer, before);
    await verifyIndependently(keys, transfer, after);

    const again = await signer.rotate();
    assert.equal(again.retired, rotated.kid);
    assert.deepEqual(
      (await signer.jwks()).keys.map((key) => key.kid),
      [again.kid, rotated.kid, first],
    );
    assert.equal(headerOf(await signer.sign(transfer)).kid, again.kid);
    for (const signature of [before, after]) assert.equal(await signer.verify(transfer, signature), true);

    const rows = await keyRows(sql);
    assert.deepEqual(
      rows.map((row) => [row.kid, row.status]),
      [
        [first, 'retired'],
        [rotated.kid, 'retired'],
        [again.kid, 'active'],
      ],
    );
    assert.ok(rows.slice(0, 2).every((row) => row.retired_at instanceof Date));
    assert.equal(rows[2]!.retired_at, null);
  });

  it('stores the JWKs as JSON objects, and the private key only in private_jwk', async () => {
    await createTransferSigner({ sql }).rotate();
    const [row] = await sql<
      { public_type: string; private_type: string; public_has_d: boolean; private_has_d: boolean }[]
    >`
      select jsonb_typeof(public_jwk) as public_type, jsonb_typeof(private_jwk) as private_type,
             public_jwk ? 'd' as public_has_d, private_jwk ? 'd' as private_has_d
        from signing_keys`;
    assert.deepEqual(row, { public_type: 'object', private_type: 'object', public_has_d: false, private_has_d: true });
  });

  it('other instances pick up a rotation within the cache TTL (refreshed in the background), and at once for an unknown kid', async () => {
    const cacheTtlMs = 300;
    const rotating = createTransferSigner({ sql });
    const other = createTransferSigner({ sql, cacheTtlMs });
    const stale = createTransferSigner({ sql, cacheTtlMs: 60_000 });
    const first = headerOf(await other.sign(transfer)).kid;
    assert.equal(headerOf(await stale.sign(transfer)).kid, first);

    const { kid } = await rotating.rotate();
    // Within the TTL the other instance still signs with the (now retired, still valid) key.
    const cached = await other.sign(transfer);
    assert.equal(headerOf(cached).kid, first);
    assert.equal(await rotating.verify(transfer, cached), true);
    // A signature by a key this cache has never seen: reloaded once, verified.
    const fresh = await rotating.sign(transfer);
    assert.equal(await stale.verify(transfer, fresh), true);
    assert.equal(headerOf(await stale.sign(transfer)).kid, kid, 'the reload also refreshed the active key');

    await new Promise((resolve) => setTimeout(resolve, cacheTtlMs + 50));
    // A stale cache still signs at once (no database wait inside a caller's transaction) and starts
    // a background refresh; the next signature uses the new key.
    await other.sign(transfer);
    await waitFor('the background refresh', async () => headerOf(await other.sign(transfer)).kid === kid, 5_000);
  });

  it('creates exactly one active key when signers start at once on an empty table', async () => {
    const pools = [pool(database), pool(database), pool(database, APP_ROLE)];
    try {
      for (let round = 0; round < 5; round += 1) {
        await sql`delete from signing_keys`;
        const signers = pools.flatMap((each) => [
          createTransferSigner({ sql: each }),
          createTransferSigner({ sql: each }),
        ]);
        const signatures = await Promise.all(signers.map((signer) => signer.sign(transfer)));
        const rows = await keyRows(sql);
        assert.equal(rows.length, 1, `round ${round}: one key, not ${rows.length}`);
        assert.equal(rows[0]!.status, 'active');
        for (const signature of signatures) assert.equal(headerOf(signature).kid, rows[0]!.kid);
        assert.equal(new Set(signatures).size, 1);
      }
    } finally {
      await Promise.all(pools.map((each) => each.end({ timeout: 5 })));
    }
  });

  it('serialises concurrent rotations: every key is kept, one stays active', async () => {
    const app = pool(database, APP_ROLE);
    const blocker = await sql.reserve();
    try {
      const signer = createTransferSigner({ sql });
      const original = await signer.sign(transfer);
      // Hold the table so the three rotations queue up and then run at the same moment.
      await blocker`begin`;
      await blocker`lock table signing_keys in share row exclusive mode`;
      const rotations = Promise.all([
        signer.rotate(),
        createTransferSigner({ sql: app }).rotate(),
        createTransferSigner({ sql }).rotate(),
      ]);
      const waitingFrom = Date.now();
      for (;;) {
        const [row] = await sql<{ waiting: number }[]>`
          select count(*)::int as waiting from pg_stat_activity
           where datname = current_database() and wait_event_type = 'Lock'`;
        if (row!.waiting >= 3) break;
        assert.ok(Date.now() - waitingFrom < 5_000, 'the rotations wait for the table');
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      await blocker`commit`;
      const results = await rotations;
      const rows = await keyRows(sql);
      assert.equal(rows.length, 4);
      const active = rows.filter((row) => row.status === 'active');
      assert.equal(active.length, 1);
      // Each rotation retired the key that was active when it ran: a chain from the first key.
      const retired = results.map((result) => result.retired).sort();
      const expected = [headerOf(original).kid as string, ...results.map((result) => result.kid)]
        .filter((kid) => kid !== active[0]!.kid)
        .sort();
      assert.deepEqual(retired, expected);
      assert.equal(await createTransferSigner({ sql: app }).verify(transfer, original), true);
    } finally {
      blocker.release();
      await app.end({ timeout: 5 });
    }
  });

  it('publishes at once a key another instance already signs with (the JWKS is never a stale cache)', async () => {
    // The API's signer, warm and caching for the default minute; the worker's (webhook payloads)
    // refreshes sooner; the CLI rotates in a process of its own.
    const api = createTransferSigner({ sql });
    const worker = createTransferSigner({ sql, cacheTtlMs: 0 });
    await api.warm();
    await worker.warm();
    const { kid } = await createTransferSigner({ sql }).rotate();
    await worker.sign(transfer); // a stale cache signs at once and refreshes in the background
    await waitFor(
      'the worker to sign with the new key',
      async () => headerOf(await worker.sign(transfer)).kid === kid,
      5_000,
    );
    const signature = await worker.sign(transfer);
    const { keys } = await api.jwks();
    assert.ok(
      keys.some((key) => key.kid === kid),
      `${kid} in ${JSON.stringify(keys.map((key) => key.kid))}`,
    );
    await verifyIndependently(keys, transfer, signature);
  });

  it('serves GET /.well-known/jwks.json: public keys only, cacheable', async () => {
    const signer = createTransferSigner({ sql });
    const signature = await signer.sign(transfer);
    await signer.rotate();
    const logger = pino({ level: 'silent' });
    const app = createHttpApp({ logger, limits: { bodyLimitBytes: 1024 } }, [getJwks({ signer })]);
    const { server, url } = await listen(app.koa, {
      host: '127.0.0.1',
      port: 0,
      requestTimeoutMs: 5_000,
      headersTimeoutMs: 5_000,
      keepAliveTimeoutMs: 1_000,
    });
    try {
      const response = await fetch(`${url}/.well-known/jwks.json`);
      assert.equal(response.status, 200);
      assert.equal(response.headers.get('cache-control'), 'public, max-age=300');
      assert.match(response.headers.get('content-type') ?? '', /^application\/json/);
      const text = await response.text();
      const body = JSON.parse(text) as { keys: SigningPublicJwk[] };
      assert.deepEqual(body, await signer.jwks());
      assert.equal(body.keys.length, 2);
      assert.doesNotMatch(text, /"d"\s*:/);
      const members = (value: unknown): string[] =>
        value && typeof value === 'object'
          ? Object.entries(value).flatMap(([key, inner]) => [key, ...members(inner)])
          : [];
      assert.ok(!members(body).includes('d'));
      await verifyIndependently(body.keys, transfer, signature);
    } finally {
      await closeServer(server);
    }
  });

  it('npm run cli -- keys rotate --json prints the new active kid and the retired one', async () => {
    const dataDir = await mkdtemp(join(tmpdir(), 'payments-signing-cli-'));
    const env: NodeJS.ProcessEnv = { ...process.env, DATABASE_URL: database.url, DATA_DIR: dataDir, LOG_LEVEL: 'warn' };
    for (const name of ['PORT', 'PUBLIC_BASE_URL', 'TEMPORAL_ADDRESS', 'TEMPORAL_UI_PORT', 'EMBEDDED_POSTGRES_PORT']) {
      delete env[name];
    }
    const cli = async (args: string[]) => {
      const child = spawn(
        process.execPath,
        ['--import', import.meta.resolve('tsx'), join(root, 'bin/cli.ts'), ...args],
        {
          cwd: root,
          env,
          stdio: ['ignore', 'pipe', 'pipe'],
          timeout: CLI_TIMEOUT_MS,
        },
      );
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
      child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
      const code = await new Promise<number | null>((resolve, reject) => {
        child.once('error', reject);
        child.once('close', resolve);
      });
      assert.equal(code, 0, `exit ${code}\nstdout:\n${stdout}\nstderr:\n${stderr}`);
      return stdout;
    };
    try {
      const signer = createTransferSigner({ sql });
      const signature = await signer.sign(transfer);
      const original = headerOf(signature).kid as string;

      const printed = JSON.parse(await cli(['keys', 'rotate', '--json'])) as { kid: string; retired: string | null };
      assert.deepEqual(Object.keys(printed).sort(), ['kid', 'retired']);
      assert.match(printed.kid, KID);
      assert.equal(printed.retired, original);
      assert.deepEqual(await activeKids(sql), [printed.kid]);

      const second = JSON.parse(await cli(['keys', 'rotate', '--json'])) as { kid: string; retired: string | null };
      assert.equal(second.retired, printed.kid);
      const rows = await keyRows(sql);
      assert.deepEqual(
        rows.map((row) => [row.kid, row.status]),
        [
          [original, 'retired'],
          [printed.kid, 'retired'],
          [second.kid, 'active'],
        ],
      );
      // This process learns of the new key on its own: an unknown kid reloads.
      const fresh = createTransferSigner({ sql });
      assert.equal(await signer.verify(transfer, await fresh.sign(transfer)), true);
      assert.equal(await fresh.verify(transfer, signature), true);

      const human = await cli(['keys', 'rotate']);
      assert.match(human, /active key\s+tsk_/);
      assert.match(human, new RegExp(`retired key\\s+${second.kid}`));
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});
