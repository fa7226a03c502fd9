// A bench-only Temporal worker on its own task queue with its own bundle of bench/baseline-workflow.ts.
// Forked by bench/run.ts with BENCH_TEMPORAL_ADDRESS; says { type: 'ready' } once polling.
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { bundleWorkflowCode, DefaultLogger, NativeConnection, Runtime, Worker } from '@temporalio/worker';
import type { BenchActivities } from './baseline-workflow.ts';
import { BENCH_TASK_QUEUE } from './types.ts';

const address = process.env.BENCH_TEMPORAL_ADDRESS;
if (!address) throw new Error('BENCH_TEMPORAL_ADDRESS is required');
Runtime.install({ logger: new DefaultLogger('WARN') });
const here = dirname(fileURLToPath(import.meta.url));
const { code } = await bundleWorkflowCode({
  workflowsPath: join(here, 'baseline-workflow.ts'),
  logger: new DefaultLogger('WARN'),
});
const connection = await NativeConnection.connect({ address });
const activities: BenchActivities = { benchStep: async (input) => `done:${input}` };
const worker = await Worker.create({
  connection,
  namespace: 'default',
  taskQueue: BENCH_TASK_QUEUE,
  workflowBundle: { code },
  activities,
});
process.on('SIGTERM', () => worker.shutdown());
const running = worker.run();
process.send?.({ type: 'ready' });
await running;
await connection.close();
process.exit(0);
