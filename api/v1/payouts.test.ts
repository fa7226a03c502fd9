// Shape A end to end through the HTTP API: the transfer row and its hold committed in the request,
// the settlement workflow started with update-with-start on the time-skipping server, the worker
// running the real activities against PostgreSQL with the simulated sandbox ACH rail.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { Client, Connection } from '@temporalio/client';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker } from '@temporalio/worker';
import { pino } from 'pino';
import { createActivities } from '../../activities/index.ts';
import { createOutboxRelayActivities } from '../../activities/outbox-relay.ts';
import { purgeExpiredIdempotencyKeys } from '../../db/idempotency.ts';
import { findOutboxEntry } from '../../db/outbox.ts';
import { withSystemScope } from '../../db/tenant.ts';
import { PEGGED_RATES } from '../../services/quotes.ts';
import { createPayoutTransfer, settlementWorkflowId } from '../../services/rail-transfers.ts';
import { call, provisionTestTenant, startTestApp, type TestApp, type TestTenant } from '../../test-support/app.ts';
import { createTimeSkippingEnv, testWorkflowBundle } from '../../test-support/temporal.ts';
import { waitFor } from '../../test-support/wait.ts';
import { SEARCH_ATTRIBUTES } from '../../workflows/shared/search-attributes.ts';
import { TASK_QUEUES } from '../../workflows/shared/task-queues.ts';

describe('/v1 payouts (Shape A) through the settlement workflow', { timeout: 180_000 }, () => {
  let env: TestWorkflowEnvironment;
  let testApp: TestApp;
  let worker: Worker;
  let running: Promise<void>;
  let tenant: TestTenant;
  let counter = 0;

  const startWorker = async () => {
    worker = await Worker.create({
      connection: env.nativeConnection,
      taskQueue: TASK_QUEUES.core,
      workflowBundle: await testWorkflowBundle(),
      activities: createActivities({ sql: testApp.appSql, temporal: () => env.client }),
    });
    running = worker.run();
  };

  before(async () => {
    env = await createTimeSkippingEnv();
    testApp = await startTestApp({ temporal: env.client, outcomeWaitMs: 2_000 });
    await startWorker();
    tenant = await provisionTestTenant(testApp);
  });
  after(async () => {
    worker.shutdown();
    await running;
    await testApp.close();
    await env.teardown();
  });

  const payout = (amount: string, options: { key?: string; account?: string; currency?: string } = {}) =>
    call(testApp, 'POST', '/v1/transfers', {
      token: tenant.sandboxApiKey,
      headers: { 'idempotency-key': options.key ?? `payout-${process.pid}-${++counter}` },
      body: {
        source: { currency: 'USDC', rail: 'stablecoin', amount },
        destination: {
          currency: options.currency ?? 'USD',
          rail: 'ach',
          account: options.account ?? tenant.sandbox.achAccountId,
        },
      },
    });
  /**
   * As the 24 h purge does once a key has expired: the transfers stay, their keys' records go (and,
   * that much later, the API's replay cache has long forgotten them).
   */
  const purgeKeys = async () => {
    await purgeExpiredIdempotencyKeys(testApp.ownerSql, { asOf: new Date(Date.now() + 25 * 3600_000), limit: 1000 });
    testApp.idempotency.clearReplayCache();
  };
  const wallet = async () =>
    (await call(testApp, 'GET', `/v1/accounts/${tenant.sandbox.usdcWalletId}`, { token: tenant.sandboxApiKey })).body
      .balances;
  const simulate = (id: string, action: string) =>
    call(testApp, 'POST', `/v1/sandbox/transfers/${id}/${action}`, {
      token: tenant.sandboxApiKey,
      headers: { 'idempotency-key': `sim-${process.pid}-${++counter}` },
      body: {},
    });

  it('settles a default payout before the response, signed, with the quote in decimal strings', async () => {
    const key = `payout-settle-${process.pid}`;
    const response = await payout('100.00', { key });
    assert.equal(response.status, 201, JSON.stringify(response.body));
    assert.equal(response.body.status, 'settled');
    assert.deepEqual(response.body.out, { amount: '99.50', currency: 'USD' });
    assert.deepEqual(response.body.fee, { amount: '0.500000', currency: 'USDC' });
    assert.equal(response.body.rate, '1', 'the rate as the quote gave it, without the column’s trailing zeros');
    const { signature, ...unsigned } = response.body;
    assert.equal(await testApp.signer.verify(unsigned, signature), true);
    assert.deepEqual(await wallet(), { available: '9900.000000', pending: '0.000000', posted: '9900.000000' });

    const replay = await payout('100.00', { key });
    assert.equal(replay.status, 201);
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.deepEqual(replay.body, response.body);
    assert.equal((await wallet()).posted, '9900.000000', 'the replay moved nothing');

    const detail = await call(testApp, 'GET', `/v1/transfers/${response.body.id}`, { token: tenant.sandboxApiKey });
    assert.equal(detail.body.rate, '1');
    assert.deepEqual(
      detail.body.status_history.map((change: { status: string }) => change.status),
      ['pending', 'processing', 'settled'],
    );
    const workflow = await env.client.workflow
      .getHandle(settlementWorkflowId(tenant.company.id, 'sandbox', key))
      .describe();
    assert.equal(workflow.type, 'transferSettlementWorkflow');
  });

  it('answers a payout the rail refuses (.13) as failed and gives the money back', async () => {
    const before = await wallet();
    const response = await payout('10.13');
    assert.equal(response.status, 201);
    assert.equal(response.body.status, 'failed');
    assert.match(response.body.failure_reason, /R01/);
    assert.deepEqual(await wallet(), before);
  });

  it('keeps a slow payout (.15) processing, with its money on hold, until the sandbox settles it', async () => {
    const before = await wallet();
    const response = await payout('20.15');
    assert.equal(response.status, 201);
    assert.equal(response.body.status, 'processing');
    assert.equal((await wallet()).pending, '-20.150000');
    const settled = await simulate(response.body.id, 'settle');
    assert.equal(settled.status, 200, JSON.stringify(settled.body));
    assert.equal(settled.body.status, 'settled');
    assert.equal((await wallet()).posted, (Number(before.posted) - 20.15).toFixed(6));
    assert.equal((await simulate(response.body.id, 'settle')).body.code, 'INVALID_TRANSFER_STATE');
  });

  it('returns a settled payout in full, fee included, when the bank sends it back', async () => {
    const before = await wallet();
    const response = await payout('30.00');
    assert.equal(response.body.status, 'settled');
    // As a client would: a 409 "retry in a moment" (the run did not answer within its wait, which
    // a loaded test server can make happen) is asked again.
    const returned = await waitFor('the return to be taken', async () => {
      const attempt = await simulate(response.body.id, 'return');
      return attempt.status === 409 && /retry in a moment/.test(String(attempt.body.detail)) ? undefined : attempt;
    });
    assert.equal(returned.status, 200, JSON.stringify(returned.body));
    assert.equal(returned.body.status, 'returned');
    assert.deepEqual(await wallet(), before);
  });

  it('refuses bad payouts with stable codes before anything moves', async () => {
    const before = await wallet();
    assert.equal((await payout('20000.00')).body.code, 'INSUFFICIENT_FUNDS');
    const missing = await payout('1.00', { account: 'ba_00000000000000000000000000000000' });
    assert.equal(missing.status, 404);
    assert.equal(missing.body.code, 'ACCOUNT_NOT_FOUND');
    assert.equal((await payout('1.00', { currency: 'EUR' })).body.code, 'CURRENCY_MISMATCH');
    const scale = await payout('1.0000001');
    assert.equal(scale.status, 400);
    assert.equal(scale.body.code, 'INVALID_AMOUNT');
    assert.deepEqual(await wallet(), before);
  });

  it('answers with the transfer exactly as it is stored: the POST body is the GET body without its history', async () => {
    for (const amount of ['40.00', '10.13', '20.15']) {
      const created = await payout(amount);
      assert.equal(created.status, 201, JSON.stringify(created.body));
      const detail = await call(testApp, 'GET', `/v1/transfers/${created.body.id}`, { token: tenant.sandboxApiKey });
      const { signature: createdSignature, ...answered } = created.body;
      const { signature: storedSignature, status_history: history, ...stored } = detail.body;
      assert.deepEqual(answered, stored, amount);
      assert.ok(createdSignature && storedSignature && history, amount);
      assert.deepEqual(Object.keys(answered), Object.keys(stored), `${amount}: same members in the same order`);
    }
  });

  it('restarts a payout whose workflow never started (crash after commit) from the outbox, once', async () => {
    const unreachable = new Client({ connection: Connection.lazy({ address: '127.0.0.1:1', connectTimeout: 200 }) });
    const key = `payout-stranded-${process.pid}`;
    const stranded = await createPayoutTransfer(
      {
        sql: testApp.appSql,
        temporal: unreachable,
        fxRates: PEGGED_RATES,
        logger: pino({ level: 'silent' }),
        outcomeWaitMs: 500,
      },
      { companyId: tenant.company.id, environment: 'sandbox' },
      {
        source: { currency: 'USDC', rail: 'stablecoin', amount: '5.00' },
        destination: { currency: 'USD', rail: 'ach', account: tenant.sandbox.achAccountId },
      },
      key,
    );
    assert.equal(stranded.status, 'pending');
    const workflowId = settlementWorkflowId(tenant.company.id, 'sandbox', key);
    const relay = createOutboxRelayActivities({ sql: testApp.appSql, temporal: () => env.client });
    assert.deepEqual(await relay.relayOutbox({ olderThanMs: 0, batchSize: 100 }), { started: 1, failed: 0 });
    assert.deepEqual(
      await relay.relayOutbox({ olderThanMs: 0, batchSize: 100 }),
      { started: 0, failed: 0 },
      'dispatched once',
    );
    await waitFor('the relayed payout to settle', async () => {
      const detail = await call(testApp, 'GET', `/v1/transfers/${stranded.id}`, { token: tenant.sandboxApiKey });
      return detail.body.status === 'settled';
    });
    const entry = await withSystemScope(testApp.appSql, (tx) => findOutboxEntry(tx, workflowId));
    assert.ok(entry?.dispatchedAt);
  });

  it('gives a key spelled like the hash of another key a workflow of its own: both payouts settle', async () => {
    const hashed = `order ${process.pid}/42`; // a space and a slash: its workflow ID is its hash
    const literal = `sha256-${createHash('sha256').update(hashed).digest('hex')}`;
    const ids = [hashed, literal].map((key) => settlementWorkflowId(tenant.company.id, 'sandbox', key));
    assert.notEqual(ids[0], ids[1]);
    const before = await wallet();
    const first = await payout('10.00', { key: hashed });
    const second = await payout('7.00', { key: literal });
    for (const [index, response] of [first, second].entries()) {
      assert.equal(response.status, 201, JSON.stringify(response.body));
      assert.equal(response.body.status, 'settled');
      const detail = await call(testApp, 'GET', `/v1/transfers/${response.body.id}`, { token: tenant.sandboxApiKey });
      assert.equal(detail.body.status, 'settled', 'stored as answered');
      const workflow = await env.client.workflow.getHandle(ids[index]!).describe();
      assert.equal(
        workflow.typedSearchAttributes.get(SEARCH_ATTRIBUTES.objectId),
        response.body.id,
        'its own workflow',
      );
    }
    assert.notEqual(first.body.id, second.body.id);
    const after = await wallet();
    assert.equal(after.pending, before.pending, 'no hold left behind');
    assert.equal(after.posted, (Number(before.posted) - 17).toFixed(6), 'both paid out');
  });

  it('refuses a different payout under a key whose transfer outlived its record (IDEMPOTENCY_KEY_USED)', async () => {
    const key = `payout-reused-${process.pid}`;
    const first = await payout('3.00', { key });
    assert.equal(first.status, 201);
    await purgeKeys();
    const before = await wallet();
    for (const different of [
      () => payout('250.00', { key }),
      () => payout('3.00', { key, account: tenant.sandbox.usdAccountId }),
      () => payout('3.00', { key, currency: 'EUR' }),
    ]) {
      const refused = await different();
      assert.equal(refused.status, 409, JSON.stringify(refused.body));
      assert.equal(refused.body.code, 'IDEMPOTENCY_KEY_USED');
      await purgeKeys(); // the key's new record goes too: each request meets the transfer itself
    }
    assert.deepEqual(await wallet(), before, 'nothing moved');

    // The same payout again is a retry (a crash after its hold): the transfer it made, not a new one.
    const same = await payout('3.00', { key });
    assert.equal(same.status, 201, JSON.stringify(same.body));
    assert.equal(same.body.id, first.body.id);
    assert.equal(same.body.status, 'settled');
    assert.deepEqual(await wallet(), before, 'the retry moved nothing');
    const rows = await testApp.ownerSql`select id from transfers where idempotency_key = ${key}`;
    assert.equal(rows.length, 1);
  });

  it('refuses a payout under a key a ledger transfer (Shape B) holds once the key record is gone', async () => {
    const key = `payout-cross-${process.pid}`;
    const ledger = await call(testApp, 'POST', '/v1/transfers', {
      token: tenant.sandboxApiKey,
      headers: { 'idempotency-key': key },
      body: {
        amount: 100,
        currency: 'USD',
        source: tenant.sandbox.usdWalletId,
        destination: tenant.sandbox.usdAccountId,
      },
    });
    assert.equal(ledger.status, 201, JSON.stringify(ledger.body));
    await purgeKeys();
    const before = await wallet();
    for (let attempt = 0; attempt < 2; attempt++) {
      const refused = await payout('1.00', { key });
      assert.equal(refused.status, 409, JSON.stringify(refused.body));
      assert.equal(refused.body.code, 'IDEMPOTENCY_KEY_USED');
    }
    assert.deepEqual(await wallet(), before, 'nothing moved');
    const outbox = await withSystemScope(testApp.appSql, (tx) =>
      findOutboxEntry(tx, settlementWorkflowId(tenant.company.id, 'sandbox', key)),
    );
    assert.equal(outbox, undefined, 'no workflow to start');
  });

  it('answers a retry of a payout whose settlement has closed from the transfer, without a second run', async () => {
    const key = `payout-closed-${process.pid}`;
    const first = await payout('10.13', { key }); // refused by the sandbox rail: the run ends
    assert.equal(first.status, 201);
    assert.equal(first.body.status, 'failed');
    const workflowId = settlementWorkflowId(tenant.company.id, 'sandbox', key);
    const handle = env.client.workflow.getHandle(workflowId);
    await handle.result();
    const closed = await handle.describe();
    assert.equal(closed.status.name, 'COMPLETED');
    await purgeKeys();

    const retry = await payout('10.13', { key });
    assert.equal(retry.status, 201, JSON.stringify(retry.body));
    assert.equal(retry.body.id, first.body.id);
    assert.equal(retry.body.status, 'failed');
    assert.equal(retry.body.failure_reason, first.body.failure_reason);
    const latest = await env.client.workflow.getHandle(workflowId).describe();
    assert.equal(latest.runId, closed.runId, 'no new run');
    assert.equal(latest.status.name, 'COMPLETED');
    const replay = await payout('10.13', { key });
    assert.equal(replay.headers.get('idempotent-replayed'), 'true', 'the answer is stored under the key again');
    assert.equal(replay.body.status, 'failed');
  });

  it('does not answer a payout with the outcome of another transfer its workflow ID reached', async () => {
    const key = `payout-foreign-${process.pid}`;
    // A settlement that answers for some other transfer (as two transfers under one ID would).
    const foreign = {
      connection: { withDeadline: <T>(_deadline: number, fn: () => Promise<T>) => fn() },
      workflow: {
        executeUpdateWithStart: async () => ({
          transferId: 'tr_other',
          status: 'settled',
          railReference: null,
          failureReason: null,
        }),
      },
    } as unknown as Client;
    await assert.rejects(
      createPayoutTransfer(
        {
          sql: testApp.appSql,
          temporal: foreign,
          fxRates: PEGGED_RATES,
          logger: pino({ level: 'silent' }),
          outcomeWaitMs: 500,
        },
        { companyId: tenant.company.id, environment: 'sandbox' },
        {
          source: { currency: 'USDC', rail: 'stablecoin', amount: '4.00' },
          destination: { currency: 'USD', rail: 'ach', account: tenant.sandbox.achAccountId },
        },
        key,
      ),
      /answered for transfer tr_other/,
    );
    const [row] = await testApp.ownerSql<{ id: string; status: string }[]>`
      select id, status from transfers where idempotency_key = ${key}`;
    assert.ok(row);
    assert.equal(row.status, 'pending', "not settled by another transfer's outcome");
    const workflowId = settlementWorkflowId(tenant.company.id, 'sandbox', key);
    const entry = await withSystemScope(testApp.appSql, (tx) => findOutboxEntry(tx, workflowId));
    assert.equal(entry?.dispatchedAt, null, 'its own workflow is still to start');
    // Which the relay does: the payout settles through its own run.
    const relay = createOutboxRelayActivities({ sql: testApp.appSql, temporal: () => env.client });
    assert.equal((await relay.relayOutbox({ olderThanMs: 0, batchSize: 100 })).started, 1);
    await waitFor('the payout to settle through its own workflow', async () => {
      const detail = await call(testApp, 'GET', `/v1/transfers/${row.id}`, { token: tenant.sandboxApiKey });
      return detail.body.status === 'settled';
    });
  });

  it('explains a payout refused for its source currency or its amount', async () => {
    const refusal = async (source: { currency: string; amount: string }) => {
      const response = await call(testApp, 'POST', '/v1/transfers', {
        token: tenant.sandboxApiKey,
        headers: { 'idempotency-key': `payout-refused-${process.pid}-${++counter}` },
        body: {
          source: { ...source, rail: 'stablecoin' },
          destination: { currency: 'USD', rail: 'ach', account: tenant.sandbox.achAccountId },
        },
      });
      assert.equal(response.status, 400, JSON.stringify(response.body));
      return response.body as { code: string; detail: string };
    };
    const fiat = await refusal({ currency: 'USD', amount: '10.00' });
    assert.equal(fiat.code, 'UNSUPPORTED_CURRENCY');
    assert.match(fiat.detail, /stablecoin rail pays out USDC/);
    const huge = await refusal({ currency: 'USDC', amount: '1'.repeat(30) });
    assert.equal(huge.code, 'INVALID_AMOUNT');
    assert.match(huge.detail, /exceeds the per-transfer limit/);
    const precise = await refusal({ currency: 'USDC', amount: `1.${'0'.repeat(19)}` });
    assert.match(precise.detail, /more decimal places/);
  });

  it('answers the loser of a settle/fail race with 409, never with the winner’s state as a success', async () => {
    const slow = await payout('20.15'); // .15: processing until /settle or /fail
    assert.equal(slow.body.status, 'processing');
    const [settle, fail] = await Promise.all([simulate(slow.body.id, 'settle'), simulate(slow.body.id, 'fail')]);
    assert.deepEqual([settle.status, fail.status].sort(), [200, 409], JSON.stringify([settle.body, fail.body]));
    const [winner, loser] = settle.status === 200 ? [settle, fail] : [fail, settle];
    assert.equal(winner.body.status, settle.status === 200 ? 'settled' : 'failed');
    assert.equal(loser.body.code, 'INVALID_TRANSFER_STATE');
    const final = await call(testApp, 'GET', `/v1/transfers/${slow.body.id}`, { token: tenant.sandboxApiKey });
    assert.equal(final.body.status, winner.body.status);
  });

  it('answers a simulation 409, not 500, when the settlement is not running', async () => {
    const slow = await payout('21.15');
    assert.equal(slow.body.status, 'processing');
    const [row] = await testApp.ownerSql<{ workflow_id: string }[]>`
      select workflow_id from transfers where id = ${slow.body.id}`;
    await env.client.workflow.getHandle(row!.workflow_id).terminate('test: the settlement stops');
    const settle = await simulate(slow.body.id, 'settle');
    assert.equal(settle.status, 409, JSON.stringify(settle.body));
    assert.equal(settle.body.code, 'INVALID_TRANSFER_STATE');
    assert.match(settle.body.detail as string, /not running/);
  });

  it('answers a return 409 while the run cannot say it has applied the settlement, and moves nothing', async () => {
    const settled = await payout('23.00');
    assert.equal(settled.body.status, 'settled');
    const before = await wallet();
    // No worker: the run cannot answer, as while a killed worker replays. The database alone says
    // settled; a return signalled now could be ignored by a run that has not applied it.
    worker.shutdown();
    await running;
    try {
      const early = await simulate(settled.body.id, 'return');
      assert.equal(early.status, 409, JSON.stringify(early.body));
      assert.equal(early.body.code, 'INVALID_TRANSFER_STATE');
      assert.match(early.body.detail as string, /retry in a moment/);
      assert.deepEqual(await wallet(), before);
    } finally {
      await startWorker();
    }
    // (That the run takes a return once it says settled, the test of a returned payout shows; here the
    // run's task stays with the stopped worker's sticky queue, which the test server does not time out.)
  });
});
