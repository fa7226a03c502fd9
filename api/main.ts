// Production entry point of the HTTP API: `npm run start:api`.
import { ledgerBatchInFlight, loadConfig } from '../platform/config.ts';
import { createLogger } from '../platform/logger.ts';
import { notifyReady, onShutdown } from '../platform/lifecycle.ts';
import { connectTemporalClient, pingTemporal } from '../platform/temporal.ts';
import { appDatabaseOptions, createSql, pingDatabase } from '../db/client.ts';
import { DEFAULT_LOGIN_POLICY } from '../services/auth.ts';
import { createIdempotency } from './middleware/idempotency.ts';
import { createLedgerBatcher } from '../db/ledger-batch.ts';
import { createTransferSigner } from '../services/signing.ts';
import { PEGGED_RATES } from '../services/quotes.ts';
import { createApp } from './app.ts';
import { closeServer, listen } from './server.ts';

const config = loadConfig();
const logger = createLogger({ level: config.LOG_LEVEL, name: 'api' });
if (!config.DATABASE_APP_URL && !config.DATABASE_URL) {
  logger.fatal('DATABASE_APP_URL or DATABASE_URL is required (`npm start` runs an embedded PostgreSQL and sets both)');
  process.exit(1);
}
const temporalAddress = config.TEMPORAL_ADDRESS ?? `127.0.0.1:${config.TEMPORAL_PORT}`;
// The API's pool runs as payments_app: row-level security applies to every query it makes.
const sql = createSql(appDatabaseOptions(config, 'payments-api'));
const temporal = await connectTemporalClient({
  address: temporalAddress,
  namespace: config.TEMPORAL_NAMESPACE,
  connectTimeoutMs: config.TEMPORAL_CONNECT_TIMEOUT_MS,
});

const signer = createTransferSigner({ sql });
await signer.warm();
const app = createApp({
  logger,
  sql,
  loginPolicy: {
    ...DEFAULT_LOGIN_POLICY,
    sessionTtlMs: config.SESSION_TTL_MINUTES * 60_000,
    throttleAfterFailures: config.LOGIN_THROTTLE_AFTER_FAILURES,
    lockAfterFailures: config.LOGIN_LOCK_AFTER_FAILURES,
    lockMs: config.LOGIN_LOCK_MINUTES * 60_000,
    emailThrottleAfterFailures: config.LOGIN_EMAIL_THROTTLE_AFTER_FAILURES,
    emailLockAfterFailures: config.LOGIN_EMAIL_LOCK_AFTER_FAILURES,
  },
  trustProxy: config.TRUST_PROXY === '1',
  signer,
  ledger: createLedgerBatcher(sql, {
    inFlightMax: ledgerBatchInFlight(config),
    batchMax: config.LEDGER_BATCH_MAX,
    queueMax: config.LEDGER_QUEUE_MAX,
    companyQueueMax: config.LEDGER_QUEUE_MAX_PER_COMPANY,
  }).write,
  rails: { temporal: temporal.client, fxRates: PEGGED_RATES, logger, outcomeWaitMs: config.TRANSFER_OUTCOME_WAIT_MS },
  idempotency: createIdempotency({
    sql,
    options: {
      ttlMs: config.IDEMPOTENCY_TTL_HOURS * 3_600_000,
      leaseMs: config.IDEMPOTENCY_LEASE_MS,
      replayCache: {
        ttlMs: config.IDEMPOTENCY_REPLAY_CACHE_SECONDS * 1_000,
        maxBytes: config.IDEMPOTENCY_REPLAY_CACHE_MB * 1024 * 1024,
      },
    },
  }),
  readiness: {
    postgres: () => pingDatabase(sql),
    temporal: () => pingTemporal(temporal.connection, config.TEMPORAL_NAMESPACE, 2_000),
  },
  limits: { bodyLimitBytes: config.HTTP_BODY_LIMIT_BYTES },
  webhooks: { allowPrivateUrls: config.ALLOW_PRIVATE_WEBHOOK_URLS === '1', maxEndpoints: config.WEBHOOK_ENDPOINTS_MAX },
});
const { server, url } = await listen(app.koa, {
  host: config.HOST,
  port: config.PORT,
  requestTimeoutMs: config.HTTP_REQUEST_TIMEOUT_MS,
  headersTimeoutMs: config.HTTP_HEADERS_TIMEOUT_MS,
  keepAliveTimeoutMs: config.HTTP_KEEP_ALIVE_TIMEOUT_MS,
});

onShutdown(logger, config.SHUTDOWN_TIMEOUT_MS, async () => {
  await closeServer(server);
  await Promise.allSettled([temporal.close(), sql.end({ timeout: 5 })]);
});
logger.info({ url }, 'api listening');
notifyReady({ service: 'api', url });
