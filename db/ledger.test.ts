// The ledger's last line of defence: the database itself refuses every bad state, whatever the code
// sends. Most tests here write the raw SQL a buggy code path would send and expect PostgreSQL to
// refuse it (overdraft, unbalanced entries, mixed currencies/environments/companies, edits of
// append-only rows, direct balance writes, double releases of a hold, cross-tenant access).
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import postgres from 'postgres';
import { newId } from '../platform/ids.ts';
import { createTestDatabase, type TestDatabase, createAppRoleSql } from '../test-support/db.ts';
import { openSystemAccount } from '../test-support/ledger.ts';
import { type Sql, type TransactionSql } from './client.ts';
import {
  balancesOf,
  findLedgerAccount,
  findTransfer,
  listTransfers,
  openLedgerAccount,
  postLedgerTransfer,
  transferHistory,
  type Environment,
  type LedgerAccountType,
} from './ledger.ts';
import { withTenant } from './tenant.ts';

type Kind = 'posted' | 'hold' | 'hold_release';

interface Balances {
  posted: bigint;
  pendingDebits: bigint;
  pendingCredits: bigint;
}

interface Expected {
  code?: string;
  constraint?: string;
  message?: RegExp;
}

/** Asserts that `promise` fails with a PostgreSQL error of this SQLSTATE / constraint / message. */
async function refused(promise: Promise<unknown>, expected: Expected, why?: string): Promise<void> {
  await assert.rejects(
    promise,
    (error: unknown) => {
      assert.ok(error instanceof postgres.PostgresError, `expected a PostgreSQL error, got ${String(error)}`);
      if (expected.code) assert.equal(error.code, expected.code, `SQLSTATE of "${error.message}"`);
      if (expected.constraint)
        assert.equal(error.constraint_name, expected.constraint, `constraint of "${error.message}"`);
      if (expected.message) assert.match(error.message, expected.message);
      return true;
    },
    why,
  );
}

const OVERDRAFT: Expected = { code: '23514', constraint: 'ledger_accounts_no_overdraft' };
const UNBALANCED: Expected = { code: '23514', message: /do not balance/ };
const APPEND_ONLY: Expected = { code: '42501', message: /append-only/ };
const BALANCE_WRITE: Expected = { code: '42501', message: /balances change only through ledger entries/ };
const ACCOUNT_SCOPE_CHANGE: Expected = { code: '42501', message: /keeps its company, environment, currency and type/ };
const HOLD_ONCE: Expected = { code: '23514', message: /posted or voided exactly once/ };

describe('ledger (database-enforced invariants)', () => {
  let database: TestDatabase;
  let sql: Sql;
  /** One platform funding account (system, unbounded) per company + environment + currency. */
  const funding = new Map<string, string>();

  before(async () => {
    database = await createTestDatabase({ poolMax: 4 });
    sql = database.sql;
  });
  after(async () => database.drop());

  async function newCompany(): Promise<string> {
    const id = newId('co');
    await sql`insert into companies (id, name) values (${id}, 'X')`;
    return id;
  }

  async function open(
    companyId: string,
    options: {
      environment?: Environment;
      currency?: string;
      type?: LedgerAccountType;
      overdraftLimit?: bigint | null;
    } = {},
  ): Promise<string> {
    const type = options.type ?? 'wallet';
    const id = newId(type === 'wallet' ? 'wal' : type === 'account' ? 'acct' : 'sys');
    if (type === 'system') {
      assert.equal(options.overdraftLimit, null, 'system accounts here are unbounded');
      const environment = options.environment ?? 'sandbox';
      const currency = options.currency ?? 'USD';
      await sql.begin((tx) => openSystemAccount(tx, { id, companyId, environment, currency, name: 'funding' }));
      return id;
    }
    await sql.begin((tx) =>
      openLedgerAccount(tx, {
        id,
        companyId,
        environment: options.environment ?? 'sandbox',
        type,
        currency: options.currency ?? 'USD',
        name: `${type} ${id.slice(-4)}`,
        ...(options.overdraftLimit === undefined ? {} : { overdraftLimit: options.overdraftLimit }),
      }),
    );
    return id;
  }

  async function accountOf(id: string) {
    const [row] = await sql<{ company_id: string; environment: Environment; currency: string }[]>`
      select company_id, environment, currency from ledger_accounts where id = ${id}`;
    assert.ok(row, `account ${id} exists`);
    return row;
  }

  async function fundingAccount(companyId: string, environment: Environment, currency: string): Promise<string> {
    const key = `${companyId}/${environment}/${currency}`;
    let id = funding.get(key);
    if (!id) {
      id = await open(companyId, { environment, currency, type: 'system', overdraftLimit: null });
      funding.set(key, id);
    }
    return id;
  }

  /** Moves `amount` from `source` to `destination` through the code path under test. */
  async function transfer(source: string, destination: string, amount: bigint, tx?: TransactionSql) {
    const account = await accountOf(source);
    const id = newId('tr');
    const input = {
      id,
      companyId: account.company_id,
      environment: account.environment,
      idempotencyKey: `key-${id}`,
      amount,
      currency: account.currency,
      sourceAccountId: source,
      destinationAccountId: destination,
    };
    return tx ? postLedgerTransfer(tx, input) : sql.begin((t) => postLedgerTransfer(t, input));
  }

  /** Credits `account` from the platform's funding account of its company, environment and currency. */
  async function fund(account: string, amount: bigint) {
    const { company_id, environment, currency } = await accountOf(account);
    await transfer(await fundingAccount(company_id, environment, currency), account, amount);
  }

  async function balances(id: string): Promise<Balances> {
    const [row] = await sql<{ posted: bigint; pending_debits: bigint; pending_credits: bigint }[]>`
      select posted, pending_debits, pending_credits from ledger_accounts where id = ${id}`;
    assert.ok(row, `account ${id} exists`);
    return { posted: row.posted, pendingDebits: row.pending_debits, pendingCredits: row.pending_credits };
  }

  async function transferExists(id: string): Promise<boolean> {
    const [row] = await sql<{ n: bigint }[]>`
      select (select count(*) from transfers where id = ${id})
           + (select count(*) from ledger_entries where transfer_id = ${id})
           + (select count(*) from transfer_status_history where transfer_id = ${id}) as n`;
    return row!.n > 0n;
  }

  /** A transfer row written by hand, as a buggy code path would (no entries yet). */
  async function rawTransfer(
    tx: TransactionSql,
    t: { source: string; destination: string; amount: bigint; status?: string; id?: string },
  ): Promise<string> {
    const account = await tx<{ company_id: string; environment: string; currency: string }[]>`
      select company_id, environment, currency from ledger_accounts where id = ${t.source}`;
    const { company_id, environment, currency } = account[0]!;
    const id = t.id ?? newId('tr');
    await tx`
      insert into transfers (id, company_id, environment, idempotency_key, rail, status, amount, currency,
                             source_account_id, destination_account_id)
      values (${id}, ${company_id}, ${environment}, ${`raw-${id}`}, 'ledger', ${t.status ?? 'settled'},
              ${t.amount.toString()}, ${currency}, ${t.source}, ${t.destination})`;
    return id;
  }

  interface RawEntry {
    account: string;
    amount: bigint;
    kind?: Kind;
    holdId?: string;
    /** Overrides of the columns a buggy code path could get wrong (default: the account's). */
    companyId?: string;
    environment?: string;
    currency?: string;
  }

  /** Inserts entries in ONE statement, in order, taking company/environment/currency from the account. */
  async function rawEntries(tx: TransactionSql, transferId: string, entries: RawEntry[]): Promise<void> {
    const rows = [];
    for (const entry of entries) {
      const [account] = await tx<{ company_id: string; environment: string; currency: string }[]>`
        select company_id, environment, currency from ledger_accounts where id = ${entry.account}`;
      rows.push({
        company_id: entry.companyId ?? account?.company_id ?? null,
        environment: entry.environment ?? account?.environment ?? null,
        transfer_id: transferId,
        account_id: entry.account,
        currency: entry.currency ?? account?.currency ?? null,
        amount: entry.amount.toString(),
        kind: entry.kind ?? 'posted',
        hold_id: entry.holdId ?? null,
      });
    }
    await tx`insert into ledger_entries ${tx(rows)}`;
  }

  /** A hold the way the settlement code would place it: a pending transfer, a hold row, hold entries. */
  async function placeHold(
    source: string,
    destination: string,
    amount: bigint,
  ): Promise<{ transferId: string; holdId: string }> {
    const holdId = newId('hold');
    const transferId = await sql.begin(async (tx) => {
      const id = await rawTransfer(tx, { source, destination, amount, status: 'pending' });
      await tx`insert into ledger_holds (id, company_id, transfer_id)
               select ${holdId}, company_id, id from transfers where id = ${id}`;
      await rawEntries(tx, id, [
        { account: source, amount: -amount, kind: 'hold', holdId },
        { account: destination, amount, kind: 'hold', holdId },
      ]);
      return id;
    });
    return { transferId, holdId };
  }

  async function resolveHold(
    hold: { transferId: string; holdId: string },
    source: string,
    destination: string,
    amount: bigint,
    outcome: 'posted' | 'voided',
  ): Promise<void> {
    await sql.begin(async (tx) => {
      await tx`update ledger_holds set status = ${outcome}, resolved_at = now() where id = ${hold.holdId}`;
      // The release must come before the posted debit: the overdraft check runs on every row.
      const entries: RawEntry[] = [
        { account: source, amount: -amount, kind: 'hold_release', holdId: hold.holdId },
        { account: destination, amount, kind: 'hold_release', holdId: hold.holdId },
      ];
      if (outcome === 'posted') entries.push({ account: source, amount: -amount }, { account: destination, amount });
      await rawEntries(tx, hold.transferId, entries);
      // pending -> processing -> settled, or pending -> canceled (contract 4), each change in the history.
      for (const status of outcome === 'posted' ? ['processing', 'settled'] : ['canceled']) {
        await tx`update transfers set status = ${status}, version = version + 1, updated_at = now() where id = ${hold.transferId}`;
        await tx`insert into transfer_status_history (transfer_id, company_id, status)
                 select id, company_id, status from transfers where id = ${hold.transferId}`;
      }
    });
  }

  describe('overdraft', () => {
    it('refuses a transfer larger than the available balance and leaves no trace', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      const before = [await balances(a), await balances(b)];

      const id = newId('tr');
      await refused(
        sql.begin((tx) =>
          postLedgerTransfer(tx, {
            id,
            companyId: co,
            environment: 'sandbox',
            idempotencyKey: 'too-much',
            amount: 1_001n,
            currency: 'USD',
            sourceAccountId: a,
            destinationAccountId: b,
          }),
        ),
        OVERDRAFT,
      );
      assert.equal(await transferExists(id), false, 'no transfer, entry or history row survives');
      assert.deepEqual([await balances(a), await balances(b)], before);
      // The idempotency key was not burnt either.
      assert.equal(
        (await sql`select 1 from transfers where company_id = ${co} and idempotency_key = 'too-much'`).length,
        0,
      );

      // Exactly the available balance is fine.
      await transfer(a, b, 1_000n);
      assert.deepEqual(await balances(a), { posted: 0n, pendingDebits: 0n, pendingCredits: 0n });
      assert.equal((await balances(b)).posted, 1_000n);
    });

    it('counts outgoing holds: available = posted - pending debits', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      await placeHold(a, b, 300n);
      assert.equal(balancesOf(await balances(a)).available, 700n);
      await refused(transfer(a, b, 701n), OVERDRAFT);
      await transfer(a, b, 700n);
      assert.deepEqual(balancesOf(await balances(a)), { available: 0n, pending: -300n, posted: 300n });
    });

    it('lets an account with overdraft_limit 500 reach -500 and not -501', async () => {
      const co = await newCompany();
      const a = await open(co, { type: 'account', overdraftLimit: 500n });
      const b = await open(co);
      await refused(transfer(a, b, 501n), OVERDRAFT);
      assert.equal((await balances(a)).posted, 0n);
      await transfer(a, b, 500n);
      assert.equal((await balances(a)).posted, -500n);
      await refused(transfer(a, b, 1n), OVERDRAFT);
      assert.equal((await balances(a)).posted, -500n);
      assert.equal((await balances(b)).posted, 500n);
      // The limit cannot be lowered below the current overdraft.
      await refused(sql`update ledger_accounts set overdraft_limit = 499 where id = ${a}`, OVERDRAFT);
    });

    it('lets a system account with a null limit go arbitrarily negative', async () => {
      const co = await newCompany();
      const sys = await open(co, { type: 'system', overdraftLimit: null });
      const b = await open(co);
      const huge = 4_000_000_000_000_000_000n; // well beyond any real balance, within bigint
      await transfer(sys, b, huge);
      await transfer(sys, b, huge);
      assert.equal((await balances(sys)).posted, -2n * huge);
      assert.equal((await balances(b)).posted, 2n * huge);
    });

    it('refuses a null (unbounded) limit on anything but a system account', async () => {
      const co = await newCompany();
      for (const type of ['wallet', 'account'] as const) {
        await refused(open(co, { type, overdraftLimit: null }), {
          code: '23514',
          constraint: 'ledger_accounts_unbounded_is_system',
        });
      }
      const a = await open(co, { type: 'account' });
      await refused(sql`update ledger_accounts set overdraft_limit = null where id = ${a}`, {
        code: '23514',
        constraint: 'ledger_accounts_unbounded_is_system',
      });
      await refused(open(co, { type: 'account', overdraftLimit: -1n }), { code: '23514' });
    });
  });

  describe('double entry (checked at COMMIT)', () => {
    it('refuses a transfer with a single entry at commit, and keeps nothing', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      let inserted = false;
      let transferId = '';
      await refused(
        sql.begin(async (tx) => {
          transferId = await rawTransfer(tx, { source: a, destination: b, amount: 100n });
          await rawEntries(tx, transferId, [{ account: b, amount: 100n }]);
          inserted = true; // the statement itself passes: the check is deferred to COMMIT
        }),
        UNBALANCED,
      );
      assert.ok(inserted, 'the single entry was accepted until COMMIT');
      assert.equal(await transferExists(transferId), false);
      assert.equal((await balances(b)).posted, 0n);
    });

    it('refuses +100/-99 at commit', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      let inserted = false;
      let transferId = '';
      await refused(
        sql.begin(async (tx) => {
          transferId = await rawTransfer(tx, { source: a, destination: b, amount: 100n });
          await rawEntries(tx, transferId, [
            { account: a, amount: -99n },
            { account: b, amount: 100n },
          ]);
          inserted = true;
        }),
        UNBALANCED,
      );
      assert.ok(inserted);
      assert.equal(await transferExists(transferId), false);
      assert.equal((await balances(a)).posted, 1_000n);
      assert.equal((await balances(b)).posted, 0n);
    });

    it('refuses entries that balance only across currencies or across kinds', async () => {
      const co = await newCompany();
      const usd = await open(co);
      const usd2 = await open(co);
      const eur = await open(co, { currency: 'EUR' });
      await fund(usd, 1_000n);
      await refused(
        sql.begin(async (tx) => {
          const id = await rawTransfer(tx, { source: usd, destination: usd2, amount: 100n });
          await rawEntries(tx, id, [
            { account: usd, amount: -100n },
            { account: eur, amount: 100n },
          ]);
        }),
        UNBALANCED,
        '-100 USD +100 EUR does not balance',
      );
      await refused(
        sql.begin(async (tx) => {
          const id = await rawTransfer(tx, { source: usd, destination: usd2, amount: 100n });
          const holdId = newId('hold');
          await tx`insert into ledger_holds (id, company_id, transfer_id) values (${holdId}, ${co}, ${id})`;
          await rawEntries(tx, id, [
            { account: usd, amount: -100n },
            { account: usd2, amount: 100n, kind: 'hold', holdId },
          ]);
        }),
        UNBALANCED,
        'a posted debit against a hold credit does not balance',
      );
      assert.equal((await balances(usd)).posted, 1_000n);
      assert.equal((await balances(eur)).posted, 0n);
      assert.deepEqual(await balances(usd2), { posted: 0n, pendingDebits: 0n, pendingCredits: 0n });
    });

    it('refuses a transfer that is balanced when written but unbalanced by a later statement', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      await refused(
        sql.begin(async (tx) => {
          const id = await rawTransfer(tx, { source: a, destination: b, amount: 100n });
          await rawEntries(tx, id, [
            { account: a, amount: -100n },
            { account: b, amount: 100n },
          ]);
          await rawEntries(tx, id, [{ account: b, amount: 1n }]);
        }),
        UNBALANCED,
      );
      assert.equal((await balances(b)).posted, 0n);
    });

    it('commits balanced entries', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      const id = await sql.begin(async (tx) => {
        const id = await rawTransfer(tx, { source: a, destination: b, amount: 100n });
        await rawEntries(tx, id, [
          { account: a, amount: -100n },
          { account: b, amount: 100n },
        ]);
        return id;
      });
      assert.equal(await transferExists(id), true);
      assert.equal((await balances(a)).posted, 900n);
      assert.equal((await balances(b)).posted, 100n);
    });

    it('commits entries in two currencies, each balanced (an FX leg)', async () => {
      const co = await newCompany();
      const usdA = await open(co);
      const usdB = await open(co);
      const eurA = await open(co, { currency: 'EUR' });
      const eurB = await open(co, { currency: 'EUR' });
      await fund(usdA, 1_000n);
      await fund(eurB, 1_000n);
      await sql.begin(async (tx) => {
        const id = await rawTransfer(tx, { source: usdA, destination: usdB, amount: 100n });
        await rawEntries(tx, id, [
          { account: usdA, amount: -100n },
          { account: eurB, amount: -92n },
          { account: usdB, amount: 100n },
          { account: eurA, amount: 92n },
        ]);
      });
      assert.deepEqual(await Promise.all([usdA, usdB, eurA, eurB].map(async (id) => (await balances(id)).posted)), [
        900n,
        100n,
        92n,
        908n,
      ]);
    });
  });

  describe("scope: currency, environment and company are the account's and the transfer's", () => {
    it("refuses an entry whose currency differs from its account's", async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      const eur = await open(co, { currency: 'EUR' });
      await refused(
        sql.begin(async (tx) => {
          const id = await rawTransfer(tx, { source: a, destination: b, amount: 100n });
          // Balanced per currency as written (EUR -100 / EUR +100), but both rows lie about an account.
          await rawEntries(tx, id, [
            { account: a, amount: -100n, currency: 'EUR' },
            { account: eur, amount: 100n },
          ]);
        }),
        { code: '23503', constraint: 'ledger_entries_account_fk' },
      );
      assert.equal((await balances(a)).posted, 0n);
      assert.equal((await balances(eur)).posted, 0n);
    });

    it("refuses an entry whose environment differs from its account's or its transfer's", async () => {
      const co = await newCompany();
      const sandboxA = await open(co, { environment: 'sandbox', overdraftLimit: 1_000n });
      const sandboxB = await open(co, { environment: 'sandbox' });
      const liveA = await open(co, { environment: 'live', overdraftLimit: 1_000n });
      const liveB = await open(co, { environment: 'live' });
      // Entry says live (like its transfer), account is sandbox.
      await refused(
        sql.begin(async (tx) => {
          const id = await rawTransfer(tx, { source: liveA, destination: liveB, amount: 100n });
          await rawEntries(tx, id, [
            { account: liveA, amount: -100n },
            { account: sandboxB, amount: 100n, environment: 'live' },
          ]);
        }),
        { code: '23503', constraint: 'ledger_entries_account_fk' },
      );
      // Entry says sandbox (like its account), transfer is live: sandbox money in a live transfer.
      await refused(
        sql.begin(async (tx) => {
          const id = await rawTransfer(tx, { source: liveA, destination: liveB, amount: 100n });
          await rawEntries(tx, id, [
            { account: sandboxA, amount: -100n },
            { account: sandboxB, amount: 100n },
          ]);
        }),
        { code: '23503', constraint: 'ledger_entries_transfer_fk' },
      );
      // A transfer row itself cannot name accounts of the other environment.
      await refused(
        sql.begin(async (tx) => {
          await tx`
            insert into transfers (id, company_id, environment, idempotency_key, rail, status, amount, currency,
                                   source_account_id, destination_account_id)
            values (${newId('tr')}, ${co}, 'live', 'mixed-env', 'ledger', 'settled', 100, 'USD', ${liveA}, ${sandboxB})`;
        }),
        { code: '23503', constraint: 'transfers_destination_fk' },
      );
      // Nor can the code path under test.
      await refused(
        sql.begin((tx) =>
          postLedgerTransfer(tx, {
            id: newId('tr'),
            companyId: co,
            environment: 'sandbox',
            idempotencyKey: 'mixed-env-2',
            amount: 100n,
            currency: 'USD',
            sourceAccountId: sandboxA,
            destinationAccountId: liveB,
          }),
        ),
        { code: '23503', constraint: 'transfers_destination_fk' },
      );
      for (const id of [sandboxA, sandboxB, liveA, liveB]) assert.equal((await balances(id)).posted, 0n);
    });

    it("refuses an entry whose company differs from its account's or its transfer's", async () => {
      const coA = await newCompany();
      const coB = await newCompany();
      const a1 = await open(coA, { overdraftLimit: 1_000n });
      const a2 = await open(coA);
      const b1 = await open(coB, { overdraftLimit: 1_000n });
      const b2 = await open(coB);
      // Entry and transfer are company A's; the account is B's.
      await refused(
        sql.begin(async (tx) => {
          const id = await rawTransfer(tx, { source: a1, destination: a2, amount: 100n });
          await rawEntries(tx, id, [
            { account: a1, amount: -100n },
            { account: b2, amount: 100n, companyId: coA },
          ]);
        }),
        { code: '23503', constraint: 'ledger_entries_account_fk' },
      );
      // Entry and account are company B's; the transfer is A's.
      await refused(
        sql.begin(async (tx) => {
          const id = await rawTransfer(tx, { source: a1, destination: a2, amount: 100n });
          await rawEntries(tx, id, [
            { account: b1, amount: -100n },
            { account: b2, amount: 100n },
          ]);
        }),
        { code: '23503', constraint: 'ledger_entries_transfer_fk' },
      );
      // A transfer between two companies.
      await refused(
        sql.begin((tx) =>
          postLedgerTransfer(tx, {
            id: newId('tr'),
            companyId: coA,
            environment: 'sandbox',
            idempotencyKey: 'cross-company',
            amount: 100n,
            currency: 'USD',
            sourceAccountId: a1,
            destinationAccountId: b2,
          }),
        ),
        { code: '23503', constraint: 'transfers_destination_fk' },
      );
      for (const id of [a1, a2, b1, b2]) assert.equal((await balances(id)).posted, 0n);
    });

    it("refuses a transfer whose currency is not its accounts' currency", async () => {
      const co = await newCompany();
      const usd = await open(co, { overdraftLimit: 1_000n });
      const eur = await open(co, { currency: 'EUR' });
      await refused(
        sql.begin((tx) =>
          postLedgerTransfer(tx, {
            id: newId('tr'),
            companyId: co,
            environment: 'sandbox',
            idempotencyKey: 'usd-to-eur',
            amount: 100n,
            currency: 'USD',
            sourceAccountId: usd,
            destinationAccountId: eur,
          }),
        ),
        { code: '23503', constraint: 'transfers_destination_fk' },
      );
      await refused(
        sql.begin((tx) =>
          postLedgerTransfer(tx, {
            id: newId('tr'),
            companyId: co,
            environment: 'sandbox',
            idempotencyKey: 'usd-as-eur',
            amount: 100n,
            currency: 'EUR',
            sourceAccountId: usd,
            destinationAccountId: eur,
          }),
        ),
        { code: '23503', constraint: 'transfers_source_fk' },
      );
      assert.equal((await balances(usd)).posted, 0n);
      assert.equal((await balances(eur)).posted, 0n);
    });
  });

  describe('append-only history and trigger-owned balances', () => {
    let co: string;
    let a: string;
    let b: string;
    let transferId: string;

    before(async () => {
      co = await newCompany();
      a = await open(co);
      b = await open(co);
      await fund(a, 1_000n);
      transferId = (await transfer(a, b, 100n)).id;
    });

    it('refuses UPDATE, DELETE and TRUNCATE of ledger_entries', async () => {
      await refused(sql`update ledger_entries set amount = amount * 2 where transfer_id = ${transferId}`, APPEND_ONLY);
      await refused(
        sql`update ledger_entries set account_id = account_id where transfer_id = ${transferId}`,
        APPEND_ONLY,
      );
      await refused(sql`delete from ledger_entries where transfer_id = ${transferId}`, APPEND_ONLY);
      await refused(sql`truncate ledger_entries cascade`, APPEND_ONLY);
      const entries = await sql`select 1 from ledger_entries where transfer_id = ${transferId}`;
      assert.equal(entries.length, 2);
      assert.equal((await balances(a)).posted, 900n);
    });

    it('refuses UPDATE and DELETE of transfer_status_history', async () => {
      await refused(
        sql`update transfer_status_history set status = 'failed' where transfer_id = ${transferId}`,
        APPEND_ONLY,
      );
      await refused(sql`delete from transfer_status_history where transfer_id = ${transferId}`, APPEND_ONLY);
      assert.deepEqual(
        (await transferHistory(sql, transferId)).map((change) => change.status),
        ['settled'],
      );
    });

    it('refuses a direct write of posted, pending_debits or pending_credits', async () => {
      await refused(sql`update ledger_accounts set posted = 1000000 where id = ${a}`, BALANCE_WRITE);
      await refused(sql`update ledger_accounts set posted = posted + 1 where id = ${b}`, BALANCE_WRITE);
      await refused(
        sql`update ledger_accounts set pending_debits = 0, pending_credits = 5 where id = ${a}`,
        BALANCE_WRITE,
      );
      await refused(sql`update ledger_accounts set posted = 0 where company_id = ${co}`, BALANCE_WRITE);
      assert.equal((await balances(a)).posted, 900n);
      assert.equal((await balances(b)).posted, 100n);
      // Non-money columns remain editable (the guard is not over-broad).
      await sql`update ledger_accounts set name = 'renamed', overdraft_limit = 10 where id = ${a}`;
      assert.equal((await sql`select name from ledger_accounts where id = ${a}`)[0]!.name, 'renamed');
    });

    it('refuses to open an account with a non-zero balance', async () => {
      for (const [column, value] of [
        ['posted', 100n],
        ['posted', -100n],
        ['pending_debits', 5n],
        ['pending_credits', 5n],
      ] as const) {
        await refused(
          sql`insert into ledger_accounts (id, company_id, environment, type, currency, ${sql(column)})
              values (${newId('wal')}, ${co}, 'sandbox', 'wallet', 'USD', ${value.toString()})`,
          { code: '23514', message: /opens with zero balances/ },
          `opening with ${column} = ${value}`,
        );
      }
    });

    it("refuses to change an account's company, environment, currency or type", async () => {
      const other = await newCompany();
      const fresh = await open(co); // no entries: only the guard stands in the way
      for (const id of [a, fresh]) {
        await refused(sql`update ledger_accounts set company_id = ${other} where id = ${id}`, ACCOUNT_SCOPE_CHANGE);
        await refused(sql`update ledger_accounts set environment = 'live' where id = ${id}`, ACCOUNT_SCOPE_CHANGE);
        await refused(sql`update ledger_accounts set currency = 'EUR' where id = ${id}`, ACCOUNT_SCOPE_CHANGE);
        await refused(sql`update ledger_accounts set type = 'account' where id = ${id}`, ACCOUNT_SCOPE_CHANGE);
        await refused(
          sql`update ledger_accounts set type = 'system', overdraft_limit = null where id = ${id}`,
          ACCOUNT_SCOPE_CHANGE,
        );
        const found = await findLedgerAccount(sql, { companyId: co, environment: 'sandbox' }, id);
        assert.ok(found);
        assert.deepEqual(
          [found.companyId, found.environment, found.currency, found.type],
          [co, 'sandbox', 'USD', 'wallet'],
        );
      }
    });
  });

  describe('holds', () => {
    it('reserves money on the source and announces it on the destination', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      await placeHold(a, b, 300n);
      assert.deepEqual(await balances(a), { posted: 1_000n, pendingDebits: 300n, pendingCredits: 0n });
      assert.deepEqual(await balances(b), { posted: 0n, pendingDebits: 0n, pendingCredits: 300n });
      assert.deepEqual(balancesOf(await balances(a)), { available: 700n, pending: -300n, posted: 1_000n });
      assert.deepEqual(balancesOf(await balances(b)), { available: 0n, pending: 300n, posted: 0n });
    });

    it('posting a hold releases it and moves the posted balances', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      // The hold takes the whole available balance: posting must still succeed.
      const hold = await placeHold(a, b, 1_000n);
      await resolveHold(hold, a, b, 1_000n, 'posted');
      assert.deepEqual(await balances(a), { posted: 0n, pendingDebits: 0n, pendingCredits: 0n });
      assert.deepEqual(await balances(b), { posted: 1_000n, pendingDebits: 0n, pendingCredits: 0n });
      const [row] = await sql<{ status: string; resolved_at: Date | null }[]>`
        select status, resolved_at from ledger_holds where id = ${hold.holdId}`;
      assert.equal(row!.status, 'posted');
      assert.ok(row!.resolved_at);
      const transfer = await findTransfer(sql, { companyId: co, environment: 'sandbox' }, hold.transferId);
      assert.equal(transfer?.status, 'settled');
    });

    it('voiding a hold gives the money back', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      const hold = await placeHold(a, b, 400n);
      await resolveHold(hold, a, b, 400n, 'voided');
      assert.deepEqual(await balances(a), { posted: 1_000n, pendingDebits: 0n, pendingCredits: 0n });
      assert.deepEqual(await balances(b), { posted: 0n, pendingDebits: 0n, pendingCredits: 0n });
      const [row] = await sql<{ status: string }[]>`select status from ledger_holds where id = ${hold.holdId}`;
      assert.equal(row!.status, 'voided');
    });

    it('refuses a second release of the same hold on the same account', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      const hold = await placeHold(a, b, 300n);
      await placeHold(a, b, 200n); // a second, unrelated pending hold the double release could eat into
      await resolveHold(hold, a, b, 300n, 'voided');
      // A buggy path that releases again, without touching the hold row (so the hold guard is not involved).
      for (const entries of [
        [
          { account: a, amount: -300n, kind: 'hold_release' as const, holdId: hold.holdId },
          { account: b, amount: 300n, kind: 'hold_release' as const, holdId: hold.holdId },
        ],
        [{ account: b, amount: 300n, kind: 'hold_release' as const, holdId: hold.holdId }],
      ]) {
        await refused(
          sql.begin((tx) => rawEntries(tx, hold.transferId, entries)),
          { code: '23505', constraint: 'ledger_entries_release_once' },
        );
      }
      assert.deepEqual(await balances(a), { posted: 1_000n, pendingDebits: 200n, pendingCredits: 0n });
      assert.deepEqual(await balances(b), { posted: 0n, pendingDebits: 0n, pendingCredits: 200n });
    });

    it('refuses to post or void a hold twice, or to send it back to pending', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      const posted = await placeHold(a, b, 100n);
      await resolveHold(posted, a, b, 100n, 'posted');
      const voided = await placeHold(a, b, 100n);
      await resolveHold(voided, a, b, 100n, 'voided');
      const pending = await placeHold(a, b, 100n);

      await refused(
        sql`update ledger_holds set status = 'pending', resolved_at = null where id = ${posted.holdId}`,
        HOLD_ONCE,
      );
      await refused(
        sql`update ledger_holds set status = 'pending', resolved_at = null where id = ${voided.holdId}`,
        HOLD_ONCE,
      );
      await refused(sql`update ledger_holds set status = 'voided' where id = ${posted.holdId}`, HOLD_ONCE);
      await refused(sql`update ledger_holds set status = 'posted' where id = ${voided.holdId}`, HOLD_ONCE);
      await refused(
        sql`update ledger_holds set status = 'posted', resolved_at = now() where id = ${posted.holdId}`,
        HOLD_ONCE,
      );
      await refused(sql`update ledger_holds set resolved_at = now() where id = ${posted.holdId}`, HOLD_ONCE);
      // A pending hold is not "edited" in place either (it can only be posted or voided).
      await refused(sql`update ledger_holds set status = 'pending' where id = ${pending.holdId}`, HOLD_ONCE);
      await refused(
        sql`update ledger_holds set status = 'posted', resolved_at = now(), transfer_id = ${posted.transferId} where id = ${pending.holdId}`,
        HOLD_ONCE,
      );
      // Resolving needs a resolution time.
      await refused(sql`update ledger_holds set status = 'posted' where id = ${pending.holdId}`, {
        code: '23514',
        constraint: 'ledger_holds_resolved',
      });
      // The full "post again" code path fails as a whole.
      await refused(resolveHold(posted, a, b, 100n, 'posted'), HOLD_ONCE);
      await refused(resolveHold(voided, a, b, 100n, 'voided'), HOLD_ONCE);
      assert.deepEqual(await balances(a), { posted: 900n, pendingDebits: 100n, pendingCredits: 0n });
      assert.deepEqual(await balances(b), { posted: 100n, pendingDebits: 0n, pendingCredits: 100n });
    });

    it('refuses a hold that would overdraw, like a posted debit, and leaves no trace', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      const limited = await open(co, { type: 'account', overdraftLimit: 500n });
      await fund(a, 1_000n);
      await refused(placeHold(a, b, 1_001n), OVERDRAFT);
      await placeHold(a, b, 600n);
      await refused(placeHold(a, b, 401n), OVERDRAFT);
      await refused(transfer(a, b, 401n), OVERDRAFT);
      await placeHold(a, b, 400n);
      assert.deepEqual(balancesOf(await balances(a)), { available: 0n, pending: -1_000n, posted: 1_000n });
      assert.deepEqual(await balances(b), { posted: 0n, pendingDebits: 0n, pendingCredits: 1_000n });
      await refused(placeHold(limited, b, 501n), OVERDRAFT);
      await placeHold(limited, b, 500n);
      assert.equal(balancesOf(await balances(limited)).available, -500n);
      const [count] = await sql<{ n: bigint }[]>`select count(*) as n from ledger_holds where company_id = ${co}`;
      assert.equal(count!.n, 3n, 'refused holds left no hold row');
    });
  });

  describe('row-level security (payments_app)', () => {
    let appSql: Sql;
    let coA: string;
    let coB: string;
    let a1: string;
    let a2: string;
    let b1: string;
    let b2: string;
    let bTransfer: string;
    let bHold: { transferId: string; holdId: string };

    before(async () => {
      appSql = createAppRoleSql(database.url, { applicationName: 'ledger-rls-test', poolMax: 2 });
      coA = await newCompany();
      coB = await newCompany();
      a1 = await open(coA);
      a2 = await open(coA);
      b1 = await open(coB);
      b2 = await open(coB);
      await fund(a1, 1_000n);
      await fund(b1, 1_000n);
      bTransfer = (await transfer(b1, b2, 100n)).id;
      bHold = await placeHold(b1, b2, 50n);
    });
    after(async () => appSql.end({ timeout: 5 }));

    it("hides the other company's accounts, transfers, entries, holds and history", async () => {
      await withTenant(appSql, coA, async (tx) => {
        const accounts = await tx<{ id: string; company_id: string }[]>`select id, company_id from ledger_accounts`;
        assert.ok(accounts.length >= 2);
        assert.ok(accounts.every((row) => row.company_id === coA));
        assert.equal((await tx`select 1 from ledger_accounts where id in (${b1}, ${b2})`).length, 0);
        assert.equal(await findLedgerAccount(tx, { companyId: coB, environment: 'sandbox' }, b1), undefined);
        assert.equal(await findTransfer(tx, { companyId: coB, environment: 'sandbox' }, bTransfer), undefined);
        assert.deepEqual(await listTransfers(tx, { companyId: coB, environment: 'sandbox' }, { limit: 100 }), []);
        assert.equal((await tx`select 1 from transfers where id = ${bTransfer}`).length, 0);
        assert.equal((await tx`select 1 from ledger_entries where account_id in (${b1}, ${b2})`).length, 0);
        assert.equal((await tx`select 1 from ledger_entries where company_id = ${coB}`).length, 0);
        assert.equal((await tx`select 1 from ledger_holds where id = ${bHold.holdId}`).length, 0);
        assert.equal((await tx`select 1 from transfer_status_history where transfer_id = ${bTransfer}`).length, 0);
        // An update that forgets its company filter does not reach B's rows.
        // (balances are the only account columns the role may update: migration 00011)
        const renamed = await tx`update ledger_accounts set posted = posted where id = ${b1} returning id`;
        assert.equal(renamed.length, 0);
        const voided =
          await tx`update ledger_holds set status = 'voided', resolved_at = now() where id = ${bHold.holdId} returning id`;
        assert.equal(voided.length, 0);
      });
      // Sanity: B sees its own.
      await withTenant(appSql, coB, async (tx) => {
        assert.equal((await tx`select 1 from ledger_entries where account_id in (${b1}, ${b2})`).length, 5);
      });
    });

    it("refuses entries and transfers for the other company's accounts", async () => {
      // Entries labelled with B's company: the policy refuses the row.
      await refused(
        withTenant(
          appSql,
          coA,
          (tx) =>
            tx`insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind)
             values (${coB}, 'sandbox', ${bTransfer}, ${b1}, 'USD', -100, 'posted'),
                    (${coB}, 'sandbox', ${bTransfer}, ${b2}, 'USD', 100, 'posted')`,
        ),
        { code: '42501', message: /row-level security/ },
      );
      // Entries labelled with A's company on B's accounts: the foreign keys refuse them.
      await refused(
        withTenant(appSql, coA, async (tx) => {
          const id = await rawTransfer(tx, { source: a1, destination: a2, amount: 100n });
          await rawEntries(tx, id, [
            { account: a1, amount: -100n },
            { account: b2, amount: 100n, companyId: coA, environment: 'sandbox', currency: 'USD' },
          ]);
        }),
        { code: '23503', constraint: 'ledger_entries_account_fk' },
      );
      // A transfer that names B (as B's company): refused by the policy.
      await refused(
        withTenant(appSql, coA, (tx) =>
          postLedgerTransfer(tx, {
            id: newId('tr'),
            companyId: coB,
            environment: 'sandbox',
            idempotencyKey: 'steal',
            amount: 100n,
            currency: 'USD',
            sourceAccountId: b1,
            destinationAccountId: a1,
          }),
        ),
        { code: '42501', message: /row-level security/ },
      );
      // A transfer as A, from B's account: refused by the foreign keys.
      await refused(
        withTenant(appSql, coA, (tx) =>
          postLedgerTransfer(tx, {
            id: newId('tr'),
            companyId: coA,
            environment: 'sandbox',
            idempotencyKey: 'steal-2',
            amount: 100n,
            currency: 'USD',
            sourceAccountId: b1,
            destinationAccountId: a1,
          }),
        ),
        { code: '23503', constraint: 'transfers_source_fk' },
      );
      assert.deepEqual(await balances(b1), { posted: 900n, pendingDebits: 50n, pendingCredits: 0n });
      assert.deepEqual(await balances(a1), { posted: 1_000n, pendingDebits: 0n, pendingCredits: 0n });
    });

    it('lets a company move its own money, balances maintained by trigger under the app role', async () => {
      const moved = await withTenant(appSql, coA, (tx) =>
        postLedgerTransfer(tx, {
          id: newId('tr'),
          companyId: coA,
          environment: 'sandbox',
          idempotencyKey: 'own-money',
          amount: 250n,
          currency: 'USD',
          sourceAccountId: a1,
          destinationAccountId: a2,
        }),
      );
      assert.equal(moved.status, 'settled');
      assert.equal((await balances(a1)).posted, 750n);
      assert.equal((await balances(a2)).posted, 250n);
      // The app role cannot write balances directly either.
      await refused(
        withTenant(appSql, coA, (tx) => tx`update ledger_accounts set posted = 1000000 where id = ${a2}`),
        BALANCE_WRITE,
      );
      // ... nor edit or delete entries (no privilege, and the trigger besides).
      await refused(
        withTenant(appSql, coA, (tx) => tx`delete from ledger_entries where account_id = ${a2}`),
        { code: '42501' },
      );
      await refused(
        withTenant(appSql, coA, (tx) => tx`update ledger_entries set amount = 1 where account_id = ${a2}`),
        { code: '42501' },
      );
    });
  });

  describe('postLedgerTransfer', () => {
    it('moves the balances with two posted entries and one settled history row', async () => {
      const co = await newCompany();
      const a = await open(co, { type: 'account' });
      const b = await open(co);
      await fund(a, 1_000n);
      const id = newId('tr');
      const result = await sql.begin((tx) =>
        postLedgerTransfer(tx, {
          id,
          companyId: co,
          environment: 'sandbox',
          idempotencyKey: 'order-42',
          amount: 275n,
          currency: 'USD',
          sourceAccountId: a,
          destinationAccountId: b,
        }),
      );
      assert.equal(result.id, id);
      assert.equal(result.status, 'settled');
      assert.equal(result.amount, 275n);
      assert.equal(result.currency, 'USD');
      assert.equal(result.rail, 'ledger');
      assert.equal(result.version, 1);
      assert.equal(result.sourceAccountId, a);
      assert.equal(result.destinationAccountId, b);
      assert.deepEqual(await balances(a), { posted: 725n, pendingDebits: 0n, pendingCredits: 0n });
      assert.deepEqual(await balances(b), { posted: 275n, pendingDebits: 0n, pendingCredits: 0n });

      const entries = await sql<
        {
          account_id: string;
          amount: bigint;
          kind: string;
          currency: string;
          company_id: string;
          environment: string;
          hold_id: string | null;
        }[]
      >`
        select account_id, amount, kind, currency, company_id, environment, hold_id
        from ledger_entries where transfer_id = ${id} order by id`;
      assert.deepEqual(
        entries.map((e) => ({ ...e })),
        [
          {
            account_id: a,
            amount: -275n,
            kind: 'posted',
            currency: 'USD',
            company_id: co,
            environment: 'sandbox',
            hold_id: null,
          },
          {
            account_id: b,
            amount: 275n,
            kind: 'posted',
            currency: 'USD',
            company_id: co,
            environment: 'sandbox',
            hold_id: null,
          },
        ],
      );
      const history = await transferHistory(sql, id);
      assert.deepEqual(
        history.map((change) => [change.status, change.reason]),
        [['settled', null]],
      );
      assert.deepEqual(await findTransfer(sql, { companyId: co, environment: 'sandbox' }, id), result);
    });

    it('refuses the same idempotency key twice in one company + environment, not across environments', async () => {
      const co = await newCompany();
      const other = await newCompany();
      const sandboxA = await open(co);
      const sandboxB = await open(co);
      const liveA = await open(co, { environment: 'live' });
      const liveB = await open(co, { environment: 'live' });
      const otherA = await open(other);
      const otherB = await open(other);
      await fund(sandboxA, 1_000n);
      await fund(liveA, 1_000n);
      await fund(otherA, 1_000n);
      const send = (companyId: string, environment: Environment, source: string, destination: string) =>
        sql.begin((tx) =>
          postLedgerTransfer(tx, {
            id: newId('tr'),
            companyId,
            environment,
            idempotencyKey: 'same-key',
            amount: 100n,
            currency: 'USD',
            sourceAccountId: source,
            destinationAccountId: destination,
          }),
        );
      const first = await send(co, 'sandbox', sandboxA, sandboxB);
      await refused(send(co, 'sandbox', sandboxA, sandboxB), {
        code: '23505',
        constraint: 'transfers_idempotency_unique',
      });
      const live = await send(co, 'live', liveA, liveB);
      const otherCompany = await send(other, 'sandbox', otherA, otherB);
      assert.notEqual(first.id, live.id);
      assert.notEqual(first.id, otherCompany.id);
      assert.equal((await balances(sandboxA)).posted, 900n, 'the refused retry moved nothing');
      assert.equal((await balances(sandboxB)).posted, 100n);
      assert.equal((await balances(liveA)).posted, 900n);
      assert.equal((await balances(liveB)).posted, 100n);
      const rows = await sql`select 1 from transfers where company_id = ${co} and idempotency_key = 'same-key'`;
      assert.equal(rows.length, 2);
    });

    it('refuses a zero, negative or self transfer', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      for (const [amount, destination] of [
        [0n, b],
        [-100n, b],
        [100n, a],
      ] as const) {
        await refused(transfer(a, destination, amount), { code: '23514' }, `amount ${amount} to ${destination}`);
      }
      assert.equal((await balances(a)).posted, 1_000n);
      assert.equal((await balances(b)).posted, 0n);
    });
  });

  // Defects these tests found in 00003, fixed by 00004: they stay as regression tests.
  describe('fixed defects', () => {
    let appSql: Sql;
    before(() => {
      appSql = createAppRoleSql(database.url, { applicationName: 'ledger-defects-test', poolMax: 2 });
    });
    after(async () => appSql.end({ timeout: 5 }));

    it('BUG: the commit-time double-entry check must not depend on the app.company_id in force at COMMIT', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      let transferId = '';
      await assert.rejects(
        withTenant(appSql, co, async (tx) => {
          transferId = await rawTransfer(tx, { source: a, destination: b, amount: 100n });
          await rawEntries(tx, transferId, [{ account: b, amount: 1_000_000n }]); // money from nowhere
          // A code path that clears (or switches) the tenant before the transaction ends, e.g. a
          // pool-hygiene step or a job looping over companies in one transaction.
          await tx`select set_config('app.company_id', '', true)`;
        }),
        (error: unknown) => error instanceof postgres.PostgresError && /do not balance/.test(error.message),
        'BUG (db/migrations/00003_ledger.sql, ledger_check_balanced): the deferred balance check is a ' +
          'SECURITY INVOKER function, so under payments_app it sees only the rows row-level security shows ' +
          'at COMMIT. With app.company_id cleared or switched before COMMIT it sees none of the ' +
          "transfer's entries and lets a single +1,000,000 entry commit: money created from nothing.",
      );
      assert.equal((await balances(b)).posted, 0n, 'BUG: the unbalanced credit was committed');
      assert.equal(await transferExists(transferId), false);
    });

    it('GAP: a hold is released only on the accounts it holds, for the amount it holds', async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      const c = await open(co);
      await fund(a, 1_000n);
      await fund(c, 1_000n);
      const onA = await placeHold(a, b, 100n);
      const onC = await placeHold(c, b, 100n);
      // Releasing hold onA on account c frees the money reserved by onC, which stays pending.
      await refused(
        sql.begin((tx) =>
          rawEntries(tx, onA.transferId, [
            { account: c, amount: -100n, kind: 'hold_release', holdId: onA.holdId },
            { account: b, amount: 100n, kind: 'hold_release', holdId: onA.holdId },
          ]),
        ),
        {},
        'a release on an account the hold does not touch',
      );
      // A partial release leaves 50 reserved forever on a hold marked posted.
      await refused(
        sql.begin(async (tx) => {
          await tx`update ledger_holds set status = 'posted', resolved_at = now() where id = ${onC.holdId}`;
          await rawEntries(tx, onC.transferId, [
            { account: c, amount: -50n, kind: 'hold_release', holdId: onC.holdId },
            { account: b, amount: 50n, kind: 'hold_release', holdId: onC.holdId },
          ]);
        }),
        {},
        'a release for less than the hold',
      );
    });

    it("GAP: a hold's status and its release entries go together", async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      const resolvedWithoutRelease = await placeHold(a, b, 100n);
      await refused(
        sql`update ledger_holds set status = 'voided', resolved_at = now() where id = ${resolvedWithoutRelease.holdId}`,
        {},
        'a hold voided without releasing its money (reserved forever)',
      );
      const releasedWhilePending = await placeHold(a, b, 100n);
      await refused(
        sql.begin((tx) =>
          rawEntries(tx, releasedWhilePending.transferId, [
            { account: a, amount: -100n, kind: 'hold_release', holdId: releasedWhilePending.holdId },
            { account: b, amount: 100n, kind: 'hold_release', holdId: releasedWhilePending.holdId },
          ]),
        ),
        {},
        'a hold released while its status stays pending',
      );
    });

    it("GAP: a hold or status-history row belongs to its transfer's company", async () => {
      const coA = await newCompany();
      const coB = await newCompany();
      const b1 = await open(coB);
      const b2 = await open(coB);
      await fund(b1, 100n);
      const bTransfer = (await transfer(b1, b2, 10n)).id;
      await refused(
        withTenant(
          appSql,
          coA,
          (tx) =>
            tx`insert into ledger_holds (id, company_id, transfer_id) values (${newId('hold')}, ${coA}, ${bTransfer})`,
        ),
        {},
        "company A attaches a hold to company B's transfer",
      );
      await refused(
        withTenant(
          appSql,
          coA,
          (tx) =>
            tx`insert into transfer_status_history (transfer_id, company_id, status) values (${bTransfer}, ${coA}, 'returned')`,
        ),
        {},
        "company A writes a status change into company B's transfer history",
      );
    });

    it("GAP: a settled transfer's amount, currency and accounts are immutable", async () => {
      const co = await newCompany();
      const a = await open(co);
      const b = await open(co);
      await fund(a, 1_000n);
      const settled = await transfer(a, b, 100n);
      await refused(
        withTenant(appSql, co, (tx) => tx`update transfers set amount = 1 where id = ${settled.id}`),
        {},
        'the transfer object no longer matches its entries',
      );
      await refused(
        withTenant(appSql, co, (tx) => tx`update transfers set status = 'pending' where id = ${settled.id}`),
        {},
        'settled -> pending is not a transition of contract 4',
      );
    });
  });
});
