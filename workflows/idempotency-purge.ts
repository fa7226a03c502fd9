import { log, proxyActivities } from '@temporalio/workflow';
import type { IdempotencyActivities } from '../activities/idempotency.ts';

export interface IdempotencyPurgeInput {
  /** Rows per delete (one short transaction each). Default 1000. */
  batchSize?: number;
  /** Batches per activity call, so that one call stays well inside its timeout. Default 10. */
  maxBatches?: number;
  /** Activity calls per run: bounds one firing's work; the next firing continues. Default 20. */
  maxCalls?: number;
}

export interface IdempotencyPurgeResult {
  /** The reference time of this purge (epoch ms, from the workflow clock). */
  asOfMs: number;
  deleted: number;
  calls: number;
  /** True when expired keys remained after maxCalls: the next firing continues. */
  backlog: boolean;
}

const { purgeExpiredIdempotencyKeys } = proxyActivities<IdempotencyActivities>({
  startToCloseTimeout: '2 minutes',
  retry: { initialInterval: '5 seconds', backoffCoefficient: 2, maximumInterval: '1 minute', maximumAttempts: 5 },
});

/**
 * One purge of expired idempotency keys, started every hour by the `system/idempotency-purge`
 * Schedule (workers/system-workflows.ts). Deletes in bounded batches while a backlog remains, at most
 * `maxCalls` activity calls, all against the same reference time taken once from the workflow
 * clock. A call that still fails after its retries fails the run; the Schedule's next firing tries
 * again, and the failed run stays visible to operators.
 */
export async function idempotencyPurgeWorkflow(input: IdempotencyPurgeInput = {}): Promise<IdempotencyPurgeResult> {
  const batchSize = input.batchSize ?? 1000;
  const maxBatches = input.maxBatches ?? 10;
  const maxCalls = input.maxCalls ?? 20;
  const asOfMs = Date.now();
  const result: IdempotencyPurgeResult = { asOfMs, deleted: 0, calls: 0, backlog: true };
  while (result.backlog && result.calls < maxCalls) {
    const purged = await purgeExpiredIdempotencyKeys({ asOfMs, batchSize, maxBatches });
    result.calls += 1;
    result.deleted += purged.deleted;
    result.backlog = purged.backlog;
  }
  if (result.backlog) log.warn('idempotency purge stopped with a backlog; the next firing continues', { ...result });
  else log.info('idempotency purge done', { ...result });
  return result;
}
