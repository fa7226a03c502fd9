import { resolveTemporalCli } from '../platform/temporal.ts';
import { startTemporalDevServer, type DevServerHandle } from '../platform/temporal-dev-server.ts';
import { SEARCH_ATTRIBUTE_FLAGS } from '../workflows/shared/search-attributes.ts';

/**
 * A throwaway Temporal dev server for the bank test, the crash tests and the benchmarks: the
 * project's CLI (or TEMPORAL_CLI_PATH), the default namespace and the project's search attributes.
 */
export function startScratchDevServer(options: {
  dataDir: string;
  port: number;
  uiPort: number;
  readyTimeoutMs?: number;
  onOutput?: (line: string) => void;
}): Promise<DevServerHandle> {
  return startTemporalDevServer({
    cliPath: resolveTemporalCli({ TEMPORAL_CLI_PATH: process.env.TEMPORAL_CLI_PATH }, process.env.PATH),
    namespace: 'default',
    searchAttributes: SEARCH_ATTRIBUTE_FLAGS,
    readyTimeoutMs: options.readyTimeoutMs ?? 120_000,
    dataDir: options.dataDir,
    port: options.port,
    uiPort: options.uiPort,
    ...(options.onOutput ? { onOutput: options.onOutput } : {}),
  });
}
