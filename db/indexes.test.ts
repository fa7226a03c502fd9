import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';

// Lookups on tables that grow with every transfer or delivery must go through an index: a sequential
// scan there is invisible in tests on small tables and grows with the table in production.
describe('indexes on growing tables', () => {
  let database: TestDatabase;
  before(async () => {
    database = await createTestDatabase();
  });
  after(async () => database.drop());

  /** The plan of a statement with sequential scans priced out, as on a table too large to read whole. */
  async function plan(statement: string): Promise<string> {
    return database.sql.begin(async (tx) => {
      await tx`set local enable_seqscan = off`;
      const rows = await tx.unsafe<{ 'QUERY PLAN': string }[]>(`explain ${statement}`);
      return rows.map((row) => row['QUERY PLAN']).join('\n');
    });
  }

  it("lists a company's accounts newest first, after a cursor, through an index (GET /v1/accounts)", async () => {
    const list = await plan(`
      select id from ledger_accounts
      where company_id = 'co_x' and environment = 'sandbox' and type <> 'system'
        and (split_part(id, '_', 2), id) < (split_part('wal_0000', '_', 2), 'wal_0000')
      order by split_part(id, '_', 2) desc, id desc limit 11`);
    assert.match(list, /ledger_accounts_listing_idx/, list);
    assert.doesNotMatch(list, /Sort/, list);
  });

  it('finds the webhook attempts to purge through an index on finished_at (the policy in db/retention.ts)', async () => {
    const purge = await plan(`
      delete from webhook_attempts
      where id in (
        select id from webhook_attempts
        where finished_at is not null and finished_at < now() - interval '30 days'
        order by finished_at
        limit 500
      )`);
    assert.match(purge, /webhook_attempts_finished_idx/, purge);
  });

  // The hold's entries: db/rails.ts resolveHold (settle and fail), and the statements inside the
  // triggers of migration 00004 (ledger_entries_hold_rules, ledger_holds_released). Migration 00010's
  // unique hold_once index (hold_id, account_id) for kind 'hold' serves them as well as 00008's.
  const HOLD = "'hold_0000'";
  for (const [name, statement] of [
    [
      'resolveHold: the clearing account a hold credited',
      `select e.account_id from ledger_entries e where e.hold_id = ${HOLD} and e.kind = 'hold' and e.amount > 0`,
    ],
    [
      'ledger_entries_hold_rules: the hold entry a release mirrors',
      `select 1 from ledger_entries e where e.hold_id = ${HOLD} and e.kind = 'hold'
       and e.account_id = 'acct_0000' and e.amount = 1`,
    ],
    [
      'ledger_holds_released: hold entries without their release',
      `select 1 from ledger_entries h where h.hold_id = ${HOLD} and h.kind = 'hold'
       and not exists (select 1 from ledger_entries r where r.hold_id = h.hold_id and r.kind = 'hold_release'
                       and r.account_id = h.account_id and r.amount = h.amount)`,
    ],
  ] as const) {
    it(`finds ${name} through a hold index (migration 00008 or 00010)`, async () => {
      const found = await plan(statement);
      assert.match(found, /ledger_entries_hold_(idx|once)/, found);
      assert.doesNotMatch(found, /Seq Scan on ledger_entries/, found);
    });
  }
});
