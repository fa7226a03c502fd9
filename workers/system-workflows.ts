import {
  ScheduleAlreadyRunning,
  ScheduleOverlapPolicy,
  type Client,
  type ScheduleOptionsStartWorkflowAction,
} from '@temporalio/client';
import { WorkflowIdConflictPolicy } from '@temporalio/common';
import { DATA_RETENTION_WORKFLOW_ID } from '../workflows/shared/data-retention.ts';
import { TASK_QUEUES } from '../workflows/shared/task-queues.ts';
import type { idempotencyPurgeWorkflow } from '../workflows/idempotency-purge.ts';
import type { outboxRelayWorkflow } from '../workflows/outbox-relay.ts';

export const IDEMPOTENCY_PURGE_SCHEDULE_ID = 'system/idempotency-purge';
export const OUTBOX_RELAY_SCHEDULE_ID = 'system/outbox-relay';

/** Every minute: start the flows the API committed to the outbox but could not hand to Temporal. */
const outboxRelaySchedule = {
  spec: { intervals: [{ every: '1 minute' }] },
  action: {
    type: 'startWorkflow',
    workflowType: 'outboxRelayWorkflow',
    workflowId: OUTBOX_RELAY_SCHEDULE_ID,
    taskQueue: TASK_QUEUES.core,
    args: [{}],
    workflowRunTimeout: '5 minutes',
  } satisfies ScheduleOptionsStartWorkflowAction<typeof outboxRelayWorkflow>,
  policies: { overlap: ScheduleOverlapPolicy.SKIP, catchupWindow: '1 minute', pauseOnFailure: false },
};

/** The hourly purge of expired idempotency keys: its spec, action and policies, in one place. */
const idempotencyPurgeSchedule = {
  spec: { intervals: [{ every: '1 hour' }] },
  action: {
    type: 'startWorkflow',
    workflowType: 'idempotencyPurgeWorkflow',
    // The Schedule appends each firing's time to this ID.
    workflowId: IDEMPOTENCY_PURGE_SCHEDULE_ID,
    taskQueue: TASK_QUEUES.core,
    args: [{}],
    workflowRunTimeout: '50 minutes',
  } satisfies ScheduleOptionsStartWorkflowAction<typeof idempotencyPurgeWorkflow>,
  policies: { overlap: ScheduleOverlapPolicy.SKIP, catchupWindow: '1 hour', pauseOnFailure: false },
};

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
  await ensureSchedule(client, IDEMPOTENCY_PURGE_SCHEDULE_ID, idempotencyPurgeSchedule);
  await ensureSchedule(client, OUTBOX_RELAY_SCHEDULE_ID, outboxRelaySchedule);
}

/**
 * Creates a Schedule, or, when it exists, brings its spec, action and policies up to date while
 * keeping its state (an operator may have paused it).
 */
async function ensureSchedule(
  client: Client,
  scheduleId: string,
  schedule: typeof idempotencyPurgeSchedule | typeof outboxRelaySchedule,
): Promise<void> {
  try {
    await client.schedule.create({ scheduleId, ...schedule });
  } catch (error) {
    if (!(error instanceof ScheduleAlreadyRunning)) throw error;
    await client.schedule.getHandle(scheduleId).update((previous) => ({ ...previous, ...schedule }));
  }
}
