import { defineQuery } from '@temporalio/workflow';

export const DATA_RETENTION_WORKFLOW_ID = 'system/data-retention';

export interface DataRetentionInput {
  /** Pause between two sweeps. Default one day. */
  intervalMs?: number;
  /** Pause before the next sweep when the previous one left a backlog. Default five minutes. */
  backlogIntervalMs?: number;
  batchSize?: number;
  maxBatches?: number;
  /** Sweeps per run before continue-as-new keeps the history bounded. */
  sweepsPerRun?: number;
  /** Totals carried across continue-as-new. */
  carried?: { sweeps: number; deleted: number; failedSweeps: number };
}

export interface DataRetentionStatus {
  sweeps: number;
  deleted: number;
  /** Sweeps whose activity still failed after every retry. */
  failedSweeps: number;
  lastDeleted: Record<string, number>;
  backlog: boolean;
}

export const dataRetentionStatusQuery = defineQuery<DataRetentionStatus>('dataRetentionStatus');
