import { fork, type ChildProcess } from 'node:child_process';

export interface ServiceProcess<TReady> {
  name: string;
  child: ChildProcess;
  ready: Promise<TReady>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

const TSX_LOADER = import.meta.resolve('tsx');

/**
 * Runs a TypeScript entry point as a child Node process with an IPC channel. The child announces
 * readiness with `{ type: 'ready', ... }`; `ready` rejects if it exits first or takes too long.
 * A detached child has its own process group, so a terminal's Ctrl-C reaches only its parent, which
 * stops it in order; it still stops by itself when the IPC channel closes.
 */
export function startService<TReady>(options: {
  name: string;
  script: string;
  env: NodeJS.ProcessEnv;
  detached: boolean;
  readyTimeoutMs: number;
}): ServiceProcess<TReady> {
  const child = fork(options.script, [], {
    env: options.env,
    execArgv: ['--import', TSX_LOADER],
    detached: options.detached,
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once('exit', (code, signal) => resolve({ code, signal }));
  });
  const ready = new Promise<TReady>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${options.name} not ready within ${options.readyTimeoutMs} ms`)),
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
      reject(new Error(`${options.name} exited before it was ready (code ${code}, signal ${signal})`));
    });
  });
  ready.catch(() => undefined);
  return { name: options.name, child, ready, exited };
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
