// The application pool under saturation. postgres.js 3.4.9 sent a transaction's BEGIN pipelined
// behind a busy connection's query without reserving that connection when the BEGIN filled the
// pipeline (porsager/postgres#1189): with our max_pipeline of 1, any saturated pool. The request got
// UNSAFE_TRANSACTION (a 500) and the connection went back to the pool with the transaction still
// open, so later autocommit writes ran inside it and were lost with it. patches/postgres+3.4.9.patch
// (applied by patch-package at install) reserves the connection whenever BEGIN was written.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import postgres from 'postgres';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { assertPostgresPatched, createSql, type Sql } from './client.ts';
import { withTenant } from './tenant.ts';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';

const COMPANY = 'co_00000000000000000000000000000000';

describe('the application pool, saturated', () => {
  let database: TestDatabase;
  let sql: Sql;
  before(async () => {
    database = await createTestDatabase();
    await database.sql`create table pool_probe (n integer not null)`;
    sql = createSql({
      url: database.url,
      poolMax: 2,
      connectTimeoutS: 10,
      idleTimeoutS: 30,
      statementTimeoutMs: 10_000,
      applicationName: 'pool-probe',
    });
  });
  after(async () => {
    await sql.end({ timeout: 5 });
    await database.drop();
  });

  it('runs every transaction queued behind busy connections, and leaves no transaction open', async () => {
    for (let round = 0; round < 5; round++) {
      const work = Array.from({ length: 40 }, (_, index) =>
        index % 2 === 0
          ? sql`select pg_sleep(0.002)`.then(() => 'ok')
          : withTenant(sql, COMPANY, async (tx) => {
              await tx`select pg_sleep(0.002)`;
              await tx`select current_setting('app.company_id') as company`;
              return 'ok';
            }),
      );
      const results = await Promise.all(
        work.map((promise) => promise.catch((error: Error & { code?: string }) => error.code ?? error.message)),
      );
      assert.deepEqual(
        results.filter((result) => result !== 'ok'),
        [],
        `round ${round}`,
      );
    }

    // Each acknowledged autocommit write is visible to another session at once: none ran inside a
    // transaction left open on a pooled connection.
    for (let n = 1; n <= 20; n++) await sql`insert into pool_probe values (${n})`;
    const other = postgres(database.url, { max: 1, onnotice: () => undefined });
    try {
      const [visible] = await other<{ count: number }[]>`select count(*)::int as count from pool_probe`;
      assert.equal(visible?.count, 20);
      const open = await other<{ state: string }[]>`
        select state from pg_stat_activity where application_name = 'pool-probe' and state like 'idle in transaction%'`;
      assert.equal(open.length, 0, JSON.stringify(open));
    } finally {
      await other.end({ timeout: 5 });
    }
  });

  it('keeps a transaction to its own connection while other queries queue for the pool', async () => {
    // A transaction that holds its connection across an await outside the database: the pool's
    // other queries must not run inside it (they would see its uncommitted row).
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const transaction = withTenant(sql, COMPANY, async (tx) => {
      await tx`insert into pool_probe values (-1)`;
      await held;
      return 'committed';
    });
    await new Promise((resolve) => setTimeout(resolve, 50));
    const outside = await Promise.all(
      Array.from(
        { length: 10 },
        () => sql<{ count: number }[]>`select count(*)::int as count from pool_probe where n = -1`,
      ),
    );
    assert.deepEqual(
      outside.map((rows) => rows[0]?.count),
      Array.from({ length: 10 }, () => 0),
    );
    release();
    assert.equal(await transaction, 'committed');
  });

  it('refuses to start on a postgres.js without the patch (an install that skipped patch-package)', async () => {
    assert.doesNotThrow(() => assertPostgresPatched());
    const dir = await mkdtemp(join(tmpdir(), 'unpatched-'));
    try {
      const unpatched = join(dir, 'connection.js');
      await writeFile(unpatched, 'export default function Connection() {}\n');
      assert.throws(() => assertPostgresPatched(unpatched), /is not patched/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
