import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readdir, readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import {
  WithStartWorkflowOperation,
  WorkflowFailedError,
  WorkflowUpdateFailedError,
  type WorkflowHandle,
  type WorkflowHandleWithFirstExecutionRunId,
} from '@temporalio/client';
import { ApplicationFailure, WorkflowIdConflictPolicy } from '@temporalio/common';
import { historyFromJSON, historyToJSON } from '@temporalio/common/lib/proto-utils.js';
import protos, { type temporal } from '@temporalio/proto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker } from '@temporalio/worker';
import { createActivities } from '../activities/index.ts';
import { createSandboxAchRail, SANDBOX_MAGIC } from '../activities/rails/sandbox-ach.ts';
import type { PayoutCancellation, PayoutRail, PayoutRequest } from '../activities/rails/types.ts';
import { createTransferActivities, createUnconfiguredLiveRail } from '../activities/transfers.ts';
import { type Sql } from '../db/client.ts';
import { balancesOf, findLedgerAccount, transferHistory } from '../db/ledger.ts';
import { createRailTransfer, insertExternalAccount, systemAccount } from '../db/rails.ts';
import { withTenant } from '../db/tenant.ts';
import { newId } from '../platform/ids.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { provisionTenant } from '../services/tenants.ts';
import { createTestDatabase, type TestDatabase, createAppRoleSql } from '../test-support/db.ts';
import { createTimeSkippingEnv, sleepWithin, testWorkflowBundle } from '../test-support/temporal.ts';
import { waitFor } from '../test-support/wait.ts';
import { SEARCH_ATTRIBUTES } from './shared/search-attributes.ts';
import { TASK_QUEUES } from './shared/task-queues.ts';
import {
  awaitTransferOutcomeUpdate,
  railConfirmedSignal,
  railFailedSignal,
  railReturnedSignal,
  SETTLEMENT_VERSION,
  TRANSFER_SETTLEMENT_WORKFLOW,
  transferSnapshotQuery,
  transferWorkflowId,
  type TransferSettlementInput,
  type TransferSnapshot,
} from './shared/transfer-settlement.ts';
import { EXPIRED_REASON, type transferSettlementWorkflow } from './transfer-settlement.ts';

const HOUR_MS = 60 * 60 * 1000;
const DAY_MS = 24 * HOUR_MS;
const USDC = 1_000_000n; // minor units per USDC (scale 6)
const WALLET_START = 10_000n * USDC; // the sandbox preload
const FEE = 1n * USDC;
const HISTORIES_DIR = join(dirname(fileURLToPath(import.meta.url)), 'histories');
const HISTORY_PREFIX = 'transfer-settlement-';
/**
 * Recorded versions: v1 ran the submission and the ledger writes as remote activities; v2 (patch
 * `settlement-local-steps`) runs them as local activities; v3 (patch `settlement-submit-settles`)
 * settles a payout the rail confirms at once in the submission's own local activity; v4 runs v3's
 * steps with the version in its input (no patch marker). Recording (UPDATE_HISTORIES=1) writes the
 * current version; every version's histories keep replaying.
 */
const HISTORY_VERSIONS = ['v1', 'v2', 'v3', 'v4'] as const;
const CURRENT_HISTORY_VERSION = 'v4';
/** The paths whose history is recorded and replayed by later versions of the workflow. */
const RECORDED_PATHS = [
  'settled',
  'failed',
  'slow-confirmed',
  'slow-failed',
  'expired',
  'returned-by-poll',
  'returned-by-signal',
];
/**
 * Paths recorded only from the version in which they were added: they replay against every later
 * version too. (The duplicate start is one of the required settlement paths.)
 */
const RECORDED_SINCE: Record<string, (typeof HISTORY_VERSIONS)[number]> = {
  'duplicate-start': 'v4',
  'submission-refused': 'v4',
  'resubmitted-after-unknown-outcome': 'v4',
  // Cancel before expiring (patch settlement-cancel-on-expiry): 'expired' stays as each version ran it.
  'expired-canceled': 'v4',
  'expired-paid-late': 'v4',
};

type Handle = WorkflowHandle<typeof transferSettlementWorkflow>;
type StartedHandle = WorkflowHandleWithFirstExecutionRunId<typeof transferSettlementWorkflow>;

interface Payout {
  companyId: string;
  walletId: string;
  transferId: string;
  workflowId: string;
  idempotencyKey: string;
  amount: bigint;
  outAmount: bigint;
  input: TransferSettlementInput;
}

/**
 * The sandbox rail the worker runs, with per-transfer hooks: a test can make one transfer's
 * submission throw (transiently or for good) without touching any other. Counts every call.
 */
function createObservedRail() {
  const inner = createSandboxAchRail();
  const submitFaults = new Map<string, (attempt: number) => Error | undefined>();
  const submits = new Map<string, number>();
  const polls = new Map<string, number>();
  const cancels = new Map<string, number>();
  /** A transfer's cancellation answered by the test instead of the sandbox (a bank that paid late). */
  const cancelAnswers = new Map<string, () => PayoutCancellation>();
  const rail: PayoutRail = {
    async submit(request: PayoutRequest) {
      const attempt = (submits.get(request.transferId) ?? 0) + 1;
      submits.set(request.transferId, attempt);
      const fault = submitFaults.get(request.transferId)?.(attempt);
      if (fault) throw fault;
      return inner.submit(request);
    },
    async status(reference: string) {
      polls.set(reference, (polls.get(reference) ?? 0) + 1);
      return inner.status(reference);
    },
    async cancel(request) {
      cancels.set(request.transferId, (cancels.get(request.transferId) ?? 0) + 1);
      return cancelAnswers.get(request.transferId)?.() ?? inner.cancel(request);
    },
  };
  return { rail, inner, submitFaults, submits, polls, cancels, cancelAnswers };
}

describe('transferSettlementWorkflow (time-skipping, real PostgreSQL, sandbox ACH rail)', () => {
  let env: TestWorkflowEnvironment;
  let database: TestDatabase;
  let appSql: Sql;
  let worker: Worker;
  let running: Promise<void>;
  let observed: ReturnType<typeof createObservedRail>;
  let tenantNumber = 0;

  before(async () => {
    [env, database] = await Promise.all([createTimeSkippingEnv(), createTestDatabase()]);
    // The worker's pool is the application's: payments_app, under row-level security.
    appSql = createAppRoleSql(database.url, { applicationName: 'payments-test-worker', poolMax: 5 });
    // The time-skipping server knows only the built-in search attributes: the workflow upserts the
    // custom ones, so they must be registered (as bin/start.ts does on the dev server). Those that
    // createTimeSkippingEnv registered already answer ALREADY_EXISTS.
    for (const key of Object.values(SEARCH_ATTRIBUTES)) {
      await env.connection.operatorService
        .addSearchAttributes({
          namespace: env.namespace ?? 'default',
          searchAttributes: { [key.name]: protos.temporal.api.enums.v1.IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD },
        })
        .catch((error: { code?: number }) => {
          if (error.code !== 6) throw error; // 6 = ALREADY_EXISTS
        });
    }
    observed = createObservedRail();
    worker = await Worker.create({
      connection: env.nativeConnection,
      taskQueue: TASK_QUEUES.core,
      workflowBundle: await testWorkflowBundle(),
      activities: createActivities({
        sql: appSql,
        rails: { sandbox: observed.rail, live: createUnconfiguredLiveRail() },
      }),
    });
    running = worker.run();
  });
  after(async () => {
    worker.shutdown();
    await running;
    await appSql.end({ timeout: 5 });
    await Promise.all([env.teardown(), database.drop()]);
  });

  /** A fresh tenant (10000 USDC in its sandbox wallet) and a pending ACH payout of `amount` USDC from it. */
  async function createPayout(amount: string, timing: Partial<TransferSettlementInput> = {}): Promise<Payout> {
    tenantNumber += 1;
    const tenant = await provisionTenant(
      database.sql,
      { name: `Payout tenant ${tenantNumber}`, ownerEmail: `payout${tenantNumber}-${process.pid}@tenant.example` },
      SYSTEM_ACTOR,
    );
    const companyId = tenant.company.id;
    const scope = { companyId, environment: 'sandbox' as const };
    const [whole, fraction = ''] = amount.split('.');
    const amountMinor = BigInt(whole!) * USDC + BigInt(fraction.padEnd(6, '0'));
    const outAmount = (amountMinor - FEE) / 10_000n; // USDC → USD cents at 1:1, rounded down
    const idempotencyKey = `payout-${tenantNumber}`;
    const workflowId = transferWorkflowId(companyId, 'sandbox', idempotencyKey);
    const transferId = newId('tr');
    await withTenant(database.sql, companyId, async (tx) => {
      const bankAccountId = `ba_${randomBytes(16).toString('hex')}`;
      await insertExternalAccount(tx, {
        id: bankAccountId,
        ...scope,
        rail: 'ach',
        currency: 'USD',
        label: 'Test checking',
        routingNumber: '110000000',
        accountLast4: '6789',
      });
      const clearingAccountId = await systemAccount(tx, scope, 'USDC', 'rail_clearing', () => newId('sys'));
      await createRailTransfer(tx, {
        id: transferId,
        holdId: newId('hold'),
        ...scope,
        idempotencyKey,
        workflowId,
        amount: amountMinor,
        currency: 'USDC',
        sourceAccountId: tenant.sandbox.usdcWalletId,
        clearingAccountId,
        destinationExternalAccountId: bankAccountId,
        outAmount,
        outCurrency: 'USD',
        feeAmount: FEE,
        fxRate: '1',
      });
    });
    return {
      companyId,
      walletId: tenant.sandbox.usdcWalletId,
      transferId,
      workflowId,
      idempotencyKey,
      amount: amountMinor,
      outAmount,
      input: { transferId, companyId, environment: 'sandbox', version: SETTLEMENT_VERSION, ...timing },
    };
  }

  function start(payout: Payout): Promise<StartedHandle> {
    return env.client.workflow.start<typeof transferSettlementWorkflow>(TRANSFER_SETTLEMENT_WORKFLOW, {
      workflowId: payout.workflowId,
      taskQueue: TASK_QUEUES.core,
      args: [payout.input],
      workflowIdConflictPolicy: WorkflowIdConflictPolicy.USE_EXISTING,
    });
  }

  function awaitOutcome(handle: Handle, payout: Payout, waitMs = 5000): Promise<TransferSnapshot> {
    return handle.executeUpdate(awaitTransferOutcomeUpdate, { args: [{ waitMs }], updateId: payout.idempotencyKey });
  }

  async function wallet(payout: Payout) {
    const account = await withTenant(database.sql, payout.companyId, (tx) =>
      findLedgerAccount(tx, { companyId: payout.companyId, environment: 'sandbox' }, payout.walletId),
    );
    return balancesOf(account!);
  }

  /** Posted balance of each platform-side account that settlement touches, by purpose and currency. */
  async function systemBalances(payout: Payout): Promise<Record<string, bigint>> {
    const rows = await withTenant(
      database.sql,
      payout.companyId,
      (tx) => tx<{ system_purpose: string; currency: string; posted: bigint }[]>`
        select system_purpose, currency, posted from ledger_accounts
        where company_id = ${payout.companyId} and environment = 'sandbox' and type = 'system'
          and system_purpose in ('fees', 'fx', 'ach_payouts')`,
    );
    return Object.fromEntries(rows.map((row) => [`${row.system_purpose} ${row.currency}`, row.posted]));
  }

  /** Money is conserved: per currency, posted balances sum to zero and every hold has its two sides. */
  async function assertConserved(payout: Payout): Promise<void> {
    const rows = await withTenant(
      database.sql,
      payout.companyId,
      (tx) => tx<{ currency: string; posted: bigint; pending_debits: bigint; pending_credits: bigint }[]>`
        select currency, sum(posted)::bigint as posted, sum(pending_debits)::bigint as pending_debits,
               sum(pending_credits)::bigint as pending_credits
        from ledger_accounts where company_id = ${payout.companyId} and environment = 'sandbox' group by currency`,
    );
    for (const row of rows) {
      assert.equal(row.posted, 0n, `posted balances of ${row.currency} sum to zero`);
      assert.equal(row.pending_debits, row.pending_credits, `holds in ${row.currency} balance`);
    }
  }

  async function assertWalletRestored(payout: Payout): Promise<void> {
    assert.deepEqual(await wallet(payout), { available: WALLET_START, pending: 0n, posted: WALLET_START });
    await assertConserved(payout);
  }

  async function assertWalletDebited(payout: Payout): Promise<void> {
    const debited = WALLET_START - payout.amount;
    assert.deepEqual(await wallet(payout), { available: debited, pending: 0n, posted: debited });
    assert.deepEqual(await systemBalances(payout), {
      'fees USDC': FEE,
      'fx USDC': payout.amount - FEE,
      'fx USD': -payout.outAmount,
      'ach_payouts USD': payout.outAmount,
    });
    await assertConserved(payout);
  }

  async function assertHeld(payout: Payout): Promise<void> {
    assert.deepEqual(await wallet(payout), {
      available: WALLET_START - payout.amount,
      pending: -payout.amount,
      posted: WALLET_START,
    });
    await assertConserved(payout);
  }

  async function statuses(payout: Payout): Promise<string[]> {
    return (await transferHistory(database.sql, payout.transferId)).map((change) => change.status);
  }

  async function assertSearchAttributes(handle: Handle, payout: Payout, status: string): Promise<void> {
    const attributes = (await handle.describe()).typedSearchAttributes;
    assert.equal(attributes.get(SEARCH_ATTRIBUTES.companyId), payout.companyId);
    assert.equal(attributes.get(SEARCH_ATTRIBUTES.objectId), payout.transferId);
    assert.equal(attributes.get(SEARCH_ATTRIBUTES.environment), 'sandbox');
    assert.equal(attributes.get(SEARCH_ATTRIBUTES.objectStatus), status);
  }

  /** Replays the run's history with the current bundle; records it for later versions when asked. */
  async function replay(handle: Handle, recordAs?: string): Promise<temporal.api.history.v1.IHistory> {
    const history = await handle.fetchHistory();
    await Worker.runReplayHistory({ workflowBundle: await testWorkflowBundle() }, history, handle.workflowId);
    if (recordAs && process.env.UPDATE_HISTORIES === '1') {
      await writeFile(
        join(HISTORIES_DIR, `${HISTORY_PREFIX}${CURRENT_HISTORY_VERSION}-${recordAs}.history.json`),
        historyToJSON(history),
      );
    }
    return history;
  }

  function elapsedMs(history: temporal.api.history.v1.IHistory): number {
    const seconds = (event: temporal.api.history.v1.IHistoryEvent | undefined) =>
      Number(event?.eventTime?.seconds ?? 0) * 1000 + Math.floor((event?.eventTime?.nanos ?? 0) / 1e6);
    const events = history.events ?? [];
    return seconds(events.at(-1)) - seconds(events[0]);
  }

  it('documents the sandbox magic amounts', () => {
    assert.deepEqual(
      SANDBOX_MAGIC.map((magic) => [magic.cents, magic.submit, magic.status]),
      [
        [13, 'failed', 'failed'],
        [14, 'confirmed', 'returned'],
        [15, 'pending', 'pending'],
      ],
    );
  });

  it('cancels at the sandbox rail what the simulated bank has not paid, and nothing else', async () => {
    const rail = createSandboxAchRail();
    const request = (transferId: string, amount: bigint): PayoutRequest => ({
      transferId,
      amount: '1.00',
      currency: 'USD',
      destination: { externalAccountId: 'ba_x', routingNumber: '021000021', accountLast4: '6789' },
      sourceAmountMinor: amount,
      sourceCurrency: 'USDC',
    });
    const slow = await rail.submit(request(`tr_${'1'.repeat(32)}`, 1_150_000n));
    assert.deepEqual(await rail.cancel({ transferId: `tr_${'1'.repeat(32)}`, reference: slow.reference }), {
      outcome: 'canceled',
    });
    const paid = await rail.submit(request(`tr_${'2'.repeat(32)}`, 1_000_000n));
    assert.deepEqual(await rail.cancel({ transferId: `tr_${'2'.repeat(32)}`, reference: paid.reference }), {
      outcome: 'confirmed',
    });
    const refused = await rail.submit(request(`tr_${'3'.repeat(32)}`, 1_130_000n));
    assert.equal(
      (await rail.cancel({ transferId: `tr_${'3'.repeat(32)}`, reference: refused.reference })).outcome,
      'failed',
    );
    // Never received (the submission's answer was lost before it arrived): canceled, and refused if it comes.
    assert.deepEqual(await rail.cancel({ transferId: `tr_${'4'.repeat(32)}` }), { outcome: 'canceled' });
    assert.equal((await rail.submit(request(`tr_${'4'.repeat(32)}`, 1_000_000n))).outcome, 'failed');
    // Received but its answer lost: the rail knows it by transfer ID.
    await rail.submit(request(`tr_${'5'.repeat(32)}`, 1_000_000n));
    assert.deepEqual(await rail.cancel({ transferId: `tr_${'5'.repeat(32)}` }), { outcome: 'confirmed' });
  });

  it('settles at once for an ordinary amount, then closes the return window', async () => {
    const payout = await createPayout('100.00');
    const handle = await start(payout);
    const answer = await awaitOutcome(handle, payout);
    assert.equal(answer.status, 'settled');
    assert.match(answer.railReference ?? '', /^sbx_ach_ok_tr_/);
    await assertWalletDebited(payout);
    await assertSearchAttributes(handle, payout, 'settled');

    const final = await handle.result(); // skips the 60-day return window, polled daily
    assert.deepEqual(final, { ...answer, failureReason: null });
    assert.equal(observed.polls.get(answer.railReference!), 60);
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'settled']);
    await assertWalletDebited(payout);
    const history = await replay(handle, 'settled');
    // Version 4: the submission, which settles a payout confirmed at once, is a local activity (a
    // marker) and only polls are activity tasks; the whole quick path (submit-and-settle, the
    // return-window timer) is the first workflow task, with no patch marker.
    const events = history.events ?? [];
    const types = events.map((event) => protos.temporal.api.enums.v1.EventType[event.eventType ?? 0]);
    const scheduled = events.flatMap((event) =>
      event.activityTaskScheduledEventAttributes ? [event.activityTaskScheduledEventAttributes.activityType?.name] : [],
    );
    assert.deepEqual([...new Set(scheduled)], ['pollRail']);
    const firstTask = types.slice(0, types.indexOf('EVENT_TYPE_WORKFLOW_TASK_SCHEDULED', 2));
    assert.deepEqual(
      firstTask.filter((type) => type === 'EVENT_TYPE_MARKER_RECORDED' || type === 'EVENT_TYPE_TIMER_STARTED'),
      ['EVENT_TYPE_MARKER_RECORDED', 'EVENT_TYPE_TIMER_STARTED'],
      `the submit-and-settle marker, then the timer, in the first workflow task: ${firstTask.join(', ')}`,
    );
    const markers = events.flatMap((event) =>
      event.markerRecordedEventAttributes ? [event.markerRecordedEventAttributes.markerName] : [],
    );
    assert.deepEqual(markers, ['core_local_activity'], 'no patch marker: the version is in the input');
    const elapsed = elapsedMs(history);
    assert.ok(elapsed >= 60 * DAY_MS && elapsed < 61 * DAY_MS, `the return window lasted 60 days (${elapsed} ms)`);
  });

  it('runs a payout started without a version (an outbox row from before version 4) by its patch', async () => {
    const payout = await createPayout('60.00', { returnWindowMs: HOUR_MS });
    const { version: _version, ...unversioned } = payout.input;
    const handle = await env.client.workflow.start<typeof transferSettlementWorkflow>(TRANSFER_SETTLEMENT_WORKFLOW, {
      workflowId: payout.workflowId,
      taskQueue: TASK_QUEUES.core,
      args: [unversioned],
    });
    assert.equal((await awaitOutcome(handle, payout)).status, 'settled');
    assert.equal((await handle.result()).status, 'settled');
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'settled']);
    const history = await replay(handle);
    const markers = (history.events ?? []).flatMap((event) =>
      event.markerRecordedEventAttributes ? [event.markerRecordedEventAttributes.markerName] : [],
    );
    assert.deepEqual(markers, ['core_patch', 'core_local_activity'], 'version 3: the newest patch, recorded');
  });

  it('fails at once when the bank refuses (.13), and the hold is voided', async () => {
    const payout = await createPayout('100.13');
    const handle = await start(payout);
    const answer = await awaitOutcome(handle, payout);
    assert.equal(answer.status, 'failed');
    assert.equal(answer.failureReason, 'R01 insufficient funds at receiving bank');
    assert.deepEqual(await handle.result(), answer);
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'failed']);
    await assert.rejects(
      env.client.workflow
        .getHandle(payout.workflowId)
        .executeUpdate(awaitTransferOutcomeUpdate, { args: [{ waitMs: -1 }] }),
      'a completed run takes no more updates',
    );
    await assertWalletRestored(payout);
    await assertSearchAttributes(handle, payout, 'failed');
    await replay(handle, 'failed');
  });

  it('waits on a slow payout (.15) and settles when the rail confirms by signal', async () => {
    const payout = await createPayout('250.15', { returnWindowMs: 2 * DAY_MS });
    const handle = await start(payout);
    const answer = await awaitOutcome(handle, payout);
    assert.equal(answer.status, 'processing');
    assert.match(answer.railReference ?? '', /^sbx_ach_slow_tr_/);
    await assertHeld(payout);
    await assertSearchAttributes(handle, payout, 'processing');

    await assert.rejects(
      handle.executeUpdate(awaitTransferOutcomeUpdate, { args: [{ waitMs: -1 }] }),
      WorkflowUpdateFailedError,
      'the validator refuses a negative wait',
    );
    // A return before settlement makes no sense: ignored (and logged).
    await handle.signal(railReturnedSignal, { reason: 'too early' });
    await env.sleep('150 minutes'); // two polls, and between polls when the signal comes: still pending
    assert.equal((await handle.query(transferSnapshotQuery)).status, 'processing');
    await handle.signal(railConfirmedSignal);
    const final = await handle.result();
    assert.equal(final.status, 'settled');
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'settled']);
    await assertWalletDebited(payout);
    await assertSearchAttributes(handle, payout, 'settled');
    await replay(handle, 'slow-confirmed');
  });

  it('fails a slow payout when the rail fails it by signal, and the hold is voided', async () => {
    const payout = await createPayout('40.15');
    const handle = await start(payout);
    assert.equal((await awaitOutcome(handle, payout)).status, 'processing');
    await handle.signal(railFailedSignal, { reason: 'R02 account closed' });
    // A second verdict is ignored: the first one decided.
    await handle.signal(railConfirmedSignal);
    const final = await handle.result();
    assert.deepEqual(final, { ...final, status: 'failed', failureReason: 'R02 account closed' });
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'failed']);
    await assertWalletRestored(payout);
    await replay(handle, 'slow-failed');
  });

  it('expires a slow payout after 3 days without confirmation, polling hourly, cancels it at the rail and voids the hold', async () => {
    const payout = await createPayout('75.15');
    const handle = await start(payout);
    const answer = await awaitOutcome(handle, payout);
    assert.equal(answer.status, 'processing');
    const final = await handle.result();
    assert.equal(final.status, 'failed');
    assert.equal(final.failureReason, EXPIRED_REASON);
    assert.equal(observed.polls.get(answer.railReference!), 72);
    assert.equal(observed.cancels.get(payout.transferId), 1, 'the rail was asked to cancel before the hold was voided');
    await assertWalletRestored(payout);
    await assertSearchAttributes(handle, payout, 'failed');
    const history = await replay(handle, 'expired-canceled');
    const elapsed = elapsedMs(history);
    assert.ok(elapsed >= 3 * DAY_MS && elapsed < 3 * DAY_MS + HOUR_MS, `expired after 3 days (${elapsed} ms)`);
  });

  it('settles a payout the rail paid too late to cancel, instead of voiding the hold of money that left', async () => {
    const payout = await createPayout('76.15', { returnWindowMs: DAY_MS });
    observed.cancelAnswers.set(payout.transferId, () => ({ outcome: 'confirmed' }));
    const handle = await start(payout);
    assert.equal((await awaitOutcome(handle, payout)).status, 'processing');
    const final = await handle.result(); // the 3-day window, the cancellation, then a 1-day return window
    assert.equal(final.status, 'settled');
    assert.equal(observed.cancels.get(payout.transferId), 1);
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'settled']);
    await assertWalletDebited(payout);
    await assertSearchAttributes(handle, payout, 'settled');
    await replay(handle, 'expired-paid-late');
  });

  it('settles a payout whose submission never got an answer, once the cancellation says it was paid', async () => {
    const payout = await createPayout('78.00', {
      confirmationTimeoutMs: 2 * HOUR_MS,
      confirmationPollMs: HOUR_MS,
      returnWindowMs: DAY_MS,
    });
    let asked = false;
    observed.submitFaults.set(payout.transferId, () => (asked ? undefined : new Error('rail unreachable')));
    observed.cancelAnswers.set(payout.transferId, () => {
      asked = true;
      return { outcome: 'confirmed' };
    });
    const handle = await start(payout);
    const final = await handle.result();
    assert.equal(final.status, 'settled');
    assert.match(final.railReference ?? '', /^sbx_ach_ok_tr_/);
    assert.equal(observed.cancels.get(payout.transferId), 1);
    await assertWalletDebited(payout);
    await replay(handle);
  });

  it('asks again, hold kept, when the rail refuses the cancellation itself, instead of failing the run', async () => {
    const payout = await createPayout('80.15', { confirmationTimeoutMs: 2 * HOUR_MS, confirmationPollMs: HOUR_MS });
    let asked = 0;
    observed.cancelAnswers.set(payout.transferId, () => {
      asked += 1;
      if (asked === 1) throw ApplicationFailure.nonRetryable('cancellation refused', 'RailCancelRefused');
      return { outcome: 'canceled' };
    });
    const handle = await start(payout);
    const final = await handle.result(); // before: WorkflowFailedError, the transfer left processing with its hold
    assert.equal(final.status, 'failed');
    assert.equal(final.failureReason, EXPIRED_REASON);
    assert.equal(asked, 2);
    await assertWalletRestored(payout);
    await replay(handle);
  });

  it('backs off, hold kept, while the rail refuses to resubmit a payout it said it paid', async () => {
    const payout = await createPayout('81.00', {
      confirmationTimeoutMs: 2 * HOUR_MS,
      confirmationPollMs: HOUR_MS,
      returnWindowMs: DAY_MS,
    });
    let phase: 'unreachable' | 'refusing' | 'answering' = 'unreachable';
    let submitsAtCancel = 0;
    observed.submitFaults.set(payout.transferId, () =>
      phase === 'unreachable'
        ? new Error('rail unreachable')
        : phase === 'refusing'
          ? ApplicationFailure.nonRetryable('duplicate payout', 'RailDuplicate')
          : undefined,
    );
    observed.cancelAnswers.set(payout.transferId, () => {
      phase = 'refusing';
      submitsAtCancel = observed.submits.get(payout.transferId) ?? 0;
      return { outcome: 'confirmed' };
    });
    const handle = await start(payout);
    await sleepWithin(env, '10 days');
    const resubmissions = (observed.submits.get(payout.transferId) ?? 0) - submitsAtCancel;
    // Before: hourly for ever (238 in 10 days); now doubling from an hour to a day.
    assert.ok(resubmissions > 0 && resubmissions <= 20, `${resubmissions} resubmissions in 10 days`);
    assert.equal(
      (await handle.describe()).status.name,
      'RUNNING',
      'paid: the hold is neither voided nor posted blindly',
    );
    await assertHeld(payout);
    phase = 'answering';
    assert.equal((await handle.result()).status, 'settled');
    await assertWalletDebited(payout);
  });

  it('fails with the rail’s reason a payout the rail says it refused when asked to cancel it', async () => {
    const payout = await createPayout('77.15');
    observed.cancelAnswers.set(payout.transferId, () => ({ outcome: 'failed', reason: 'R02 account closed' }));
    const handle = await start(payout);
    const final = await handle.result();
    assert.equal(final.status, 'failed');
    assert.equal(final.failureReason, 'R02 account closed');
    await assertWalletRestored(payout);
    await replay(handle);
  });

  it('reverses a settled payout that the rail reports returned (.14): full amount back, fee and FX reversed', async () => {
    const payout = await createPayout('500.14', { returnPollMs: HOUR_MS });
    const handle = await start(payout);
    const answer = await awaitOutcome(handle, payout);
    assert.equal(answer.status, 'settled');
    await assertWalletDebited(payout);
    const final = await handle.result(); // the first poll, an hour later, finds the return
    assert.equal(final.status, 'returned');
    assert.equal(final.failureReason, 'R03 no account');
    assert.equal(observed.polls.get(answer.railReference!), 1);
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'settled', 'returned']);
    await assertWalletRestored(payout);
    assert.deepEqual(await systemBalances(payout), {
      'fees USDC': 0n,
      'fx USDC': 0n,
      'fx USD': 0n,
      'ach_payouts USD': 0n,
    });
    await assertSearchAttributes(handle, payout, 'returned');
    await replay(handle, 'returned-by-poll');
  });

  it('reverses a settled payout returned by signal, and ignores signals that make no sense', async () => {
    const payout = await createPayout('20.00');
    const handle = await start(payout);
    assert.equal((await awaitOutcome(handle, payout)).status, 'settled');
    await handle.signal(railFailedSignal, { reason: 'too late' }); // ignored: already settled
    // Skipped time ends between two polls: the Java test server mishandles a signal that lands in
    // the same instant as a timer firing ("invalid history builder state for action").
    await env.sleep('36 hours');
    await handle.signal(railReturnedSignal, { reason: 'R10 customer advises not authorized' });
    const final = await handle.result();
    assert.equal(final.status, 'returned');
    assert.equal(final.failureReason, 'R10 customer advises not authorized');
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'settled', 'returned']);
    await assertWalletRestored(payout);
    assert.deepEqual(await systemBalances(payout), {
      'fees USDC': 0n,
      'fx USDC': 0n,
      'fx USD': 0n,
      'ach_payouts USD': 0n,
    });
    await replay(handle, 'returned-by-signal');
  });

  it('joins the running workflow on a duplicate start, and the same update ID answers once', async () => {
    const payout = await createPayout('60.15', { confirmationTimeoutMs: 2 * HOUR_MS, returnWindowMs: HOUR_MS });
    const first = await start(payout);
    const second = await start(payout);
    assert.equal(second.firstExecutionRunId, first.firstExecutionRunId);
    const answer = await awaitOutcome(first, payout);
    assert.equal(answer.status, 'processing');
    await first.signal(railConfirmedSignal);
    await waitFor('settlement', async () => (await first.query(transferSnapshotQuery)).status === 'settled');
    // Now a new update would answer 'settled': the same update ID returns the first result instead.
    assert.deepEqual(await awaitOutcome(second, payout), answer, 'the same update ID returns the first result');
    assert.equal(observed.submits.get(payout.transferId), 1, 'submitted to the rail once');
    const history = await replay(first, 'duplicate-start');
    const accepted = (history.events ?? []).filter((event) => event.workflowExecutionUpdateAcceptedEventAttributes);
    assert.equal(accepted.length, 1, 'one update in the history');
    assert.equal((await first.result()).status, 'settled');
  });

  it('answers update-with-start from a client: settled for an ordinary amount, processing for a slow one', async () => {
    for (const [amount, expected] of [
      ['30.00', 'settled'],
      ['30.15', 'processing'],
    ] as const) {
      const payout = await createPayout(amount, { confirmationTimeoutMs: HOUR_MS, returnWindowMs: HOUR_MS });
      const updateWithStart = () => {
        const startWorkflowOperation = new WithStartWorkflowOperation<typeof transferSettlementWorkflow>(
          TRANSFER_SETTLEMENT_WORKFLOW,
          {
            workflowId: payout.workflowId,
            taskQueue: TASK_QUEUES.core,
            args: [payout.input],
            workflowIdConflictPolicy: WorkflowIdConflictPolicy.USE_EXISTING,
            // As the API starts it (services/rail-transfers.ts): the run carries its search attributes.
            typedSearchAttributes: [
              { key: SEARCH_ATTRIBUTES.companyId, value: payout.companyId },
              { key: SEARCH_ATTRIBUTES.objectId, value: payout.transferId },
              { key: SEARCH_ATTRIBUTES.objectStatus, value: 'pending' },
              { key: SEARCH_ATTRIBUTES.environment, value: 'sandbox' },
            ],
          },
        );
        return {
          startWorkflowOperation,
          answer: env.client.workflow.executeUpdateWithStart(awaitTransferOutcomeUpdate, {
            startWorkflowOperation,
            args: [{ waitMs: 5000 }],
            updateId: payout.idempotencyKey,
          }),
        };
      };
      const first = updateWithStart();
      const answer = await first.answer;
      assert.equal(answer.status, expected, `${amount} USDC answers ${expected}`);
      const handle = await first.startWorkflowOperation.workflowHandle();
      // The API's retry: the same key joins the same run and gets the same answer.
      const retry = updateWithStart();
      assert.deepEqual(await retry.answer, answer);
      const runId = (await handle.describe()).runId;
      assert.equal((await (await retry.startWorkflowOperation.workflowHandle()).describe()).runId, runId);
      assert.equal(observed.submits.get(payout.transferId), 1);
      const final = await handle.result();
      assert.equal(final.status, expected === 'settled' ? 'settled' : 'failed');
      const history = await replay(handle);
      if (expected === 'settled') {
        // Started with its search attributes, the run upserts only its status change, straight from
        // pending to settled (version 4 records no patch, so no TemporalChangeVersion either).
        const upserts = (history.events ?? []).flatMap((event) => {
          const fields = event.upsertWorkflowSearchAttributesEventAttributes?.searchAttributes?.indexedFields;
          return fields ? [Object.keys(fields).sort().join(',')] : [];
        });
        assert.deepEqual(upserts, [SEARCH_ATTRIBUTES.objectStatus.name]);
        await assertSearchAttributes(handle, payout, 'settled');
      }
    }
  });

  it('retries a submission that fails transiently, and the rail sees one payout', async () => {
    const payout = await createPayout('80.00', { returnWindowMs: HOUR_MS });
    observed.submitFaults.set(payout.transferId, (attempt) =>
      attempt <= 2 ? new Error('connection reset by the bank') : undefined,
    );
    const handle = await start(payout);
    const final = await handle.result(); // time skipping jumps over the retry backoff
    assert.equal(final.status, 'settled');
    assert.equal(observed.submits.get(payout.transferId), 3);
    assert.equal(observed.inner.submissionCount() > 0, true);
    await assertWalletDebited(payout);
    await replay(handle);
  });

  it('submitAndSettleTransfer: a retry after the settling commit answers the same, without a second submission', async () => {
    const payout = await createPayout('75.00');
    const activities = createTransferActivities({
      sql: appSql,
      rails: { sandbox: observed.rail, live: createUnconfiguredLiveRail() },
    });
    const ref = { transferId: payout.transferId, companyId: payout.companyId, environment: 'sandbox' as const };
    const first = await activities.submitAndSettleTransfer(ref);
    assert.equal(first.submission.outcome, 'confirmed');
    assert.equal(first.settled?.status, 'settled');
    assert.equal(first.settled?.railReference, first.submission.reference);
    // Both status changes are recorded, in the one transaction.
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'settled']);
    await assertWalletDebited(payout);
    // The answer was lost (a worker crash): the retry finds the transfer settled.
    assert.deepEqual(await activities.submitAndSettleTransfer(ref), {
      submission: { reference: first.submission.reference, outcome: 'confirmed' },
      settled: first.settled,
    });
    assert.equal(observed.submits.get(payout.transferId), 1, 'the rail saw one submission');
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'settled']);
    await assertWalletDebited(payout);
  });

  it('submits again at the next poll when every attempt failed and the outcome is unknown', async () => {
    const payout = await createPayout('85.00', { returnWindowMs: HOUR_MS });
    // Ten attempts (the activity's maximum) time out at the bank: the rail may or may not have the payout.
    observed.submitFaults.set(payout.transferId, (attempt) =>
      attempt <= 10 ? new Error('bank gateway timeout') : undefined,
    );
    const handle = await start(payout);
    const pending = await awaitOutcome(handle, payout, 0);
    assert.equal(pending.status, 'pending', 'nothing is known yet');
    const final = await handle.result(); // an hour later the idempotent submission is made again
    assert.equal(final.status, 'settled');
    assert.equal(observed.submits.get(payout.transferId), 11);
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'settled']);
    await assertWalletDebited(payout);
    await replay(handle, 'resubmitted-after-unknown-outcome');
  });

  it('fails the run for a transfer that does not exist, without calling the rail', async () => {
    const payout = await createPayout('10.00');
    const missing = { ...payout, transferId: newId('tr'), workflowId: `${payout.workflowId}-missing` };
    missing.input = { ...payout.input, transferId: missing.transferId };
    const handle = await start(missing);
    await assert.rejects(handle.result(), (error: unknown) => {
      assert.ok(error instanceof WorkflowFailedError);
      // A local activity's failure is the ApplicationFailure itself (a remote one's comes wrapped).
      assert.ok(error.cause instanceof ApplicationFailure, `cause: ${String(error.cause)}`);
      assert.equal(error.cause.type, 'TransferNotFound');
      return true;
    });
    assert.equal(observed.submits.get(missing.transferId), undefined);
    await assertHeld(payout); // the real transfer is untouched
  });

  it('fails the transfer and voids the hold when the submission is refused for good', async () => {
    const payout = await createPayout('90.00');
    observed.submitFaults.set(payout.transferId, () =>
      ApplicationFailure.nonRetryable('destination account frozen', 'RailRefused'),
    );
    const handle = await start(payout);
    const answer = await awaitOutcome(handle, payout);
    assert.equal(answer.status, 'failed');
    assert.equal(answer.failureReason, 'submission refused: destination account frozen');
    assert.deepEqual(await handle.result(), answer);
    assert.equal(observed.submits.get(payout.transferId), 1, 'a refusal is not retried');
    assert.deepEqual(await statuses(payout), ['pending', 'failed']);
    await assertWalletRestored(payout);
    await replay(handle, 'submission-refused');
  });

  /** Makes every move of the transfer to `status` fail (a bug, a constraint, an outage of that write) until healed. */
  async function refuseStatus(transferId: string, status: 'settled' | 'failed'): Promise<() => Promise<void>> {
    const fault = `refuse_${status}_${transferId}`;
    await database.sql.unsafe(`
      create function ${fault}() returns trigger language plpgsql as $$ begin
        if new.id = '${transferId}' and new.status = '${status}' then raise exception 'moving to ${status} fails'; end if;
        return new;
      end $$;
      create trigger ${fault} before update on transfers for each row execute function ${fault}();`);
    return async () => {
      await database.sql.unsafe(`drop trigger ${fault} on transfers; drop function ${fault}();`);
    };
  }

  it('settles a payout the rail confirmed at once when the settling write fails for a while, instead of expiring it', async () => {
    const payout = await createPayout('70.00', { confirmationTimeoutMs: 30 * 60 * 1000, returnWindowMs: HOUR_MS });
    // The settling transaction fails (a bug, a constraint, an outage of that write) until it is fixed.
    const heal = await refuseStatus(payout.transferId, 'settled');
    const handle = await start(payout);
    // The rail confirmed (paid out): the submission is recorded on its own, and the settlement retried.
    await waitFor('the submission recorded', async () => (await statuses(payout)).includes('processing'));
    await env.sleep(HOUR_MS); // past the confirmation timeout: a payout the rail confirmed never expires
    assert.equal((await handle.describe()).status.name, 'RUNNING');
    await assertHeld(payout);
    await heal();
    const final = await handle.result();
    assert.equal(final.status, 'settled');
    assert.equal(observed.submits.get(payout.transferId), 1, 'submitted once: the answer was known, not unknown');
    assert.deepEqual(await statuses(payout), ['pending', 'processing', 'settled']);
    await assertWalletDebited(payout);
    await replay(handle);
  });

  it('keeps retrying a ledger write that fails for hours, and voids the hold once it goes through', async () => {
    const payout = await createPayout('100.13'); // the bank refuses at once: the hold must be voided
    const heal = await refuseStatus(payout.transferId, 'failed');
    const handle = await start(payout);
    await waitFor('the refusal recorded', async () => (await statuses(payout)).includes('processing'));
    await env.sleep(4 * HOUR_MS); // longer than 30 attempts took (about 1.8 hours)
    assert.equal((await handle.describe()).status.name, 'RUNNING', 'the run waits for the database, it does not fail');
    await assertHeld(payout);
    await heal();
    const final = await handle.result();
    assert.equal(final.status, 'failed');
    assert.equal(final.failureReason, 'R01 insufficient funds at receiving bank');
    await assertWalletRestored(payout);
    await replay(handle);
  });

  it('replays every recorded history of an earlier version without non-determinism', async () => {
    const files = (await readdir(HISTORIES_DIR)).filter((file) => file.startsWith(HISTORY_PREFIX)).sort();
    assert.deepEqual(
      files,
      [
        ...HISTORY_VERSIONS.flatMap((version) =>
          RECORDED_PATHS.map((path) => `${HISTORY_PREFIX}${version}-${path}.history.json`),
        ),
        ...Object.entries(RECORDED_SINCE).flatMap(([path, since]) =>
          HISTORY_VERSIONS.slice(HISTORY_VERSIONS.indexOf(since)).map(
            (version) => `${HISTORY_PREFIX}${version}-${path}.history.json`,
          ),
        ),
      ].sort(),
      'one recorded history per main path (record them with UPDATE_HISTORIES=1)',
    );
    for (const file of files) {
      const history = historyFromJSON(JSON.parse(await readFile(join(HISTORIES_DIR, file), 'utf8')));
      await Worker.runReplayHistory({ workflowBundle: await testWorkflowBundle() }, history, `recorded/${file}`);
    }
  });

  // Last: a run whose workflow tasks keep failing stalls the time-skipping test server's clock for the tests after it.
  it('waits for a worker that knows the version of a run started with an unknown one, instead of failing it', async () => {
    // An API at the next version (deployed before this worker), or a run recorded before a rollback.
    const payout = await createPayout('61.00');
    const handle = await env.client.workflow.start(TRANSFER_SETTLEMENT_WORKFLOW, {
      workflowId: payout.workflowId,
      taskQueue: TASK_QUEUES.core,
      args: [{ ...payout.input, version: 5 }],
    });
    await waitFor('a failed workflow task', async () =>
      ((await handle.fetchHistory()).events ?? []).some((event) =>
        /version must be one of 4 or absent/.test(event.workflowTaskFailedEventAttributes?.failure?.message ?? ''),
      ),
    );
    assert.equal((await handle.describe()).status.name, 'RUNNING', 'the run is not failed: a newer worker will run it');
    await assertHeld(payout);
    await handle.terminate('test over');
  });
});
