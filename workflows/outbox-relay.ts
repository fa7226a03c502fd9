import { proxyActivities } from '@temporalio/workflow';
import type { OutboxRelayActivities, RelayOutboxResult } from '../activities/outbox-relay.ts';

const { relayOutbox } = proxyActivities<OutboxRelayActivities>({
  startToCloseTimeout: '2 minutes',
  retry: { initialInterval: '5 seconds', backoffCoefficient: 2, maximumInterval: '30 seconds', maximumAttempts: 3 },
});

/**
 * One pass of the outbox relay, fired every minute by the `system/outbox-relay` Schedule: restarts
 * the flows the API committed but failed to start. Bounded to one batch; the next firing continues.
 */
export async function outboxRelayWorkflow(input: { olderThanMs?: number; batchSize?: number } = {}): Promise<RelayOutboxResult> {
  return relayOutbox({ olderThanMs: input.olderThanMs ?? 30_000, batchSize: input.batchSize ?? 200 });
}
