import { spawn, type ChildProcess } from 'node:child_process';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { Connection } from '@temporalio/client';
import { pingTemporal } from './temporal.ts';

export interface DevServerOptions {
  cliPath: string;
  dataDir: string;
  port: number;
  uiPort: number;
  namespace: string;
  searchAttributes: readonly string[];
  readyTimeoutMs: number;
  onOutput?: (line: string) => void;
}

export interface DevServerHandle {
  address: string;
  uiUrl: string;
  child: ChildProcess;
  stop(timeoutMs?: number): Promise<void>;
}

function exited(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', () => resolve());
  });
}

/**
 * The Temporal CLI dev server (server + Web UI) on a SQLite file, with the project's search
 * attributes registered. Resolves once the frontend answers a namespace call.
 */
export async function startTemporalDevServer(options: DevServerOptions): Promise<DevServerHandle> {
  await mkdir(options.dataDir, { recursive: true });
  const args = [
    'server', 'start-dev',
    '--db-filename', join(options.dataDir, 'temporal.sqlite'),
    '--ip', '127.0.0.1',
    '--port', String(options.port),
    '--ui-port', String(options.uiPort),
    '--namespace', options.namespace,
    '--log-level', 'warn',
    ...options.searchAttributes.flatMap((pair) => ['--search-attribute', pair]),
  ];
  const child = spawn(options.cliPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const forward = (chunk: Buffer) => {
    for (const line of chunk.toString('utf8').split('\n')) if (line.trim()) options.onOutput?.(line);
  };
  child.stdout?.on('data', forward);
  child.stderr?.on('data', forward);
  const address = `127.0.0.1:${options.port}`;
  const stop = async (timeoutMs = 15_000) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    await exited(child);
    clearTimeout(timer);
  };

  const deadline = Date.now() + options.readyTimeoutMs;
  let lastError: unknown;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`Temporal dev server exited with code ${child.exitCode}`);
    try {
      const connection = await Connection.connect({ address, connectTimeout: 1_000 });
      const ok = await pingTemporal(connection, options.namespace, 1_000);
      await connection.close();
      if (ok) return { address, uiUrl: `http://127.0.0.1:${options.uiPort}`, child, stop };
    } catch (error) {
      lastError = error;
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  await stop();
  throw new Error(`Temporal dev server not ready within ${options.readyTimeoutMs} ms: ${String(lastError)}`);
}
