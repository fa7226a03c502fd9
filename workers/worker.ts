import { Worker, type NativeConnection } from '@temporalio/worker';
import type { Logger } from '../platform/logger.ts';
import { createActivities, type ActivityDeps } from '../activities/index.ts';
import { TASK_QUEUES } from '../workflows/shared/task-queues.ts';

export interface WorkerDeps extends ActivityDeps {
  connection: NativeConnection;
  namespace: string;
  workflowBundle: { code: string };
  logger?: Logger;
  taskQueue?: string;
}

/** The worker for the core task queue: the workflow bundle plus every activity, wired with deps. */
export async function createWorker(deps: WorkerDeps): Promise<Worker> {
  return Worker.create({
    connection: deps.connection,
    namespace: deps.namespace,
    taskQueue: deps.taskQueue ?? TASK_QUEUES.core,
    workflowBundle: deps.workflowBundle,
    activities: createActivities({
      sql: deps.sql,
      ...(deps.temporal ? { temporal: deps.temporal } : {}),
      ...(deps.webhooks ? { webhooks: deps.webhooks } : {}),
    }),
    shutdownGraceTime: '10 seconds',
    maxConcurrentActivityTaskExecutions: 100,
    maxConcurrentWorkflowTaskExecutions: 100,
    maxCachedWorkflows: 1000,
  });
}
