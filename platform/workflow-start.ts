import { WorkflowExecutionAlreadyStartedError, type Client } from '@temporalio/client';
import { WorkflowIdConflictPolicy, WorkflowIdReusePolicy } from '@temporalio/common';

/**
 * Starts a workflow at most once per ID, ever: a start while it runs joins it (USE_EXISTING), and a
 * start after it closed is refused (REJECT_DUPLICATE) and counts as done. Without the reuse policy a
 * late retry of a start (outbox relay, a dispatcher pass, a retried request) would begin a second
 * run of a flow that already finished, and do its side effects again.
 */
export async function startOnce(
  client: Client,
  workflowType: string,
  options: { workflowId: string; taskQueue: string; args: unknown[] },
): Promise<'started' | 'already-done'> {
  try {
    await client.workflow.start(workflowType, {
      workflowId: options.workflowId,
      taskQueue: options.taskQueue,
      args: options.args,
      workflowIdConflictPolicy: WorkflowIdConflictPolicy.USE_EXISTING,
      workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
    });
    return 'started';
  } catch (error) {
    if (error instanceof WorkflowExecutionAlreadyStartedError) return 'already-done';
    throw error;
  }
}
