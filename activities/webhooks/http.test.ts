// Real local HTTP servers on 127.0.0.1 (port 0), no mocks of the network.
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { LookupFunction } from 'node:net';
import { after, describe, it } from 'node:test';
import { createWebhookSender } from './http.ts';
import type { WebhookHttpRequest } from './http.ts';

interface Received {
  method: string | undefined;
  url: string | undefined;
  headers: http.IncomingHttpHeaders;
  body: string;
}

interface TestServer {
  url: string;
  port: number;
  received: Received[];
  close(): Promise<void>;
}

const servers: TestServer[] = [];

/** A server on 127.0.0.1 that records every request it receives, then lets `handle` answer. */
async function startServer(
  handle: (request: http.IncomingMessage, response: http.ServerResponse) => void,
): Promise<TestServer> {
  const received: Received[] = [];
  const server = http.createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      received.push({
        method: request.method,
        url: request.url,
        headers: request.headers,
        body: Buffer.concat(chunks).toString('utf8'),
      });
      handle(request, response);
    });
  });
  server.on('connection', (socket) => socket.on('error', () => undefined));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const testServer: TestServer = {
    url: `http://127.0.0.1:${port}`,
    port,
    received,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  servers.push(testServer);
  return testServer;
}

/** A port nothing listens on: bound, then released. */
async function closedPort(): Promise<number> {
  const server = http.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** Resolves every name to one fixed address, as a DNS server that rebinds would. */
function lookupTo(address: string, family: 4 | 6): LookupFunction {
  return (_hostname, options, callback) => {
    if (options.all) callback(null, [{ address, family }]);
    else callback(null, address, family);
  };
}

after(async () => {
  await Promise.all(servers.map((server) => server.close()));
});

const local = createWebhookSender({ allowPrivate: true });
const strict = createWebhookSender({ allowPrivate: false });

function post(url: string, overrides: Partial<WebhookHttpRequest> = {}): WebhookHttpRequest {
  return { url, headers: {}, body: '{"type":"transfer.completed"}', timeoutMs: 5_000, ...overrides };
}

describe('webhook sender: answers', () => {
  it('delivers and reports a 2xx as ok', async () => {
    const server = await startServer((_request, response) => {
      response.writeHead(204).end();
    });
    const result = await local.send(post(`${server.url}/hooks`));
    assert.equal(result.ok, true);
    assert.equal(result.statusCode, 204);
    assert.equal(result.error, null);
    assert.equal(result.responseBody, '');
    assert.ok(Number.isInteger(result.latencyMs) && result.latencyMs >= 0);
    assert.equal(server.received.length, 1);
  });

  it('sends the headers and the body exactly', async () => {
    const server = await startServer((_request, response) => {
      response.writeHead(200, { 'content-type': 'text/plain' }).end('thanks');
    });
    const body = JSON.stringify({ id: 'evt_1', amount: '12.50', note: 'café ☕' });
    const result = await local.send(
      post(`${server.url}/hooks?tenant=1`, {
        body,
        headers: { 'Webhook-Id': 'msg_1', 'webhook-timestamp': '1700000000', 'webhook-signature': 'v1,abc=' },
      }),
    );
    assert.deepEqual(result, {
      ok: true,
      statusCode: 200,
      latencyMs: result.latencyMs,
      error: null,
      responseBody: 'thanks',
    });
    const [received] = server.received;
    assert.equal(received?.method, 'POST');
    assert.equal(received?.url, '/hooks?tenant=1');
    assert.equal(received?.body, body);
    assert.equal(received?.headers['content-type'], 'application/json');
    assert.equal(received?.headers['user-agent'], 'payments-webhooks/1');
    assert.equal(received?.headers['content-length'], String(Buffer.byteLength(body)));
    assert.equal(received?.headers['webhook-id'], 'msg_1');
    assert.equal(received?.headers['webhook-timestamp'], '1700000000');
    assert.equal(received?.headers['webhook-signature'], 'v1,abc=');
  });

  it('uses the configured user agent', async () => {
    const server = await startServer((_request, response) => response.end());
    await createWebhookSender({ allowPrivate: true, userAgent: 'acme-hooks/2' }).send(post(server.url));
    assert.equal(server.received[0]?.headers['user-agent'], 'acme-hooks/2');
  });

  it('reports a 500 as a failure and keeps its body', async () => {
    const server = await startServer((_request, response) => {
      response.writeHead(500).end('database on fire');
    });
    const result = await local.send(post(server.url));
    assert.equal(result.ok, false);
    assert.equal(result.statusCode, 500);
    assert.equal(result.error, 'HTTP 500');
    assert.equal(result.responseBody, 'database on fire');
  });

  it('keeps only 1024 bytes of a huge answer and stops reading it', async () => {
    let bytesWritten = 0;
    let stopped = false;
    const server = await startServer((_request, response) => {
      response.writeHead(200, { 'content-type': 'text/plain' });
      const chunk = Buffer.alloc(64 * 1024, 'x');
      const total = 5 * 1024 * 1024;
      const write = () => {
        while (bytesWritten < total) {
          bytesWritten += chunk.length;
          if (!response.write(chunk)) {
            response.once('drain', write);
            return;
          }
        }
        response.end();
      };
      response.on('close', () => (stopped = bytesWritten < total));
      write();
    });
    const startedAt = Date.now();
    const result = await local.send(post(server.url));
    assert.equal(result.ok, true);
    assert.equal(result.responseBody, 'x'.repeat(1024));
    assert.ok(Date.now() - startedAt < 2_000, 'returns without waiting for the rest');
    // The sender hung up: the server could not write all 5 MB.
    await new Promise((resolve) => setTimeout(resolve, 100));
    assert.equal(stopped, true);
  });

  it('cuts a multi-byte UTF-8 answer on a character boundary', async () => {
    // 1023 ASCII bytes then "€" (3 bytes): byte 1024 is inside the euro sign.
    const server = await startServer((_request, response) => {
      response.writeHead(400).end(`${'a'.repeat(1023)}€ and more`);
    });
    const result = await local.send(post(server.url));
    assert.equal(result.statusCode, 400);
    assert.equal(result.responseBody, 'a'.repeat(1023));
    assert.ok(!result.responseBody.includes('\uFFFD'));
  });

  it('cuts on a boundary with a smaller limit and 4-byte characters', async () => {
    const server = await startServer((_request, response) => response.end('😀😀😀'));
    const result = await createWebhookSender({ allowPrivate: true, maxResponseBytes: 10 }).send(post(server.url));
    assert.equal(result.responseBody, '😀😀');
  });

  it('keeps an answer of exactly the limit whole', async () => {
    const server = await startServer((_request, response) => response.end('é'.repeat(512)));
    const result = await local.send(post(server.url));
    assert.equal(result.responseBody, 'é'.repeat(512));
  });

  it('keeps only text PostgreSQL can store: no NUL, and at most the limit once invalid bytes are decoded', async () => {
    // Either used to fail the attempt's closing statement after a 2xx, so the activity sent again
    // (96 requests for one event) and the endpoint was disabled.
    const nul = await startServer((_request, response) => response.end(Buffer.from('ok\u0000done')));
    const withNul = await local.send(post(nul.url));
    assert.equal(withNul.ok, true);
    assert.equal(withNul.responseBody, 'ok\uFFFDdone');
    const latin1 = await startServer((_request, response) => response.end(Buffer.alloc(400, 0xe9)));
    const invalid = await local.send(post(latin1.url));
    assert.equal(invalid.ok, true);
    assert.ok(
      Buffer.byteLength(invalid.responseBody, 'utf8') <= 1024,
      `${Buffer.byteLength(invalid.responseBody)} bytes`,
    );
    assert.match(invalid.responseBody, /^\uFFFD+$/);
  });

  it('reports a status outside 100–599 as a failure with no status', async () => {
    const server = await startServer((_request, response) => response.writeHead(999).end('x'));
    const result = await local.send(post(server.url));
    assert.equal(result.ok, false);
    assert.equal(result.statusCode, null);
    assert.equal(result.error, 'invalid HTTP status 999');
  });

  it('does not follow a redirect, and the redirect target receives nothing', async () => {
    const target = await startServer((_request, response) => response.end('should not be reached'));
    const server = await startServer((_request, response) => {
      response.writeHead(302, { location: `${target.url}/elsewhere` }).end();
    });
    const result = await local.send(post(server.url));
    assert.equal(result.ok, false);
    assert.equal(result.statusCode, 302);
    assert.equal(result.error, `redirect not followed (Location: ${target.url}/elsewhere)`);
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.equal(target.received.length, 0);
  });

  it('truncates a long Location to 200 characters', async () => {
    const location = `https://example.com/${'a'.repeat(500)}`;
    const server = await startServer((_request, response) => {
      response.writeHead(307, { location }).end();
    });
    const result = await local.send(post(server.url));
    const shown = /^redirect not followed \(Location: (.*)\)$/.exec(result.error ?? '')?.[1];
    assert.equal(shown?.length, 200);
    assert.ok(location.startsWith(shown.slice(0, -1)));
  });
});

describe('webhook sender: network failures', () => {
  it('times out a server that never answers', async () => {
    const server = await startServer(() => undefined); // reads the request, never answers
    const result = await local.send(post(server.url, { timeoutMs: 200 }));
    assert.deepEqual(
      { ok: result.ok, statusCode: result.statusCode, error: result.error },
      { ok: false, statusCode: null, error: 'timeout after 200 ms' },
    );
    assert.ok(result.latencyMs >= 190 && result.latencyMs < 2_000, `latency ${result.latencyMs}`);
  });

  it('times out a body that never ends, keeping the status', async () => {
    const server = await startServer((_request, response) => {
      response.writeHead(200, { 'content-type': 'text/plain' });
      response.write('partial');
    });
    const result = await local.send(post(server.url, { timeoutMs: 200 }));
    assert.equal(result.ok, false);
    assert.equal(result.statusCode, 200);
    assert.equal(result.error, 'timeout after 200 ms');
    assert.equal(result.responseBody, 'partial');
  });

  it('reports a refused connection', async () => {
    const port = await closedPort();
    const result = await local.send(post(`http://127.0.0.1:${port}/`));
    assert.equal(result.ok, false);
    assert.equal(result.statusCode, null);
    assert.equal(result.error, `connection refused (127.0.0.1:${port})`);
  });

  it('reports a DNS failure', async () => {
    const result = await local.send(post('http://webhook-target.invalid/', { timeoutMs: 3_000 }));
    assert.equal(result.ok, false);
    assert.match(result.error ?? '', /^(DNS lookup failed for webhook-target\.invalid|timeout)/);
  });

  it('reports a TLS failure (https to a plain HTTP server)', async () => {
    const server = await startServer((_request, response) => response.end());
    const result = await local.send(post(`https://127.0.0.1:${server.port}/`));
    assert.equal(result.ok, false);
    assert.equal(result.error, 'TLS error: wrong version number (EPROTO)');
    assert.ok((result.error ?? '').length <= 500);
  });

  it('reports an invalid URL instead of throwing', async () => {
    assert.equal((await local.send(post('not a url'))).error, 'invalid URL');
    assert.equal((await local.send(post('ftp://example.com/'))).error, 'invalid URL scheme ftp:');
  });
});

describe('webhook sender: SSRF', () => {
  it('blocks 127.0.0.1 before connecting when private targets are not allowed', async () => {
    const server = await startServer((_request, response) => response.end());
    const result = await strict.send(post(`${server.url}/hooks`));
    assert.equal(result.ok, false);
    assert.equal(result.statusCode, null);
    assert.equal(result.error, 'blocked: 127.0.0.1 is not a public address');
    assert.equal(server.received.length, 0);
  });

  it('blocks localhost and IPv4-mapped spellings of loopback', async () => {
    const server = await startServer((_request, response) => response.end());
    for (const url of [
      `http://localhost:${server.port}/`,
      `http://[::ffff:127.0.0.1]:${server.port}/`,
      `http://2130706433:${server.port}/`,
    ]) {
      const result = await strict.send(post(url));
      assert.match(result.error ?? '', /^blocked: /, url);
    }
    assert.equal(server.received.length, 0);
  });

  it('delivers to 127.0.0.1 when private targets are allowed', async () => {
    const server = await startServer((_request, response) => response.end('ok'));
    const result = await local.send(post(server.url));
    assert.equal(result.ok, true);
    assert.equal(server.received.length, 1);
  });

  it('blocks a name that resolves to 127.0.0.1 at connection time (DNS rebinding), with the agent’s reason', async () => {
    // The registration check saw a public answer; at delivery the resolver answers 127.0.0.1.
    const server = await startServer((_request, response) => response.end());
    const sender = createWebhookSender({ allowPrivate: false, lookup: lookupTo('127.0.0.1', 4) });
    const result = await sender.send(post(`http://hooks.rebind.example:${server.port}/`, { timeoutMs: 2_000 }));
    assert.equal(result.ok, false);
    assert.equal(result.statusCode, null);
    assert.match(result.error ?? '', /^blocked: .*127\.0\.0\.1.*hooks\.rebind\.example.*private IP address/);
    assert.equal(server.received.length, 0);
  });

  it('delivers to the same rebinding name when private targets are allowed (the lookup is really used)', async () => {
    const server = await startServer((_request, response) => response.end());
    const sender = createWebhookSender({ allowPrivate: true, lookup: lookupTo('127.0.0.1', 4) });
    const result = await sender.send(post(`http://hooks.rebind.example:${server.port}/`, { timeoutMs: 2_000 }));
    assert.equal(result.ok, true, result.error ?? '');
    assert.equal(server.received[0]?.headers.host, `hooks.rebind.example:${server.port}`);
  });

  it('blocks a name resolving to an IPv6 address outside 2000::/3 that ipaddr.js calls unicast', async () => {
    const sender = createWebhookSender({ allowPrivate: false, lookup: lookupTo('::7f00:1', 6) });
    const result = await sender.send(post('http://compat.example/', { timeoutMs: 1_000 }));
    assert.equal(result.error, 'blocked: compat.example resolves to ::7f00:1 is not a public address');
  });

  const metadataUrls = [
    'http://169.254.169.254/latest/meta-data/',
    'http://[fd00:ec2::254]/latest/meta-data/',
    'http://100.100.100.200/latest/meta-data/',
    'http://[::ffff:169.254.169.254]/latest/meta-data/',
  ];
  for (const url of metadataUrls) {
    it(`refuses the metadata address ${url} even when private targets are allowed`, async () => {
      const result = await local.send(post(url, { timeoutMs: 500 }));
      assert.equal(result.ok, false);
      assert.equal(result.statusCode, null);
      assert.match(result.error ?? '', /^blocked: .*cloud metadata address/);
      assert.ok(result.latencyMs < 400, 'refused without waiting for the timeout');
    });
  }

  it('refuses a name that resolves to the metadata address, even when private targets are allowed', async () => {
    for (const [address, family] of [
      ['169.254.169.254', 4],
      ['::ffff:169.254.169.254', 6],
    ] as const) {
      const sender = createWebhookSender({ allowPrivate: true, lookup: lookupTo(address, family) });
      const result = await sender.send(post('http://imds.example/latest/meta-data/', { timeoutMs: 500 }));
      assert.match(result.error ?? '', /^blocked: imds\.example resolves to .* cloud metadata address/, address);
    }
  });
});
