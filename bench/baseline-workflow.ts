// Bench-only workflow (bundled by bench/baseline-worker.ts, never part of workflows/): the bare
// Temporal ceiling for Shape A. One local activity; an update that waits for its result, so that
// update-with-start returns once the activity has run, as the settlement's awaitOutcome update does.
import { allHandlersFinished, condition, defineUpdate, proxyLocalActivities, setHandler } from '@temporalio/workflow';

export const benchAwaitUpdate = defineUpdate<string, []>('benchAwait');

export interface BenchActivities {
  benchStep(input: string): Promise<string>;
}

const { benchStep } = proxyLocalActivities<BenchActivities>({ startToCloseTimeout: '10 seconds' });

export async function benchWorkflow(input: string): Promise<string> {
  const state: { result?: string } = {};
  setHandler(benchAwaitUpdate, async () => {
    await condition(() => state.result !== undefined);
    return state.result ?? '';
  });
  state.result = await benchStep(input);
  await condition(allHandlersFinished);
  return state.result;
}
