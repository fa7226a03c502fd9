import type { Server } from 'node:http';
import { pino } from 'pino';
import { Client, Connection } from '@temporalio/client';
import { PEGGED_RATES } from '../services/quotes.ts';
import { createApp, type App } from '../api/app.ts';
import { createIdempotency, type Idempotency } from '../api/middleware/idempotency.ts';
import { closeServer, listen } from '../api/server.ts';
import { createLedgerBatcher, type LedgerWrite } from '../db/ledger-batch.ts';
import { type Sql } from '../db/client.ts';
import { DEFAULT_LOGIN_POLICY, type LoginPolicy } from '../services/auth.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { provisionTenant, type ProvisionedTenant } from '../services/tenants.ts';
import { createTransferSigner, type TransferSigner } from '../services/signing.ts';
import { createTestDatabase, type TestDatabase, createAppRoleSql } from './db.ts';
import type { WebhookEndpointPolicy } from '../services/webhook-endpoints.ts';

export interface TestApp {
  url: string;
  app: App;
  database: TestDatabase;
  /** Owner connection: sees every company (for seeding and checking). */
  ownerSql: Sql;
  /** The app's own pool, as `payments_app` under row-level security. */
  appSql: Sql;
  signer: TransferSigner;
  /** The app's idempotency layer: clearReplayCache() after deleting a key's row by hand. */
  idempotency: Idempotency;
  close(): Promise<void>;
}

/** The real app on a real listener, over a private database, with the app pool under RLS. */
export async function startTestApp(
  options: {
    loginPolicy?: Partial<LoginPolicy>;
    temporal?: Client;
    outcomeWaitMs?: number;
    /** Default: private targets allowed (tests deliver to local receivers), 16 endpoints. */
    webhooks?: Partial<WebhookEndpointPolicy>;
    trustProxy?: boolean;
    /** Wraps the Shape B ledger writer (the real batcher), to make it refuse or fail on cue. */
    ledger?: (write: LedgerWrite) => LedgerWrite;
  } = {},
): Promise<TestApp> {
  const database = await createTestDatabase();
  const appSql = createAppRoleSql(database.url, { applicationName: 'payments-test-api', poolMax: 10 });
  const signer = createTransferSigner({ sql: appSql });
  // As api/main.ts configures it by default: retries of this app's writes are answered from memory.
  const idempotency = createIdempotency({
    sql: appSql,
    options: {
      ttlMs: 24 * 60 * 60 * 1000,
      leaseMs: 60_000,
      replayCache: { ttlMs: 300_000, maxBytes: 8 * 1024 * 1024 },
    },
  });
  const app = createApp({
    // LOG_LEVEL=error npm test -- file shows the app's errors (npm test sets it to silent by default).
    logger: pino({ level: process.env.LOG_LEVEL ?? 'silent' }),
    sql: appSql,
    signer,
    ledger: (options.ledger ?? ((write: LedgerWrite) => write))(
      createLedgerBatcher(appSql, { inFlightMax: 4, batchMax: 32, queueMax: 4096, companyQueueMax: 1024 }).write,
    ),
    rails: {
      // Tests that start settlement workflows pass a time-skipping environment's client; for the
      // others a lazy connection that is never used never connects.
      temporal: options.temporal ?? new Client({ connection: Connection.lazy({ address: '127.0.0.1:1' }) }),
      fxRates: PEGGED_RATES,
      logger: pino({ level: process.env.LOG_LEVEL ?? 'silent' }),
      outcomeWaitMs: options.outcomeWaitMs ?? 3_000,
    },
    readiness: { postgres: async () => true },
    limits: { bodyLimitBytes: 256 * 1024 },
    ...(options.trustProxy ? { trustProxy: true } : {}),
    webhooks: { allowPrivateUrls: true, maxEndpoints: 16, ...options.webhooks },
    loginPolicy: { ...DEFAULT_LOGIN_POLICY, ...options.loginPolicy },
    idempotency,
  });
  const { server, url }: { server: Server; url: string } = await listen(app.koa, {
    host: '127.0.0.1',
    port: 0,
    requestTimeoutMs: 10_000,
    headersTimeoutMs: 10_000,
    keepAliveTimeoutMs: 1_000,
  });
  return {
    url,
    app,
    database,
    ownerSql: database.sql,
    appSql,
    signer,
    idempotency,
    async close() {
      await closeServer(server);
      await appSql.end({ timeout: 5 });
      await database.drop();
    },
  };
}

let tenantCounter = 0;

export interface TestTenant extends ProvisionedTenant {
  /** Signs in as this tenant's owner (or another operator) and returns the bearer token. */
  token: string;
}

export async function provisionTestTenant(
  testApp: TestApp,
  options: { isMasterCompany?: boolean } = {},
): Promise<TestTenant> {
  tenantCounter += 1;
  const tenant = await provisionTenant(
    testApp.ownerSql,
    {
      name: `Tenant ${tenantCounter}`,
      ownerEmail: `owner${tenantCounter}-${process.pid}@tenant.example`,
      isMasterCompany: options.isMasterCompany ?? false,
    },
    SYSTEM_ACTOR,
  );
  const token = await signIn(testApp, tenant.owner.email, tenant.ownerPassword);
  return { ...tenant, token };
}

export async function signIn(testApp: TestApp, email: string, password: string): Promise<string> {
  const response = await fetch(`${testApp.url}/admin/auth/login`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ email, password }),
  });
  if (response.status !== 200) throw new Error(`sign-in failed: ${response.status} ${await response.text()}`);
  return ((await response.json()) as { token: string }).token;
}

/** fetch with a bearer token and JSON. */
export async function call(
  testApp: TestApp,
  method: string,
  path: string,
  options: { token?: string; body?: unknown; headers?: Record<string, string> } = {},
): Promise<{ status: number; body: any; headers: Headers }> {
  const response = await fetch(`${testApp.url}${path}`, {
    method,
    headers: {
      ...(options.token ? { authorization: `Bearer ${options.token}` } : {}),
      ...(options.body !== undefined ? { 'content-type': 'application/json' } : {}),
      ...options.headers,
    },
    ...(options.body !== undefined ? { body: JSON.stringify(options.body) } : {}),
  });
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : undefined, headers: response.headers };
}
