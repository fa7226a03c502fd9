import assert from 'node:assert/strict';
import type { Sql } from '../db/client.ts';
import { purgeExpiredIdempotencyKeys as purgeBatch } from '../db/idempotency.ts';

export interface PurgeExpiredIdempotencyKeysInput {
  /**
   * The purge's reference time (epoch ms), taken from the workflow clock: keys whose retention ended
   * before it are deleted, so a retry of the same purge means the same thing however late it runs.
   */
  asOfMs: number;
  /** Upper bound on rows deleted per batch (one short transaction each). */
  batchSize: number;
  /** Upper bound on batches per call; the workflow calls again while a backlog remains. */
  maxBatches: number;
}

export interface PurgeExpiredIdempotencyKeysResult {
  deleted: number;
  /** True when the last batch was full: expired keys may remain. */
  backlog: boolean;
}

export interface IdempotencyActivityDeps {
  sql: Sql;
}

export function createIdempotencyActivities(deps: IdempotencyActivityDeps) {
  return {
    /** Idempotent by nature: deleting keys that are already gone deletes nothing. */
    purgeExpiredIdempotencyKeys: async (input: PurgeExpiredIdempotencyKeysInput): Promise<PurgeExpiredIdempotencyKeysResult> => {
      assert(Number.isInteger(input.batchSize) && input.batchSize >= 1, 'batchSize must be a positive integer');
      assert(Number.isInteger(input.maxBatches) && input.maxBatches >= 1, 'maxBatches must be a positive integer');
      const asOf = new Date(input.asOfMs);
      let deleted = 0;
      let last = 0;
      for (let batch = 0; batch < input.maxBatches; batch++) {
        last = await purgeBatch(deps.sql, { asOf, limit: input.batchSize });
        deleted += last;
        if (last < input.batchSize) break;
      }
      return { deleted, backlog: last === input.batchSize };
    },
  };
}

export type IdempotencyActivities = ReturnType<typeof createIdempotencyActivities>;
