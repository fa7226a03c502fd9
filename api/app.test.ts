import assert from 'node:assert/strict';
import { request as httpRequest, type Server } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { z } from 'zod';
import { pino } from 'pino';
import type Koa from 'koa';
import postgres from 'postgres';
import { DEFAULT_LOGIN_POLICY } from '../services/auth.ts';
import { createTransferSigner } from '../services/signing.ts';
import { PEGGED_RATES } from '../services/quotes.ts';
import { Client, Connection } from '@temporalio/client';
import { createApp, createHttpApp } from './app.ts';
import { closeServer, listen } from './server.ts';
import { defineRoute } from './route.ts';
import { problems } from './problem.ts';

const logger = pino({ level: 'silent' });
const limits = { bodyLimitBytes: 1024 };
const serverLimits = {
  host: '127.0.0.1',
  port: 0,
  requestTimeoutMs: 5_000,
  headersTimeoutMs: 5_000,
  keepAliveTimeoutMs: 1_000,
};

// Probe routes exercise the shared middleware stack the way real operations will use it.
const probeRoutes = [
  defineRoute({
    method: 'POST',
    path: '/probe/:id',
    operationId: 'probe',
    summary: 'probe',
    tags: ['test'],
    auth: { kind: 'public' },
    params: z.object({ id: z.string().regex(/^p_[a-z0-9]+$/) }),
    query: z.object({ limit: z.coerce.number().int().min(1).max(100).default(10) }),
    body: z.strictObject({ amount: z.string().regex(/^\d+(\.\d+)?$/), currency: z.string().length(3) }),
    responses: { 201: 'created' },
    handler(ctx, input) {
      ctx.status = 201;
      ctx.body = { id: input.params.id, limit: input.query.limit, amount: input.body.amount };
    },
  }),
  defineRoute({
    method: 'GET',
    path: '/probe/crash',
    operationId: 'crash',
    summary: 'crash',
    tags: ['test'],
    auth: { kind: 'public' },
    responses: { 500: 'always' },
    handler() {
      throw new Error('connection to db at 10.0.0.3 failed: password authentication for user "payments" failed');
    },
  }),
  defineRoute({
    method: 'GET',
    path: '/probe/missing',
    operationId: 'missing',
    summary: 'missing',
    tags: ['test'],
    auth: { kind: 'public' },
    responses: { 404: 'always' },
    handler() {
      throw problems.notFound('No transfer tr_123.');
    },
  }),
];

async function serve(app: { koa: Koa }): Promise<{ server: Server; url: string }> {
  return listen(app.koa, serverLimits);
}

describe('HTTP foundation', () => {
  let server: Server;
  let url: string;

  before(async () => {
    ({ server, url } = await serve(createHttpApp({ logger, limits }, probeRoutes)));
  });
  after(async () => closeServer(server));

  it('parses params, query and body once and hands typed input to the handler', async () => {
    const response = await fetch(`${url}/probe/p_1?limit=5`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amount: '10.50', currency: 'USD' }),
    });
    assert.equal(response.status, 201);
    assert.deepEqual(await response.json(), { id: 'p_1', limit: 5, amount: '10.50' });
  });

  it('gives every response a request ID and echoes a well-formed one from the caller', async () => {
    const generated = await fetch(`${url}/probe/missing`);
    assert.match(generated.headers.get('x-request-id') ?? '', /^req_[0-9a-f-]{36}$/);
    const echoed = await fetch(`${url}/probe/missing`, { headers: { 'x-request-id': 'client-abc-12345' } });
    assert.equal(echoed.headers.get('x-request-id'), 'client-abc-12345');
    const body = (await echoed.json()) as { request_id: string };
    assert.equal(body.request_id, 'client-abc-12345');
    const refused = await fetch(`${url}/probe/missing`, { headers: { 'x-request-id': 'bad id <script>' } });
    assert.notEqual(refused.headers.get('x-request-id'), 'bad id <script>');
  });

  it('refuses the NUL character in params, query, body values and field names with a 400 naming the field', async () => {
    const post = (path: string, body: string) =>
      fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    const cases: [Promise<Response>, string][] = [
      [post('/probe/p_1', JSON.stringify({ amount: '1', currency: 'US\u0000' })), 'body.currency'],
      [post('/probe/p_1', '{"amount":"1","currency":"USD","x":{"y":["ok","a\\u0000b"]}}'), 'body.x.y.1'],
      [post('/probe/p_1', '{"amount":"1","currency":"USD","a\\u0000":1}'), 'body'],
      [post('/probe/p_%00', JSON.stringify({ amount: '1', currency: 'USD' })), 'params.id'],
      [post('/probe/p_1?limit=%00', JSON.stringify({ amount: '1', currency: 'USD' })), 'query.limit'],
    ];
    for (const [request, path] of cases) {
      const response = await request;
      assert.equal(response.status, 400);
      const problem = (await response.json()) as { code: string; errors: { path: string; message: string }[] };
      assert.equal(problem.code, 'VALIDATION_FAILED');
      assert.ok(
        problem.errors.some((issue) => issue.path === path && issue.message.includes('NUL')),
        `${path} in ${JSON.stringify(problem.errors)}`,
      );
    }
  });

  it('answers an unknown route with a 404 problem', async () => {
    const response = await fetch(`${url}/nowhere`);
    assert.equal(response.status, 404);
    assert.match(response.headers.get('content-type') ?? '', /^application\/problem\+json/);
    const body = (await response.json()) as Record<string, unknown>;
    assert.equal(body.code, 'ROUTE_NOT_FOUND');
    assert.equal(body.status, 404);
    assert.equal(body.title, 'Not found');
    assert.equal(typeof body.type, 'string');
    assert.equal(typeof body.request_id, 'string');
  });

  it('answers a known path with the wrong method with 405 and Allow', async () => {
    const response = await fetch(`${url}/probe/p_1`, { method: 'DELETE' });
    assert.equal(response.status, 405);
    assert.equal(response.headers.get('allow'), 'POST');
    const body = (await response.json()) as Record<string, unknown>;
    assert.equal(body.code, 'METHOD_NOT_ALLOWED');
  });

  it('answers a method the API does not implement with a 501 problem', async () => {
    // fetch refuses to send TRACE, so this goes through node:http.
    const trace = (path: string) =>
      new Promise<{ status: number; headers: Record<string, unknown>; body: string }>((resolve, reject) => {
        const request = httpRequest(`${url}${path}`, { method: 'TRACE' }, (response) => {
          let body = '';
          response.setEncoding('utf8');
          response.on('data', (chunk: string) => (body += chunk));
          response.on('end', () => resolve({ status: response.statusCode ?? 0, headers: response.headers, body }));
        });
        request.on('error', reject);
        request.end();
      });
    const known = await trace('/probe/p_1');
    assert.equal(known.status, 501);
    assert.match(String(known.headers['content-type']), /^application\/problem\+json/);
    assert.equal(known.headers.allow, 'POST');
    const body = JSON.parse(known.body) as Record<string, unknown>;
    assert.equal(body.code, 'NOT_IMPLEMENTED');
    assert.equal(body.status, 501);
    assert.match(String(body.detail), /TRACE/);
    assert.equal(typeof body.request_id, 'string');
    const unknown = await trace('/nowhere');
    assert.equal(unknown.status, 501);
    assert.equal(unknown.headers.allow, undefined, 'no empty Allow for a path with no routes');
    assert.equal((JSON.parse(unknown.body) as { code: string }).code, 'NOT_IMPLEMENTED');
  });

  it('refuses a query parameter given more than once with a 400 naming it', async () => {
    const response = await fetch(`${url}/probe/p_1?limit=1&limit=2`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amount: '1', currency: 'USD' }),
    });
    assert.equal(response.status, 400);
    const problem = (await response.json()) as { code: string; errors: { path: string; message: string }[] };
    assert.equal(problem.code, 'VALIDATION_FAILED');
    assert.deepEqual(problem.errors, [{ path: 'query.limit', message: 'given 2 times; give it once' }]);
  });

  it('answers a JSON body with a "__proto__" key, at any depth, with a 400 saying so', async () => {
    for (const body of [
      '{"amount":"1","currency":"USD","__proto__":{"admin":true}}',
      '{"amount":"1","currency":"USD","x":[{"\\u005f_proto__":{}}]}',
    ]) {
      const response = await fetch(`${url}/probe/p_1`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
      });
      assert.equal(response.status, 400, body);
      const problem = (await response.json()) as { code: string; errors: { path: string; message: string }[] };
      assert.equal(problem.code, 'VALIDATION_FAILED', body);
      assert.equal(problem.errors.length, 1, body);
      assert.equal(problem.errors[0]!.path, 'body', body);
      assert.match(problem.errors[0]!.message, /"__proto__"/, body);
    }
  });

  it('answers malformed JSON with a 400 problem', async () => {
    const response = await fetch(`${url}/probe/p_1`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"amount": "1",',
    });
    assert.equal(response.status, 400);
    assert.equal(((await response.json()) as { code: string }).code, 'MALFORMED_JSON');
  });

  it('answers zod failures with a 400 listing every field path', async () => {
    const response = await fetch(`${url}/probe/nope?limit=1000`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amount: 12, currency: 'USDC', extra: true }),
    });
    assert.equal(response.status, 400);
    const body = (await response.json()) as { code: string; errors: { path: string; message: string }[] };
    assert.equal(body.code, 'VALIDATION_FAILED');
    const paths = body.errors.map((error) => error.path).sort();
    assert.deepEqual(paths, ['body', 'body.amount', 'body.currency', 'params.id', 'query.limit']);
    for (const error of body.errors) assert.ok(error.message.length > 0);
  });

  it('refuses a body over the limit with 413 and a non-JSON body with 415', async () => {
    const big = await fetch(`${url}/probe/p_1`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ amount: '1', currency: 'USD', pad: 'x'.repeat(2048) }),
    });
    assert.equal(big.status, 413);
    assert.equal(((await big.json()) as { code: string }).code, 'PAYLOAD_TOO_LARGE');
    const text = await fetch(`${url}/probe/p_1`, {
      method: 'POST',
      headers: { 'content-type': 'text/plain' },
      body: 'amount=1',
    });
    assert.equal(text.status, 415);
    assert.equal(((await text.json()) as { code: string }).code, 'UNSUPPORTED_MEDIA_TYPE');
  });

  it('answers an unexpected error with a bare 500 that carries no internals', async () => {
    const response = await fetch(`${url}/probe/crash`);
    assert.equal(response.status, 500);
    const text = await response.text();
    assert.doesNotMatch(text, /10\.0\.0\.3|password|payments"|stack|Error:/);
    const body = JSON.parse(text) as Record<string, unknown>;
    assert.equal(body.code, 'INTERNAL_ERROR');
    assert.equal(typeof body.request_id, 'string');
  });

  it('passes a thrown problem through unchanged', async () => {
    const response = await fetch(`${url}/probe/missing`);
    assert.equal(response.status, 404);
    const body = (await response.json()) as Record<string, unknown>;
    assert.equal(body.code, 'NOT_FOUND');
    assert.equal(body.detail, 'No transfer tr_123.');
  });
});

describe('operations and docs routes', () => {
  it('reports liveness, readiness per dependency, and serves the docs', async () => {
    let temporalUp = true;
    const unusedPool = postgres('postgres://unused@127.0.0.1:1/unused', { max: 1 });
    const app = createApp({
      logger,
      limits,
      // Health and docs routes never query: a pool that is never used never connects.
      sql: unusedPool,
      signer: createTransferSigner({ sql: unusedPool }),
      ledger: () => Promise.reject(new Error('health and docs routes write no transfers')),
      rails: {
        temporal: new Client({ connection: Connection.lazy({ address: '127.0.0.1:1' }) }),
        fxRates: PEGGED_RATES,
        logger,
        outcomeWaitMs: 1_000,
      },
      loginPolicy: DEFAULT_LOGIN_POLICY,
      webhooks: { allowPrivateUrls: false, maxEndpoints: 16 },
      idempotency: { run: (_ctx, _scope, _options, execute) => execute() },
      readiness: {
        postgres: async () => true,
        temporal: async () => {
          if (!temporalUp) throw new Error('unreachable');
          return true;
        },
      },
    });
    const { server, url } = await serve(app);
    try {
      const health = await fetch(`${url}/healthz`);
      assert.equal(health.status, 200);
      assert.deepEqual(await health.json(), { status: 'ok' });

      const ready = await fetch(`${url}/readyz`);
      assert.equal(ready.status, 200);
      assert.deepEqual(await ready.json(), { status: 'ready', checks: { postgres: 'ok', temporal: 'ok' } });

      temporalUp = false;
      const notReady = await fetch(`${url}/readyz`);
      assert.equal(notReady.status, 503);
      assert.deepEqual(await notReady.json(), {
        status: 'not_ready',
        checks: { postgres: 'ok', temporal: 'unavailable' },
      });

      const openapi = (await (await fetch(`${url}/openapi.json`)).json()) as {
        openapi: string;
        paths: Record<string, unknown>;
      };
      assert.equal(openapi.openapi, '3.1.0');
      for (const route of app.routes) assert.ok(openapi.paths[route.path.replace(/:(\w+)/g, '{$1}')], route.path);

      const docs = await fetch(`${url}/docs`);
      assert.equal(docs.status, 200);
      assert.match(docs.headers.get('content-type') ?? '', /^text\/html/);
      assert.match(await docs.text(), /\/readyz/);
    } finally {
      await closeServer(server);
    }
  });
});
