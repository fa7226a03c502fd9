import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, beforeEach, describe, it } from 'node:test';
import { ActivityFailure, ScheduleOverlapPolicy, WorkflowExecutionAlreadyStartedError, WorkflowFailedError } from '@temporalio/client';
import { ApplicationFailure } from '@temporalio/common';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker } from '@temporalio/worker';
import { createActivities } from '../activities/index.ts';
import {
  createIdempotencyActivities,
  type PurgeExpiredIdempotencyKeysInput,
  type PurgeExpiredIdempotencyKeysResult,
} from '../activities/idempotency.ts';
import { type Sql } from '../db/client.ts';
import { withSystemScope } from '../db/tenant.ts';
import { resolveTemporalCli } from '../platform/temporal.ts';
import { createTestDatabase, type TestDatabase, createAppRoleSql } from '../test-support/db.ts';
import { createTimeSkippingEnv, testWorkflowBundle } from '../test-support/temporal.ts';
import { waitFor } from '../test-support/wait.ts';
import { ensureSystemWorkflows, IDEMPOTENCY_PURGE_SCHEDULE_ID } from '../workers/system-workflows.ts';
import { DATA_RETENTION_WORKFLOW_ID } from './shared/data-retention.ts';
import { TASK_QUEUES } from './shared/task-queues.ts';
import type { idempotencyPurgeWorkflow, IdempotencyPurgeInput } from './idempotency-purge.ts';

const HOUR_MS = 60 * 60 * 1000;
const DAY_MS = 24 * HOUR_MS;
const COMPANY_A = `co_${randomBytes(16).toString('hex')}`;
const COMPANY_B = `co_${randomBytes(16).toString('hex')}`;

/** The worker's pool connects as payments_app: the purge sees other companies' rows only in system scope. */
function createAppSql(database: TestDatabase): Sql {
  return createAppRoleSql(database.url, { applicationName: 'payments-test-worker', poolMax: 5 });
}

async function seedCompanies(database: TestDatabase): Promise<void> {
  await withSystemScope(database.sql, async (tx) => {
    await tx`insert into companies (id, name) values (${COMPANY_A}, 'Company A'), (${COMPANY_B}, 'Company B')`;
  });
}

/**
 * A key whose retention ends `expiresInMs` after `nowMs` (negative: already expired), completed or
 * running. `nowMs` is the workflow clock: the time-skipping server's clock runs ahead of the wall
 * clock (it skips years once a workflow has completed).
 */
async function seedKey(
  database: TestDatabase,
  key: string,
  options: { nowMs: number; companyId?: string; expiresInMs: number; running?: boolean },
) {
  const expiresAt = new Date(options.nowMs + options.expiresInMs);
  const createdAt = new Date(expiresAt.getTime() - DAY_MS - HOUR_MS);
  const running = options.running ?? false;
  await withSystemScope(database.sql, (tx) => tx`
    insert into idempotency_keys (company_id, environment, key, request_method, request_path, request_hash, status,
                                  locked_until, response_status, response_headers, response_body, created_at,
                                  completed_at, expires_at)
    values (${options.companyId ?? COMPANY_A}, 'sandbox', ${key}, 'POST', '/v1/transfers', ${Buffer.alloc(32)},
            ${running ? 'running' : 'completed'}, ${running ? createdAt : null}, ${running ? null : 201},
            ${running ? null : tx.json({ 'content-type': 'application/json' })}, ${running ? null : Buffer.from('{}')},
            ${createdAt}, ${running ? null : createdAt}, ${expiresAt})`);
}

async function remainingKeys(database: TestDatabase): Promise<string[]> {
  const rows = await withSystemScope(database.sql, (tx) => tx<{ key: string }[]>`select key from idempotency_keys order by key`);
  return rows.map((row) => row.key);
}

describe('idempotencyPurgeWorkflow (time-skipping)', () => {
  let env: TestWorkflowEnvironment;
  let database: TestDatabase;
  let appSql: Sql;
  let worker: Worker;
  let running: Promise<void>;
  let workflowNumber = 0;
  /** The activity the worker runs; a test swaps in a failing one. */
  let purge: (input: PurgeExpiredIdempotencyKeysInput) => Promise<PurgeExpiredIdempotencyKeysResult>;
  let calls: PurgeExpiredIdempotencyKeysInput[];
  /** The workflow clock when the test began. */
  let nowMs: number;

  before(async () => {
    [env, database] = await Promise.all([createTimeSkippingEnv(), createTestDatabase()]);
    appSql = createAppSql(database);
    await seedCompanies(database);
    worker = await Worker.create({
      connection: env.nativeConnection,
      taskQueue: TASK_QUEUES.core,
      workflowBundle: await testWorkflowBundle(),
      activities: {
        purgeExpiredIdempotencyKeys: (input: PurgeExpiredIdempotencyKeysInput) => {
          calls.push(input);
          return purge(input);
        },
      },
    });
    running = worker.run();
  });
  beforeEach(async () => {
    purge = createIdempotencyActivities({ sql: appSql }).purgeExpiredIdempotencyKeys;
    calls = [];
    await withSystemScope(database.sql, (tx) => tx`delete from idempotency_keys`);
    nowMs = await env.currentTimeMs();
  });
  after(async () => {
    worker.shutdown();
    await running;
    await appSql.end({ timeout: 5 });
    await Promise.all([env.teardown(), database.drop()]);
  });

  function start(input: IdempotencyPurgeInput = {}) {
    workflowNumber += 1;
    return env.client.workflow.start<typeof idempotencyPurgeWorkflow>('idempotencyPurgeWorkflow', {
      workflowId: `test/idempotency-purge-${workflowNumber}`,
      taskQueue: TASK_QUEUES.core,
      args: [input],
    });
  }

  it('deletes expired keys of every company, keeps the others, and replays its history', async () => {
    await seedKey(database, 'a-expired', { nowMs, expiresInMs: -DAY_MS });
    await seedKey(database, 'a-expired-running', { nowMs, expiresInMs: -HOUR_MS, running: true });
    await seedKey(database, 'b-expired', { nowMs, companyId: COMPANY_B, expiresInMs: -1000 });
    await seedKey(database, 'a-fresh', { nowMs, expiresInMs: DAY_MS });
    await seedKey(database, 'b-fresh-running', { nowMs, companyId: COMPANY_B, expiresInMs: HOUR_MS, running: true });
    const handle = await start();
    const result = await handle.result();

    assert.deepEqual({ ...result, asOfMs: 0 }, { asOfMs: 0, deleted: 3, calls: 1, backlog: false });
    assert.ok(result.asOfMs >= nowMs && result.asOfMs - nowMs < 60_000, 'asOf is the workflow clock at the start');
    assert.deepEqual(calls, [{ asOfMs: result.asOfMs, batchSize: 1000, maxBatches: 10 }]);
    assert.deepEqual(await remainingKeys(database), ['a-fresh', 'b-fresh-running']);

    const history = await handle.fetchHistory();
    await Worker.runReplayHistory({ workflowBundle: await testWorkflowBundle() }, history, handle.workflowId);
  });

  it('works through a backlog in bounded batches, with one reference time', async () => {
    for (let index = 0; index < 7; index++) await seedKey(database, `expired-${index}`, { nowMs, expiresInMs: -DAY_MS });
    await seedKey(database, 'fresh', { nowMs, expiresInMs: DAY_MS });
    const result = await (await start({ batchSize: 2, maxBatches: 1 })).result();
    assert.equal(result.deleted, 7);
    assert.equal(result.calls, 4); // 2 + 2 + 2 + 1
    assert.equal(result.backlog, false);
    assert.deepEqual(calls.map((call) => call.asOfMs), Array(4).fill(result.asOfMs));
    assert.deepEqual(await remainingKeys(database), ['fresh']);
  });

  it('stops after maxCalls and reports the backlog for the next firing', async () => {
    for (let index = 0; index < 7; index++) await seedKey(database, `expired-${index}`, { nowMs, expiresInMs: -DAY_MS });
    const result = await (await start({ batchSize: 2, maxBatches: 1, maxCalls: 2 })).result();
    assert.equal(result.deleted, 4);
    assert.equal(result.calls, 2);
    assert.equal(result.backlog, true);
    assert.equal((await remainingKeys(database)).length, 3);
  });

  it('retries a transient activity failure', async () => {
    await seedKey(database, 'expired', { nowMs, expiresInMs: -DAY_MS });
    const real = purge;
    let attempts = 0;
    purge = async (input) => {
      attempts += 1;
      if (attempts <= 2) throw new Error('connection reset');
      return real(input);
    };
    const handle = await start();
    const result = await handle.result(); // time skipping jumps over the retry backoff
    assert.equal(attempts, 3);
    assert.equal(result.deleted, 1);
    assert.deepEqual(await remainingKeys(database), []);
    const history = await handle.fetchHistory();
    await Worker.runReplayHistory({ workflowBundle: await testWorkflowBundle() }, history, handle.workflowId);
  });

  it('fails the run when the purge fails for good (the next firing tries again)', async () => {
    await seedKey(database, 'expired', { nowMs, expiresInMs: -DAY_MS });
    purge = async () => {
      throw ApplicationFailure.nonRetryable('purge misconfigured', 'PurgeMisconfigured');
    };
    const handle = await start();
    await assert.rejects(handle.result(), (error: unknown) => {
      assert.ok(error instanceof WorkflowFailedError);
      assert.ok(error.cause instanceof ActivityFailure);
      return true;
    });
    assert.deepEqual(await remainingKeys(database), ['expired']);
  });
});

describe('ensureSystemWorkflows: the idempotency-purge Schedule (local dev server)', () => {
  // The Java time-skipping server has no Schedules: this one test runs the Temporal CLI dev server.
  let env: TestWorkflowEnvironment;
  let database: TestDatabase;
  let appSql: Sql;

  before(async () => {
    [env, database] = await Promise.all([
      TestWorkflowEnvironment.createLocal({
        server: { executable: { type: 'existing-path', path: resolveTemporalCli({}, process.env.PATH) } },
      }),
      createTestDatabase(),
    ]);
    appSql = createAppSql(database);
    await seedCompanies(database);
  });
  after(async () => {
    await appSql.end({ timeout: 5 });
    await Promise.all([env.teardown(), database.drop()]);
  });

  it('creates the hourly Schedule once, keeps it (and its paused state) on later calls, and its firing purges', async () => {
    await ensureSystemWorkflows(env.client);
    const retentionRunId = (await env.client.workflow.getHandle(DATA_RETENTION_WORKFLOW_ID).describe()).runId;
    await ensureSystemWorkflows(env.client);
    // The data-retention workflow is joined, not started twice (the same check as in
    // data-retention.test.ts, here on a server that also has Schedules).
    assert.equal((await env.client.workflow.getHandle(DATA_RETENTION_WORKFLOW_ID).describe()).runId, retentionRunId);
    await assert.rejects(
      env.client.workflow.start('dataRetentionWorkflow', { workflowId: DATA_RETENTION_WORKFLOW_ID, taskQueue: TASK_QUEUES.core, args: [{}] }),
      WorkflowExecutionAlreadyStartedError,
    );
    const handle = env.client.schedule.getHandle(IDEMPOTENCY_PURGE_SCHEDULE_ID);
    const described = await handle.describe();
    assert.equal(described.spec.intervals?.length, 1);
    assert.equal(described.spec.intervals[0]!.every, HOUR_MS);
    assert.equal(described.policies.overlap, ScheduleOverlapPolicy.SKIP);
    assert.equal(described.policies.catchupWindow, HOUR_MS);
    assert.equal(described.action.type, 'startWorkflow');
    assert.equal(described.action.workflowType, 'idempotencyPurgeWorkflow');
    assert.equal(described.action.taskQueue, TASK_QUEUES.core);

    // An operator's pause survives the next worker start.
    await handle.pause('maintenance');
    await ensureSystemWorkflows(env.client);
    assert.equal((await handle.describe()).state.paused, true);
    await handle.unpause();

    // A firing starts the workflow on the core queue, and the real activities purge.
    await seedKey(database, 'expired', { nowMs: Date.now(), expiresInMs: -DAY_MS });
    await seedKey(database, 'fresh', { nowMs: Date.now(), expiresInMs: DAY_MS });
    const worker = await Worker.create({
      connection: env.nativeConnection,
      taskQueue: TASK_QUEUES.core,
      workflowBundle: await testWorkflowBundle(),
      activities: createActivities({ sql: appSql }),
    });
    await worker.runUntil(async () => {
      await handle.trigger();
      const action = await waitFor('a schedule action', async () => (await handle.describe()).info.recentActions[0]);
      assert.ok(action.action.workflow.workflowId.startsWith(`${IDEMPOTENCY_PURGE_SCHEDULE_ID}-`));
      const result = (await env.client.workflow.getHandle(action.action.workflow.workflowId).result()) as { deleted: number };
      assert.equal(result.deleted, 1);
    });
    assert.deepEqual(await remainingKeys(database), ['fresh']);

    await handle.delete();
    await env.client.workflow.getHandle(DATA_RETENTION_WORKFLOW_ID).terminate('test done');
  });
});
