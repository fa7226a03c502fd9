import type { Client } from '@temporalio/client';
import { startOnce } from '../platform/workflow-start.ts';
import type { Sql } from '../db/client.ts';
import { findStrandedOutboxEntries, markOutboxDispatched, recordOutboxFailure } from '../db/outbox.ts';
import { withSystemScope } from '../db/tenant.ts';

export interface RelayOutboxInput {
  /** Only entries at least this old: younger ones are still being started by the API itself. */
  olderThanMs: number;
  batchSize: number;
}

export interface RelayOutboxResult {
  started: number;
  failed: number;
}

/**
 * Starts, with the SAME workflow ID, every flow the API wrote to the outbox but could not hand to
 * Temporal (a crash or an outage between the commit and the start). A start of a flow that did
 * begin after all joins it, and one of a flow that already finished is refused (startOnce), so
 * nothing runs twice.
 */
export function createOutboxRelayActivities(deps: { sql: Sql; temporal: () => Client }) {
  return {
    relayOutbox: async (input: RelayOutboxInput): Promise<RelayOutboxResult> => {
      const entries = await withSystemScope(deps.sql, (tx) =>
        findStrandedOutboxEntries(tx, { olderThan: new Date(Date.now() - input.olderThanMs), limit: input.batchSize }),
      );
      const result: RelayOutboxResult = { started: 0, failed: 0 };
      for (const entry of entries) {
        try {
          await startOnce(deps.temporal(), entry.workflowType, { workflowId: entry.workflowId, taskQueue: entry.taskQueue, args: [entry.payload] });
          await withSystemScope(deps.sql, (tx) => markOutboxDispatched(tx, entry.workflowId, new Date()));
          result.started += 1;
        } catch (error) {
          result.failed += 1;
          await withSystemScope(deps.sql, (tx) => recordOutboxFailure(tx, entry.workflowId, String(error)));
        }
      }
      return result;
    },
  };
}

export type OutboxRelayActivities = ReturnType<typeof createOutboxRelayActivities>;
