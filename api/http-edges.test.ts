// Edges an adversarial review of the HTTP surface found answered wrongly: each test failed before
// its fix. Raw node:http requests, so that headers can repeat and bodies can lie about their type.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import { findRailTransfer, markRailTransferProcessing, settleRailTransfer } from '../db/rails.ts';
import { withTenant } from '../db/tenant.ts';
import { newId } from '../platform/ids.ts';
import { provisionTestTenant, startTestApp, type TestApp, type TestTenant } from '../test-support/app.ts';

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: any;
  ms: number;
}

function send(
  base: string,
  method: string,
  path: string,
  headers: Record<string, string | string[]>,
  body?: string,
): Promise<Answer> {
  const url = new URL(base);
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const request = http.request(
      { host: url.hostname, port: url.port, method, path, agent: false, headers },
      (response) => {
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => chunks.push(chunk));
        response.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          resolve({
            status: response.statusCode!,
            headers: response.headers,
            body: text ? JSON.parse(text) : undefined,
            ms: Date.now() - started,
          });
        });
      },
    );
    request.setTimeout(30_000, () => request.destroy(new Error(`no answer in 30 s: ${method} ${path}`)));
    request.on('error', reject);
    if (body !== undefined) request.setHeader('content-length', Buffer.byteLength(body));
    request.end(body);
  });
}

let counter = 0;
const key = () => `edges-${process.pid}-${Date.now()}-${++counter}`;

describe('HTTP edges', { timeout: 300_000 }, () => {
  let testApp: TestApp;
  let own: TestTenant;
  let foreign: TestTenant;
  const v1 = (
    method: string,
    path: string,
    options: { body?: string; headers?: Record<string, string | string[]> } = {},
  ) =>
    send(
      testApp.url,
      method,
      path,
      {
        authorization: `Bearer ${own.sandboxApiKey}`,
        ...(method === 'GET' ? {} : { 'idempotency-key': key() }),
        ...(options.body !== undefined ? { 'content-type': 'application/json' } : {}),
        ...options.headers,
      },
      options.body,
    );

  before(async () => {
    // The default test app's Temporal client points at 127.0.0.1:1: Temporal is unreachable.
    testApp = await startTestApp({ outcomeWaitMs: 500 });
    own = await provisionTestTenant(testApp);
    foreign = await provisionTestTenant(testApp);
  });
  after(async () => testApp.close());

  /** A Shape A payout, answered 201 while Temporal is unreachable (so it stays pending). */
  async function payoutOf(amount: string): Promise<Answer> {
    const payout = await v1('POST', '/v1/transfers', {
      body: JSON.stringify({
        source: { currency: 'USDC', rail: 'stablecoin', amount },
        destination: { currency: 'USD', rail: 'ach', account: own.sandbox.achAccountId },
      }),
    });
    assert.equal(payout.status, 201, JSON.stringify(payout.body));
    return payout;
  }

  it('a sandbox control answers 503 SERVICE_UNAVAILABLE promptly when Temporal cannot be reached (not a 500 after ~20 s)', async () => {
    const payout = await payoutOf('1.15');
    assert.equal(payout.body.status, 'pending', 'Temporal is unreachable: the payout stays pending');
    const settle = await v1('POST', `/v1/sandbox/transfers/${payout.body.id}/settle`, { body: '{}' });
    assert.equal(settle.status, 503, JSON.stringify(settle.body));
    assert.equal(settle.body.code, 'SERVICE_UNAVAILABLE');
    assert.ok(settle.headers['retry-after']);
    assert.ok(settle.ms < 10_000, `answered after ${settle.ms} ms`);
  });

  it('a sandbox return answers 503 when Temporal cannot be reached, not "retry in a moment"', async () => {
    const payout = await payoutOf('2.00');
    // Settled as the run would have settled it, so that only a return is left to simulate.
    const scope = { companyId: own.company.id, environment: 'sandbox' as const };
    await withTenant(testApp.ownerSql, own.company.id, async (tx) => {
      const transfer = (await findRailTransfer(tx, scope, payout.body.id))!;
      const processing = (await markRailTransferProcessing(tx, transfer, `sbx_ach_ok_${transfer.id}`))!;
      await settleRailTransfer(tx, processing, () => newId('sys'));
    });
    const returned = await v1('POST', `/v1/sandbox/transfers/${payout.body.id}/return`, { body: '{}' });
    assert.equal(returned.status, 503, JSON.stringify(returned.body));
    assert.equal(returned.body.code, 'SERVICE_UNAVAILABLE');
    assert.ok(returned.ms < 10_000, `answered after ${returned.ms} ms`);
  });

  it('a +json body (application/merge-patch+json) is parsed, not silently dropped', async () => {
    const endpoint = await v1('POST', '/v1/webhook_endpoints', {
      body: JSON.stringify({ url: 'http://127.0.0.1:9/hook' }),
    });
    assert.equal(endpoint.status, 201);
    // The caller retires the old (leaked) secret at once...
    const rotated = await v1('POST', `/v1/webhook_endpoints/${endpoint.body.id}/rotate_secret`, {
      body: JSON.stringify({ overlap_seconds: 0 }),
      headers: { 'content-type': 'application/merge-patch+json' },
    });
    assert.equal(rotated.status, 200, JSON.stringify(rotated.body));
    // ...and must not get the 24 h default overlap instead.
    assert.equal(rotated.body.previous_secret_expires_at, null);
  });

  it('two Authorization headers are refused, not resolved to the first one', async () => {
    const accounts = await send(testApp.url, 'GET', '/v1/accounts', {
      authorization: [`Bearer ${own.sandboxApiKey}`, `Bearer ${foreign.sandboxApiKey}`],
    });
    assert.equal(accounts.status, 401, JSON.stringify(accounts.body).slice(0, 200));
    const admin = await send(testApp.url, 'GET', '/admin/company/config', {
      authorization: [`Bearer ${own.token}`, `Bearer ${foreign.token}`],
    });
    assert.equal(admin.status, 401, JSON.stringify(admin.body).slice(0, 200));
  });

  it('a wrong method is 405 and an unknown path 404 whatever the body (not 400/413/415 from the body parser)', async () => {
    const malformed = await v1('PUT', '/v1/transfers', { body: '{' });
    assert.equal(malformed.status, 405, JSON.stringify(malformed.body));
    assert.ok(malformed.headers.allow);
    const text = await v1('PATCH', '/v1/transfers', { body: 'hello', headers: { 'content-type': 'text/plain' } });
    assert.equal(text.status, 405, JSON.stringify(text.body));
    const oversized = await v1('PUT', '/v1/accounts', { body: JSON.stringify({ a: 'x'.repeat(300 * 1024) }) });
    assert.equal(oversized.status, 405, JSON.stringify(oversized.body));
    const unknown = await v1('POST', '/v1/nope', { body: 'hello', headers: { 'content-type': 'text/plain' } });
    assert.equal(unknown.status, 404, JSON.stringify(unknown.body));
  });

  it('a cursor from another list (or forged) is a 400, not a silently wrong page', async () => {
    const accounts = await v1('GET', '/v1/accounts?limit=1');
    assert.ok(accounts.body.next_cursor);
    const transfers = await v1('GET', `/v1/transfers?cursor=${accounts.body.next_cursor}`);
    assert.equal(transfers.status, 400, `status ${transfers.status}, ${transfers.body?.data?.length} items`);
    assert.equal(transfers.body.errors[0].path, 'query.cursor');
    const forged = Buffer.from(JSON.stringify({ i: 'zzzz' })).toString('base64url');
    assert.equal((await v1('GET', `/v1/events?cursor=${forged}`)).status, 400);
    // A cursor of the same list keeps working.
    const page = await v1('GET', `/v1/accounts?limit=1&cursor=${accounts.body.next_cursor}`);
    assert.equal(page.status, 200);
    assert.equal(page.body.data.length, 1);
  });

  it('limit is a plain integer 1-100: hex, exponent, padded and fractional spellings are 400', async () => {
    for (const limit of ['0x10', '1e1', '%201', '2.0', '+3', '0b11']) {
      const answer = await v1('GET', `/v1/accounts?limit=${limit}`);
      assert.equal(answer.status, 400, `limit=${limit}: ${answer.status}`);
      assert.equal(answer.body.errors[0].path, 'query.limit');
    }
    assert.equal((await v1('GET', '/v1/accounts?limit=2')).body.data.length, 2);
    assert.equal((await v1('GET', '/v1/accounts?limit=100')).status, 200);
    assert.equal((await v1('GET', '/v1/accounts')).status, 200);
  });

  it('publishes limit as an integer from 1 to 100 on every list, however strictly the query string is read', async () => {
    const doc = (await (await fetch(`${testApp.url}/openapi.json`)).json()) as {
      paths: Record<string, Record<string, { parameters?: { name: string; in: string; schema: any }[] }>>;
    };
    let lists = 0;
    for (const [path, operations] of Object.entries(doc.paths)) {
      for (const [method, operation] of Object.entries(operations)) {
        const limit = operation.parameters?.find((p) => p.name === 'limit' && p.in === 'query');
        if (!limit) continue;
        lists += 1;
        assert.equal(limit.schema.type, 'integer', `${method} ${path}: ${JSON.stringify(limit.schema)}`);
        assert.equal(limit.schema.minimum, 1, `${method} ${path}`);
        assert.equal(limit.schema.maximum, 100, `${method} ${path}`);
      }
    }
    assert.ok(lists >= 5, `${lists} lists`);
  });
});
