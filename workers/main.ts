// Production entry point of the worker: `npm run start:worker`.
import { join } from 'node:path';
import { NativeConnection, Runtime, DefaultLogger } from '@temporalio/worker';
import { connectTemporalClient } from '../platform/temporal.ts';
import { loadConfig } from '../platform/config.ts';
import { createLogger } from '../platform/logger.ts';
import { notifyReady, onShutdown } from '../platform/lifecycle.ts';
import { appDatabaseOptions, createSql } from '../db/client.ts';
import { loadWorkflowBundle } from './bundle.ts';
import { createWorker } from './worker.ts';
import { ensureSystemWorkflows } from './system-workflows.ts';
import { startWebhookDispatcher } from './webhook-dispatcher.ts';
import { createWebhookSender } from '../activities/webhooks/http.ts';

const config = loadConfig();
const logger = createLogger({ level: config.LOG_LEVEL, name: 'worker' });
if (!config.DATABASE_APP_URL && !config.DATABASE_URL) {
  logger.fatal('DATABASE_APP_URL or DATABASE_URL is required (`npm start` runs an embedded PostgreSQL and sets both)');
  process.exit(1);
}
const temporalAddress = config.TEMPORAL_ADDRESS ?? `127.0.0.1:${config.TEMPORAL_PORT}`;

// The process's own shutdown handler (onShutdown) drains the worker; the SDK must not race it.
Runtime.install({
  logger: new DefaultLogger(config.LOG_LEVEL === 'debug' || config.LOG_LEVEL === 'trace' ? 'DEBUG' : 'WARN'),
  shutdownSignals: [],
});
const sql = createSql(appDatabaseOptions(config, 'payments-worker'));
const connection = await NativeConnection.connect({ address: temporalAddress });
const temporal = await connectTemporalClient({
  address: temporalAddress,
  namespace: config.TEMPORAL_NAMESPACE,
  connectTimeoutMs: config.TEMPORAL_CONNECT_TIMEOUT_MS,
});
const bundle = await loadWorkflowBundle(join(config.dataDir, 'cache'));
const worker = await createWorker({
  connection,
  namespace: config.TEMPORAL_NAMESPACE,
  workflowBundle: bundle,
  sql,
  temporal: () => temporal.client,
  webhooks: {
    sender: createWebhookSender({ allowPrivate: config.ALLOW_PRIVATE_WEBHOOK_URLS === '1' }),
    limits: {
      attemptTimeoutMs: config.WEBHOOK_ATTEMPT_TIMEOUT_MS,
      maxInFlightPerEndpoint: config.WEBHOOK_MAX_IN_FLIGHT_PER_ENDPOINT,
      maxPayloadBytes: config.WEBHOOK_MAX_PAYLOAD_BYTES,
    },
  },
});
await ensureSystemWorkflows(temporal.client);
const dispatcher = startWebhookDispatcher({
  sql,
  temporal: () => temporal.client,
  logger,
  intervalMs: config.WEBHOOK_DISPATCH_INTERVAL_MS,
  batchSize: 100,
});

onShutdown(logger, config.SHUTDOWN_TIMEOUT_MS, async () => {
  await dispatcher.stop();
  worker.shutdown();
  await running;
  await Promise.allSettled([connection.close(), temporal.close(), sql.end({ timeout: 5 })]);
});

const running = worker.run();
logger.info({ temporalAddress, namespace: config.TEMPORAL_NAMESPACE }, 'worker running');
notifyReady({ service: 'worker' });
await running.catch((error: unknown) => {
  logger.fatal({ err: error }, 'worker failed');
  process.exit(1);
});
