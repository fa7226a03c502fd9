import { ActivityFailure, continueAsNew, log, proxyActivities, setHandler, sleep } from '@temporalio/workflow';
import type { DataRetentionActivities } from '../activities/data-retention.ts';
import { DAY_MS, MINUTE_MS } from './shared/durations.ts';
import { dataRetentionStatusQuery, type DataRetentionInput, type DataRetentionStatus } from './shared/data-retention.ts';

const SWEEPS_PER_RUN_DEFAULT = 30;

const { purgeExpiredRows } = proxyActivities<DataRetentionActivities>({
  startToCloseTimeout: '2 minutes',
  retry: { initialInterval: '5 seconds', backoffCoefficient: 2, maximumInterval: '1 minute', maximumAttempts: 5 },
});

/**
 * Housekeeping loop under a fixed ID: sweep the rows whose retention period has passed (see
 * db/retention.ts) in bounded batches, then sleep a day (or a few minutes while a backlog remains).
 * A sweep that still fails after its retries is recorded and tried again at the next interval: the
 * loop itself never fails. After `sweepsPerRun` sweeps it continues as new to keep its history short.
 */
export async function dataRetentionWorkflow(input: DataRetentionInput = {}): Promise<never> {
  const intervalMs = input.intervalMs ?? DAY_MS;
  const backlogIntervalMs = input.backlogIntervalMs ?? 5 * MINUTE_MS;
  const sweepsPerRun = input.sweepsPerRun ?? SWEEPS_PER_RUN_DEFAULT;
  const status: DataRetentionStatus = {
    sweeps: input.carried?.sweeps ?? 0,
    deleted: input.carried?.deleted ?? 0,
    failedSweeps: input.carried?.failedSweeps ?? 0,
    lastDeleted: {},
    backlog: false,
  };
  setHandler(dataRetentionStatusQuery, () => status);

  for (let sweep = 0; sweep < sweepsPerRun; sweep++) {
    if (sweep > 0) await sleep(status.backlog ? backlogIntervalMs : intervalMs);
    try {
      const result = await purgeExpiredRows({
        asOfMs: Date.now(),
        batchSize: input.batchSize ?? 1000,
        maxBatches: input.maxBatches ?? 50,
      });
      status.sweeps += 1;
      status.deleted += Object.values(result.deleted).reduce((sum, n) => sum + n, 0);
      status.lastDeleted = result.deleted;
      status.backlog = result.backlog;
      log.info('retention sweep', { sweeps: status.sweeps, deleted: result.deleted, backlog: result.backlog });
    } catch (error) {
      if (!(error instanceof ActivityFailure)) throw error;
      status.sweeps += 1;
      status.failedSweeps += 1;
      status.lastDeleted = {};
      status.backlog = false;
      log.warn('retention sweep failed after retries; next sweep at the next interval', { error: error.message });
    }
  }
  await sleep(status.backlog ? backlogIntervalMs : intervalMs);
  return continueAsNew<typeof dataRetentionWorkflow>({
    ...input,
    carried: { sweeps: status.sweeps, deleted: status.deleted, failedSweeps: status.failedSweeps },
  });
}
