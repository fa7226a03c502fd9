import type { Logger } from './logger.ts';

/**
 * Runs `shutdown` once when the process is asked to stop: SIGINT (Ctrl-C), SIGTERM, or the parent
 * that started it with an IPC channel going away (so a child never outlives a killed parent).
 * A shutdown that overruns `timeoutMs` exits with code 1 instead of hanging.
 */
export function onShutdown(logger: Logger, timeoutMs: number, shutdown: (reason: string) => Promise<void>): void {
  let started = false;
  const run = (reason: string) => {
    if (started) return;
    started = true;
    logger.info({ reason }, 'shutting down');
    const timer = setTimeout(() => {
      logger.error({ reason, timeoutMs }, 'shutdown timed out');
      process.exit(1);
    }, timeoutMs);
    timer.unref();
    shutdown(reason).then(
      () => {
        logger.info('stopped');
        process.exit(0);
      },
      (error: unknown) => {
        logger.error({ err: error }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  // `on`, not `once`: a second Ctrl-C (or npm forwarding the same one) must not kill the process
  // half-way through its shutdown.
  process.on('SIGINT', () => run('SIGINT'));
  process.on('SIGTERM', () => run('SIGTERM'));
  if (process.send) process.once('disconnect', () => run('parent disconnected'));
}

/** Tells a parent that started this process with IPC that it is ready (no-op otherwise). */
export function notifyReady(message: Record<string, unknown>): void {
  process.send?.({ type: 'ready', ...message });
}
