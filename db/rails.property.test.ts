// Property-based test of the payout (rail transfer) lifecycle through the PRODUCTION code: random
// sequences of create / retry / submit / settle / fail / return run against a provisioned sandbox
// tenant's USDC wallet, through createPayoutTransfer (services/rail-transfers.ts, Temporal stubbed
// as unreachable: the outbox path), the transfer activities (activities/transfers.ts, called as
// plain functions) and the step functions of db/rails.ts called directly, with fresh and with stale
// copies of the transfer. A small independent model (bigint arithmetic, its own fee and FX sums)
// says what each step must do; after every step the database must agree with it exactly: wallet and
// platform balances, holds, every transfer's entries, statuses and status history, outbox rows.
// The seed and the number of runs are fixed, so a failure reproduces and every run covers the same
// cases whatever the machine's speed (a time budget would make the coverage guard below flaky).
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Client } from '@temporalio/client';
import { ApplicationFailure } from '@temporalio/common';
import fc from 'fast-check';
import { pino } from 'pino';
import { createSandboxAchRail } from '../activities/rails/sandbox-ach.ts';
import { createTransferActivities, createUnconfiguredLiveRail } from '../activities/transfers.ts';
import { newId } from '../platform/ids.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { PEGGED_RATES } from '../services/quotes.ts';
import { createPayoutTransfer, type RailTransferDeps } from '../services/rail-transfers.ts';
import { provisionTenant } from '../services/tenants.ts';
import { createAppRoleSql, createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { DomainError } from '../workflows/shared/errors.ts';
import type { Sql, TransactionSql } from './client.ts';
import {
  failRailTransfer,
  findRailTransfer,
  returnRailTransfer,
  settleRailTransfer,
  type RailTransfer,
} from './rails.ts';
import { withTenant } from './tenant.ts';

// ---------------------------------------------------------------------------------------------
// The model: nothing here calls production code.

const USDC_UNIT = 1_000_000n; // USDC has 6 decimals
const USD_PER_USDC_MINOR = 10_000n; // 1 USD cent = 10^4 USDC minor units at the 1:1 peg
const SANDBOX_USDC = 10_000n * USDC_UNIT; // README: every company gets 10,000 USDC
const FEE_BPS = 50n; // README: 0.50 % fee in the source currency, rounded up

type Status = 'pending' | 'processing' | 'settled' | 'failed' | 'returned';
type Resolution = 'settle' | 'fail' | 'return';

/** Where each resolution may start, and where it leads (README: the settlement workflow). */
const FROM: Record<Resolution, readonly Status[]> = {
  settle: ['processing'],
  fail: ['pending', 'processing'],
  return: ['settled'],
};
const TO: Record<Resolution, Status> = { settle: 'settled', fail: 'failed', return: 'returned' };

interface ModelPayout {
  id: string;
  key: string;
  amount: bigint;
  fee: bigint;
  out: bigint;
  /** What the sandbox rail does with it (README's magic cents of the source amount). */
  rail: 'confirmed' | 'failed' | 'pending';
  status: Status;
  version: number;
  history: Status[];
  /** Every version of the row seen so far (for calls with a stale copy). */
  copies: RailTransfer[];
}

interface Model {
  posted: bigint;
  payouts: ModelPayout[];
}

const inFlight = (p: ModelPayout) => p.status === 'pending' || p.status === 'processing';
const pendingDebits = (model: Model) => model.payouts.filter(inFlight).reduce((sum, p) => sum + p.amount, 0n);
const available = (model: Model) => model.posted - pendingDebits(model);

function quote(amount: bigint): { fee: bigint; out: bigint } {
  const fee = (amount * FEE_BPS + 9_999n) / 10_000n; // ceil
  const out = (amount - fee) / USD_PER_USDC_MINOR; // floor
  return { fee, out };
}

function railBehaviour(amount: bigint): ModelPayout['rail'] {
  const cents = (amount / USD_PER_USDC_MINOR) % 100n;
  return cents === 13n ? 'failed' : cents === 15n ? 'pending' : 'confirmed';
}

function formatUsdc(amount: bigint): string {
  return `${amount / USDC_UNIT}.${(amount % USDC_UNIT).toString().padStart(6, '0')}`;
}

/** The entries a payout must have in its state, as sorted `role kind amount` lines. */
function expectedEntries(p: ModelPayout): string[] {
  const lines = [`wallet hold ${-p.amount}`, `rail_clearing:USDC hold ${p.amount}`];
  if (!inFlight(p)) lines.push(`wallet hold_release ${-p.amount}`, `rail_clearing:USDC hold_release ${p.amount}`);
  const settlement = (sign: bigint) => {
    lines.push(
      `wallet posted ${-sign * p.amount}`,
      `fx:USDC posted ${sign * (p.amount - p.fee)}`,
      `fx:USD posted ${-sign * p.out}`,
      `ach_payouts:USD posted ${sign * p.out}`,
    );
    if (p.fee > 0n) lines.push(`fees:USDC posted ${sign * p.fee}`);
  };
  if (p.status === 'settled' || p.status === 'returned') settlement(1n);
  if (p.status === 'returned') settlement(-1n);
  return lines.sort();
}

const holdStatus = (p: ModelPayout) => (inFlight(p) ? 'pending' : p.status === 'failed' ? 'voided' : 'posted');

// ---------------------------------------------------------------------------------------------
// Generators

type AmountSpec =
  | { kind: 'some'; major: bigint; cents: number; micro: bigint }
  | { kind: 'all' }
  | { kind: 'over'; extra: bigint }
  | { kind: 'tiny'; micro: bigint };

const amountSpec: fc.Arbitrary<AmountSpec> = fc.oneof(
  {
    weight: 8,
    arbitrary: fc.record({
      kind: fc.constant('some' as const),
      major: fc.bigInt(1n, 3_000n),
      // The sandbox rail's magic cents (.13 refused, .14 returned, .15 slow) often enough to matter.
      cents: fc.oneof(fc.constantFrom(13, 14, 15), fc.integer({ min: 0, max: 99 })),
      micro: fc.oneof(fc.constant(0n), fc.bigInt(0n, 9_999n)),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ kind: 'all' as const }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('over' as const), extra: fc.bigInt(1n, 500n * USDC_UNIT) }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant('tiny' as const), micro: fc.bigInt(1n, 20_000n) }) },
);

type Via = 'activity' | 'direct' | 'stale';

type Operation =
  | { op: 'create'; amount: AmountSpec }
  | { op: 'retry'; payout: number; same: boolean }
  | { op: 'submit'; payout: number; settleIfConfirmed: boolean }
  | { op: Resolution; payout: number; via: Via; copy: number };

// Mostly one of the latest payouts (still in flight more often), sometimes any of them.
const payoutRef = fc.oneof({ weight: 3, arbitrary: fc.nat({ max: 2 }) }, { weight: 1, arbitrary: fc.nat({ max: 30 }) });
const resolution = (op: Resolution) =>
  fc.record({
    op: fc.constant(op),
    payout: payoutRef,
    via: fc.constantFrom<Via>('activity', 'direct', 'stale'),
    copy: fc.nat({ max: 5 }),
  });

const operation: fc.Arbitrary<Operation> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ op: fc.constant('create' as const), amount: amountSpec }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('retry' as const), payout: payoutRef, same: fc.boolean() }) },
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constant('submit' as const),
      payout: payoutRef,
      // Mostly the plain submission (→ processing), so that settle and fail find payouts to act on.
      settleIfConfirmed: fc.constantFrom(false, false, true),
    }),
  },
  { weight: 4, arbitrary: resolution('settle') },
  { weight: 2, arbitrary: resolution('fail') },
  { weight: 3, arbitrary: resolution('return') },
);

/** Every way an operation can end; the test fails if one of them never happened. */
const OUTCOME_KINDS = [
  'create:ok',
  'create:drains-wallet',
  'create:insufficient-funds',
  'create:too-small',
  'retry:same',
  'retry:key-used',
  'submit:processing',
  'submit:settled',
  'submit:no-op',
  'submit:refused',
  ...(['settle', 'fail', 'return'] as const).flatMap((r) => [
    `${r}:applied-by-activity`,
    `${r}:applied-by-step`,
    `${r}:repeat`,
    `${r}:wrong-state`,
    `${r}:stale-copy`,
  ]),
] as const;
type OutcomeKind = (typeof OUTCOME_KINDS)[number];

// ---------------------------------------------------------------------------------------------

/** fast-check's report plus the assertion that failed (which its default report leaves out). */
function failureReport<Ts>(details: fc.RunDetails<Ts>): string {
  const error = details.errorInstance;
  return `${fc.defaultReportMessage(details) ?? 'property failed'}\n\nFailure: ${error instanceof Error ? error.message : String(error)}`;
}

const show = (value: unknown) => JSON.stringify(value, (_key, v: unknown) => (typeof v === 'bigint' ? `${v}n` : v));

/** Temporal is out of scope: every start fails, as when it is unreachable (the outbox keeps the row). */
const NO_TEMPORAL = {
  connection: { withDeadline: () => Promise.reject(new Error('Temporal is not part of this test')) },
} as unknown as Client;

/** The code of a refusal the production code raises on purpose; anything else is rethrown. */
async function refusalOf(
  fn: () => Promise<unknown>,
): Promise<{ ok: true; value: unknown } | { ok: false; code: string }> {
  try {
    return { ok: true, value: await fn() };
  } catch (error) {
    if (error instanceof DomainError) return { ok: false, code: error.code };
    if (error instanceof ApplicationFailure && error.type) return { ok: false, code: error.type };
    throw error;
  }
}

describe('payout lifecycle properties (db/rails.ts vs. model)', () => {
  let database: TestDatabase;
  let sql: Sql;
  let appSql: Sql;

  before(async () => {
    database = await createTestDatabase({ poolMax: 4 });
    sql = database.sql;
    appSql = createAppRoleSql(database.url, { applicationName: 'rails-property-test', poolMax: 4 });
  });
  after(async () => {
    await appSql.end({ timeout: 5 });
    await database.drop();
  });

  interface World {
    companyId: string;
    walletId: string;
    achAccountId: string;
    /** The preload's transfers (one per funded account): not payouts. */
    preloadTransfers: number;
  }

  const scopeOf = (world: World) => ({ companyId: world.companyId, environment: 'sandbox' as const });

  /** The whole state of the company compared with the model; `step` names the operation in messages. */
  async function check(world: World, model: Model, step: string): Promise<void> {
    const { companyId } = world;
    const [accounts, entries, transfers, holds, outbox] = await Promise.all([
      sql<
        {
          id: string;
          type: string;
          system_purpose: string | null;
          currency: string;
          posted: bigint;
          pending_debits: bigint;
          pending_credits: bigint;
          overdraft_limit: bigint | null;
        }[]
      >`select id, type, system_purpose, currency, posted, pending_debits, pending_credits, overdraft_limit
        from ledger_accounts where company_id = ${companyId}`,
      sql<
        {
          transfer_id: string;
          account_id: string;
          currency: string;
          kind: string;
          amount: bigint;
          hold_id: string | null;
        }[]
      >`
        select transfer_id, account_id, currency, kind, amount, hold_id from ledger_entries where company_id = ${companyId}`,
      sql<{ id: string; status: string; version: number; has_reason: boolean; history: string[] }[]>`
        select t.id, t.status, t.version, t.failure_reason is not null as has_reason,
               coalesce((select array_agg(h.status order by h.id) from transfer_status_history h where h.transfer_id = t.id),
                        '{}') as history
        from transfers t where t.company_id = ${companyId} and t.rail = 'ach'`,
      sql<{ id: string; transfer_id: string; status: string; resolved: boolean }[]>`
        select id, transfer_id, status, resolved_at is not null as resolved from ledger_holds where company_id = ${companyId}`,
      sql<{ transfers: bigint; outbox: bigint }[]>`
        select (select count(*) from transfers where company_id = ${companyId}) as transfers,
               (select count(*) from outbox where company_id = ${companyId}) as outbox`,
    ]);
    const role = new Map(
      accounts.map((a) => [a.id, a.id === world.walletId ? 'wallet' : `${a.system_purpose ?? a.type}:${a.currency}`]),
    );

    // Nothing but the model's payouts was written: transfers, outbox rows, holds.
    assert.equal(
      outbox[0]!.transfers,
      BigInt(world.preloadTransfers + model.payouts.length),
      `${step}: transfer count`,
    );
    assert.equal(outbox[0]!.outbox, BigInt(model.payouts.length), `${step}: one outbox row per payout`);
    assert.equal(transfers.length, model.payouts.length, `${step}: payout count`);
    assert.equal(holds.length, model.payouts.length, `${step}: one hold per payout`);

    // The wallet: posted moves only on settle (down by the full debit) and return (back in full);
    // pending debits are exactly the in-flight holds; available never below the floor (0).
    const wallet = accounts.find((a) => a.id === world.walletId)!;
    const expectedPending = pendingDebits(model);
    assert.deepEqual(
      { posted: wallet.posted, pendingDebits: wallet.pending_debits, pendingCredits: wallet.pending_credits },
      { posted: model.posted, pendingDebits: expectedPending, pendingCredits: 0n },
      `${step}: USDC wallet balances`,
    );
    assert.equal(wallet.overdraft_limit, 0n, `${step}: the wallet's floor is 0`);
    assert.ok(wallet.posted - wallet.pending_debits >= 0n, `${step}: wallet available below its floor`);

    // The platform side: clearing carries the in-flight holds; fees and FX carry the settled payouts.
    const settled = model.payouts.filter((p) => p.status === 'settled');
    const sum = (ps: ModelPayout[], f: (p: ModelPayout) => bigint) => ps.reduce((s, p) => s + f(p), 0n);
    const expectedSystem: Record<string, { posted: bigint; pendingDebits: bigint; pendingCredits: bigint }> = {
      'rail_clearing:USDC': { posted: 0n, pendingDebits: 0n, pendingCredits: expectedPending },
      'fees:USDC': { posted: sum(settled, (p) => p.fee), pendingDebits: 0n, pendingCredits: 0n },
      'fx:USDC': { posted: sum(settled, (p) => p.amount - p.fee), pendingDebits: 0n, pendingCredits: 0n },
      'fx:USD': { posted: -sum(settled, (p) => p.out), pendingDebits: 0n, pendingCredits: 0n },
      'ach_payouts:USD': { posted: sum(settled, (p) => p.out), pendingDebits: 0n, pendingCredits: 0n },
    };
    for (const account of accounts) {
      const expected = expectedSystem[role.get(account.id)!];
      if (!expected) continue; // the preload's accounts are checked by conservation below
      assert.deepEqual(
        { posted: account.posted, pendingDebits: account.pending_debits, pendingCredits: account.pending_credits },
        expected,
        `${step}: balances of ${role.get(account.id)}`,
      );
    }

    // Every bounded account above its floor; money conserved per currency.
    const totals = new Map<string, { posted: bigint; pending: bigint }>();
    for (const account of accounts) {
      if (account.overdraft_limit !== null)
        assert.ok(
          account.posted - account.pending_debits >= -account.overdraft_limit,
          `${step}: ${account.id} overdrawn`,
        );
      const total = totals.get(account.currency) ?? { posted: 0n, pending: 0n };
      total.posted += account.posted;
      total.pending += account.pending_debits - account.pending_credits;
      totals.set(account.currency, total);
    }
    for (const [currency, total] of totals)
      assert.deepEqual(total, { posted: 0n, pending: 0n }, `${step}: ${currency} is conserved`);

    // Double entry: each transfer's entries sum to zero per currency and kind; stored balances are
    // exactly their entries.
    const sums = new Map<string, bigint>();
    const recomputed = new Map<string, { posted: bigint; pendingDebits: bigint; pendingCredits: bigint }>();
    for (const e of entries) {
      const key = `${e.transfer_id} ${e.currency} ${e.kind}`;
      sums.set(key, (sums.get(key) ?? 0n) + e.amount);
      const r = recomputed.get(e.account_id) ?? { posted: 0n, pendingDebits: 0n, pendingCredits: 0n };
      const sign = e.kind === 'hold_release' ? -1n : 1n;
      if (e.kind === 'posted') r.posted += e.amount;
      else if (e.amount < 0n) r.pendingDebits += sign * -e.amount;
      else r.pendingCredits += sign * e.amount;
      recomputed.set(e.account_id, r);
    }
    for (const [key, total] of sums) assert.equal(total, 0n, `${step}: entries of ${key} sum to ${total}`);
    for (const account of accounts) {
      assert.deepEqual(
        recomputed.get(account.id) ?? { posted: 0n, pendingDebits: 0n, pendingCredits: 0n },
        { posted: account.posted, pendingDebits: account.pending_debits, pendingCredits: account.pending_credits },
        `${step}: balances of ${role.get(account.id)} recomputed from its entries`,
      );
    }

    // Each payout: status, version, history, hold, and exactly the entries its state calls for.
    const byTransfer = new Map<string, string[]>();
    for (const e of entries) {
      const lines = byTransfer.get(e.transfer_id) ?? [];
      lines.push(`${role.get(e.account_id)} ${e.kind} ${e.amount}`);
      byTransfer.set(e.transfer_id, lines);
    }
    const rows = new Map(transfers.map((t) => [t.id, t]));
    const holdOf = new Map(holds.map((h) => [h.transfer_id, h]));
    for (const p of model.payouts) {
      const row = rows.get(p.id);
      assert.ok(row, `${step}: payout ${p.id} exists`);
      assert.deepEqual(
        { status: row.status, version: row.version, history: row.history, hasReason: row.has_reason },
        {
          status: p.status,
          version: p.version,
          history: p.history,
          hasReason: p.status === 'failed' || p.status === 'returned',
        },
        `${step}: payout ${p.id} (${formatUsdc(p.amount)} USDC)`,
      );
      const hold = holdOf.get(p.id);
      assert.ok(hold, `${step}: payout ${p.id} has a hold`);
      assert.deepEqual(
        { status: hold.status, resolved: hold.resolved },
        { status: holdStatus(p), resolved: !inFlight(p) },
        `${step}: hold of ${p.status} payout ${p.id}`,
      );
      assert.deepEqual(
        (byTransfer.get(p.id) ?? []).sort(),
        expectedEntries(p),
        `${step}: entries of ${p.status} payout ${p.id} (amount ${p.amount}, fee ${p.fee}, out ${p.out})`,
      );
      for (const e of entries.filter((e) => e.transfer_id === p.id && e.kind !== 'posted'))
        assert.equal(e.hold_id, hold.id, `${step}: hold entries of ${p.id} name its hold`);
    }
  }

  it(
    'drives random payout lifecycles through db/rails.ts and agrees with the model',
    { timeout: 120_000 },
    async (t) => {
      const seen = Object.fromEntries(OUTCOME_KINDS.map((kind) => [kind, 0])) as Record<OutcomeKind, number>;
      let runs = 0;
      let operations = 0;
      const deps: RailTransferDeps = {
        sql: appSql,
        temporal: NO_TEMPORAL,
        fxRates: PEGGED_RATES,
        logger: pino({ level: 'silent' }),
        outcomeWaitMs: 0,
      };

      const details = await fc.check(
        fc.asyncProperty(fc.array(operation, { minLength: 1, maxLength: 40, size: 'medium' }), async (ops) => {
          runs += 1;
          const tenant = await provisionTenant(
            sql,
            {
              name: 'Rails property',
              ownerEmail: `rails-prop-${runs}-${newId('co')}@example.com`,
              ownerPassword: 'x'.repeat(16),
            },
            SYSTEM_ACTOR,
          );
          const world: World = {
            companyId: tenant.company.id,
            walletId: tenant.sandbox.usdcWalletId,
            achAccountId: tenant.sandbox.achAccountId,
            preloadTransfers: 2, // USDC wallet and USD wallet (the USD account opens empty)
          };
          const scope = scopeOf(world);
          const activities = createTransferActivities({
            sql: appSql,
            rails: { sandbox: createSandboxAchRail(), live: createUnconfiguredLiveRail() },
          });
          const model: Model = { posted: SANDBOX_USDC, payouts: [] };
          const record = (kind: OutcomeKind) => {
            seen[kind] = (seen[kind] ?? 0) + 1;
          };

          /** Re-reads the payout through production code; keeps the copy when it is a new version. */
          const remember = async (p: ModelPayout, step: string) => {
            const current = await withTenant(appSql, world.companyId, (tx) => findRailTransfer(tx, scope, p.id));
            assert.ok(current, `${step}: findRailTransfer finds ${p.id}`);
            assert.equal(current.version, p.version, `${step}: version of ${p.id}`);
            if (p.copies.at(-1)?.version !== current.version) p.copies.push(current);
          };
          const move = (p: ModelPayout, ...statuses: Status[]) => {
            for (const status of statuses) {
              p.status = status;
              p.version += 1;
              p.history.push(status);
            }
            if (statuses.includes('settled')) model.posted -= p.amount;
            if (statuses.includes('returned')) model.posted += p.amount;
          };

          await check(world, model, 'provisioned');
          for (const [index, op] of ops.entries()) {
            operations += 1;
            const step = `op ${index} ${show(op)}`;
            try {
              if (op.op === 'create') {
                const free = available(model);
                const spec = op.amount;
                const amount =
                  spec.kind === 'some'
                    ? spec.major * USDC_UNIT + BigInt(spec.cents) * USD_PER_USDC_MINOR + spec.micro
                    : spec.kind === 'all'
                      ? free > 0n
                        ? free
                        : 1n
                      : spec.kind === 'over'
                        ? free + spec.extra
                        : spec.micro;
                const { fee, out } = quote(amount);
                const key = `payout-${index}-${newId('co').slice(3, 11)}`;
                const request = {
                  source: { currency: 'USDC', rail: 'stablecoin' as const, amount: formatUsdc(amount) },
                  destination: { currency: 'USD', rail: 'ach' as const, account: world.achAccountId },
                };
                const result = await refusalOf(() => createPayoutTransfer(deps, scope, request, key));
                const expected = out <= 0n ? 'AMOUNT_TOO_SMALL' : amount > free ? 'INSUFFICIENT_FUNDS' : null;
                const label = `${step} (amount ${amount}, available ${free})`;
                if (expected !== null) {
                  assert.deepEqual(result, { ok: false, code: expected }, `${label}: must be refused`);
                  record(expected === 'AMOUNT_TOO_SMALL' ? 'create:too-small' : 'create:insufficient-funds');
                } else {
                  assert.ok(result.ok, `${label}: refused (${result.ok ? '' : result.code}) what the model allows`);
                  const created = result.value as Awaited<ReturnType<typeof createPayoutTransfer>>;
                  assert.deepEqual(
                    {
                      status: created.status,
                      amount: created.amount,
                      fee: created.payout?.feeAmount,
                      out: created.payout?.outAmount,
                      rate: /^1(\.0*)?$/.test(created.payout?.fxRate ?? ''), // numeric(.., 18) in the row
                      source: created.sourceAccountId,
                    },
                    { status: 'pending', amount, fee, out, rate: true, source: world.walletId },
                    `${label}: the created payout`,
                  );
                  const p: ModelPayout = {
                    id: created.id,
                    key,
                    amount,
                    fee,
                    out,
                    rail: railBehaviour(amount),
                    status: 'pending',
                    version: 1,
                    history: ['pending'],
                    copies: [],
                  };
                  model.payouts.push(p);
                  await remember(p, step);
                  record(available(model) === 0n ? 'create:drains-wallet' : 'create:ok');
                }
                await check(world, model, label);
                continue;
              }

              if (model.payouts.length === 0) continue;
              const p = model.payouts[model.payouts.length - 1 - (op.payout % model.payouts.length)]!;
              const label = `${step} on ${p.status} payout ${p.id} (amount ${p.amount}, rail ${p.rail})`;

              if (op.op === 'retry') {
                // The same Idempotency-Key again: the same payout answers and nothing is written; another
                // payout under the key is refused.
                const request = {
                  source: {
                    currency: 'USDC',
                    rail: 'stablecoin' as const,
                    amount: formatUsdc(p.amount + (op.same ? 0n : 1n)),
                  },
                  destination: { currency: 'USD', rail: 'ach' as const, account: world.achAccountId },
                };
                const result = await refusalOf(() => createPayoutTransfer(deps, scope, request, p.key));
                if (op.same) {
                  assert.ok(result.ok, `${label}: a retry was refused (${result.ok ? '' : result.code})`);
                  const again = result.value as Awaited<ReturnType<typeof createPayoutTransfer>>;
                  assert.deepEqual(
                    { id: again.id, status: again.status },
                    { id: p.id, status: p.status },
                    `${label}: retry`,
                  );
                  record('retry:same');
                } else {
                  assert.deepEqual(result, { ok: false, code: 'IDEMPOTENCY_KEY_USED' }, label);
                  record('retry:key-used');
                }
              } else if (op.op === 'submit') {
                const ref = { transferId: p.id, companyId: world.companyId, environment: 'sandbox' as const };
                const settles = op.settleIfConfirmed && p.rail === 'confirmed';
                const before = p.status;
                const result = await refusalOf(() =>
                  op.settleIfConfirmed ? activities.submitAndSettleTransfer(ref) : activities.submitTransferToRail(ref),
                );
                if (before === 'pending' || before === 'processing') {
                  assert.ok(result.ok, `${label}: submission refused (${result.ok ? '' : result.code})`);
                  if (settles)
                    move(p, ...(before === 'pending' ? (['processing', 'settled'] as const) : (['settled'] as const)));
                  else if (before === 'pending') move(p, 'processing');
                  record(settles ? 'submit:settled' : before === 'pending' ? 'submit:processing' : 'submit:no-op');
                } else if (before === 'settled' && op.settleIfConfirmed) {
                  // A retry of the settling submission: answered from the row, nothing written.
                  assert.ok(result.ok, `${label}: retry of a settling submission refused`);
                  record('submit:no-op');
                } else {
                  assert.deepEqual(result, { ok: false, code: 'TransferNotSubmittable' }, label);
                  record('submit:refused');
                }
                if (result.ok) {
                  const value = result.value as {
                    outcome?: string;
                    submission?: { outcome: string };
                    settled?: { status: string };
                  };
                  const submission = op.settleIfConfirmed ? value.submission : value;
                  // A settled payout is answered from its row as the settling attempt was: confirmed.
                  const answered = before === 'settled' ? 'confirmed' : p.rail;
                  assert.equal(submission?.outcome, answered, `${label}: the submission's answer`);
                  if (op.settleIfConfirmed) {
                    const settledAnswer = settles || before === 'settled' ? 'settled' : undefined;
                    assert.equal(value.settled?.status, settledAnswer, `${label}: settled answer`);
                  }
                }
              } else {
                // settle | fail | return, three ways: the activity (re-reads, then a no-op unless in
                // `from`), the db/rails.ts step on a fresh read, or on a stale copy of the row.
                const from = FROM[op.op];
                const to = TO[op.op];
                const copy = p.copies[op.copy % p.copies.length]!;
                const current = from.includes(p.status);
                const applies = current && (op.via !== 'stale' || copy.version === p.version);
                const kind: OutcomeKind = applies
                  ? `${op.op}:applied-by-${op.via === 'activity' ? 'activity' : 'step'}`
                  : current
                    ? `${op.op}:stale-copy`
                    : p.status === to
                      ? `${op.op}:repeat`
                      : `${op.op}:wrong-state`;
                const reason = `model: ${op.op}`;
                const stepFn = (tx: TransactionSql, transfer: RailTransfer) =>
                  op.op === 'settle'
                    ? settleRailTransfer(tx, transfer, () => newId('sys'))
                    : op.op === 'fail'
                      ? failRailTransfer(tx, transfer, reason)
                      : returnRailTransfer(tx, transfer, reason, () => newId('sys'));
                const stepLabel = `${label} via ${op.via}${op.via === 'stale' ? ` (copy v${copy.version} ${copy.status}, row v${p.version})` : ''}`;
                if (op.via === 'activity') {
                  const ref = { transferId: p.id, companyId: world.companyId, environment: 'sandbox' as const, reason };
                  const snapshot =
                    op.op === 'settle'
                      ? await activities.settleTransfer(ref)
                      : op.op === 'fail'
                        ? await activities.failTransfer(ref)
                        : await activities.returnTransfer(ref);
                  assert.equal(snapshot.status, applies ? to : p.status, `${stepLabel}: the activity's answer`);
                } else {
                  const result = await withTenant(appSql, world.companyId, async (tx) => {
                    const transfer = op.via === 'stale' ? copy : await findRailTransfer(tx, scope, p.id);
                    return stepFn(tx, transfer!);
                  });
                  if (applies) {
                    assert.ok(result, `${stepLabel}: the step refused what the model allows`);
                    assert.deepEqual(
                      { status: result.status, version: result.version },
                      { status: to, version: p.version + 1 },
                      stepLabel,
                    );
                  } else {
                    assert.equal(
                      result,
                      undefined,
                      `${stepLabel}: the step applied what the model refuses (${result?.status})`,
                    );
                  }
                }
                if (applies) move(p, to);
                record(kind);
                await check(world, model, stepLabel);
                await remember(p, stepLabel);
                continue;
              }
              await check(world, model, label);
              await remember(p, label);
            } catch (error) {
              // A refusal or crash the model did not expect, named with the operation that met it.
              if (error instanceof assert.AssertionError) throw error;
              throw new Error(
                `${step}: unexpected ${error instanceof Error ? `${error.name}: ${error.message}` : String(error)}`,
                {
                  cause: error,
                },
              );
            }
          }
        }),
        {
          seed: 20_250_704,
          numRuns: 120,
          endOnFailure: false,
        },
      );
      if (details.failed) throw new Error(failureReport(details), { cause: details.errorInstance });
      t.diagnostic(
        `seed ${details.seed}: ${details.numRuns} runs, ${runs} tenants, ` +
          `${operations} operations; outcomes ${JSON.stringify(seen)}`,
      );
      for (const [kind, count] of Object.entries(seen))
        assert.ok(count > 0, `no operation ended as "${kind}": the generators miss a case`);
    },
  );
});
