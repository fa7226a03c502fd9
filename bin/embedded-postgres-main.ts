// Supervisor process for the embedded PostgreSQL of `npm start`: starts the cluster, reports its URL
// to the parent over IPC, and stops it when asked (IPC message, SIGTERM/SIGINT) or when the parent
// disappears, so a killed `npm start` never leaves a postmaster behind.
import { join } from 'node:path';
import { loadConfig } from '../platform/config.ts';
import { createLogger } from '../platform/logger.ts';
import { startEmbeddedPostgres } from '../db/embedded.ts';

const config = loadConfig();
const logger = createLogger({ level: config.LOG_LEVEL, name: 'postgres' });
const handle = await startEmbeddedPostgres({
  dir: join(config.dataDir, 'postgres'),
  port: config.EMBEDDED_POSTGRES_PORT,
  database: 'payments',
  onLog: (line) => logger.debug(line),
});

let stopping = false;
async function stop(reason: string): Promise<void> {
  if (stopping) return;
  stopping = true;
  logger.info({ reason }, 'stopping embedded PostgreSQL');
  await handle.stop();
  process.exit(0);
}
process.on('message', (message) => {
  if ((message as { type?: string }).type === 'stop') void stop('parent asked');
});
process.once('disconnect', () => void stop('parent disconnected'));

logger.info({ port: config.EMBEDDED_POSTGRES_PORT }, 'embedded PostgreSQL ready');
process.send?.({ type: 'ready', url: handle.url });
