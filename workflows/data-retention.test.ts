import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, beforeEach, describe, it } from 'node:test';
import {
  WorkflowExecutionAlreadyStartedError,
  type WorkflowHandle,
  type WorkflowHandleWithFirstExecutionRunId,
} from '@temporalio/client';
import { ApplicationFailure, WorkflowIdConflictPolicy } from '@temporalio/common';
import { historyFromJSON, historyToJSON } from '@temporalio/common/lib/proto-utils.js';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker } from '@temporalio/worker';
import { createDataRetentionActivities } from '../activities/data-retention.ts';
import { RETENTION_POLICIES, type RetentionPolicy } from '../db/retention.ts';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { createTimeSkippingEnv, sleepWithin, testWorkflowBundle } from '../test-support/temporal.ts';
import { waitFor } from '../test-support/wait.ts';
import {
  dataRetentionStatusQuery,
  DATA_RETENTION_WORKFLOW_ID,
  type DataRetentionStatus,
} from './shared/data-retention.ts';
import { TASK_QUEUES } from './shared/task-queues.ts';
import type { dataRetentionWorkflow } from './data-retention.ts';

const DAY_MS = 24 * 60 * 60 * 1000;
/**
 * Each test takes seconds. This file has hung until the runner's 5-minute file timeout in a few full
 * runs, without saying where (no test had finished): a stalled test now fails after this, by name.
 */
const STEP_TIMEOUT_MS = 90_000;
/** The hooks' own deadlines: a stalled setup or teardown step fails by name instead of hanging the file. */
const HOOK_STEP_MS = 60_000;
const HOOK_TIMEOUT_MS = 150_000;
const HISTORY_FIXTURE = join(dirname(fileURLToPath(import.meta.url)), 'histories', 'data-retention.history.json');

/** Rejects with `what` in the message when `promise` has not settled within `ms`. */
async function within<T>(what: string, ms: number, promise: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms / 1000} s`)), ms);
  });
  try {
    return await Promise.race([promise, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

describe('dataRetentionWorkflow (time-skipping)', () => {
  let env: TestWorkflowEnvironment;
  let database: TestDatabase;
  let policies: RetentionPolicy[];
  let worker: Worker;
  let running: Promise<void> | undefined;
  let workflowNumber = 0;

  before(
    async () => {
      // Assigned as each one is ready, so that `after` cleans up whatever was created before a stall.
      await Promise.all([
        within(
          'before: createTimeSkippingEnv()',
          HOOK_STEP_MS,
          createTimeSkippingEnv().then((ready) => (env = ready)),
        ),
        within(
          'before: createTestDatabase()',
          HOOK_STEP_MS,
          createTestDatabase().then((ready) => (database = ready)),
        ),
      ]);
      policies = [...RETENTION_POLICIES];
      // The worker reads `policies` on every call, so a test can swap in a failing one.
      worker = await within(
        'before: Worker.create()',
        HOOK_STEP_MS,
        testWorkflowBundle().then((workflowBundle) =>
          Worker.create({
            connection: env.nativeConnection,
            taskQueue: TASK_QUEUES.core,
            workflowBundle,
            activities: {
              purgeExpiredRows: (
                input: Parameters<ReturnType<typeof createDataRetentionActivities>['purgeExpiredRows']>[0],
              ) => createDataRetentionActivities({ sql: database.sql, policies }).purgeExpiredRows(input),
            },
          }),
        ),
      );
      running = worker.run();
    },
    { timeout: HOOK_TIMEOUT_MS },
  );
  beforeEach(
    async () => {
      policies = [...RETENTION_POLICIES];
      await database.sql`delete from outbox`;
    },
    { timeout: HOOK_STEP_MS },
  );
  after(
    async () => {
      try {
        if (worker?.getState() === 'RUNNING') worker.shutdown();
        if (running !== undefined) await within('after: worker shutdown', HOOK_STEP_MS, running);
      } finally {
        await within(
          'after: test server teardown and database drop',
          HOOK_STEP_MS,
          Promise.all([env?.teardown(), database?.drop()]),
        );
      }
    },
    { timeout: HOOK_TIMEOUT_MS },
  );

  async function seed(id: string, dispatchedAgoMs: number | null): Promise<void> {
    const now = Date.now();
    await database.sql`
      insert into outbox (workflow_type, workflow_id, task_queue, created_at, dispatched_at)
      values ('transferSettlement', ${id}, 'payments-core', ${new Date(now - 30 * DAY_MS)},
              ${dispatchedAgoMs === null ? null : new Date(now - dispatchedAgoMs)})`;
  }

  async function remaining(): Promise<string[]> {
    const rows = await database.sql<{ workflow_id: string }[]>`select workflow_id from outbox order by workflow_id`;
    return rows.map((row) => row.workflow_id);
  }

  function start(
    args: Parameters<typeof dataRetentionWorkflow>[0],
  ): Promise<WorkflowHandleWithFirstExecutionRunId<typeof dataRetentionWorkflow>> {
    workflowNumber += 1;
    return env.client.workflow.start<typeof dataRetentionWorkflow>('dataRetentionWorkflow', {
      workflowId: `test/data-retention-${workflowNumber}`,
      taskQueue: TASK_QUEUES.core,
      args: [args],
    });
  }

  /** Skips `duration` of workflow time; fails within 30 s if time skipping is locked (see sleepWithin). */
  const skip = (duration: string) => sleepWithin(env, duration);

  /**
   * Terminates the latest run once it has no workflow task and no activity in flight (it waits on its
   * timer). Terminating a run with either in flight leaves the test server's time-skipping lock for
   * that task held for good, and every later `env.sleep` in this file would then wait in real time.
   */
  async function terminateWhenIdle(workflowId: string): Promise<void> {
    const handle = env.client.workflow.getHandle(workflowId);
    await waitFor('the run to have no workflow task or activity in flight', async () => {
      let taskOpen = false;
      const openActivities = new Set<string>();
      for (const event of (await handle.fetchHistory()).events ?? []) {
        if (event.workflowTaskScheduledEventAttributes) taskOpen = true;
        if (
          event.workflowTaskCompletedEventAttributes ||
          event.workflowTaskFailedEventAttributes ||
          event.workflowTaskTimedOutEventAttributes
        ) {
          taskOpen = false;
        }
        if (event.activityTaskScheduledEventAttributes) openActivities.add(String(event.eventId));
        const closed =
          event.activityTaskCompletedEventAttributes ??
          event.activityTaskFailedEventAttributes ??
          event.activityTaskTimedOutEventAttributes ??
          event.activityTaskCanceledEventAttributes;
        if (closed) openActivities.delete(String(closed.scheduledEventId));
      }
      return !taskOpen && openActivities.size === 0;
    });
    await handle.terminate('test done');
  }

  // A query has no deadline of its own: one that stalls on the time-skipping server under load would
  // hang the file until its timeout, past waitFor's own; with one, waitFor asks again.
  const status = (handle: WorkflowHandle) =>
    env.client.withDeadline(Date.now() + 5_000, () => handle.query(dataRetentionStatusQuery));
  const afterSweeps = (handle: WorkflowHandle, sweeps: number) =>
    waitFor<DataRetentionStatus>(`${sweeps} sweeps`, async () => {
      const current = await status(handle);
      return current.sweeps >= sweeps ? current : undefined;
    });

  it(
    'sweeps once a day for days in seconds, continues as new, and replays deterministically',
    { timeout: STEP_TIMEOUT_MS },
    async () => {
      await seed('expired-at-start', 8 * DAY_MS);
      await seed('expires-on-day-1', 6.5 * DAY_MS);
      await seed('expires-on-day-2', 5.5 * DAY_MS);
      await seed('still-fresh', 0);
      await seed('never-dispatched', null);
      const startedAt = Date.now();
      const handle = await start({ sweepsPerRun: 3 });
      const firstRunId = handle.firstExecutionRunId;

      assert.equal((await afterSweeps(handle, 1)).deleted, 1);
      assert.deepEqual(await remaining(), ['expires-on-day-1', 'expires-on-day-2', 'never-dispatched', 'still-fresh']);

      await skip('1 day');
      assert.equal((await afterSweeps(handle, 2)).deleted, 2);
      assert.deepEqual(await remaining(), ['expires-on-day-2', 'never-dispatched', 'still-fresh']);

      await skip('1 day');
      assert.equal((await afterSweeps(handle, 3)).deleted, 3);
      assert.deepEqual(await remaining(), ['never-dispatched', 'still-fresh']);

      // After three sweeps the run continues as new, carrying its totals, and sweeps again at once.
      await skip('1 day');
      // The sleep can return while the workflow task that continues the first run as new is still in
      // flight. A query that reached that run then would make the test server schedule one more task on
      // the closed run, never completed, and time skipping would stay locked for the rest of the file;
      // so no query until the first run has closed (describe does not touch the run).
      const firstRun = env.client.workflow.getHandle(handle.workflowId, firstRunId);
      await waitFor('the first run to continue as new', async () => {
        return (await firstRun.describe()).status.name === 'CONTINUED_AS_NEW';
      });
      const carried = await afterSweeps(handle, 4);
      assert.equal(carried.deleted, 3);
      const latest = await env.client.workflow.getHandle(handle.workflowId).describe();
      assert.notEqual(latest.runId, firstRunId);
      assert.ok(Date.now() - startedAt < 60_000, 'three days of timers took under a minute of real time');

      const history = await firstRun.fetchHistory();
      await Worker.runReplayHistory({ workflowBundle: await testWorkflowBundle() }, history, handle.workflowId);
      if (process.env.UPDATE_HISTORIES === '1') await writeFile(HISTORY_FIXTURE, historyToJSON(history));
      await terminateWhenIdle(handle.workflowId);
    },
  );

  it('retries a transient failure within the sweep', { timeout: STEP_TIMEOUT_MS }, async () => {
    await seed('expired', 8 * DAY_MS);
    let calls = 0;
    policies = [
      {
        ...RETENTION_POLICIES[0]!,
        async purge(sql, options) {
          calls += 1;
          if (calls <= 2) throw new Error('connection reset');
          return RETENTION_POLICIES[0]!.purge(sql, options);
        },
      },
    ];
    const handle = await start({});
    const current = await waitFor('sweep after retries', async () => {
      await skip('30 seconds'); // skips the retry backoff
      const value = await status(handle);
      return value.deleted === 1 ? value : undefined;
    });
    assert.equal(current.failedSweeps, 0);
    assert.equal(calls, 3);
    assert.deepEqual(await remaining(), []);
    await terminateWhenIdle(handle.workflowId);
  });

  it('survives a sweep that fails for good and sweeps again the next day', { timeout: STEP_TIMEOUT_MS }, async () => {
    await seed('expired', 8 * DAY_MS);
    policies = [
      {
        ...RETENTION_POLICIES[0]!,
        async purge() {
          throw ApplicationFailure.nonRetryable('retention policy misconfigured', 'RetentionPolicyInvalid');
        },
      },
    ];
    const handle = await start({});
    const failed = await waitFor('failed sweep', async () => {
      const value = await status(handle);
      return value.failedSweeps === 1 ? value : undefined;
    });
    assert.equal(failed.deleted, 0);
    assert.deepEqual(await remaining(), ['expired']);

    policies = [...RETENTION_POLICIES];
    await skip('1 day');
    const recovered = await afterSweeps(handle, 2);
    assert.equal(recovered.deleted, 1);
    assert.equal(recovered.failedSweeps, 1);
    assert.deepEqual(await remaining(), []);
    const history = await handle.fetchHistory();
    await Worker.runReplayHistory({ workflowBundle: await testWorkflowBundle() }, history, handle.workflowId);
    await terminateWhenIdle(handle.workflowId);
  });

  it('sweeps again soon while a backlog remains', { timeout: STEP_TIMEOUT_MS }, async () => {
    for (let index = 0; index < 5; index++) await seed(`expired-${index}`, 8 * DAY_MS);
    const handle = await start({ batchSize: 2, maxBatches: 1 });
    assert.equal((await afterSweeps(handle, 1)).backlog, true);
    await skip('5 minutes');
    await afterSweeps(handle, 2);
    await skip('5 minutes');
    const done = await afterSweeps(handle, 3);
    assert.equal(done.deleted, 5);
    assert.equal(done.backlog, false);
    await terminateWhenIdle(handle.workflowId);
  });

  it(
    'joins the running workflow on a duplicate start instead of starting a second one',
    { timeout: STEP_TIMEOUT_MS },
    async () => {
      // The same start ensureSystemWorkflows makes (its Schedule part needs a real server: see
      // workflows/idempotency-purge.test.ts, which also checks this on the dev server).
      const startRetention = () =>
        env.client.workflow.start('dataRetentionWorkflow', {
          workflowId: DATA_RETENTION_WORKFLOW_ID,
          taskQueue: TASK_QUEUES.core,
          args: [{}],
          workflowIdConflictPolicy: WorkflowIdConflictPolicy.USE_EXISTING,
        });
      const first = await startRetention();
      const second = await startRetention();
      assert.equal(second.firstExecutionRunId, first.firstExecutionRunId);
      await assert.rejects(
        env.client.workflow.start('dataRetentionWorkflow', {
          workflowId: DATA_RETENTION_WORKFLOW_ID,
          taskQueue: TASK_QUEUES.core,
          args: [{}],
        }),
        WorkflowExecutionAlreadyStartedError,
      );
      // Its first sweep is still running: terminating now would leave its locks held (see above).
      await terminateWhenIdle(DATA_RETENTION_WORKFLOW_ID);
    },
  );

  it(
    'replays the recorded history of an earlier version without non-determinism',
    { timeout: STEP_TIMEOUT_MS },
    async () => {
      const history = historyFromJSON(JSON.parse(await readFile(HISTORY_FIXTURE, 'utf8')));
      await Worker.runReplayHistory({ workflowBundle: await testWorkflowBundle() }, history, 'recorded/data-retention');
    },
  );
});
