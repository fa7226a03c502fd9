// Hostile input on every route, over real HTTP (raw sockets where a client library would tidy the
// request up): each answer must be a 4xx problem document with a stable code or a legitimate
// success, never a 5xx, never a hung request, never another tenant's data. The routes come from the
// app itself, so a new route is covered without editing this file.
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import zlib from 'node:zlib';
import { after, afterEach, before, describe, it } from 'node:test';
import fc from 'fast-check';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { createApiKey, revokeApiKey } from '../services/api-keys.ts';
import { verifyCompany } from '../services/companies.ts';
import { createLedgerTransfer } from '../services/transfers.ts';
import { provisionTestTenant, signIn, startTestApp, type TestApp, type TestTenant } from '../test-support/app.ts';
import type { RouteDefinition } from './route.ts';

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  body: any;
}

const REQUEST_TIMEOUT_MS = 20_000;

/** One request with full control over headers (arrays repeat a header) and the body bytes. */
function send(
  base: string,
  method: string,
  path: string,
  options: { headers?: Record<string, string | string[]>; body?: string | Buffer } = {},
): Promise<Answer> {
  const url = new URL(base);
  path = path.replace(/[^\x21-\x7e]/gu, (character) =>
    [...Buffer.from(character)].map((byte) => `%${byte.toString(16).padStart(2, '0')}`).join(''),
  );
  return new Promise((resolve, reject) => {
    const request = http.request(
      { host: url.hostname, port: url.port, method, path, agent: false, headers: options.headers ?? {} },
      (response) => {
        const chunks: Buffer[] = [];
        response.on('data', (chunk: Buffer) => chunks.push(chunk));
        response.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let body: unknown;
          try {
            body = text ? JSON.parse(text) : undefined;
          } catch {
            body = undefined;
          }
          resolve({ status: response.statusCode ?? 0, headers: response.headers, text, body });
        });
        response.on('error', reject);
      },
    );
    request.setTimeout(REQUEST_TIMEOUT_MS, () => request.destroy(new Error(`HUNG: ${method} ${path}`)));
    request.on('error', reject);
    if (options.body !== undefined) {
      if (!Object.keys(options.headers ?? {}).some((name) => /^(content-length|transfer-encoding)$/i.test(name)))
        request.setHeader('content-length', Buffer.byteLength(options.body));
      request.end(options.body);
    } else request.end();
  });
}

/** Raw bytes on a socket (Content-Length lies, odd methods): the first response head and body. */
function sendRaw(base: string, bytes: Buffer | string, options: { halfClose?: boolean; waitMs?: number } = {}) {
  const url = new URL(base);
  return new Promise<{ raw: string; closed: boolean; ms: number }>((resolve) => {
    const started = Date.now();
    const socket = net.connect(Number(url.port), url.hostname);
    let raw = '';
    let done = false;
    const finish = (closed: boolean) => {
      if (done) return;
      done = true;
      socket.destroy();
      resolve({ raw, closed, ms: Date.now() - started });
    };
    socket.on('data', (chunk) => {
      raw += chunk.toString('latin1');
    });
    socket.on('end', () => finish(true));
    socket.on('close', () => finish(true));
    socket.on('error', () => finish(true));
    socket.write(bytes, () => {
      if (options.halfClose) socket.end();
    });
    setTimeout(() => finish(false), options.waitMs ?? 15_000);
  });
}

const PROBLEM_CODE = /^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$/;

const failures: string[] = [];
/** Collects instead of throwing, so one run shows every finding; each test flushes at its end. */
function assertSane(answer: Answer, label: string): void {
  try {
    strictSane(answer, label);
  } catch (error) {
    failures.push((error as Error).message.split('\n')[0]!.slice(0, 400));
  }
}
function soft(condition: unknown, message: string): void {
  if (!condition) failures.push(message.slice(0, 400));
}
function flush(): void {
  const found = [...new Set(failures.splice(0))];
  assert.deepEqual(found, [], `${found.length} findings:\n${found.slice(0, 60).join('\n')}`);
}

/** Never a 5xx (501 NOT_IMPLEMENTED for TRACE is documented); every error a problem document. */
function strictSane(answer: Answer, label: string): void {
  const method = label.split(' ')[0];
  const detail = `${label} → ${answer.status} ${answer.text.slice(0, 300)}`;
  assert.ok(answer.status >= 200, detail);
  if (answer.status === 501) assert.equal(answer.body?.code, 'NOT_IMPLEMENTED', detail);
  // A dependency outage (Temporal unreachable in this test app) may be a 503 with Retry-After.
  else if (answer.status === 503)
    assert.ok(answer.body?.code === 'SERVICE_UNAVAILABLE' && answer.headers['retry-after'], detail);
  else assert.ok(answer.status < 500, detail);
  if (answer.status >= 400 && method !== 'HEAD') {
    assert.match(String(answer.headers['content-type']), /^application\/problem\+json/, detail);
    assert.match(String(answer.body?.code), PROBLEM_CODE, detail);
    assert.equal(answer.body?.status, answer.status, detail);
    assert.equal(typeof answer.body?.title, 'string', detail);
    assert.equal(typeof answer.body?.type, 'string', detail);
    assert.ok(
      !/at .*\.ts:\d+|node_modules|postgres|SELECT|syntax error/i.test(answer.text),
      `leaks internals: ${detail}`,
    );
  }
  assert.ok(answer.headers['x-request-id'], `${label}: no X-Request-Id`);
}

/** Spellings of a number that no decimal-string amount accepts. */
const MALFORMED_DECIMALS = ['1e3', '0x10', ' 1.00', '1.', '.5', '-0', '1,00', '１'];

let keyCounter = 0;
const newKey = () => `fuzz-${process.pid}-${Date.now()}-${++keyCounter}`;

describe('hostile input: never a 500, never a hang, never a cross-tenant leak', { timeout: 600_000 }, () => {
  let testApp: TestApp;
  let own: TestTenant;
  let foreign: TestTenant;
  let ownLiveKey: string;
  let revokedKey: string;
  let operatorToken: string; // for fuzzing (never logged out)
  const ids: Record<string, string> = {};
  const foreignIds: Record<string, string> = {};

  const v1 = (
    method: string,
    path: string,
    options: { body?: unknown; raw?: string | Buffer; key?: string; headers?: Record<string, string | string[]> } = {},
  ) =>
    send(testApp.url, method, path, {
      headers: {
        authorization: `Bearer ${options.key ?? own.sandboxApiKey}`,
        ...(options.body !== undefined || options.raw !== undefined ? { 'content-type': 'application/json' } : {}),
        ...(method === 'GET' || method === 'HEAD' ? {} : { 'idempotency-key': newKey() }),
        ...options.headers,
      },
      ...(options.raw !== undefined
        ? { body: options.raw }
        : options.body !== undefined
          ? { body: JSON.stringify(options.body) }
          : {}),
    });

  async function makeFixtures(tenant: TestTenant, into: Record<string, string>) {
    into.transfer = (
      await createLedgerTransfer(
        testApp.ownerSql,
        { companyId: tenant.company.id, environment: 'sandbox' },
        { amount: 1n, currency: 'USD', source: tenant.sandbox.usdWalletId, destination: tenant.sandbox.usdAccountId },
        `fixture-${Math.random()}`,
      )
    ).id;
    into.ledger_account = tenant.sandbox.usdWalletId;
    into.rail_transfer = into.transfer;
    const endpoint = await send(testApp.url, 'POST', '/v1/webhook_endpoints', {
      headers: {
        authorization: `Bearer ${tenant.sandboxApiKey}`,
        'content-type': 'application/json',
        'idempotency-key': newKey(),
      },
      body: JSON.stringify({ url: 'http://127.0.0.1:9/hook' }),
    });
    assert.equal(endpoint.status, 201, endpoint.text);
    into.webhook_endpoint = endpoint.body.id;
    const [event] = await testApp.ownerSql<{ id: string }[]>`select id from events where object_id = ${into.transfer}`;
    into.event = event!.id;
    into.api_key = (
      await createApiKey(
        testApp.ownerSql,
        { companyId: tenant.company.id, environment: 'sandbox', name: 'fz', createdBy: null },
        SYSTEM_ACTOR,
      )
    ).apiKey.id;
  }

  before(async () => {
    testApp = await startTestApp({ outcomeWaitMs: 500 });
    own = await provisionTestTenant(testApp);
    foreign = await provisionTestTenant(testApp);
    operatorToken = await signIn(testApp, own.owner.email, own.ownerPassword);
    await verifyCompany(testApp.ownerSql, own.company.id, SYSTEM_ACTOR);
    ownLiveKey = (
      await createApiKey(
        testApp.ownerSql,
        { companyId: own.company.id, environment: 'live', name: 'live', createdBy: null },
        SYSTEM_ACTOR,
      )
    ).secret;
    const revoked = await createApiKey(
      testApp.ownerSql,
      { companyId: own.company.id, environment: 'sandbox', name: 'revoked', createdBy: null },
      SYSTEM_ACTOR,
    );
    await revokeApiKey(
      testApp.ownerSql,
      { companyId: own.company.id, id: revoked.apiKey.id, revokedBy: null },
      SYSTEM_ACTOR,
    );
    revokedKey = revoked.secret;
    await makeFixtures(own, ids);
    await makeFixtures(foreign, foreignIds);
  });
  after(async () => testApp.close());
  afterEach(() => flush());

  const tokenFor = (route: RouteDefinition) =>
    route.auth.kind === 'api_key' ? own.sandboxApiKey : route.auth.kind === 'operator' ? operatorToken : undefined;
  const pathFor = (route: RouteDefinition, id?: string) =>
    route.path.replace(/:([A-Za-z0-9_]+)/g, () => encodeURIComponent(id ?? ids[route.resource!.type]!));
  /** Routes a fuzz run may call repeatedly without ending the fuzzing session. */
  const fuzzable = () => testApp.app.routes.filter((route) => route.operationId !== 'logout');

  function routeCall(
    route: RouteDefinition,
    options: { path?: string; body?: string | Buffer; headers?: Record<string, string | string[]> } = {},
  ) {
    const token = tokenFor(route);
    return send(testApp.url, route.method, options.path ?? pathFor(route), {
      headers: {
        ...(token ? { authorization: `Bearer ${token}` } : {}),
        ...(options.body !== undefined ? { 'content-type': 'application/json' } : {}),
        ...(route.method === 'GET' ? {} : { 'idempotency-key': newKey() }),
        ...options.headers,
      },
      ...(options.body !== undefined ? { body: options.body } : {}),
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Bodies
  // ---------------------------------------------------------------------------------------------

  /** Every leaf path of an example body. */
  function leafPaths(value: unknown, prefix: string[] = []): string[][] {
    if (typeof value !== 'object' || value === null || Array.isArray(value)) return [prefix];
    return Object.entries(value).flatMap(([name, child]) => leafPaths(child, [...prefix, name]));
  }
  function replaceAt(value: unknown, path: string[], replacement: unknown): unknown {
    if (path.length === 0) return replacement;
    const copy = { ...(value as Record<string, unknown>) };
    copy[path[0]!] = replaceAt(copy[path[0]!], path.slice(1), replacement);
    return copy;
  }

  const hostileScalars: unknown[] = [
    null,
    true,
    false,
    0,
    -1,
    1.5,
    -0,
    1e308,
    -1e308,
    2 ** 53 + 1,
    1e15,
    1e15 + 1,
    '',
    ' ',
    '0',
    '1',
    'x'.repeat(10_000),
    ...MALFORMED_DECIMALS,
    '１０',
    '٣',
    '1_000',
    'Infinity',
    'NaN',
    '1.00 ',
    '+1',
    '00.5',
    '0.0000001',
    '9'.repeat(39),
    '9'.repeat(41),
    [],
    [1],
    {},
    { a: 1 },
    '\u202e',
    '😀',
    'a\u0000b',
    '\ud800',
    '<script>',
    "'; drop table transfers; --",
    'sys_platform',
    'wal_00000000000000000000000000000000',
    '../../etc/passwd',
    '%00',
  ];

  it('survives wrong types and hostile values at every body field of every route', async () => {
    for (const route of fuzzable().filter((candidate) => candidate.body)) {
      const example =
        route.operationId === 'createTransfer'
          ? { amount: 1, currency: 'USD', source: own.sandbox.usdWalletId, destination: own.sandbox.usdAccountId }
          : route.operationId === 'resendWebhookEvent'
            ? { event: ids.event }
            : (route.example ?? {});
      const leaves = leafPaths(example);
      const paths = leaves.length > 0 ? leaves : [['reason']];
      for (const path of paths) {
        for (const value of hostileScalars) {
          const body = JSON.stringify(replaceAt(example, path, value));
          assertSane(
            await routeCall(route, { body }),
            `${route.method} ${route.path} ${path.join('.')}=${JSON.stringify(value).slice(0, 40)}`,
          );
        }
      }
      await fc.assert(
        fc.asyncProperty(fc.constantFrom(...paths), fc.jsonValue({ maxDepth: 3 }), async (path, value) => {
          const body = JSON.stringify(replaceAt(example, path, value));
          assertSane(
            await routeCall(route, { body }),
            `${route.method} ${route.path} ${path.join('.')}=${JSON.stringify(value).slice(0, 80)}`,
          );
        }),
        { numRuns: 25, seed: 20261122 },
      );
      await fc.assert(
        fc.asyncProperty(fc.jsonValue({ maxDepth: 4 }), async (value) => {
          assertSane(
            await routeCall(route, { body: JSON.stringify(value) }),
            `${route.method} ${route.path} body=${JSON.stringify(value).slice(0, 80)}`,
          );
        }),
        { numRuns: 15, seed: 7 },
      );
    }
  });

  it('refuses amounts that are not plain decimals (Shape A) and non-integers (Shape B), with 400s', async () => {
    /** A Shape B body whose amount is the JSON text `raw`, exactly as written. */
    const shapeBWithRawAmount = (raw: string) =>
      `{"amount":${raw},"currency":"USD","source":"${own.sandbox.usdWalletId}","destination":"${own.sandbox.usdAccountId}"}`;
    const shapeA = (amount: unknown) => ({
      source: { currency: 'USDC', rail: 'stablecoin', amount },
      destination: { currency: 'USD', rail: 'ach', account: own.sandbox.achAccountId },
    });
    const bad = [...MALFORMED_DECIMALS, '0', '0.000000', '0.0000001', '-1', '+1', '00.5', '1.00 ', '', '9'.repeat(40)];
    for (const amount of bad) {
      const answer = await v1('POST', '/v1/transfers', { body: shapeA(amount) });
      assertSane(answer, `Shape A amount ${JSON.stringify(amount)}`);
      soft(answer.status === 400, `Shape A amount ${JSON.stringify(amount)}: ${answer.text}`);
    }
    for (const raw of ['1e3', '1.0', '1E3', '10.000']) {
      // Valid JSON numbers that are integers: legitimate (JSON has no integer type).
      const answer = await v1('POST', '/v1/transfers', {
        raw: shapeBWithRawAmount(raw),
      });
      assertSane(answer, `Shape B amount ${raw}`);
    }
    for (const raw of [
      '"1"',
      '1.5',
      '-0',
      '0',
      '-1',
      '1e400',
      '9007199254740993',
      '1e16',
      '"１"',
      'null',
      '[1]',
      '{"$numberLong":"1"}',
    ]) {
      const answer = await v1('POST', '/v1/transfers', {
        raw: shapeBWithRawAmount(raw),
      });
      assertSane(answer, `Shape B amount ${raw}`);
      soft(answer.status === 400, `Shape B amount ${raw}: ${answer.text}`);
    }
  });

  it('handles huge, deep, duplicate-key, prototype and non-JSON bodies', async () => {
    const route = fuzzable().find((candidate) => candidate.operationId === 'createTransfer')!;
    const cases: [string, string | Buffer, Record<string, string>?][] = [
      [
        '1 MB string',
        JSON.stringify({ amount: 1, currency: 'USD', source: 'x'.repeat(1024 * 1024), destination: 'y' }),
      ],
      ['10k nesting', '['.repeat(10_000) + ']'.repeat(10_000)],
      ['10k object nesting', '{"a":'.repeat(10_000) + '1' + '}'.repeat(10_000)],
      ['100k nesting (under limit)', '['.repeat(100_000) + ']'.repeat(100_000)],
      ['deep __proto__', '{"a":'.repeat(2_000) + '{"__proto__":{"x":1}}' + '}'.repeat(2_000)],
      [
        'duplicate keys',
        `{"amount":1,"amount":"x","currency":"USD","source":"${own.sandbox.usdWalletId}","destination":"${own.sandbox.usdAccountId}"}`,
      ],
      [
        'duplicate keys, last valid',
        `{"amount":"x","amount":1,"currency":"USD","source":"${own.sandbox.usdWalletId}","destination":"${own.sandbox.usdAccountId}"}`,
      ],
      ['__proto__', '{"__proto__":{"amount":1}}'],
      ['constructor', '{"constructor":{"prototype":{"x":1}}}'],
      ['prototype key', '{"prototype":1}'],
      ['empty body', ''],
      ['whitespace body', '   '],
      ['null', 'null'],
      ['number', '1'],
      ['string', '"x"'],
      ['array', '[]'],
      ['truncated', '{"amount":'],
      ['trailing garbage', '{"amount":1} x'],
      ['two documents', '{}{}'],
      [
        'invalid UTF-8',
        Buffer.concat([
          Buffer.from('{"amount":1,"currency":"'),
          Buffer.from([0xc3, 0x28, 0xff]),
          Buffer.from('","source":"a","destination":"b"}'),
        ]),
      ],
      [
        'overlong UTF-8 NUL',
        Buffer.concat([Buffer.from('{"currency":"'), Buffer.from([0xc0, 0x80]), Buffer.from('"}')]),
      ],
      ['BOM', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{}')])],
      ['UTF-16 body', Buffer.from('{"amount":1}', 'utf16le')],
      ['escaped NUL in key', '{"a\\u0000":1}'],
      ['lone surrogate key', '{"\\ud800":1}'],
    ];
    for (const [label, body, headers] of cases) {
      assertSane(await routeCall(route, { body, ...(headers ? { headers } : {}) }), `body ${label}`);
    }
    const contentTypes = [
      'text/plain',
      'application/x-www-form-urlencoded',
      'multipart/form-data; boundary=x',
      'application/xml',
      'text/json',
      'application/json; charset=utf-16',
      'application/json; charset=latin1',
      'application/json; charset=bogus',
      'application/json;',
      'APPLICATION/JSON',
      'application/vnd.api+json',
      'application/merge-patch+json',
      'application/problem+json',
      '',
      '*/*',
      'application/json, text/plain',
      'invalid',
      'application/',
      ';;;',
    ];
    for (const type of contentTypes) {
      for (const candidate of fuzzable().filter((r) => r.body)) {
        assertSane(
          await routeCall(candidate, {
            body: JSON.stringify(candidate.example ?? {}),
            headers: { 'content-type': type },
          }),
          `${candidate.method} ${candidate.path} content-type ${JSON.stringify(type)}`,
        );
      }
    }
  });

  it('handles gzip/deflate bodies: garbage, bombs, valid, unknown encodings', async () => {
    const route = fuzzable().find((candidate) => candidate.operationId === 'createTransfer')!;
    const valid = JSON.stringify({
      amount: 1,
      currency: 'USD',
      source: own.sandbox.usdWalletId,
      destination: own.sandbox.usdAccountId,
    });
    const cases: [string, Buffer, string][] = [
      ['gzip garbage', Buffer.from('not gzip at all'), 'gzip'],
      ['deflate garbage', Buffer.from('not deflate'), 'deflate'],
      ['br garbage', Buffer.from('nope'), 'br'],
      ['truncated gzip', zlib.gzipSync(valid).subarray(0, 10), 'gzip'],
      ['gzip bomb', zlib.gzipSync(Buffer.alloc(50 * 1024 * 1024, 0x20)), 'gzip'],
      ['valid gzip', zlib.gzipSync(valid), 'gzip'],
      ['unknown encoding', Buffer.from(valid), 'x-unknown'],
      ['double encoding', zlib.gzipSync(zlib.gzipSync(valid)), 'gzip, gzip'],
      ['identity, gzip', Buffer.from(valid), 'identity, gzip'],
    ];
    for (const [label, body, encoding] of cases) {
      assertSane(await routeCall(route, { body, headers: { 'content-encoding': encoding } }), label);
    }
  });

  it('does not hang or 5xx on Content-Length lies and odd request lines', async () => {
    const url = new URL(testApp.url);
    const head = (method: string, path: string, extra: string) =>
      `${method} ${path} HTTP/1.1\r\nHost: ${url.host}\r\nAuthorization: Bearer ${own.sandboxApiKey}\r\nIdempotency-Key: ${newKey()}\r\n${extra}`;
    const cases: [string, string, { halfClose?: boolean; waitMs?: number }][] = [
      [
        'CL longer than body, half-closed',
        head('POST', '/v1/transfers', 'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"amount":1}'),
        { halfClose: true },
      ],
      [
        'CL shorter than body',
        head(
          'POST',
          '/v1/transfers',
          'Content-Type: application/json\r\nContent-Length: 5\r\nConnection: close\r\n\r\n{"amount":1}',
        ),
        {},
      ],
      [
        'CL and chunked',
        head(
          'POST',
          '/v1/transfers',
          'Content-Type: application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
        ),
        {},
      ],
      [
        'two CLs',
        head(
          'POST',
          '/v1/transfers',
          'Content-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}',
        ),
        {},
      ],
      [
        'negative CL',
        head('POST', '/v1/transfers', 'Content-Type: application/json\r\nContent-Length: -1\r\n\r\n{}'),
        {},
      ],
      [
        'huge CL',
        head('POST', '/v1/transfers', 'Content-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n{}'),
        { halfClose: true },
      ],
      [
        'bad chunk',
        head(
          'POST',
          '/v1/transfers',
          'Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n',
        ),
        {},
      ],
      ['unknown method', head('FOO', '/v1/transfers', '\r\n'), {}],
      ['CONNECT', `CONNECT ${url.host} HTTP/1.1\r\nHost: ${url.host}\r\n\r\n`, {}],
      ['absolute URI', head('GET', `http://evil.example/v1/accounts`, 'Connection: close\r\n\r\n'), {}],
      ['asterisk', head('OPTIONS', '*', 'Connection: close\r\n\r\n'), {}],
      ['no leading slash', head('GET', 'v1/accounts', 'Connection: close\r\n\r\n'), {}],
      ['header without colon', head('GET', '/v1/accounts', 'Garbage\r\n\r\n'), {}],
      ['obs-fold', head('GET', '/v1/accounts', 'X-A: a\r\n b\r\nConnection: close\r\n\r\n'), {}],
      ['HTTP/1.0', `GET /v1/accounts HTTP/1.0\r\nAuthorization: Bearer ${own.sandboxApiKey}\r\n\r\n`, {}],
    ];
    for (const [label, bytes, options] of cases) {
      const result = await sendRaw(testApp.url, bytes, options);
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(result.raw)?.[1] ?? 0);
      assert.ok(result.closed || status > 0, `${label}: no answer and not closed after ${result.ms} ms`);
      assert.ok(status === 0 || status < 500 || status === 501, `${label}: ${result.raw.slice(0, 300)}`);
    }
    // The server still answers.
    assert.equal((await send(testApp.url, 'GET', '/healthz')).status, 200);
  });

  it('answers a body that stops half-way, within the request timeout, without a 5xx', async () => {
    const url = new URL(testApp.url);
    const bytes = `POST /v1/transfers HTTP/1.1\r\nHost: ${url.host}\r\nAuthorization: Bearer ${own.sandboxApiKey}\r\nIdempotency-Key: ${newKey()}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"amount":1}`;
    const result = await sendRaw(testApp.url, bytes, { waitMs: 45_000 });
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(result.raw)?.[1] ?? 0);
    assert.ok(result.closed || status > 0, `no answer after ${result.ms} ms`);
    assert.ok(status === 0 || status < 500, result.raw.slice(0, 300));
  });

  // ---------------------------------------------------------------------------------------------
  // Headers
  // ---------------------------------------------------------------------------------------------

  it('handles odd Idempotency-Keys, repeated headers, Authorization variants and odd Accept', async () => {
    const transfer = () =>
      JSON.stringify({
        amount: 1,
        currency: 'USD',
        source: own.sandbox.usdWalletId,
        destination: own.sandbox.usdAccountId,
      });
    for (const key of [
      '',
      ' ',
      'a',
      'a'.repeat(255),
      'a'.repeat(256),
      'a'.repeat(8000),
      'ä',
      '\u00ff'.repeat(3),
      'a b',
      '"quoted"',
      'a,b',
      '%00',
      '../../x',
      'key\ttab',
    ]) {
      const answer = await send(testApp.url, 'POST', '/v1/transfers', {
        headers: {
          authorization: `Bearer ${own.sandboxApiKey}`,
          'content-type': 'application/json',
          'idempotency-key': key,
        },
        body: transfer(),
      }).catch((error: Error) => ({ status: -1, headers: {}, text: error.message, body: undefined }));
      if (answer.status === -1) continue; // the client refused to send it (non-Latin-1); the raw test below sends bytes
      assertSane(answer, `Idempotency-Key ${JSON.stringify(key).slice(0, 40)}`);
    }
    const repeated = await send(testApp.url, 'POST', '/v1/transfers', {
      headers: {
        authorization: `Bearer ${own.sandboxApiKey}`,
        'content-type': 'application/json',
        'idempotency-key': ['k1', 'k2'],
      },
      body: transfer(),
    });
    assertSane(repeated, 'repeated Idempotency-Key');
    assert.equal(repeated.status, 400);

    const authVariants: (string | string[])[] = [
      '',
      'Bearer',
      'Bearer ',
      'Bearer  ' + own.sandboxApiKey,
      'bearer ' + own.sandboxApiKey,
      'BEARER ' + own.sandboxApiKey,
      'Basic ' + Buffer.from('a:b').toString('base64'),
      'Token ' + own.sandboxApiKey,
      own.sandboxApiKey,
      'Bearer ' + 'A'.repeat(512),
      'Bearer ' + 'A'.repeat(513),
      'Bearer ' + 'A'.repeat(8000),
      `Bearer ${own.sandboxApiKey} extra`,
      `Bearer ${own.sandboxApiKey}\u00e9`,
      `Bearer ${foreign.sandboxApiKey}`,
      `Bearer ${revokedKey}`,
      `Bearer ${own.sandboxApiKey.replace('sk_sandbox_', 'sk_live_')}`,
      `Bearer ${own.sandboxApiKey.slice(0, -1)}`,
      `Bearer ${own.sandboxApiKey}x`,
      `Bearer sk_sandbox_`,
      `Bearer sk_`,
      `Bearer sk_prod_abc`,
      `Bearer ${operatorToken}`,
      [`Bearer ${own.sandboxApiKey}`, `Bearer ${foreign.sandboxApiKey}`],
      [`Bearer ${own.sandboxApiKey}`, `Bearer ${own.sandboxApiKey}`],
    ];
    for (const route of fuzzable().filter((candidate) => candidate.auth.kind !== 'public')) {
      for (const authorization of authVariants) {
        const answer = await send(testApp.url, route.method, pathFor(route), {
          headers: {
            authorization:
              route.auth.kind === 'operator' && typeof authorization === 'string'
                ? authorization.replace(own.sandboxApiKey, operatorToken)
                : authorization,
            ...(route.body ? { 'content-type': 'application/json' } : {}),
            ...(route.method === 'GET' ? {} : { 'idempotency-key': newKey() }),
          },
          ...(route.body ? { body: JSON.stringify(route.example ?? {}) } : {}),
        });
        assertSane(answer, `${route.method} ${route.path} Authorization ${JSON.stringify(authorization).slice(0, 60)}`);
        if (Array.isArray(authorization) && authorization[0] !== authorization[1]) {
          soft(answer.status === 401, `${route.method} ${route.path}: two different credentials must not authenticate`);
        }
      }
    }
    // The revoked key, another tenant's key and a tampered key are 401 INVALID_API_KEY.
    // Tampered: its last character changed (to 'Z', or 'Y' when it was 'Z' already: the same key is no tampering).
    const tampered = `${own.sandboxApiKey.slice(0, -1)}${own.sandboxApiKey.endsWith('Z') ? 'Y' : 'Z'}`;
    for (const key of [revokedKey, tampered]) {
      const answer = await v1('GET', '/v1/accounts', { key });
      assert.equal(answer.status, 401);
      assert.equal(answer.body.code, 'INVALID_API_KEY');
    }
    for (const accept of [
      'text/html',
      'application/xml',
      '*/*;q=0',
      'application/json;q=0',
      'x'.repeat(4000),
      '',
      'image/png, */*;q=0.1',
    ]) {
      for (const path of ['/v1/accounts', '/v1/transfers/nope', '/.well-known/jwks.json', '/nope']) {
        assertSane(await v1('GET', path, { headers: { accept } }), `GET ${path} Accept ${accept.slice(0, 30)}`);
      }
    }
    for (const requestId of [
      '',
      'short',
      'x'.repeat(129),
      'a b c d e f',
      '<script>alert(1)</script>',
      'valid-request-id-1',
      ['aaaaaaaa1', 'bbbbbbbb2'],
    ]) {
      const answer = await v1('GET', '/v1/accounts', { headers: { 'x-request-id': requestId } });
      assertSane(answer, `X-Request-Id ${JSON.stringify(requestId)}`);
      assert.match(String(answer.headers['x-request-id']), /^[A-Za-z0-9._:-]{8,128}$/);
    }
  });

  it('keeps Idempotency-Keys per tenant and environment: another tenant with the same key gets its own answer', async () => {
    const key = `shared-${newKey()}`;
    const body = (tenant: TestTenant) =>
      JSON.stringify({
        amount: 2,
        currency: 'USD',
        source: tenant.sandbox.usdWalletId,
        destination: tenant.sandbox.usdAccountId,
      });
    const post = (tenant: TestTenant) =>
      send(testApp.url, 'POST', '/v1/transfers', {
        headers: {
          authorization: `Bearer ${tenant.sandboxApiKey}`,
          'content-type': 'application/json',
          'idempotency-key': key,
        },
        body: body(tenant),
      });
    const first = await post(own);
    const second = await post(foreign);
    soft(first.status === 201, first.text);
    soft(second.status === 201, second.text);
    assert.notEqual(first.body.id, second.body.id);
    assert.equal(second.headers['idempotent-replayed'], undefined);
    // The foreign tenant cannot read the first one's transfer.
    assert.equal((await v1('GET', `/v1/transfers/${first.body.id}`, { key: foreign.sandboxApiKey })).status, 404);
    // Same key, another webhook route of the other tenant: its own fresh answer.
    const hook = await send(testApp.url, 'POST', '/v1/webhook_endpoints', {
      headers: {
        authorization: `Bearer ${foreign.sandboxApiKey}`,
        'content-type': 'application/json',
        'idempotency-key': `${key}-hook`,
      },
      body: JSON.stringify({ url: 'http://127.0.0.1:9/x' }),
    });
    const hookOther = await send(testApp.url, 'POST', '/v1/webhook_endpoints', {
      headers: {
        authorization: `Bearer ${own.sandboxApiKey}`,
        'content-type': 'application/json',
        'idempotency-key': `${key}-hook`,
      },
      body: JSON.stringify({ url: 'http://127.0.0.1:9/x' }),
    });
    assert.equal(hook.status, 201);
    assert.equal(hookOther.status, 201);
    assert.notEqual(hook.body.id, hookOther.body.id);
    assert.ok(hookOther.body.secret, "a fresh secret, not the other tenant's replay");
  });

  // ---------------------------------------------------------------------------------------------
  // Paths and query strings
  // ---------------------------------------------------------------------------------------------

  it("answers 404 (same as missing) for other tenants' and other environments' objects, and 4xx for odd IDs", async () => {
    const oddIds = [
      '',
      '.',
      '..',
      '%2e%2e',
      '%2E%2E%2F%2E%2E',
      'a%2Fb',
      '%00',
      '%ff',
      '%E0%A4%A',
      '%ED%A0%80',
      '%',
      '%%',
      '%uD800',
      'x'.repeat(100),
      'x'.repeat(101),
      'x'.repeat(5000),
      'tr_' + '0'.repeat(32),
      'wal_' + '0'.repeat(32),
      'sys_sandbox_funding_usd',
      'acct_%27%3B',
      "'",
      '"',
      '%20',
      '+',
      '*',
      'tr_*',
      'tr_%',
      '%5C',
      'null',
      'undefined',
      '__proto__',
      'constructor',
      '%F0%9F%98%80',
      '%C0%80',
    ];
    for (const route of fuzzable().filter((candidate) => candidate.resource)) {
      for (const id of oddIds) {
        const path = route.path.replace(/:([A-Za-z0-9_]+)/, id);
        const body = route.body
          ? JSON.stringify(route.operationId === 'resendWebhookEvent' ? { event: ids.event } : (route.example ?? {}))
          : undefined;
        assertSane(await routeCall(route, { path, ...(body ? { body } : {}) }), `${route.method} ${path.slice(0, 80)}`);
      }
      // Other prefixes: every other fixture's ID at this route.
      for (const [type, id] of Object.entries(ids)) {
        if (
          type === route.resource!.type ||
          (type === 'transfer' && route.resource!.type === 'rail_transfer') ||
          (type === 'rail_transfer' && route.resource!.type === 'transfer')
        )
          continue;
        const answer = await routeCall(route, {
          path: pathFor(route, id),
          ...(route.body
            ? {
                body: JSON.stringify(
                  route.operationId === 'resendWebhookEvent' ? { event: ids.event } : (route.example ?? {}),
                ),
              }
            : {}),
        });
        assertSane(answer, `${route.method} ${route.path} with a ${type} ID`);
        soft(answer.status === 404, `${route.method} ${route.path} with a ${type} ID: ${answer.text}`);
      }
      // Another tenant's object of the right type: 404, indistinguishable from a missing one.
      const body = route.body
        ? JSON.stringify(route.operationId === 'resendWebhookEvent' ? { event: ids.event } : (route.example ?? {}))
        : undefined;
      const foreignAnswer = await routeCall(route, {
        path: pathFor(route, foreignIds[route.resource!.type]),
        ...(body ? { body } : {}),
      });
      soft(foreignAnswer.status === 404, `${route.method} ${route.path} foreign: ${foreignAnswer.text}`);
      // The live key of the same company: sandbox objects do not exist there.
      if (route.auth.kind === 'api_key') {
        const live = await send(testApp.url, route.method, pathFor(route), {
          headers: {
            authorization: `Bearer ${ownLiveKey}`,
            ...(body ? { 'content-type': 'application/json' } : {}),
            ...(route.method === 'GET' ? {} : { 'idempotency-key': newKey() }),
          },
          ...(body ? { body } : {}),
        });
        assertSane(live, `${route.method} ${route.path} live key on a sandbox object`);
        soft([403, 404].includes(live.status), `${route.method} ${route.path} live key: ${live.status} ${live.text}`);
      }
    }
  });

  it("never lets a body name another tenant's objects", async () => {
    // (The Authorization test above may have deleted the fixture endpoint with a valid credential variant.)
    const endpoint = await v1('POST', '/v1/webhook_endpoints', { body: { url: 'http://127.0.0.1:9/again' } });
    ids.webhook_endpoint = endpoint.body.id;
    const cases: [string, unknown][] = [
      [
        'Shape B foreign source',
        { amount: 1, currency: 'USD', source: foreign.sandbox.usdWalletId, destination: own.sandbox.usdAccountId },
      ],
      [
        'Shape B foreign destination',
        { amount: 1, currency: 'USD', source: own.sandbox.usdWalletId, destination: foreign.sandbox.usdAccountId },
      ],
      [
        'Shape A foreign bank account',
        {
          source: { currency: 'USDC', rail: 'stablecoin', amount: '1.00' },
          destination: { currency: 'USD', rail: 'ach', account: foreign.sandbox.achAccountId },
        },
      ],
    ];
    for (const [label, body] of cases) {
      const answer = await v1('POST', '/v1/transfers', { body });
      assertSane(answer, label);
      soft(answer.status === 404, `${label}: ${answer.text}`);
    }
    const resend = await v1('POST', `/v1/webhook_endpoints/${ids.webhook_endpoint}/resend`, {
      body: { event: foreignIds.event },
    });
    assertSane(resend, 'resend a foreign event');
    soft(resend.status === 404, resend.text);
    const events = await v1('GET', `/v1/events?object=${foreignIds.transfer}`);
    assert.equal(events.status, 200);
    assert.deepEqual(events.body.data, []);
    const attempts = await v1(
      'GET',
      `/v1/webhook_endpoints/${ids.webhook_endpoint}/attempts?event=${foreignIds.event}`,
    );
    assert.equal(attempts.status, 200, attempts.text);
    assert.deepEqual(attempts.body.data, []);
  });

  it('validates limit and cursor on every list; forged and foreign cursors leak nothing', async () => {
    const lists = fuzzable().filter(
      (route) =>
        route.method === 'GET' &&
        route.query &&
        'shape' in (route.query as object) &&
        'cursor' in (route.query as any).shape,
    );
    assert.ok(lists.length >= 5);
    const forged = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');
    const queries = [
      'limit=0',
      'limit=-1',
      'limit=1e9',
      'limit=abc',
      'limit=',
      'limit=1.5',
      'limit=0x10',
      'limit=%201',
      'limit=101',
      'limit=1&limit=2',
      'limit[]=1',
      'limit=Infinity',
      'limit=NaN',
      'limit=１',
      'cursor=',
      'cursor=%%%',
      'cursor=' + 'A'.repeat(201),
      'cursor=' + 'A'.repeat(200),
      'cursor=' + forged({ i: 'zzzz' }),
      'cursor=' + forged({ i: 'tr_' + 'f'.repeat(32) }),
      'cursor=' + forged({ i: '' }),
      'cursor=' + forged({ i: 1 }),
      'cursor=' + forged({ i: ['a'] }),
      'cursor=' + forged({}),
      'cursor=' + forged(null),
      'cursor=' + forged('x'),
      'cursor=' + forged({ i: "' or 1=1 --" }),
      'cursor=' + forged({ i: 'a\u0000' }),
      'cursor=' + forged({ i: 'é' }),
      'cursor=' + forged({ i: 'x'.repeat(100) }),
      'cursor=' + forged({ i: 'x'.repeat(101) }),
      'cursor=' + forged({ i: 'a', extra: 1 }),
      'cursor=' + forged({ __proto__: { i: 'a' } }),
      'cursor=a&cursor=b',
      'unknown=1',
      '__proto__=1',
      'constructor=1',
      'limit=5&%00=1',
      'type=transfer.settled&type=transfer.failed',
      'status=settled',
      'created%5Bgte%5D=2026-01-01T00:00:00Z',
      'created[gte]=0000-01-01T00:00:00Z',
      'created[gte]=9999-12-31T23:59:59.999Z',
      'created[lt]=2026-02-30T00:00:00Z',
      'created[gte]=2026-01-01',
      'created[gte]=2026-01-01T00:00:00.123456789Z',
      'created[gte]=2026-01-01T00:00:00%2B14:00',
      'created[gte]=0001-01-01T00:00:00Z',
      'event=' + 'x'.repeat(101),
      'object=%00',
      'type=%ED%A0%80',
      'status=%ff',
      'rail=ACH',
      'rail=ach&rail=ach',
      'x'.repeat(8000) + '=1',
    ];
    for (const route of lists) {
      for (const query of queries) {
        const answer = await routeCall(route, { path: `${pathFor(route)}?${query}` });
        assertSane(answer, `${route.method} ${route.path}?${query.slice(0, 60)}`);
      }
    }
    // A cursor from another tenant's list, or another list, gives only this tenant's items.
    const foreignPage = await v1('GET', '/v1/transfers?limit=1', { key: foreign.sandboxApiKey });
    const ownAll = await v1('GET', '/v1/transfers?limit=100');
    const ownIds = new Set(ownAll.body.data.map((transfer: { id: string }) => transfer.id));
    for (const cursor of [
      foreignPage.body.next_cursor ?? forged({ i: foreignIds.transfer }),
      forged({ i: ids.event }),
      forged({ i: 'zzzz' }),
    ]) {
      for (const route of lists) {
        const answer = await routeCall(route, { path: `${pathFor(route)}?cursor=${cursor}` });
        assertSane(answer, `${route.path} foreign cursor`);
        const text = answer.text;
        for (const foreignId of Object.values(foreignIds))
          assert.ok(!text.includes(foreignId), `${route.path}: foreign ID ${foreignId} leaked`);
        if (route.path === '/v1/transfers' && answer.status === 200) {
          for (const transfer of answer.body.data)
            soft(ownIds.has(transfer.id), `foreign transfer ${transfer.id} listed`);
        }
      }
    }
    // The foreign tenant's lists never show this tenant's objects.
    for (const path of [
      '/v1/transfers?limit=100',
      '/v1/accounts?limit=100',
      '/v1/events?limit=100',
      '/v1/webhook_endpoints?limit=100',
    ]) {
      const answer = await v1('GET', path, { key: foreign.sandboxApiKey });
      assert.equal(answer.status, 200);
      for (const ownId of Object.values(ids))
        assert.ok(!answer.text.includes(ownId), `${path}: own ID ${ownId} in the foreign list`);
    }
  });

  it('fuzzes query strings of every route', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...fuzzable().filter((route) => route.method === 'GET')),
        fc.array(
          fc.tuple(
            fc.constantFrom(
              'limit',
              'cursor',
              'status',
              'rail',
              'type',
              'object',
              'event',
              'created[gte]',
              'created[lt]',
              'x',
              '__proto__',
            ),
            fc.oneof(fc.string(), fc.string({ unit: 'binary' }), fc.integer().map(String), fc.double().map(String)),
          ),
          { maxLength: 4 },
        ),
        async (route, pairs) => {
          const query = pairs
            .map(([name, value]) => `${encodeURIComponent(name)}=${encodeURIComponent(value)}`)
            .join('&');
          assertSane(
            await routeCall(route, { path: `${pathFor(route)}?${query}` }),
            `${route.path}?${query.slice(0, 100)}`,
          );
        },
      ),
      { numRuns: 300, seed: 42 },
    );
  });

  it('handles payouts (Shape A) end to end with Temporal unreachable: create, read, list, events, sandbox controls', async () => {
    const created: string[] = [];
    for (const [currency, amount, destinationCurrency] of [
      ['USDC', '1.00', 'USD'],
      ['USDC', '1.13', 'USD'],
      ['USDC', '1.14', 'USD'],
      ['USDC', '1.15', 'USD'],
      ['USDC', '0.000001', 'USD'],
      ['USDC', '9999.999999', 'USD'],
      ['USDC', '10000.000001', 'USD'],
      ['USDC', '999999999.999999', 'USD'],
      ['USDT', '1.00', 'USD'],
      ['USDC', '1.00', 'EUR'],
      ['USDC', '1.00', 'JPY'],
      ['USDC', '1.00', 'USDC'],
      ['USD', '1.00', 'USD'],
      ['JPY', '1', 'USD'],
      ['XXX', '1', 'USD'],
    ] as const) {
      const answer = await v1('POST', '/v1/transfers', {
        body: {
          source: { currency, rail: 'stablecoin', amount },
          destination: { currency: destinationCurrency, rail: 'ach', account: own.sandbox.achAccountId },
        },
      });
      assertSane(answer, `Shape A ${amount} ${currency}→${destinationCurrency}`);
      if (answer.status === 201) created.push(answer.body.id);
    }
    soft(created.length > 0, 'no payout was created');
    for (const id of created) {
      assertSane(await v1('GET', `/v1/transfers/${id}`), `GET payout ${id}`);
      assertSane(await v1('GET', `/v1/events?object=${id}`), `GET events of payout ${id}`);
    }
    assertSane(await v1('GET', '/v1/transfers?rail=ach&status=pending&limit=100'), 'list payouts');
    for (const action of ['settle', 'fail', 'return']) {
      const started = Date.now();
      const answer = await v1('POST', `/v1/sandbox/transfers/${created[0]}/${action}`, { body: {} }).catch(
        (error: Error) => error,
      );
      if (answer instanceof Error) {
        soft(
          false,
          `sandbox ${action} of a pending payout, Temporal unreachable: ${answer.message} after ${Date.now() - started} ms`,
        );
        continue;
      }
      assertSane(answer, `sandbox ${action} of a pending payout, Temporal unreachable (${Date.now() - started} ms)`);
      soft(Date.now() - started < 10_000, `sandbox ${action}: answered after ${Date.now() - started} ms`);
    }
  });

  it('keeps environments apart: the live key of the same company sees no sandbox object and no sandbox idempotency key', async () => {
    const key = `env-${newKey()}`;
    const sandbox = await v1('POST', '/v1/webhook_endpoints', {
      body: { url: 'http://127.0.0.1:9/env' },
      headers: { 'idempotency-key': key },
    });
    soft(sandbox.status === 201, `sandbox create: ${sandbox.text}`);
    const live = await v1('POST', '/v1/webhook_endpoints', {
      key: ownLiveKey,
      body: { url: 'http://127.0.0.1:9/env' },
      headers: { 'idempotency-key': key },
    });
    assertSane(live, "live create with the sandbox key's Idempotency-Key");
    soft(live.headers['idempotent-replayed'] === undefined, 'live replayed the sandbox answer');
    const shapeB = await v1('POST', '/v1/transfers', {
      key: ownLiveKey,
      body: { amount: 1, currency: 'USD', source: own.sandbox.usdWalletId, destination: own.sandbox.usdAccountId },
    });
    assertSane(shapeB, 'live Shape B between sandbox accounts');
    soft(shapeB.status === 404, `live Shape B between sandbox accounts: ${shapeB.status}`);
    for (const path of ['/v1/accounts', '/v1/transfers', '/v1/events', '/v1/webhook_endpoints']) {
      const answer = await v1('GET', `${path}?limit=100`, { key: ownLiveKey });
      assertSane(answer, `live ${path}`);
      for (const id of Object.values(ids)) soft(!answer.text.includes(id), `live ${path} shows sandbox ${id}`);
    }
  });

  it('refuses hostile webhook URLs with 4xx, quickly', async () => {
    const urls = [
      'javascript:alert(1)',
      'file:///etc/passwd',
      'http://169.254.169.254/latest/meta-data',
      'http://[::ffff:169.254.169.254]/',
      'http://0xa9.0xfe.0xa9.0xfe/',
      'http://2852039166/',
      'http://[fd00:ec2::254]/',
      'http://metadata.google.internal/',
      'http://user:pass@example.com/',
      'http://example.com:0/',
      'http://example.com:65536/',
      'http://example.com/#x',
      'http://example.com/#',
      'http://' + 'a'.repeat(63) + '.' + 'b'.repeat(63) + '.invalid/',
      'http://xn--/',
      'http://例え.テスト/' + '😀'.repeat(400),
      'http://a/' + '%'.repeat(2000),
      'http://nonexistent-host-for-review.invalid/',
      'http:///x',
      'http://[::]/',
      'http://0.0.0.0/',
      'gopher://x/',
      'ws://example.com/',
      ' http://example.com',
      'http://exa mple.com/',
      'http://example.com/\u0000',
    ];
    for (const url of urls) {
      const started = Date.now();
      const answer = await v1('POST', '/v1/webhook_endpoints', { body: { url } });
      assertSane(answer, `webhook url ${url.slice(0, 60)}`);
      soft(Date.now() - started < 10_000, `webhook url ${url.slice(0, 60)}: ${Date.now() - started} ms`);
      if (answer.status === 201) {
        soft(!/169\.254|metadata|\[fd00/.test(answer.body.url), `accepted ${answer.body.url}`);
        await v1('DELETE', `/v1/webhook_endpoints/${answer.body.id}`);
      }
    }
  });

  // ---------------------------------------------------------------------------------------------
  // Methods
  // ---------------------------------------------------------------------------------------------

  it('answers an unsupported method 405 with Allow (TRACE 501), consistently, whatever the body', async () => {
    const byPath = new Map<string, Set<string>>();
    for (const route of testApp.app.routes) {
      const path = route.resource ? pathFor(route) : route.path;
      if (!byPath.has(path)) byPath.set(path, new Set());
      byPath.get(path)!.add(route.method);
    }
    const inconsistent: string[] = [];
    for (const [path, methods] of byPath) {
      for (const method of [
        'GET',
        'POST',
        'PUT',
        'PATCH',
        'DELETE',
        'TRACE',
        'OPTIONS',
        'HEAD',
        'PROPFIND',
        'SEARCH',
        'QUERY',
      ]) {
        if (methods.has(method) || (method === 'HEAD' && methods.has('GET'))) continue;
        for (const [label, body, type] of [
          ['no body', undefined, undefined],
          ['JSON body', '{}', 'application/json'],
          ['malformed JSON', '{', 'application/json'],
          ['text body', 'hello', 'text/plain'],
          ['oversized body', JSON.stringify({ a: 'x'.repeat(300 * 1024) }), 'application/json'],
        ] as const) {
          const answer: Answer = await send(testApp.url, method, path, {
            headers: { authorization: `Bearer ${own.sandboxApiKey}`, ...(type ? { 'content-type': type } : {}) },
            ...(body !== undefined ? { body } : {}),
          }).catch((error: Error) => ({ status: -1, headers: {}, text: error.message, body: undefined }));
          if (answer.status === -1) {
            inconsistent.push(`${method} ${path} (${label}): ${answer.text}`);
            continue;
          }
          if (method === 'OPTIONS') {
            soft(
              [200, 204].includes(answer.status),
              `${method} ${path} (${label}): ${answer.status} ${answer.text.slice(0, 200)}`,
            );
            continue;
          }
          if (['PROPFIND', 'SEARCH', 'QUERY', 'TRACE'].includes(method)) {
            if (answer.status !== 501)
              inconsistent.push(`${method} ${path} (${label}): ${answer.status} ${answer.body?.code}`);
            continue;
          }
          assertSane(answer, `${method} ${path} (${label})`);
          if (answer.status !== 405 || !answer.headers.allow)
            inconsistent.push(`${method} ${path} (${label}): ${answer.status} ${answer.body?.code}`);
        }
      }
    }
    assert.deepEqual(inconsistent, [], inconsistent.join('\n'));
  });

  it('answers unknown paths 404 ROUTE_NOT_FOUND whatever the body', async () => {
    for (const path of [
      '/v1',
      '/v1/',
      '/v1/transfers/',
      '/v1//transfers',
      '/V1/transfers',
      '/v1/transfers/x/y',
      '/.well-known/',
      '/.well-known/jwks.json/',
      '/.well-known/../v1/accounts',
      '/%2e%2e/v1/accounts',
      '/admin',
      '/admin/payments/api-keys/',
      '/v2/transfers',
    ]) {
      for (const [body, type] of [
        [undefined, undefined],
        ['{', 'application/json'],
        ['hi', 'text/plain'],
      ] as const) {
        const answer = await send(testApp.url, 'POST', path, {
          headers: {
            authorization: `Bearer ${own.sandboxApiKey}`,
            'idempotency-key': newKey(),
            ...(type ? { 'content-type': type } : {}),
          },
          ...(body !== undefined ? { body } : {}),
        });
        assertSane(answer, `POST ${path} ${type ?? ''}`);
      }
      assertSane(
        await send(testApp.url, 'GET', path, { headers: { authorization: `Bearer ${own.sandboxApiKey}` } }),
        `GET ${path}`,
      );
    }
  });

  it('still answers after everything', async () => {
    assert.equal((await send(testApp.url, 'GET', '/healthz')).status, 200);
    const jwks = await send(testApp.url, 'GET', '/.well-known/jwks.json?x=1&__proto__=1&constructor=2');
    assert.equal(jwks.status, 200, jwks.text);
    for (const key of jwks.body.keys) assert.equal(key.d, undefined, 'no private member');
  });
});
