// `npm start`: the whole service on one machine. Embedded PostgreSQL unless DATABASE_URL is set,
// migrations, the Temporal dev server with its Web UI unless TEMPORAL_ADDRESS is set, the worker and
// the API. Ctrl-C stops them in reverse order; the data under DATA_DIR is kept for the next start.
import { randomBytes } from 'node:crypto';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { childEnv, loadConfig } from '../platform/config.ts';
import { createLogger } from '../platform/logger.ts';
import { startService, stopService, type ServiceProcess } from '../platform/services.ts';
import { createSql, databaseOptionsFromConfig, enableAppLogin } from '../db/client.ts';
import { migrate } from '../db/migrate.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const config = loadConfig();
const logger = createLogger({ level: config.LOG_LEVEL, name: 'start' });
await mkdir(config.dataDir, { recursive: true, mode: 0o755 });

const infrastructure: ServiceProcess<unknown>[] = [];
const applications: ServiceProcess<unknown>[] = [];
let shuttingDown = false;

async function shutdown(reason: string, exitCode: number): Promise<never> {
  if (!shuttingDown) {
    shuttingDown = true;
    logger.info({ reason }, 'stopping every service');
    // Applications first (they drain against live dependencies), then Temporal, then PostgreSQL.
    await Promise.all(
      applications.map((service) => stopService(service, { signal: 'SIGTERM', timeoutMs: config.SHUTDOWN_TIMEOUT_MS })),
    );
    for (const service of [...infrastructure].reverse()) {
      await stopService(service, { signal: 'SIGTERM', timeoutMs: config.SHUTDOWN_TIMEOUT_MS });
    }
    logger.info('all services stopped');
    process.exit(exitCode);
  }
  return new Promise<never>(() => undefined);
}
// `on`, not `once`: npm forwards the terminal's Ctrl-C, so the signal can arrive twice.
process.on('SIGINT', () => void shutdown('SIGINT', 0));
process.on('SIGTERM', () => void shutdown('SIGTERM', 0));

function watch(service: ServiceProcess<unknown>): void {
  void service.exited.then(({ code, signal }) => {
    if (!shuttingDown) {
      logger.error({ service: service.name, code, signal }, 'service stopped unexpectedly');
      void shutdown(`${service.name} exited`, 1);
    }
  });
}

function launch<T>(
  list: ServiceProcess<unknown>[],
  name: string,
  script: string,
  env: NodeJS.ProcessEnv,
  detached: boolean,
  readyTimeoutMs: number,
) {
  const service = startService<T>({ name, script: join(root, script), env, detached, readyTimeoutMs });
  list.push(service);
  watch(service);
  return service.ready;
}

/** A random hex secret kept in `file` (owner-only), made on first use. */
async function readOrCreateSecret(file: string): Promise<string> {
  try {
    return (await readFile(file, 'utf8')).trim();
  } catch (error) {
    if ((error as { code?: string }).code !== 'ENOENT') throw error;
    const secret = randomBytes(24).toString('hex');
    await writeFile(file, `${secret}\n`, { mode: 0o600, flag: 'wx' });
    return secret;
  }
}

try {
  const started = Date.now();
  let databaseUrl = config.DATABASE_URL;
  const embedded = !databaseUrl;
  if (!databaseUrl) {
    const ready = await launch<{ url: string }>(
      infrastructure,
      'postgres',
      'bin/embedded-postgres-main.ts',
      childEnv({}),
      true,
      120_000,
    );
    databaseUrl = ready.url;
  }
  const sql = createSql(databaseOptionsFromConfig(config, databaseUrl, 'payments-migrate'));
  await migrate(sql, { onApplied: (name) => logger.info({ migration: name }, 'migration applied') });
  // The API and the worker log in as payments_app itself, not as the owner switching to it (which
  // could switch back): on the embedded database this start owns, with a password kept beside it.
  const appUrl = embedded
    ? await enableAppLogin(sql, databaseUrl, await readOrCreateSecret(join(config.dataDir, 'postgres', 'app-password')))
    : config.DATABASE_APP_URL;
  await sql.end({ timeout: 5 });

  let temporalAddress = config.TEMPORAL_ADDRESS;
  let temporalUiUrl: string | undefined;
  if (!temporalAddress) {
    const ready = await launch<{ address: string; uiUrl: string }>(
      infrastructure,
      'temporal',
      'bin/temporal-dev-server-main.ts',
      childEnv({}),
      true,
      120_000,
    );
    temporalAddress = ready.address;
    temporalUiUrl = ready.uiUrl;
  }

  const appEnv = childEnv({ DATABASE_URL: databaseUrl, DATABASE_APP_URL: appUrl, TEMPORAL_ADDRESS: temporalAddress });
  const [, api] = await Promise.all([
    launch<{ service: string }>(applications, 'worker', 'workers/main.ts', appEnv, false, 180_000),
    launch<{ url: string }>(applications, 'api', 'api/main.ts', appEnv, false, 60_000),
  ]);
  const apiUrl = config.PUBLIC_BASE_URL ?? api.url;
  const lines = [
    '',
    `  API          ${apiUrl}`,
    `  API docs     ${apiUrl}/docs  (OpenAPI: ${apiUrl}/openapi.json)`,
    `  Temporal UI  ${temporalUiUrl ?? `(external Temporal at ${temporalAddress})`}`,
    `  Data         ${config.dataDir}`,
    `  Ready in ${((Date.now() - started) / 1000).toFixed(1)} s. Ctrl-C stops everything.`,
    '',
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
  process.send?.({ type: 'ready', apiUrl, temporalUiUrl, temporalAddress });
} catch (error) {
  logger.fatal({ err: error }, 'start failed');
  await shutdown('start failed', 1);
}
