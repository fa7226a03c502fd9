import type { Sql } from '../db/client.ts';
import { withSystemScope } from '../db/tenant.ts';
import type { RetentionPolicy } from '../db/retention.ts';

export interface PurgeExpiredRowsInput {
  /**
   * The sweep's reference time (epoch ms), taken from the workflow clock: retention periods count
   * back from it, so a sweep means the same thing however late a retry of it runs.
   */
  asOfMs: number;
  /** Upper bound on rows deleted per policy in one call, so a backlog never becomes one huge delete. */
  batchSize: number;
  /** Upper bound on batches per policy in one call; the next sweep continues where this one stopped. */
  maxBatches: number;
}

export interface PurgeExpiredRowsResult {
  deleted: Record<string, number>;
  /** True when some policy still had expired rows after maxBatches: the workflow sweeps again soon. */
  backlog: boolean;
}

export interface DataRetentionActivityDeps {
  sql: Sql;
  policies: readonly RetentionPolicy[];
}

export function createDataRetentionActivities(deps: DataRetentionActivityDeps) {
  return {
    /** Idempotent by nature: deleting rows that are already gone deletes nothing. */
    purgeExpiredRows: async (input: PurgeExpiredRowsInput): Promise<PurgeExpiredRowsResult> => {
      const deleted: Record<string, number> = {};
      let backlog = false;
      for (const policy of deps.policies) {
        const olderThan = new Date(input.asOfMs - policy.keepForMs);
        let total = 0;
        let last = 0;
        for (let batch = 0; batch < input.maxBatches; batch++) {
          // A platform job: it sweeps every company's rows, so it runs in system scope.
          last = await withSystemScope(deps.sql, (tx) => policy.purge(tx, { olderThan, limit: input.batchSize }));
          total += last;
          if (last < input.batchSize) break;
        }
        if (last === input.batchSize) backlog = true;
        deleted[policy.name] = total;
      }
      return { deleted, backlog };
    },
  };
}

export type DataRetentionActivities = ReturnType<typeof createDataRetentionActivities>;
