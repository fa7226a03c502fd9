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
  /** Told when a CLI that exited before it was ready is started again. */
  onRestart?: (error: Error) => void;
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

/** How many of the CLI's last output lines a start failure quotes. */
const OUTPUT_TAIL_LINES = 40;

/**
 * Attempts per start. The CLI binds internal services (history, matching, HTTP API, metrics) to
 * ports it picks itself, so a start can lose a port to another process in between and exit; a
 * second attempt picks again. Our own ports (gRPC, UI) stay as configured.
 */
const START_ATTEMPTS = 2;

/**
 * The Temporal CLI dev server (server + Web UI) on a SQLite file, with the project's search
 * attributes registered. Resolves once the frontend answers a namespace call. A CLI that exits
 * before it is ready is started once more; the error of a last failure quotes its output.
 */
export async function startTemporalDevServer(options: DevServerOptions): Promise<DevServerHandle> {
  await mkdir(options.dataDir, { recursive: true });
  const deadline = Date.now() + options.readyTimeoutMs;
  for (let attempt = 1; ; attempt++) {
    const started = await startOnce(options, deadline);
    if ('handle' in started) return started.handle;
    if (attempt >= START_ATTEMPTS || Date.now() >= deadline) throw started.error;
    options.onRestart?.(started.error);
  }
}

async function startOnce(
  options: DevServerOptions,
  deadline: number,
): Promise<{ handle: DevServerHandle } | { error: Error }> {
  // prettier-ignore
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
  const closed = new Promise<void>((resolve) => child.once('close', () => resolve()));
  const tail: string[] = [];
  const forward = (chunk: Buffer) => {
    for (const line of chunk.toString('utf8').split('\n')) {
      if (!line.trim()) continue;
      tail.push(line);
      if (tail.length > OUTPUT_TAIL_LINES) tail.shift();
      options.onOutput?.(line);
    }
  };
  child.stdout?.on('data', forward);
  child.stderr?.on('data', forward);
  const quoted = () => (tail.length === 0 ? ' (no output)' : `; its last output:\n${tail.join('\n')}`);
  const address = `127.0.0.1:${options.port}`;
  const stop = async (timeoutMs = 15_000) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    await exited(child);
    clearTimeout(timer);
  };

  let lastError: unknown;
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) {
      // 'close' comes after the last of its output; 'exit' may come before.
      await Promise.race([closed, new Promise((resolve) => setTimeout(resolve, 1_000))]);
      const how = child.exitCode !== null ? `code ${child.exitCode}` : `signal ${child.signalCode}`;
      return { error: new Error(`Temporal dev server exited with ${how}${quoted()}`) };
    }
    try {
      const connection = await Connection.connect({ address, connectTimeout: 1_000 });
      const ok = await pingTemporal(connection, options.namespace, 1_000);
      await connection.close();
      if (ok) return { handle: { address, uiUrl: `http://127.0.0.1:${options.uiPort}`, child, stop } };
    } catch (error) {
      lastError = error;
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  await stop();
  throw new Error(`Temporal dev server not ready within ${options.readyTimeoutMs} ms: ${String(lastError)}${quoted()}`);
}
