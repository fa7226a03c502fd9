// The sandbox simulation endpoints' answers when the simulated event does not simply win: a settle
// racing a fail on the same payout, and an event for a settlement that is not running.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker } from '@temporalio/worker';
import { createActivities } from '../../activities/index.ts';
import { call, provisionTestTenant, startTestApp, type TestApp, type TestTenant } from '../../test-support/app.ts';
import { createTimeSkippingEnv, testWorkflowBundle } from '../../test-support/temporal.ts';
import { TASK_QUEUES } from '../../workflows/shared/task-queues.ts';

describe('/v1/sandbox/transfers simulations that lose or find nothing to signal', { timeout: 180_000 }, () => {
  let env: TestWorkflowEnvironment;
  let testApp: TestApp;
  let worker: Worker;
  let running: Promise<void>;
  let tenant: TestTenant;
  let counter = 0;

  before(async () => {
    env = await createTimeSkippingEnv();
    testApp = await startTestApp({ temporal: env.client, outcomeWaitMs: 2_000 });
    worker = await Worker.create({
      connection: env.nativeConnection,
      taskQueue: TASK_QUEUES.core,
      workflowBundle: await testWorkflowBundle(),
      activities: createActivities({ sql: testApp.appSql, temporal: () => env.client }),
    });
    running = worker.run();
    tenant = await provisionTestTenant(testApp);
  });
  after(async () => {
    worker.shutdown();
    await running;
    await testApp.close();
    await env.teardown();
  });

  // `.15`: the sandbox rail keeps the payout processing until /settle or /fail.
  const slowPayout = async () => {
    const response = await call(testApp, 'POST', '/v1/transfers', {
      token: tenant.sandboxApiKey,
      headers: { 'idempotency-key': `sim-payout-${process.pid}-${++counter}` },
      body: {
        source: { currency: 'USDC', rail: 'stablecoin', amount: '20.15' },
        destination: { currency: 'USD', rail: 'ach', account: tenant.sandbox.achAccountId },
      },
    });
    assert.equal(response.status, 201, JSON.stringify(response.body));
    assert.equal(response.body.status, 'processing');
    return response.body as { id: string };
  };
  const simulate = (id: string, action: string) =>
    call(testApp, 'POST', `/v1/sandbox/transfers/${id}/${action}`, {
      token: tenant.sandboxApiKey,
      headers: { 'idempotency-key': `sim-${process.pid}-${++counter}` },
      body: {},
    });

  it('answers the loser of a settle/fail race with 409, never with the winner’s state as a success', async () => {
    const { id } = await slowPayout();
    const [settle, fail] = await Promise.all([simulate(id, 'settle'), simulate(id, 'fail')]);
    const answers = [settle, fail].map((response) => response.status).sort();
    assert.deepEqual(answers, [200, 409], JSON.stringify([settle.body, fail.body]));
    const [winner, loser] = settle.status === 200 ? [settle, fail] : [fail, settle];
    assert.equal(winner.body.status, settle.status === 200 ? 'settled' : 'failed');
    assert.equal(loser.body.code, 'INVALID_TRANSFER_STATE');
    const final = await call(testApp, 'GET', `/v1/transfers/${id}`, { token: tenant.sandboxApiKey });
    assert.equal(final.body.status, winner.body.status);
  });

  it('answers 409 when the settlement is not running, instead of a 500', async () => {
    const { id } = await slowPayout();
    const transfer = await call(testApp, 'GET', `/v1/transfers/${id}`, { token: tenant.sandboxApiKey });
    assert.equal(transfer.body.status, 'processing');
    const [row] = await testApp.ownerSql<{ workflow_id: string }[]>`select workflow_id from transfers where id = ${id}`;
    await env.client.workflow.getHandle(row!.workflow_id).terminate('test: the settlement stops');
    const settle = await simulate(id, 'settle');
    assert.equal(settle.status, 409, JSON.stringify(settle.body));
    assert.equal(settle.body.code, 'INVALID_TRANSFER_STATE');
    assert.match(settle.body.detail as string, /not running/);
  });
});
