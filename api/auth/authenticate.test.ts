// The short-lived API-key cache (services/api-keys.ts): a hit needs the exact secret the database
// accepted, an entry lives at most its TTL, the cache is bounded, and a revocation through the
// service takes effect at once in the revoking process. The `Bearer` scheme is case-insensitive.
import assert from 'node:assert/strict';
import { setTimeout as delay } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { createApiKeyCache } from '../../services/api-keys.ts';
import { call, provisionTestTenant, startTestApp, type TestApp, type TestTenant } from '../../test-support/app.ts';

describe('API-key authentication cache', () => {
  let testApp: TestApp;
  let tenant: TestTenant;
  let counter = 0;

  before(async () => {
    testApp = await startTestApp();
    tenant = await provisionTestTenant(testApp);
  });
  after(async () => testApp.close());

  const newKey = async (): Promise<{ id: string; secret: string }> => {
    const created = await call(testApp, 'POST', '/admin/payments/api-keys', {
      token: tenant.token,
      body: { name: `cache ${++counter}`, environment: 'sandbox' },
      headers: { 'idempotency-key': `cache-${process.pid}-${counter}` },
    });
    assert.equal(created.status, 201);
    return { id: created.body._id as string, secret: created.body.secret as string };
  };
  const revokeInDatabase = (id: string) => testApp.ownerSql`update api_keys set revoked_at = now() where id = ${id}`;
  const rejects = (promise: Promise<unknown>) =>
    assert.rejects(promise, (error: { code?: string }) => error.code === 'INVALID_API_KEY');

  it('reads the Bearer scheme case-insensitively (RFC 9110 §11.1), for API keys and console sessions', async () => {
    const as = (path: string, authorization: string) => fetch(`${testApp.url}${path}`, { headers: { authorization } });
    for (const scheme of ['Bearer', 'bearer', 'BEARER', 'bEaReR']) {
      assert.equal((await as('/v1/accounts', `${scheme} ${tenant.sandboxApiKey}`)).status, 200, scheme);
      assert.equal((await as('/admin/auth/me', `${scheme} ${tenant.token}`)).status, 200, scheme);
    }
    for (const refused of [
      `Basic ${tenant.sandboxApiKey}`,
      `Bearer${tenant.sandboxApiKey}`,
      `bearer  ${tenant.sandboxApiKey}`,
    ]) {
      const response = await as('/v1/accounts', refused);
      assert.equal(response.status, 401, refused);
      assert.equal(((await response.json()) as { code: string }).code, 'UNAUTHENTICATED', refused);
    }
    // The credential itself stays case-sensitive.
    const swapped = tenant.sandboxApiKey.replace(/[a-z]/g, (letter) => letter.toUpperCase());
    assert.equal((await as('/v1/accounts', `bearer ${swapped}`)).status, 401);
  });

  it('serves a key from memory for at most its TTL, then asks the database again', async () => {
    const cache = createApiKeyCache({ ttlMs: 200, maxEntries: 100 });
    const key = await newKey();
    assert.equal((await cache.authenticate(testApp.appSql, key.secret)).keyId, key.id);
    await revokeInDatabase(key.id);
    assert.equal((await cache.authenticate(testApp.appSql, key.secret)).keyId, key.id, 'within the TTL: from memory');
    await delay(250);
    await rejects(cache.authenticate(testApp.appSql, key.secret));
  });

  it('never caches a failure, needs the exact secret, and stays within its size', async () => {
    const cache = createApiKeyCache({ ttlMs: 60_000, maxEntries: 1 });
    const first = await newKey();
    const second = await newKey();
    const tampered = `${first.secret.slice(0, -1)}${first.secret.endsWith('x') ? 'y' : 'x'}`;
    await rejects(cache.authenticate(testApp.appSql, tampered));
    await cache.authenticate(testApp.appSql, first.secret);
    await cache.authenticate(testApp.appSql, second.secret); // evicts the first
    await revokeInDatabase(first.id);
    await revokeInDatabase(second.id);
    assert.equal((await cache.authenticate(testApp.appSql, second.secret)).keyId, second.id, 'still cached');
    await rejects(cache.authenticate(testApp.appSql, first.secret));
  });

  it('forgets a key revoked through the API at once', async () => {
    const key = await newKey();
    const v1 = () => call(testApp, 'GET', '/v1/accounts', { token: key.secret });
    assert.equal((await v1()).status, 200);
    assert.equal((await v1()).status, 200);
    const revoked = await call(testApp, 'DELETE', `/admin/payments/api-keys/${key.id}`, {
      token: tenant.token,
      headers: { 'idempotency-key': `cache-revoke-${process.pid}` },
    });
    assert.equal(revoked.status, 200);
    const after = await v1();
    assert.equal(after.status, 401);
    assert.equal(after.body.code, 'INVALID_API_KEY');
  });
});
