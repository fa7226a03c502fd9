import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type Koa from 'koa';

export interface ServerLimits {
  requestTimeoutMs: number;
  headersTimeoutMs: number;
  keepAliveTimeoutMs: number;
}

/** A Node HTTP server for the app with every timeout set explicitly. */
export async function listen(koa: Koa, options: { host: string; port: number } & ServerLimits): Promise<{ server: Server; url: string }> {
  const server = createServer(
    { requestTimeout: options.requestTimeoutMs, headersTimeout: options.headersTimeoutMs, maxHeaderSize: 16 * 1024 },
    // eslint-disable-next-line @typescript-eslint/no-misused-promises -- Koa's callback handles its own rejections
    koa.callback(),
  );
  server.keepAliveTimeout = options.keepAliveTimeoutMs;
  server.maxRequestsPerSocket = 1000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  return { server, url: `http://${host}:${address.port}` };
}

/** Stops accepting connections, lets in-flight requests finish, then closes idle keep-alives. */
export async function closeServer(server: Server): Promise<void> {
  await new Promise<void>((resolve) => {
    server.close(() => resolve());
    server.closeIdleConnections();
  });
}
