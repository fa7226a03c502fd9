// The one place that reads process.env. Every process parses its configuration once, at start.
import { resolve } from 'node:path';
import { z } from 'zod';

const ZPort = z.coerce.number().int().min(0).max(65_535);
const ZPositiveInt = z.coerce.number().int().positive();

/**
 * How much longer than TRANSFER_OUTCOME_WAIT_MS the idempotency lease must be. A Shape A transfer
 * (POST /v1/transfers to a bank account) holds its key through: the transaction that claims the key
 * and places the hold; the settlement workflow's start and outcome, bounded by the outcome wait plus
 * the 2 s start margin (START_MARGIN_MS in services/rail-transfers.ts); the transaction that records
 * the response. 5 s covers the start margin and both transactions, with room to spare.
 */
export const IDEMPOTENCY_LEASE_MARGIN_MS = 5_000;

const ZConfigFields = z.object({
  NODE_ENV: z.enum(['development', 'test', 'production']).default('development'),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  HOST: z.string().min(1).default('127.0.0.1'),
  PORT: ZPort.default(3000),
  DATA_DIR: z.string().min(1).default('.data'),
  DATABASE_URL: z.url().optional(),
  /**
   * What the API and the worker connect with: a login of the role payments_app itself. Without it
   * they connect with DATABASE_URL and switch to payments_app at connection start, and a login user
   * allowed to switch to payments_app may also switch back to itself. `npm start` sets it for the
   * embedded PostgreSQL.
   */
  DATABASE_APP_URL: z.url().optional(),
  /**
   * `npm run db:migrate` only: after migrating, lets payments_app log in with this password (what a
   * deployment's DATABASE_APP_URL then carries), so the API and the worker never hold the owner's
   * credentials. docker-compose.yml sets it from PAYMENTS_APP_PASSWORD.
   */
  DATABASE_APP_PASSWORD: z.string().min(16, 'at least 16 characters').max(200).optional(),
  DATABASE_POOL_MAX: ZPositiveInt.max(200).default(10),
  /**
   * Shape B group commit (db/ledger-batch.ts): batches of ledger transfers in the database at once
   * (the transfers arriving meanwhile wait and go together), and transfers per batch at most.
   */
  LEDGER_BATCH_IN_FLIGHT_MAX: ZPositiveInt.max(199).optional(),
  LEDGER_BATCH_MAX: ZPositiveInt.max(1000).default(32),
  // Transfers waiting for a batch at most, all companies and one company: beyond, 429 LEDGER_BUSY.
  LEDGER_QUEUE_MAX: ZPositiveInt.max(1_000_000).default(4096),
  LEDGER_QUEUE_MAX_PER_COMPANY: ZPositiveInt.max(1_000_000).default(1024),
  DATABASE_CONNECT_TIMEOUT_S: ZPositiveInt.max(120).default(10),
  DATABASE_IDLE_TIMEOUT_S: ZPositiveInt.max(3600).default(30),
  DATABASE_STATEMENT_TIMEOUT_MS: ZPositiveInt.max(600_000).default(10_000),
  EMBEDDED_POSTGRES_PORT: ZPort.default(5433),
  TEMPORAL_ADDRESS: z.string().min(1).optional(),
  TEMPORAL_NAMESPACE: z.string().min(1).default('default'),
  TEMPORAL_PORT: ZPort.default(7233),
  TEMPORAL_UI_PORT: ZPort.default(8233),
  TEMPORAL_CONNECT_TIMEOUT_MS: ZPositiveInt.max(120_000).default(10_000),
  TEMPORAL_CLI_PATH: z.string().min(1).optional(),
  TEMPORAL_TEST_SERVER_PATH: z.string().min(1).optional(),
  HTTP_BODY_LIMIT_BYTES: ZPositiveInt.max(10 * 1024 * 1024).default(256 * 1024),
  HTTP_REQUEST_TIMEOUT_MS: ZPositiveInt.max(300_000).default(30_000),
  HTTP_HEADERS_TIMEOUT_MS: ZPositiveInt.max(120_000).default(15_000),
  HTTP_KEEP_ALIVE_TIMEOUT_MS: ZPositiveInt.max(120_000).default(5_000),
  SESSION_TTL_MINUTES: ZPositiveInt.max(7 * 24 * 60).default(12 * 60),
  LOGIN_THROTTLE_AFTER_FAILURES: ZPositiveInt.max(100).default(5),
  LOGIN_LOCK_AFTER_FAILURES: ZPositiveInt.max(1000).default(10),
  LOGIN_LOCK_MINUTES: ZPositiveInt.max(7 * 24 * 60).default(60),
  LOGIN_EMAIL_THROTTLE_AFTER_FAILURES: ZPositiveInt.max(10_000).default(50),
  LOGIN_EMAIL_LOCK_AFTER_FAILURES: ZPositiveInt.max(10_000).default(100),
  // 1 when a proxy in front sets X-Forwarded-For: the client's address is then the one it appended.
  TRUST_PROXY: z.enum(['0', '1']).default('0'),
  IDEMPOTENCY_TTL_HOURS: ZPositiveInt.min(24)
    .max(24 * 30)
    .default(24),
  IDEMPOTENCY_LEASE_MS: ZPositiveInt.min(1000).max(600_000).default(60_000),
  // Retries answered from memory (api/middleware/replay-cache.ts): how long, 0 = off, and how much.
  IDEMPOTENCY_REPLAY_CACHE_SECONDS: z.coerce.number().int().min(0).max(3_600).default(300),
  IDEMPOTENCY_REPLAY_CACHE_MB: ZPositiveInt.max(4_096).default(32),
  TRANSFER_OUTCOME_WAIT_MS: ZPositiveInt.max(10_000).default(3_000),
  SHUTDOWN_TIMEOUT_MS: ZPositiveInt.max(120_000).default(20_000),
  PUBLIC_BASE_URL: z.url().optional(),
  // Webhooks. Private, loopback and link-local targets are refused unless this is 1 (local development only).
  ALLOW_PRIVATE_WEBHOOK_URLS: z.enum(['0', '1']).default('0'),
  WEBHOOK_ATTEMPT_TIMEOUT_MS: ZPositiveInt.min(1000).max(30_000).default(15_000),
  WEBHOOK_MAX_IN_FLIGHT_PER_ENDPOINT: ZPositiveInt.max(100).default(10),
  WEBHOOK_MAX_PAYLOAD_BYTES: ZPositiveInt.min(1024)
    .max(1024 * 1024)
    .default(256 * 1024),
  WEBHOOK_ENDPOINTS_MAX: ZPositiveInt.max(100).default(16),
  WEBHOOK_DISPATCH_INTERVAL_MS: ZPositiveInt.min(10).max(60_000).default(250),
});

/** The variables, and the rules between them. */
export const ZConfig = ZConfigFields.superRefine((config, context) => {
  if (
    config.LEDGER_BATCH_IN_FLIGHT_MAX !== undefined &&
    config.LEDGER_BATCH_IN_FLIGHT_MAX >= config.DATABASE_POOL_MAX
  ) {
    context.addIssue({
      code: 'custom',
      path: ['LEDGER_BATCH_IN_FLIGHT_MAX'],
      message: `must be less than DATABASE_POOL_MAX (${config.DATABASE_POOL_MAX}): ledger batches may not take every connection`,
    });
  }
  if (config.LEDGER_QUEUE_MAX_PER_COMPANY > config.LEDGER_QUEUE_MAX) {
    context.addIssue({
      code: 'custom',
      path: ['LEDGER_QUEUE_MAX_PER_COMPANY'],
      message: `may not exceed LEDGER_QUEUE_MAX (${config.LEDGER_QUEUE_MAX})`,
    });
  }
  const leaseMin = config.TRANSFER_OUTCOME_WAIT_MS + IDEMPOTENCY_LEASE_MARGIN_MS;
  if (config.IDEMPOTENCY_LEASE_MS < leaseMin) {
    context.addIssue({
      code: 'custom',
      path: ['IDEMPOTENCY_LEASE_MS'],
      message:
        `must be at least TRANSFER_OUTCOME_WAIT_MS + ${IDEMPOTENCY_LEASE_MARGIN_MS} ms (${leaseMin}): a Shape A ` +
        'transfer holds its key while it waits for the outcome, and a shorter lease lets a retry take the key ' +
        'over from a request that is still running',
    });
  }
});

export type TConfig = z.infer<typeof ZConfig> & { dataDir: string };

/**
 * Ledger batches in the database at once: LEDGER_BATCH_IN_FLIGHT_MAX, else 8 (the benchmark's best
 * on 2 cores) with two of the pool's connections always left for everything else.
 */
export function ledgerBatchInFlight(config: Pick<TConfig, 'LEDGER_BATCH_IN_FLIGHT_MAX' | 'DATABASE_POOL_MAX'>): number {
  return config.LEDGER_BATCH_IN_FLIGHT_MAX ?? Math.max(1, Math.min(8, config.DATABASE_POOL_MAX - 2));
}

export class ConfigError extends Error {
  override readonly name = 'ConfigError';
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): TConfig {
  const parsed = ZConfig.safeParse(env);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((issue) => `  ${issue.path.join('.')}: ${issue.message}`);
    throw new ConfigError(`invalid configuration:\n${lines.join('\n')}`);
  }
  return { ...parsed.data, dataDir: resolve(parsed.data.DATA_DIR) };
}

/** Environment overrides a parent process hands to a child it starts (never secrets in defaults). */
export function childEnv(overrides: Record<string, string | undefined>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const [key, value] of Object.entries(overrides)) {
    if (value === undefined) delete env[key];
    else env[key] = value;
  }
  return env;
}
