import { continueAsNew, log, proxyActivities, setHandler, sleep } from '@temporalio/workflow';
import type { DataRetentionActivities } from '../activities/data-retention.ts';
import { DAY_MS, MINUTE_MS } from './shared/durations.ts';
import { dataRetentionStatusQuery, type DataRetentionInput, type DataRetentionStatus } from './shared/data-retention.ts';

const SWEEPS_PER_RUN_DEFAULT = 30;

const { purgeExpiredRows } = proxyActivities<DataRetentionActivities>({
  startToCloseTimeout: '2 minutes',
  retry: { initialInterval: '5 seconds', backoffCoefficient: 2, maximumInterval: '10 minutes', maximumAttempts: 10 },
});

/**
 * Housekeeping loop under a fixed ID: sweep the rows whose retention period has passed (see
 * db/retention.ts) in bounded batches, then sleep a day (or a few minutes while a backlog remains).
 * It never completes; after `sweepsPerRun` sweeps it continues as new so its history stays short.
 */
export async function dataRetentionWorkflow(input: DataRetentionInput = {}): Promise<never> {
  const intervalMs = input.intervalMs ?? DAY_MS;
  const backlogIntervalMs = input.backlogIntervalMs ?? 5 * MINUTE_MS;
  const sweepsPerRun = input.sweepsPerRun ?? SWEEPS_PER_RUN_DEFAULT;
  const status: DataRetentionStatus = {
    sweeps: input.carried?.sweeps ?? 0,
    deleted: input.carried?.deleted ?? 0,
    lastDeleted: {},
    backlog: false,
  };
  setHandler(dataRetentionStatusQuery, () => status);

  for (let sweep = 0; sweep < sweepsPerRun; sweep++) {
    if (sweep > 0) await sleep(status.backlog ? backlogIntervalMs : intervalMs);
    const result = await purgeExpiredRows({ batchSize: input.batchSize ?? 1000, maxBatches: input.maxBatches ?? 50 });
    status.sweeps += 1;
    status.deleted += Object.values(result.deleted).reduce((sum, n) => sum + n, 0);
    status.lastDeleted = result.deleted;
    status.backlog = result.backlog;
    log.info('retention sweep', { sweeps: status.sweeps, deleted: result.deleted, backlog: result.backlog });
  }
  await sleep(status.backlog ? backlogIntervalMs : intervalMs);
  return continueAsNew<typeof dataRetentionWorkflow>({
    ...input,
    carried: { sweeps: status.sweeps, deleted: status.deleted },
  });
}
