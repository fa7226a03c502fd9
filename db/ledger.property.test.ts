// Property-based tests of the ledger: random worlds and random operation sequences are run against
// PostgreSQL (as the app role, through withTenant) and against a small in-memory model of the rules.
// After every operation the database must agree with the model and keep the ledger's invariants.
// Seeds are fixed so a CI failure reproduces locally; a time budget keeps the file under a minute.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import fc from 'fast-check';
import postgres from 'postgres';
import { newId } from '../platform/ids.ts';
import { createTestDatabase, type TestDatabase, createAppRoleSql } from '../test-support/db.ts';
import { openSystemAccount } from '../test-support/ledger.ts';
import { type Sql, type TransactionSql } from './client.ts';
import { openLedgerAccount, postLedgerTransfer, type Environment } from './ledger.ts';
import { withTenant } from './tenant.ts';

const CURRENCIES = ['USD', 'USDC'] as const;
const ENVIRONMENTS = ['sandbox', 'live'] as const satisfies readonly Environment[];
type Currency = (typeof CURRENCIES)[number];


// ---------------------------------------------------------------------------------------------
// The model

interface ModelAccount {
  id: string;
  type: 'wallet' | 'account' | 'system';
  currency: Currency;
  environment: Environment;
  /** null: unbounded (system accounts). */
  overdraftLimit: bigint | null;
  posted: bigint;
  pendingDebits: bigint;
  pendingCredits: bigint;
}

interface ModelHold {
  id: string;
  transferId: string;
  source: ModelAccount;
  destination: ModelAccount;
  amount: bigint;
  status: 'pending' | 'posted' | 'voided';
}

/** Why the model refuses an operation (null: allowed). */
type Refusal = null | 'invalid' | 'scope' | 'overdraft' | 'resolved';

function available(account: ModelAccount): bigint {
  return account.posted - account.pendingDebits;
}

/** The rules a debit of `amount` from source to destination in `currency` must satisfy. */
function judgeMove(source: ModelAccount, destination: ModelAccount, currency: Currency, amount: bigint): Refusal {
  if (amount <= 0n || source.id === destination.id) return 'invalid';
  if (
    source.currency !== currency ||
    destination.currency !== currency ||
    source.environment !== destination.environment
  ) {
    return 'scope';
  }
  if (source.overdraftLimit !== null && available(source) - amount < -source.overdraftLimit) return 'overdraft';
  return null;
}

// ---------------------------------------------------------------------------------------------
// Generators

interface AccountSpec {
  type: 'wallet' | 'account';
  currency: Currency;
  environment: Environment;
  overdraftLimit: bigint;
}

// Biased towards USD/sandbox so that same-scope pairs (transfers that can succeed) are common.
const accountSpec: fc.Arbitrary<AccountSpec> = fc.record({
  type: fc.constantFrom('wallet' as const, 'account' as const),
  currency: fc.constantFrom<Currency>('USD', 'USD', 'USDC'),
  environment: fc.constantFrom<Environment>('sandbox', 'sandbox', 'live'),
  overdraftLimit: fc.constantFrom(0n, 0n, 0n, 500n, 5_000n),
});

const world = fc.array(accountSpec, { minLength: 3, maxLength: 5 }).map((accounts) => {
  // Every world spans both currencies and both environments.
  accounts[0] = { ...accounts[0]!, currency: 'USD', environment: 'sandbox' };
  accounts[1] = { ...accounts[1]!, currency: 'USDC', environment: 'live' };
  return accounts;
});

// Mostly ordinary amounts; some far larger than any balance; a few invalid ones.
const amount = fc.oneof(
  { weight: 6, arbitrary: fc.bigInt(1n, 2_000n) },
  { weight: 2, arbitrary: fc.bigInt(2_001n, 1_000_000n) },
  { weight: 1, arbitrary: fc.constantFrom(0n, -1n, -500n) },
);

/** Account references are indexes into [user accounts..., system accounts...], taken modulo. */
type Operation =
  | { op: 'fund'; to: number; amount: bigint }
  | {
      op: 'transfer';
      from: number;
      to: number;
      sameScope: boolean;
      currencyOf: 'source' | 'destination';
      amount: bigint;
    }
  | { op: 'hold'; from: number; to: number; sameScope: boolean; amount: bigint }
  | { op: 'post' | 'void'; hold: number; statusFirst: boolean };

const ref = fc.nat({ max: 20 });
const operation: fc.Arbitrary<Operation> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ op: fc.constant('fund' as const), to: ref, amount: fc.bigInt(1n, 5_000n) }) },
  {
    weight: 5,
    arbitrary: fc.record({
      op: fc.constant('transfer' as const),
      from: ref,
      to: ref,
      sameScope: fc.boolean(),
      currencyOf: fc.constantFrom('source' as const, 'destination' as const),
      amount,
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({ op: fc.constant('hold' as const), from: ref, to: ref, sameScope: fc.boolean(), amount }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constantFrom('post' as const, 'void' as const),
      hold: ref,
      statusFirst: fc.boolean(),
    }),
  },
);

// ---------------------------------------------------------------------------------------------
// The database side

interface PgErrorLike {
  code: string;
  constraint_name?: string | undefined;
  message: string;
}

/** fast-check's report plus the assertion that failed (which its default report leaves out). */
function failureReport<Ts>(details: fc.RunDetails<Ts>): string {
  const error = details.errorInstance;
  return `${fc.defaultReportMessage(details) ?? 'property failed'}\n\nFailure: ${error instanceof Error ? error.message : String(error)}`;
}

type Outcome = { ok: true } | { ok: false; error: PgErrorLike };

async function attempt(fn: () => Promise<unknown>): Promise<Outcome> {
  try {
    await fn();
    return { ok: true };
  } catch (error) {
    if (error instanceof postgres.PostgresError) return { ok: false, error };
    throw error; // not a refusal by the database: a bug in the test or the driver
  }
}

describe('ledger properties (database vs. model)', () => {
  let database: TestDatabase;
  let sql: Sql;
  let appSql: Sql;

  before(async () => {
    database = await createTestDatabase({ poolMax: 4 });
    sql = database.sql;
    appSql = createAppRoleSql(database.url, { applicationName: 'ledger-property-test', poolMax: 10 });
  });
  after(async () => {
    await appSql.end({ timeout: 5 });
    await database.drop();
  });

  /** A fresh company with one unbounded system funding account per currency + environment. */
  async function createWorld(
    specs: AccountSpec[],
  ): Promise<{ companyId: string; users: ModelAccount[]; systems: ModelAccount[] }> {
    const companyId = newId('co');
    await sql`insert into companies (id, name) values (${companyId}, 'X')`;
    const users: ModelAccount[] = [];
    const systems: ModelAccount[] = [];
    await withTenant(appSql, companyId, async (tx) => {
      for (const currency of CURRENCIES) {
        for (const environment of ENVIRONMENTS) {
          const id = newId('sys');
          await openSystemAccount(tx, { id, companyId, environment, currency, name: 'funding' });
          systems.push({
            id,
            type: 'system',
            currency,
            environment,
            overdraftLimit: null,
            posted: 0n,
            pendingDebits: 0n,
            pendingCredits: 0n,
          });
        }
      }
      for (const spec of specs) {
        const id = newId(spec.type === 'wallet' ? 'wal' : 'acct');
        await openLedgerAccount(tx, { id, companyId, name: spec.type, ...spec });
        users.push({ id, ...spec, posted: 0n, pendingDebits: 0n, pendingCredits: 0n });
      }
    });
    return { companyId, users, systems };
  }

  async function insertPendingTransfer(
    tx: TransactionSql,
    t: { id: string; companyId: string; source: ModelAccount; destination: ModelAccount; amount: bigint },
  ): Promise<void> {
    await tx`
      insert into transfers (id, company_id, environment, idempotency_key, rail, status, amount, currency,
                             source_account_id, destination_account_id)
      values (${t.id}, ${t.companyId}, ${t.source.environment}, ${`hold-${t.id}`}, 'ledger', 'pending',
              ${t.amount.toString()}, ${t.source.currency}, ${t.source.id}, ${t.destination.id})`;
    await tx`insert into transfer_status_history (transfer_id, company_id, status) values (${t.id}, ${t.companyId}, 'pending')`;
  }

  /** A hold as the settlement code places it: pending transfer, hold row, hold entries taken from the transfer. */
  async function placeHold(
    tx: TransactionSql,
    h: {
      transferId: string;
      holdId: string;
      companyId: string;
      source: ModelAccount;
      destination: ModelAccount;
      amount: bigint;
    },
  ): Promise<void> {
    await insertPendingTransfer(tx, { id: h.transferId, ...h });
    await tx`insert into ledger_holds (id, company_id, transfer_id) values (${h.holdId}, ${h.companyId}, ${h.transferId})`;
    await tx`
      insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind, hold_id)
      select t.company_id, t.environment, t.id, e.account_id, t.currency, e.amount, 'hold', ${h.holdId}
      from transfers t
      cross join lateral (values (t.source_account_id, -t.amount, 1), (t.destination_account_id, t.amount, 2)) as e(account_id, amount, n)
      where t.id = ${h.transferId}
      order by e.n`;
  }

  /** Posts or voids a hold: status change + release entries (+ posted entries), in either order. */
  async function resolveHold(
    tx: TransactionSql,
    hold: ModelHold,
    outcome: 'posted' | 'voided',
    statusFirst: boolean,
  ): Promise<void> {
    const setStatus = () => tx`update ledger_holds set status = ${outcome}, resolved_at = now() where id = ${hold.id}`;
    if (statusFirst) await setStatus();
    // Releases before the posted debit: CHECK constraints run on every row, not at the end.
    await tx`
      insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind, hold_id)
      select t.company_id, t.environment, t.id, e.account_id, t.currency, e.amount, e.kind, ${hold.id}
      from transfers t
      cross join lateral (values
        (t.source_account_id, -t.amount, 'hold_release', 1, true),
        (t.destination_account_id, t.amount, 'hold_release', 2, true),
        (t.source_account_id, -t.amount, 'posted', 3, ${outcome === 'posted'}),
        (t.destination_account_id, t.amount, 'posted', 4, ${outcome === 'posted'})
      ) as e(account_id, amount, kind, n, wanted)
      where t.id = ${hold.transferId} and e.wanted
      order by e.n`;
    if (!statusFirst) await setStatus();
    // pending -> processing -> settled, or pending -> canceled (contract 4), each change in the history.
    for (const status of outcome === 'posted' ? ['processing', 'settled'] : ['canceled']) {
      await tx`update transfers set status = ${status}, version = version + 1, updated_at = now() where id = ${hold.transferId}`;
      await tx`insert into transfer_status_history (transfer_id, company_id, status)
               select id, company_id, status from transfers where id = ${hold.transferId}`;
    }
  }

  interface Snapshot {
    accounts: Map<
      string,
      { posted: bigint; pendingDebits: bigint; pendingCredits: bigint; overdraftLimit: bigint | null; type: string }
    >;
  }

  /** Every invariant of the ledger, checked for one company against the model. */
  async function checkInvariants(
    companyId: string,
    accounts: ModelAccount[],
    holds: ModelHold[],
    transfers: number,
    step: string,
  ) {
    const rows = await sql<
      {
        id: string;
        type: string;
        posted: bigint;
        pending_debits: bigint;
        pending_credits: bigint;
        overdraft_limit: bigint | null;
      }[]
    >`select id, type, posted, pending_debits, pending_credits, overdraft_limit from ledger_accounts where company_id = ${companyId}`;
    const snapshot: Snapshot = { accounts: new Map() };
    for (const row of rows) {
      snapshot.accounts.set(row.id, {
        posted: row.posted,
        pendingDebits: row.pending_debits,
        pendingCredits: row.pending_credits,
        overdraftLimit: row.overdraft_limit,
        type: row.type,
      });
    }
    assert.equal(snapshot.accounts.size, accounts.length, `${step}: account count`);

    // 1. Each account's balances are the model's.
    for (const account of accounts) {
      const stored = snapshot.accounts.get(account.id);
      assert.ok(stored, `${step}: account ${account.id} exists`);
      assert.deepEqual(
        { posted: stored.posted, pendingDebits: stored.pendingDebits, pendingCredits: stored.pendingCredits },
        { posted: account.posted, pendingDebits: account.pendingDebits, pendingCredits: account.pendingCredits },
        `${step}: balances of ${account.type} ${account.id} (${account.currency}/${account.environment})`,
      );
    }

    // 2. Money is conserved per currency + environment: posted sums to zero (system accounts hold the
    //    negatives), and every pending debit is someone's pending credit.
    const sums = await sql<{ environment: string; currency: string; posted: string; pending: string }[]>`
      select environment, currency, sum(posted)::text as posted, (sum(pending_debits) - sum(pending_credits))::text as pending
      from ledger_accounts where company_id = ${companyId} group by environment, currency`;
    for (const sum of sums) {
      assert.equal(sum.posted, '0', `${step}: posted balances of ${sum.currency}/${sum.environment} sum to zero`);
      assert.equal(sum.pending, '0', `${step}: pending debits = pending credits in ${sum.currency}/${sum.environment}`);
    }

    // 3. No bounded account is below its floor.
    for (const [id, stored] of snapshot.accounts) {
      assert.ok(
        stored.pendingDebits >= 0n && stored.pendingCredits >= 0n,
        `${step}: ${id} pending amounts are non-negative`,
      );
      if (stored.overdraftLimit !== null) {
        assert.ok(
          stored.posted - stored.pendingDebits >= -stored.overdraftLimit,
          `${step}: ${id} is overdrawn beyond its limit`,
        );
      } else {
        assert.equal(stored.type, 'system', `${step}: only system accounts are unbounded`);
      }
    }

    // 4. Double entry: each transfer's entries sum to zero per currency and kind.
    const unbalanced = await sql`
      select transfer_id, currency, kind, sum(amount)::text as total from ledger_entries
      where company_id = ${companyId} group by transfer_id, currency, kind having sum(amount) <> 0`;
    assert.deepEqual([...unbalanced], [], `${step}: unbalanced transfers`);

    // 5. Stored balances are exactly what the entries say.
    const recomputed = await sql<{ id: string; posted: bigint; pending_debits: bigint; pending_credits: bigint }[]>`
      select a.id,
             coalesce(sum(e.amount) filter (where e.kind = 'posted'), 0)::bigint as posted,
             coalesce(sum(-e.amount) filter (where e.kind = 'hold' and e.amount < 0), 0)::bigint
               - coalesce(sum(-e.amount) filter (where e.kind = 'hold_release' and e.amount < 0), 0)::bigint as pending_debits,
             coalesce(sum(e.amount) filter (where e.kind = 'hold' and e.amount > 0), 0)::bigint
               - coalesce(sum(e.amount) filter (where e.kind = 'hold_release' and e.amount > 0), 0)::bigint as pending_credits
      from ledger_accounts a left join ledger_entries e on e.account_id = a.id
      where a.company_id = ${companyId} group by a.id`;
    for (const row of recomputed) {
      const stored = snapshot.accounts.get(row.id)!;
      assert.deepEqual(
        [row.posted, row.pending_debits, row.pending_credits],
        [stored.posted, stored.pendingDebits, stored.pendingCredits],
        `${step}: ${row.id} balances recomputed from its entries`,
      );
    }

    // 6. Refused operations left no trace; holds have the model's status.
    const [counts] = await sql<{ transfers: bigint; holds: bigint }[]>`
      select (select count(*) from transfers where company_id = ${companyId}) as transfers,
             (select count(*) from ledger_holds where company_id = ${companyId}) as holds`;
    assert.equal(counts!.transfers, BigInt(transfers), `${step}: number of transfers`);
    assert.equal(counts!.holds, BigInt(holds.length), `${step}: number of holds`);
    if (holds.length > 0) {
      const statuses = await sql<{ id: string; status: string }[]>`
        select id, status from ledger_holds where company_id = ${companyId}`;
      const byId = new Map(statuses.map((row) => [row.id, row.status]));
      for (const hold of holds) assert.equal(byId.get(hold.id), hold.status, `${step}: status of hold ${hold.id}`);
    }
  }

  /** The database's refusal is the one the model predicts (when the model can tell which it is). */
  function assertRefusal(refusal: Exclude<Refusal, null>, error: PgErrorLike, step: string, statusFirst?: boolean) {
    const seen = `${error.code} ${error.constraint_name ?? ''} ${error.message}`;
    switch (refusal) {
      case 'overdraft':
        assert.equal(
          error.constraint_name,
          'ledger_accounts_no_overdraft',
          `${step}: expected an overdraft refusal, got ${seen}`,
        );
        break;
      case 'scope':
        assert.equal(error.code, '23503', `${step}: expected a foreign-key refusal, got ${seen}`);
        assert.match(error.constraint_name ?? '', /^transfers_(source|destination)_fk$/, `${step}: ${seen}`);
        break;
      case 'invalid':
        assert.equal(error.code, '23514', `${step}: expected a check refusal, got ${seen}`);
        break;
      case 'resolved':
        if (statusFirst) assert.match(error.message, /posted or voided exactly once/, `${step}: ${seen}`);
        else assert.equal(error.constraint_name, 'ledger_entries_release_once', `${step}: ${seen}`);
        break;
    }
  }

  it('agrees with the model after every operation and keeps every invariant', { timeout: 120_000 }, async (t) => {
    let runs = 0;
    let operations = 0;
    const outcomes = { ok: 0, invalid: 0, scope: 0, overdraft: 0, resolved: 0 };
    const details = await fc.check(
      fc.asyncProperty(
        world,
        fc.array(operation, { minLength: 1, maxLength: 40, size: 'medium' }),
        async (specs, ops) => {
          runs += 1;
          const { companyId, users, systems } = await createWorld(specs);
          const all = [...users, ...systems];
          const holds: ModelHold[] = [];
          let transfers = 0;
          const pick = (index: number, pool: ModelAccount[]) => pool[index % pool.length]!;
          const fundingFor = (account: ModelAccount) =>
            systems.find((s) => s.currency === account.currency && s.environment === account.environment)!;
          /** The destination: any account, or (sameScope) one of the source's currency and environment. */
          const destinationFor = (source: ModelAccount, index: number, sameScope: boolean) => {
            if (!sameScope) return pick(index, all);
            const peers = all.filter(
              (a) => a.id !== source.id && a.currency === source.currency && a.environment === source.environment,
            );
            return pick(index, peers.length > 0 ? peers : all);
          };

          await checkInvariants(companyId, all, holds, transfers, 'opened');
          for (const [index, op] of ops.entries()) {
            operations += 1;
            const step = `op ${index} ${JSON.stringify(op, (_key, value: unknown) => (typeof value === 'bigint' ? `${value}n` : value))}`;
            let refusal: Refusal;
            let outcome: Outcome;
            let apply: () => void;
            let statusFirst: boolean | undefined;

            if (op.op === 'fund' || op.op === 'transfer') {
              const source = op.op === 'fund' ? fundingFor(pick(op.to, users)) : pick(op.from, all);
              const destination = op.op === 'fund' ? pick(op.to, users) : destinationFor(source, op.to, op.sameScope);
              const currency =
                op.op === 'transfer' && op.currencyOf === 'destination' ? destination.currency : source.currency;
              const value = op.amount;
              refusal = judgeMove(source, destination, currency, value);
              apply = () => {
                source.posted -= value;
                destination.posted += value;
                transfers += 1;
              };
              const id = newId('tr');
              outcome = await attempt(() =>
                withTenant(appSql, companyId, (tx) =>
                  postLedgerTransfer(tx, {
                    id,
                    companyId,
                    environment: source.environment,
                    idempotencyKey: `op-${id}`,
                    amount: value,
                    currency,
                    sourceAccountId: source.id,
                    destinationAccountId: destination.id,
                  }),
                ),
              );
            } else if (op.op === 'hold') {
              const source = pick(op.from, all);
              const destination = destinationFor(source, op.to, op.sameScope);
              const value = op.amount;
              refusal = judgeMove(source, destination, source.currency, value);
              const hold: ModelHold = {
                id: newId('hold'),
                transferId: newId('tr'),
                source,
                destination,
                amount: value,
                status: 'pending',
              };
              apply = () => {
                source.pendingDebits += value;
                destination.pendingCredits += value;
                holds.push(hold);
                transfers += 1;
              };
              outcome = await attempt(() =>
                withTenant(appSql, companyId, (tx) =>
                  placeHold(tx, {
                    transferId: hold.transferId,
                    holdId: hold.id,
                    companyId,
                    source,
                    destination,
                    amount: value,
                  }),
                ),
              );
            } else {
              if (holds.length === 0) continue;
              const hold = holds[op.hold % holds.length]!;
              const outcomeStatus = op.op === 'post' ? 'posted' : 'voided';
              refusal = hold.status === 'pending' ? null : 'resolved';
              statusFirst = op.statusFirst;
              apply = () => {
                hold.source.pendingDebits -= hold.amount;
                hold.destination.pendingCredits -= hold.amount;
                if (outcomeStatus === 'posted') {
                  hold.source.posted -= hold.amount;
                  hold.destination.posted += hold.amount;
                }
                hold.status = outcomeStatus;
              };
              outcome = await attempt(() =>
                withTenant(appSql, companyId, (tx) => resolveHold(tx, hold, outcomeStatus, op.statusFirst)),
              );
            }

            if (outcome.ok) {
              assert.equal(refusal, null, `${step}: the database accepted what the model refuses (${refusal})`);
              apply();
              outcomes.ok += 1;
            } else {
              assert.notEqual(
                refusal,
                null,
                `${step}: the database refused what the model allows: ${outcome.error.code} ${outcome.error.message}`,
              );
              assertRefusal(refusal!, outcome.error, step, statusFirst);
              outcomes[refusal!] += 1;
            }
            await checkInvariants(companyId, all, holds, transfers, step);
          }
        },
      ),
      {
        seed: 20_250_611,
        numRuns: 100,
        interruptAfterTimeLimit: 35_000,
        markInterruptAsFailure: false,
        endOnFailure: false,
      },
    );
    if (details.failed) throw new Error(failureReport(details), { cause: details.errorInstance });
    t.diagnostic(
      `seed ${details.seed}: ${details.numRuns} runs${details.interrupted ? ' (time budget reached)' : ''}, ${runs} worlds, ${operations} operations; ` +
        `outcomes ${JSON.stringify(outcomes)}`,
    );
    assert.ok(details.numRuns >= 20, `only ${details.numRuns} runs fitted in the time budget`);
    for (const [kind, count] of Object.entries(outcomes))
      assert.ok(count > 0, `no operation ended as "${kind}": the generators miss a case`);
  });

  it('concurrent debits of one account never overdraw it nor lose an update', { timeout: 60_000 }, async (t) => {
    let committed = 0;
    let refused = 0;
    const details = await fc.check(
      fc.asyncProperty(
        fc.bigInt(0n, 3_000n),
        fc.constantFrom(0n, 500n),
        fc.array(fc.record({ hold: fc.boolean(), amount: fc.bigInt(1n, 1_000n), to: fc.nat({ max: 2 }) }), {
          minLength: 2,
          maxLength: 8,
        }),
        async (funded, limit, debits) => {
          const companyId = newId('co');
          await sql`insert into companies (id, name) values (${companyId}, 'X')`;
          const system = newId('sys');
          const source = newId('acct');
          const destinations = [newId('wal'), newId('wal'), newId('wal')];
          await withTenant(appSql, companyId, async (tx) => {
            const base = { companyId, environment: 'sandbox' as const, currency: 'USD', name: 'x' };
            await openSystemAccount(tx, { ...base, id: system });
            await openLedgerAccount(tx, { ...base, id: source, type: 'account', overdraftLimit: limit });
            for (const id of destinations) await openLedgerAccount(tx, { ...base, id, type: 'wallet' });
          });
          if (funded > 0n) {
            await withTenant(appSql, companyId, (tx) =>
              postLedgerTransfer(tx, {
                id: newId('tr'),
                companyId,
                environment: 'sandbox',
                idempotencyKey: 'fund',
                amount: funded,
                currency: 'USD',
                sourceAccountId: system,
                destinationAccountId: source,
              }),
            );
          }
          // All debits race; each is one transaction on its own connection.
          const results = await Promise.all(
            debits.map((debit, index) =>
              attempt(() =>
                withTenant(appSql, companyId, async (tx) => {
                  const transferId = newId('tr');
                  const destination = destinations[debit.to]!;
                  if (!debit.hold) {
                    return postLedgerTransfer(tx, {
                      id: transferId,
                      companyId,
                      environment: 'sandbox',
                      idempotencyKey: `debit-${index}`,
                      amount: debit.amount,
                      currency: 'USD',
                      sourceAccountId: source,
                      destinationAccountId: destination,
                    });
                  }
                  const model = (id: string): ModelAccount => ({
                    id,
                    type: 'wallet',
                    currency: 'USD',
                    environment: 'sandbox',
                    overdraftLimit: 0n,
                    posted: 0n,
                    pendingDebits: 0n,
                    pendingCredits: 0n,
                  });
                  return placeHold(tx, {
                    transferId,
                    holdId: newId('hold'),
                    companyId,
                    source: model(source),
                    destination: model(destination),
                    amount: debit.amount,
                  });
                }),
              ),
            ),
          );
          let posted = 0n;
          let held = 0n;
          for (const [index, result] of results.entries()) {
            if (!result.ok) {
              assert.equal(
                result.error.constraint_name,
                'ledger_accounts_no_overdraft',
                `debit ${index}: ${result.error.message}`,
              );
              refused += 1;
              continue;
            }
            committed += 1;
            if (debits[index]!.hold) held += debits[index]!.amount;
            else posted += debits[index]!.amount;
          }
          const [row] = await sql<{ posted: bigint; pending_debits: bigint }[]>`
            select posted, pending_debits from ledger_accounts where id = ${source}`;
          // No lost update: the stored balance is exactly the initial one minus the debits that committed.
          assert.equal(row!.posted, funded - posted, 'posted = funded - committed posted debits');
          assert.equal(row!.pending_debits, held, 'pending debits = committed holds');
          const finalAvailable = row!.posted - row!.pending_debits;
          assert.ok(finalAvailable >= -limit, 'never beyond the overdraft limit');
          // Available only falls while debits run, so a refused debit exceeded even the final available balance.
          for (const [index, result] of results.entries()) {
            if (!result.ok)
              assert.ok(debits[index]!.amount > finalAvailable + limit, `debit ${index} was refused needlessly`);
          }
          const [sums] = await sql<{ posted: string; pending: string }[]>`
            select sum(posted)::text as posted, (sum(pending_debits) - sum(pending_credits))::text as pending
            from ledger_accounts where company_id = ${companyId}`;
          assert.deepEqual({ ...sums }, { posted: '0', pending: '0' }, 'money is conserved');
        },
      ),
      {
        seed: 424_242,
        numRuns: 40,
        interruptAfterTimeLimit: 15_000,
        markInterruptAsFailure: false,
        endOnFailure: false,
      },
    );
    if (details.failed) throw new Error(failureReport(details), { cause: details.errorInstance });
    t.diagnostic(
      `seed ${details.seed}: ${details.numRuns} runs${details.interrupted ? ' (time budget reached)' : ''}, ` +
        `${committed} debits committed, ${refused} refused`,
    );
    assert.ok(committed > 0 && refused > 0, 'the races both commit and refuse debits');
    assert.ok(details.numRuns >= 10, `only ${details.numRuns} runs fitted in the time budget`);
  });
});
