import type { Client } from '@temporalio/client';
import { WorkflowIdConflictPolicy } from '@temporalio/common';
import { DATA_RETENTION_WORKFLOW_ID } from '../workflows/shared/data-retention.ts';
import { TASK_QUEUES } from '../workflows/shared/task-queues.ts';

/**
 * Starts the platform's long-running housekeeping workflows if they are not running yet. Safe to
 * call from every worker at every start: the fixed workflow ID with USE_EXISTING joins a live run.
 */
export async function ensureSystemWorkflows(client: Client): Promise<void> {
  await client.workflow.start('dataRetentionWorkflow', {
    workflowId: DATA_RETENTION_WORKFLOW_ID,
    taskQueue: TASK_QUEUES.core,
    args: [{}],
    workflowIdConflictPolicy: WorkflowIdConflictPolicy.USE_EXISTING,
  });
}
