// Supervisor process for the Temporal dev server of `npm start`: starts it, reports its address to
// the parent over IPC, and stops it when asked or when the parent disappears.
import { join } from 'node:path';
import { loadConfig } from '../platform/config.ts';
import { createLogger } from '../platform/logger.ts';
import { resolveTemporalCli } from '../platform/temporal.ts';
import { startTemporalDevServer } from '../platform/temporal-dev-server.ts';
import { SEARCH_ATTRIBUTE_FLAGS } from '../workflows/shared/search-attributes.ts';

const config = loadConfig();
const logger = createLogger({ level: config.LOG_LEVEL, name: 'temporal' });
const server = await startTemporalDevServer({
  cliPath: resolveTemporalCli(config, process.env.PATH),
  dataDir: join(config.dataDir, 'temporal'),
  port: config.TEMPORAL_PORT,
  uiPort: config.TEMPORAL_UI_PORT,
  namespace: config.TEMPORAL_NAMESPACE,
  searchAttributes: SEARCH_ATTRIBUTE_FLAGS,
  readyTimeoutMs: 90_000,
  onOutput: (line) => logger.info({ source: 'temporal-cli' }, line),
  onRestart: (error) => logger.warn({ err: error }, 'Temporal dev server exited while starting; starting it again'),
});

let stopping = false;
async function stop(reason: string): Promise<void> {
  if (stopping) return;
  stopping = true;
  logger.info({ reason }, 'stopping Temporal dev server');
  await server.stop();
  process.exit(0);
}
process.on('message', (message) => {
  if ((message as { type?: string }).type === 'stop') void stop('parent asked');
});
process.once('disconnect', () => void stop('parent disconnected'));
process.on('SIGTERM', () => void stop('SIGTERM'));
process.on('SIGINT', () => void stop('SIGINT'));
server.child.once('exit', (code) => {
  if (!stopping) {
    logger.error({ code }, 'Temporal dev server exited unexpectedly');
    process.exit(1);
  }
});

logger.info({ address: server.address, ui: server.uiUrl }, 'Temporal dev server ready');
process.send?.({ type: 'ready', address: server.address, uiUrl: server.uiUrl });
