import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { verifyAuditChain } from '../../db/audit.ts';
import { API_KEYS_MAX_PER_ENVIRONMENT, authenticateApiKey } from '../../services/api-keys.ts';
import { SYSTEM_ACTOR } from '../../services/audit-context.ts';
import { verifyCompany } from '../../services/companies.ts';
import { DomainError } from '../../workflows/shared/errors.ts';
import { call, provisionTestTenant, startTestApp, type TestApp, type TestTenant } from '../../test-support/app.ts';

async function rejectsWith(promise: Promise<unknown>, code: string) {
  await assert.rejects(promise, (error: unknown) => error instanceof DomainError && error.code === code);
}

describe('payment API keys', () => {
  let testApp: TestApp;
  let tenant: TestTenant;
  before(async () => {
    testApp = await startTestApp();
    tenant = await provisionTestTenant(testApp);
  });
  after(async () => testApp.close());

  it('creates a sandbox key whose secret is shown once and authenticates /v1 as company + environment', async () => {
    const created = await call(testApp, 'POST', '/admin/payments/api-keys', {
      token: tenant.token,
      body: { name: 'Checkout', environment: 'sandbox' },
    });
    assert.equal(created.status, 201);
    assert.match(created.body.secret, /^sk_sandbox_[0-9A-Za-z]{44}$/);
    assert.equal(created.body.status, 'active');
    assert.equal(created.body.last4, created.body.secret.slice(-4));
    assert.ok(created.body.secret.startsWith(created.body.prefix));

    const principal = await authenticateApiKey(testApp.appSql, created.body.secret);
    assert.deepEqual(principal, { keyId: created.body._id, companyId: tenant.company.id, environment: 'sandbox' });

    const listed = await call(testApp, 'GET', '/admin/payments/api-keys', { token: tenant.token });
    assert.equal(listed.status, 200);
    assert.equal(JSON.stringify(listed.body).includes(created.body.secret), false, 'a list never shows a secret');
    assert.ok(listed.body.data.some((key: { _id: string }) => key._id === created.body._id));
    assert.equal(listed.body.has_more, false);
    assert.equal(listed.body.next_cursor, null);

    const stored = await testApp.ownerSql<
      { secret_hash: Buffer }[]
    >`select secret_hash from api_keys where id = ${created.body._id}`;
    assert.equal(stored[0]!.secret_hash.length, 32);
  });

  it('keeps no secret in the idempotency store: a replay answers 201 with the key and secret null', async () => {
    const idempotencyKey = `api-key-${Date.now()}-${Math.random().toString(16).slice(2)}`;
    const create = () =>
      call(testApp, 'POST', '/admin/payments/api-keys', {
        token: tenant.token,
        body: { name: 'Idempotent', environment: 'sandbox' },
        headers: { 'idempotency-key': idempotencyKey },
      });
    const created = await create();
    assert.equal(created.status, 201);
    assert.equal(created.headers.get('idempotent-replayed'), null);
    assert.equal(created.headers.get('cache-control'), 'no-store');
    const { secret } = created.body as { secret: string };
    assert.match(secret, /^sk_sandbox_[0-9A-Za-z]{44}$/);

    const replay = await create();
    assert.equal(replay.status, 201);
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.deepEqual(replay.body, { ...created.body, secret: null }, 'the same key, without its secret');
    assert.equal((await authenticateApiKey(testApp.appSql, secret)).keyId, created.body._id, 'one key was created');

    const rows = await testApp.ownerSql<{ status: string; response_body: Buffer | null }[]>`
      select status, response_body from idempotency_keys
      where company_id = ${tenant.company.id} and environment = 'admin' and key = ${idempotencyKey}`;
    assert.equal(rows.length, 1);
    assert.equal(rows[0]!.status, 'completed');
    const stored = rows[0]!.response_body!.toString('utf8');
    assert.equal(stored.includes(secret), false, 'the secret is not in the idempotency store');
    assert.equal(stored.includes(secret.slice('sk_sandbox_'.length)), false);
    assert.equal((JSON.parse(stored) as { secret: unknown }).secret, null);
  });

  it('refuses a live key until the company is verified, then issues one that authenticates as live', async () => {
    const refused = await call(testApp, 'POST', '/admin/payments/api-keys', {
      token: tenant.token,
      body: { name: 'Production', environment: 'live' },
    });
    assert.equal(refused.status, 403);
    assert.equal(refused.body.code, 'VERIFICATION_REQUIRED');

    await verifyCompany(testApp.ownerSql, tenant.company.id, SYSTEM_ACTOR);
    const created = await call(testApp, 'POST', '/admin/payments/api-keys', {
      token: tenant.token,
      body: { name: 'Production', environment: 'live' },
    });
    assert.equal(created.status, 201);
    assert.match(created.body.secret, /^sk_live_/);
    assert.equal((await authenticateApiKey(testApp.appSql, created.body.secret)).environment, 'live');
  });

  it('revokes a key: it stops authenticating at once, and revoking again is harmless', async () => {
    const created = await call(testApp, 'POST', '/admin/payments/api-keys', {
      token: tenant.token,
      body: { name: 'Short-lived', environment: 'sandbox' },
    });
    const revoked = await call(testApp, 'DELETE', `/admin/payments/api-keys/${created.body._id}`, {
      token: tenant.token,
    });
    assert.equal(revoked.status, 200);
    assert.equal(revoked.body.status, 'revoked');
    await rejectsWith(authenticateApiKey(testApp.appSql, created.body.secret), 'INVALID_API_KEY');
    const again = await call(testApp, 'DELETE', `/admin/payments/api-keys/${created.body._id}`, {
      token: tenant.token,
    });
    assert.equal(again.status, 200);
    assert.equal(again.body.revokedAt, revoked.body.revokedAt);
  });

  it('rejects unknown, malformed and tampered keys with INVALID_API_KEY', async () => {
    await rejectsWith(authenticateApiKey(testApp.appSql, 'sk_sandbox_nope'), 'INVALID_API_KEY');
    await rejectsWith(authenticateApiKey(testApp.appSql, `sk_sandbox_${'A'.repeat(44)}`), 'INVALID_API_KEY');
    const tampered = `${tenant.sandboxApiKey.slice(0, -1)}${tenant.sandboxApiKey.endsWith('A') ? 'B' : 'A'}`;
    await rejectsWith(authenticateApiKey(testApp.appSql, tampered), 'INVALID_API_KEY');
    const wrongEnvironment = tenant.sandboxApiKey.replace('sk_sandbox_', 'sk_live_');
    await rejectsWith(authenticateApiKey(testApp.appSql, wrongEnvironment), 'INVALID_API_KEY');
  });

  it('validates the creation body and paginates the list with a cursor', async () => {
    const bad = await call(testApp, 'POST', '/admin/payments/api-keys', {
      token: tenant.token,
      body: { name: '', environment: 'staging', extra: 1 },
    });
    assert.equal(bad.status, 400);
    assert.deepEqual(bad.body.errors.map((error: { path: string }) => error.path).sort(), [
      'body',
      'body.environment',
      'body.name',
    ]);

    const other = await provisionTestTenant(testApp);
    for (let index = 0; index < 4; index++) {
      await call(testApp, 'POST', '/admin/payments/api-keys', {
        token: other.token,
        body: { name: `k${index}`, environment: 'sandbox' },
      });
    }
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const page: { body: { data: { _id: string }[]; has_more: boolean; next_cursor: string | null } } = await call(
        testApp,
        'GET',
        `/admin/payments/api-keys?limit=2${cursor ? `&cursor=${cursor}` : ''}`,
        { token: other.token },
      );
      assert.ok(page.body.data.length <= 2);
      seen.push(...page.body.data.map((key) => key._id));
      cursor = page.body.next_cursor;
      assert.equal(page.body.has_more, cursor !== null);
    } while (cursor);
    assert.equal(seen.length, 5, 'four created + the default sandbox key');
    assert.deepEqual([...seen].sort().reverse(), seen, 'newest first');
    assert.equal(
      (await call(testApp, 'GET', '/admin/payments/api-keys?limit=101', { token: other.token })).status,
      400,
    );
    assert.equal(
      (await call(testApp, 'GET', '/admin/payments/api-keys?cursor=%%%', { token: other.token })).status,
      400,
    );
  });

  it('caps the active keys of a company per environment; revoking one makes room', async () => {
    const capped = await provisionTestTenant(testApp); // holds its default sandbox key
    const create = (index: number) =>
      call(testApp, 'POST', '/admin/payments/api-keys', {
        token: capped.token,
        body: { name: `cap ${index}`, environment: 'sandbox' },
      });
    let last: { status: number; body: { _id: string } } | undefined;
    for (let index = 1; index < API_KEYS_MAX_PER_ENVIRONMENT; index++) {
      last = await create(index);
      assert.equal(last.status, 201);
    }
    const refused = await create(API_KEYS_MAX_PER_ENVIRONMENT);
    assert.equal(refused.status, 422);
    assert.equal(refused.body.code, 'API_KEY_LIMIT');
    const revoked = await call(testApp, 'DELETE', `/admin/payments/api-keys/${last!.body._id}`, {
      token: capped.token,
    });
    assert.equal(revoked.status, 200);
    assert.equal((await create(API_KEYS_MAX_PER_ENVIRONMENT + 1)).status, 201);
  });

  it('records every key change in the company audit chain', async () => {
    const events = await testApp.ownerSql<{ event: string }[]>`
      select event from audit_events where company_id = ${tenant.company.id} and event like 'api_key.%' order by seq`;
    assert.ok(events.filter((row) => row.event === 'api_key.created').length >= 3);
    assert.ok(events.some((row) => row.event === 'api_key.revoked'));
    assert.equal((await verifyAuditChain(testApp.appSql, tenant.company.id)).ok, true);
  });
});
