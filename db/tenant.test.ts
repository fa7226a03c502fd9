// The second wall: row-level security, checked against the schema itself so a new tenant table
// without it fails here.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { provisionTenant, type ProvisionedTenant } from '../services/tenants.ts';
import { createTestDatabase, type TestDatabase, createAppRoleSql } from '../test-support/db.ts';
import { type Sql } from './client.ts';
import { withSystemScope, withTenant } from './tenant.ts';

describe('row-level security', () => {
  let database: TestDatabase;
  let appSql: Sql;
  let a: ProvisionedTenant;
  let b: ProvisionedTenant;

  before(async () => {
    database = await createTestDatabase();
    appSql = createAppRoleSql(database.url, { applicationName: 'rls-test', poolMax: 2 });
    a = await provisionTenant(database.sql, { name: 'A', ownerEmail: 'a@rls.example' }, SYSTEM_ACTOR);
    b = await provisionTenant(database.sql, { name: 'B', ownerEmail: 'b@rls.example' }, SYSTEM_ACTOR);
  });
  after(async () => {
    await appSql.end({ timeout: 5 });
    await database.drop();
  });

  async function tenantTables(): Promise<string[]> {
    const rows = await database.sql<{ table_name: string }[]>`
      select c.table_name from information_schema.columns c
      join information_schema.tables t on t.table_name = c.table_name and t.table_schema = c.table_schema
      where c.table_schema = 'public' and t.table_type = 'BASE TABLE'
        and (c.column_name = 'company_id' or c.table_name = 'companies' and c.column_name = 'id')
      order by 1`;
    return rows.map((row) => row.table_name);
  }

  it('is enabled and forced on every table that carries a company', async () => {
    const tables = await tenantTables();
    assert.ok(tables.includes('api_keys') && tables.includes('companies') && tables.includes('audit_events'));
    const rows = await database.sql<{ relname: string; relrowsecurity: boolean; relforcerowsecurity: boolean }[]>`
      select relname, relrowsecurity, relforcerowsecurity from pg_class where relname = any(${tables}) and relkind = 'r'`;
    for (const row of rows) {
      assert.ok(row.relrowsecurity && row.relforcerowsecurity, `${row.relname} must enable and force row-level security`);
    }
    assert.equal(rows.length, tables.length);
  });

  it('shows a query that forgets its company filter only the current company', async () => {
    for (const table of await tenantTables()) {
      const column = table === 'companies' ? 'id' : 'company_id';
      const seen = await withTenant(appSql, a.company.id, (tx) =>
        tx<{ company: string }[]>`select distinct ${tx(column)} as company from ${tx(table)}`,
      );
      for (const row of seen) assert.equal(row.company, a.company.id, `${table} leaked another company's rows`);
    }
    const keys = await withTenant(appSql, a.company.id, (tx) => tx`select id from api_keys`);
    assert.equal(keys.length, 1);
  });

  it('shows nothing without a company, and refuses writes into another company', async () => {
    const bare = await appSql`select id from companies`;
    assert.equal(bare.length, 0);
    await assert.rejects(
      withTenant(appSql, a.company.id, (tx) =>
        tx`update api_keys set name = 'hijacked' where company_id = ${b.company.id} returning id`.then((rows) => {
          if (rows.length === 0) throw new Error('row-level security hid the row');
        }),
      ),
      /row-level security hid the row/,
    );
    await assert.rejects(
      withTenant(appSql, a.company.id, (tx) =>
        tx`insert into outbox (company_id, workflow_type, workflow_id, task_queue) values (${b.company.id}, 't', 'rls-x', 'q')`,
      ),
      /row-level security/,
    );
  });

  it('lets an explicit system scope see across companies (platform jobs)', async () => {
    const all = await withSystemScope(appSql, (tx) => tx<{ id: string }[]>`select id from companies order by id`);
    assert.deepEqual(all.map((row) => row.id).sort(), [a.company.id, b.company.id].sort());
  });
});
