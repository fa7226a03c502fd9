// System accounts (db/rails.ts): opened on first use, found afterwards, and opened once when two
// transactions need the same one at the same time; the sandbox funding account found the same way.
// Through the app pool, under row-level security.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { openFundedSandboxAccounts } from '../services/sandbox.ts';
import { provisionTenant, type ProvisionedTenant } from '../services/tenants.ts';
import { createAppRoleSql, createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { waitFor } from '../test-support/wait.ts';
import { newId } from '../platform/ids.ts';
import type { Sql } from './client.ts';
import { findSystemAccount, systemAccount } from './rails.ts';
import { withTenant } from './tenant.ts';

describe('system accounts', () => {
  let database: TestDatabase;
  let ownerSql: Sql;
  let appSql: Sql;
  let tenant: ProvisionedTenant;
  const APPLICATION_NAME = 'payments-test-rails';

  before(async () => {
    database = await createTestDatabase();
    ownerSql = database.sql;
    appSql = createAppRoleSql(database.url, { applicationName: APPLICATION_NAME, poolMax: 4 });
    tenant = await provisionTenant(ownerSql, { name: 'Rails', ownerEmail: `rails-${process.pid}@example.com` }, SYSTEM_ACTOR);
  });
  after(async () => {
    await appSql.end({ timeout: 5 });
    await database.drop();
  });

  const scope = () => ({ companyId: tenant.company.id, environment: 'sandbox' as const });
  const rows = (purpose: string, currency: string) => ownerSql<{ id: string; name: string; type: string }[]>`
    select id, name, type from ledger_accounts
    where company_id = ${tenant.company.id} and environment = 'sandbox' and system_purpose = ${purpose} and currency = ${currency}`;

  it('opens a system account on first use and finds the same one afterwards', async () => {
    assert.equal(await withTenant(appSql, tenant.company.id, (tx) => findSystemAccount(tx, scope(), { purpose: 'fx', currency: 'USDC' })), undefined);
    const opened = await withTenant(appSql, tenant.company.id, (tx) => systemAccount(tx, scope(), 'USDC', 'fx', () => newId('sys')));
    const again = await withTenant(appSql, tenant.company.id, (tx) => systemAccount(tx, scope(), 'USDC', 'fx', () => newId('sys')));
    assert.equal(again, opened);
    assert.equal(await withTenant(appSql, tenant.company.id, (tx) => findSystemAccount(tx, scope(), { purpose: 'fx', currency: 'USDC' })), opened);
    assert.deepEqual((await rows('fx', 'USDC')).map((row) => ({ ...row })), [{ id: opened, name: 'fx USDC', type: 'system' }]);
  });

  it('funds extra sandbox accounts from the funding account provisioning opened', async () => {
    const [funding] = await rows('sandbox_funding', 'USD');
    assert.equal(
      await withTenant(appSql, tenant.company.id, (tx) => findSystemAccount(tx, scope(), { purpose: 'sandbox_funding', currency: 'USD' })),
      funding!.id,
    );
    const ids = await openFundedSandboxAccounts(appSql, tenant.company.id, { count: 2, amountMinor: 500n, currency: 'USD', namePrefix: 'Extra' });
    assert.equal(ids.length, 2);
    const funded = await ownerSql<{ source_account_id: string; amount: bigint }[]>`
      select source_account_id, amount from transfers where destination_account_id = any(${ids})`;
    assert.deepEqual(funded.map((transfer) => ({ ...transfer })), [
      { source_account_id: funding!.id, amount: 500n },
      { source_account_id: funding!.id, amount: 500n },
    ]);
  });

  it('opens it once when a second transaction needs it while the first has not committed', async () => {
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let opened!: (id: string) => void;
    const openedByFirst = new Promise<string>((resolve) => (opened = resolve));
    const first = withTenant(appSql, tenant.company.id, async (tx) => {
      const id = await systemAccount(tx, scope(), 'USD', 'fees', () => newId('sys'));
      opened(id);
      await held;
      return id;
    });
    await openedByFirst;
    const second = withTenant(appSql, tenant.company.id, (tx) => systemAccount(tx, scope(), 'USD', 'fees', () => newId('sys')));
    // The second one's insert waits on the first one's uncommitted row.
    await waitFor('the second transaction to wait on the first', async () => {
      const [waiting] = await ownerSql<{ count: number }[]>`
        select count(*)::int as count from pg_stat_activity
        where application_name = ${APPLICATION_NAME} and wait_event_type = 'Lock'`;
      return waiting!.count > 0;
    });
    release();
    const [firstId, secondId] = await Promise.all([first, second]);
    assert.equal(secondId, firstId);
    assert.equal((await rows('fees', 'USD')).length, 1);
  });
});
