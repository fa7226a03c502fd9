// Migrations 00010–00012: statements crafted as payments_app (the role of every application connection)
// that committed before it, each refused now.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql, TransactionSql } from './client.ts';
import { newId } from '../platform/ids.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { openFundedSandboxAccounts } from '../services/sandbox.ts';
import { provisionTenant } from '../services/tenants.ts';
import { generateWebhookSecret } from '../services/webhook-endpoints.ts';
import { createAppRoleSql, createTestDatabase, type TestDatabase } from '../test-support/db.ts';

interface Refusal {
  code: string;
  constraint?: string;
  message?: RegExp;
}

describe('database hardening against crafted statements of the application role (migrations 00010–00012)', () => {
  let database: TestDatabase;
  let owner: Sql;
  let app: Sql;
  let a: string;
  let b: string;
  let walletA: string;
  let accountA: string;
  let walletB: string;
  let accountB: string;
  let spareA: string[];

  before(async () => {
    database = await createTestDatabase();
    owner = database.sql;
    // A clone of the migrated template does not copy database privileges: migration 00010's REVOKE
    // again, on this clone.
    await owner.unsafe(
      `revoke temporary on database ${(await owner`select current_database() as name`)[0]!.name} from public`,
    );
    app = createAppRoleSql(database.url, { applicationName: 'payments-test-hardening', poolMax: 4 });
    const tenantA = await provisionTenant(
      owner,
      { name: 'A', ownerEmail: `a-${process.pid}@example.com` },
      SYSTEM_ACTOR,
    );
    const tenantB = await provisionTenant(
      owner,
      { name: 'B', ownerEmail: `b-${process.pid}@example.com` },
      SYSTEM_ACTOR,
    );
    a = tenantA.company.id;
    b = tenantB.company.id;
    walletA = tenantA.sandbox.usdWalletId;
    accountA = tenantA.sandbox.usdAccountId;
    walletB = tenantB.sandbox.usdWalletId;
    accountB = tenantB.sandbox.usdAccountId;
    // Accounts the hold does not touch yet, so that only the hold's state can refuse a new entry.
    spareA = await openFundedSandboxAccounts(owner, a, {
      count: 2,
      amountMinor: 1_000n,
      currency: 'USD',
      namePrefix: 'Spare',
    });
  });
  after(async () => {
    await app.end({ timeout: 5 });
    await database.drop();
  });

  /** `fn` in one payments_app transaction scoped to `company`. */
  const as = <T>(company: string, fn: (tx: TransactionSql) => Promise<T>) =>
    app.begin(async (tx) => {
      await tx`select set_config('app.company_id', ${company}, true)`;
      return fn(tx);
    }) as Promise<T>;

  async function refused(attempt: Promise<unknown>, expected: Refusal) {
    await assert.rejects(attempt, (error: { code?: string; constraint_name?: string; message: string }) => {
      assert.equal(error.code, expected.code, error.message);
      if (expected.constraint) assert.equal(error.constraint_name, expected.constraint);
      if (expected.message) assert.match(error.message, expected.message);
      return true;
    });
  }

  const newTransfer = (
    tx: TransactionSql,
    company: string,
    source: string,
    destination: string,
    status = 'pending',
  ) => {
    const id = newId('tr');
    return tx`
      insert into transfers (id, company_id, environment, idempotency_key, rail, status, amount, currency,
                             source_account_id, destination_account_id)
      values (${id}, ${company}, 'sandbox', ${`k-${id}`}, 'ledger', ${status}, 100, 'USD', ${source}, ${destination})
      returning id`.then((rows) => rows[0]!.id as string);
  };

  /** A pending hold on a new transfer of company A, with one hold entry per [account, amount]. */
  async function openHold(tx: TransactionSql, entries: [string, number][]) {
    const transfer = await newTransfer(tx, a, walletA, accountA);
    const hold = newId('hold');
    await tx`insert into ledger_holds (id, company_id, transfer_id) values (${hold}, ${a}, ${transfer})`;
    for (const [account, amount] of entries) {
      await tx`
        insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind, hold_id)
        values (${a}, 'sandbox', ${transfer}, ${account}, 'USD', ${amount}, 'hold', ${hold})`;
    }
    return { transfer, hold };
  }

  it('refuses temporary tables and functions, which shadowed the ledger tables inside its triggers', async () => {
    const insufficientPrivilege = { code: '42501' };
    await refused(
      as(a, (tx) => tx`create temp table ledger_entries (transfer_id text, currency text, kind text, amount bigint)`),
      insufficientPrivilege,
    );
    await refused(
      as(a, (tx) => tx`create temp table ledger_accounts (id text, posted bigint) on commit drop`),
      insufficientPrivilege,
    );
    await refused(
      as(
        a,
        (tx) => tx`create function pg_temp.boost() returns trigger language plpgsql as $f$ begin return null; end $f$`,
      ),
      insufficientPrivilege,
    );
  });

  it('refuses any change of an account but its balances (migration 00011): no raised overdraft limit', async () => {
    for (const change of [
      (tx: TransactionSql) => tx`update ledger_accounts set overdraft_limit = 1000000000000 where id = ${walletA}`,
      (tx: TransactionSql) => tx`update ledger_accounts set name = 'renamed' where id = ${walletA}`,
    ]) {
      await refused(
        as(a, (tx) => change(tx)),
        { code: '42501' },
      );
    }
    // Balances still move, through entries.
    const [before] = await owner<{ posted: bigint }[]>`select posted from ledger_accounts where id = ${accountA}`;
    await as(a, async (tx) => {
      const transfer = await newTransfer(tx, a, walletA, accountA, 'settled');
      await tx`
        insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind)
        values (${a}, 'sandbox', ${transfer}, ${walletA}, 'USD', -100, 'posted'),
               (${a}, 'sandbox', ${transfer}, ${accountA}, 'USD', 100, 'posted')`;
    });
    const [after] = await owner<{ posted: bigint }[]>`select posted from ledger_accounts where id = ${accountA}`;
    assert.equal(after!.posted, before!.posted + 100n);
  });

  it('refuses any change of a company by the application role (migrations 00011, 00014)', async () => {
    await refused(
      as(a, (tx) => tx`update companies set verification_status = 'verified', verified_at = now() where id = ${a}`),
      { code: '42501' },
    );
    await refused(
      as(a, (tx) => tx`update companies set is_master_company = true where id = ${a}`),
      { code: '42501' },
    );
    await refused(
      as(a, (tx) => tx`delete from companies where id = ${a}`),
      { code: '42501' },
    );
    // Nor a new company, already verified, to hold a live key (migration 00014).
    const fresh = newId('co');
    await refused(
      as(
        fresh,
        (tx) => tx`
        insert into companies (id, name, verification_status, verified_at)
        values (${fresh}, 'Self-verified', 'verified', now())`,
      ),
      { code: '42501' },
    );
  });

  it('refuses a transfer settled or returned without a posted entry, at commit (migration 00012)', async () => {
    await refused(
      as(a, (tx) => newTransfer(tx, a, walletA, accountA, 'settled')),
      { code: '23514', message: /no posted entry/ },
    );
    await refused(
      as(a, (tx) => newTransfer(tx, a, walletA, accountA, 'returned')),
      { code: '23514', message: /no posted entry/ },
    );
  });

  it('refuses a second hold entry for the same hold and account', async () => {
    await refused(
      as(a, (tx) =>
        openHold(tx, [
          [walletA, -100],
          [walletA, -100],
          [accountA, 200],
        ]),
      ),
      { code: '23505', constraint: 'ledger_entries_hold_once' },
    );
  });

  it('makes a hold entry wait for a concurrent resolution of its hold, then refuses it', async () => {
    const { transfer, hold } = await as(a, (tx) =>
      openHold(tx, [
        [walletA, -100],
        [accountA, 100],
      ]),
    );
    const pendingBefore = (await owner`select pending_debits from ledger_accounts where id = ${walletA}`)[0]!
      .pending_debits as bigint;

    let resolved!: () => void;
    const resolving = new Promise<void>((resolve) => (resolved = resolve));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const voiding = as(a, async (tx) => {
      await tx`update ledger_holds set status = 'voided', resolved_at = now() where id = ${hold}`;
      await tx`
        insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind, hold_id)
        values (${a}, 'sandbox', ${transfer}, ${walletA}, 'USD', -100, 'hold_release', ${hold}),
               (${a}, 'sandbox', ${transfer}, ${accountA}, 'USD', 100, 'hold_release', ${hold})`;
      resolved();
      await released; // commit only once the competing entry is waiting on the hold
    });
    await resolving;
    const competing = as(
      a,
      (tx) => tx`
      insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind, hold_id)
      values (${a}, 'sandbox', ${transfer}, ${spareA[0]!}, 'USD', -20, 'hold', ${hold}),
             (${a}, 'sandbox', ${transfer}, ${spareA[1]!}, 'USD', 20, 'hold', ${hold})`,
    );
    const settledCompeting = competing.then(
      () => undefined,
      (error: unknown) => error,
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    release();
    await voiding;
    const error = (await settledCompeting) as { code?: string; message?: string } | undefined;
    assert.ok(error, 'the competing hold entry must not commit');
    assert.equal(error.code, '23514', error.message);
    assert.match(error.message ?? '', /already resolved/);
    const pendingAfter = (await owner`select pending_debits from ledger_accounts where id = ${walletA}`)[0]!
      .pending_debits as bigint;
    assert.equal(pendingAfter, pendingBefore - 100n, 'nothing is left pending on the voided hold');
  });

  it('refuses a delivery pairing another company’s event with this company’s endpoint', async () => {
    const transferB = await as(b, (tx) => newTransfer(tx, b, walletB, accountB));
    const [eventB] = await owner<{ id: string }[]>`select id from events where object_id = ${transferB}`;
    const endpoint = `we_${newId('tr').slice(3)}`;
    await owner`
      insert into webhook_endpoints (id, company_id, environment, url, secret)
      values (${endpoint}, ${a}, 'sandbox', 'https://hooks.example.com/a', ${generateWebhookSecret()})`;
    await refused(
      as(
        a,
        (tx) => tx`
        insert into webhook_deliveries (company_id, environment, event_id, endpoint_id)
        values (${a}, 'sandbox', ${eventB!.id}, ${endpoint})`,
      ),
      { code: '23503', message: /not an event of this company/ },
    );
    // Its own events still get deliveries.
    const transferA = await as(a, (tx) => newTransfer(tx, a, walletA, accountA));
    const [eventA] = await owner<{ id: string }[]>`select id from events where object_id = ${transferA}`;
    await as(
      a,
      (tx) => tx`
      insert into webhook_deliveries (company_id, environment, event_id, endpoint_id)
      values (${a}, 'sandbox', ${eventA!.id}, ${endpoint})`,
    );
  });

  it('keeps one company from taking another company’s (object, version) event slot', async () => {
    const transferB = await as(b, (tx) => newTransfer(tx, b, walletB, accountB));
    await as(
      a,
      (tx) => tx`
      insert into events (id, company_id, environment, type, object_type, object_id, object_version, snapshot)
      values (new_event_id(), ${a}, 'sandbox', 'transfer.processing', 'transfer', ${transferB}, 2, '{}')`,
    );
    const [moved] = await as(
      b,
      (tx) => tx<{ status: string }[]>`
      update transfers set status = 'processing', version = 2 where id = ${transferB} returning status`,
    );
    assert.equal(moved!.status, 'processing');
  });
});
