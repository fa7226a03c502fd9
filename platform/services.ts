import { fork, type ChildProcess } from 'node:child_process';

export interface ServiceProcess<TReady> {
  name: string;
  child: ChildProcess;
  ready: Promise<TReady>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** The last `lines` lines the child wrote to stdout and stderr ('' unless started with `captureOutput`). */
  tail(lines?: number): string;
}

const TSX_LOADER = import.meta.resolve('tsx');
/** Lines of output kept for tail() when captured. */
const KEPT_LINES = 200;

/**
 * Runs a TypeScript entry point as a child Node process with an IPC channel. The child announces
 * readiness with `{ type: 'ready', ... }`; `ready` rejects if it exits first or takes too long.
 * A detached child has its own process group, so a terminal's Ctrl-C reaches only its parent, which
 * stops it in order; it still stops by itself when the IPC channel closes.
 * The child's stdout and stderr are inherited, or with `captureOutput` kept (the last lines) for
 * `tail()` and for the error when it fails to become ready.
 */
export function startService<TReady>(options: {
  name: string;
  script: string;
  env: NodeJS.ProcessEnv;
  detached: boolean;
  readyTimeoutMs: number;
  cwd?: string;
  /** Node flags after tsx's loader (e.g. `--cpu-prof`). */
  execArgv?: string[];
  captureOutput?: boolean;
}): ServiceProcess<TReady> {
  const child = fork(options.script, [], {
    env: options.env,
    execArgv: ['--import', TSX_LOADER, ...(options.execArgv ?? [])],
    detached: options.detached,
    stdio: ['ignore', options.captureOutput ? 'pipe' : 'inherit', options.captureOutput ? 'pipe' : 'inherit', 'ipc'],
    ...(options.cwd ? { cwd: options.cwd } : {}),
  });
  const output: string[] = [];
  if (options.captureOutput) {
    const keep = (chunk: Buffer) => {
      for (const line of chunk.toString('utf8').split('\n')) if (line.trim()) output.push(line);
      if (output.length > 2 * KEPT_LINES) output.splice(0, output.length - KEPT_LINES);
    };
    child.stdout?.on('data', keep);
    child.stderr?.on('data', keep);
  }
  const tail = (lines = 30) => output.slice(-lines).join('\n');
  const withTail = (message: string) => (output.length > 0 ? `${message}:\n${tail()}` : message);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once('exit', (code, signal) => resolve({ code, signal }));
  });
  const ready = new Promise<TReady>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(withTail(`${options.name} not ready within ${options.readyTimeoutMs} ms`))),
      options.readyTimeoutMs,
    );
    child.on('message', (message) => {
      if ((message as { type?: string }).type === 'ready') {
        clearTimeout(timer);
        resolve(message as TReady);
      }
    });
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(withTail(`${options.name} exited before it was ready (code ${code}, signal ${signal})`)));
    });
  });
  ready.catch(() => undefined);
  return { name: options.name, child, ready, exited, tail };
}

/** Asks a service to stop (IPC `stop` if it listens, else the signal) and escalates to SIGKILL. */
export async function stopService(service: ServiceProcess<unknown>, options: { signal: NodeJS.Signals; timeoutMs: number }) {
  const { child } = service;
  if (child.exitCode !== null || child.signalCode !== null) return;
  if (child.connected) child.send({ type: 'stop' }, () => undefined);
  child.kill(options.signal);
  const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs);
  await service.exited;
  clearTimeout(timer);
}
