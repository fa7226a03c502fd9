import type { Sql } from '../db/client.ts';
import { RETENTION_POLICIES } from '../db/retention.ts';
import { createDataRetentionActivities } from './data-retention.ts';
import { createIdempotencyActivities } from './idempotency.ts';

export interface ActivityDeps {
  sql: Sql;
}

/** Every activity the worker registers, built from injected dependencies. */
export function createActivities(deps: ActivityDeps) {
  return {
    ...createDataRetentionActivities({ sql: deps.sql, policies: RETENTION_POLICIES }),
    ...createIdempotencyActivities({ sql: deps.sql }),
  };
}

export type Activities = ReturnType<typeof createActivities>;
