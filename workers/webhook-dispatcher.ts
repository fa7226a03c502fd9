import type { Client } from '@temporalio/client';
import type { Sql } from '../db/client.ts';
import type { Logger } from '../platform/logger.ts';
import { dispatchWebhookEvents } from '../services/webhook-dispatch.ts';

/**
 * How often a pass also looks for deliveries recorded but not started (an extra transaction, not
 * worth running on every idle poll). With STRANDED_AFTER_MS (5 s) a stranded delivery is started
 * again at most about 7.5 s after it was recorded.
 */
const STRANDED_RESCAN_INTERVAL_MS = 2_500;

export interface WebhookDispatcher {
  stop(): Promise<void>;
}

/**
 * Polls for undispatched events every `intervalMs` (a partial index makes an idle poll one cheap
 * lookup; NOTIFY would serialize every committing transfer on a global lock) and keeps going
 * without pause while there is a backlog; stranded deliveries are looked for every
 * STRANDED_RESCAN_INTERVAL_MS. Errors back off up to 30 s; the loop never dies.
 */
export function startWebhookDispatcher(deps: {
  sql: Sql;
  temporal: () => Client;
  logger: Logger;
  intervalMs: number;
  batchSize: number;
}): WebhookDispatcher {
  let stopping = false;
  let wake: (() => void) | undefined;
  const pause = (ms: number) =>
    new Promise<void>((resolve) => {
      // A pause asked for after stop() (a pass was in flight when it came) ends at once: stop() must
      // not wait out an error backoff of up to 30 s, since the worker is drained only after it returns.
      if (stopping) {
        resolve();
        return;
      }
      const timer = setTimeout(resolve, ms);
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  const loop = (async () => {
    let failures = 0;
    let lastRescanAt = Number.NEGATIVE_INFINITY;
    while (!stopping) {
      try {
        const now = performance.now();
        const restartStranded = now - lastRescanAt >= STRANDED_RESCAN_INTERVAL_MS;
        const result = await dispatchWebhookEvents(
          { sql: deps.sql, temporal: deps.temporal() },
          { batchSize: deps.batchSize, restartStranded },
        );
        if (restartStranded) lastRescanAt = now;
        failures = 0;
        if (result.deliveries > 0 || result.restarted > 0) deps.logger.debug(result, 'webhook events dispatched');
        if (result.failed > 0)
          deps.logger.warn(
            result,
            'some webhook deliveries could not be started; a later pass (or the outbox relay) will',
          );
        if (result.events < deps.batchSize) await pause(deps.intervalMs);
      } catch (error) {
        failures += 1;
        deps.logger.error({ err: error }, 'webhook dispatch failed');
        await pause(Math.min(30_000, deps.intervalMs * 2 ** failures));
      }
    }
  })();
  return {
    async stop() {
      stopping = true;
      wake?.();
      await loop;
    },
  };
}
