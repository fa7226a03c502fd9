import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';

describe('retention indexes', () => {
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
});
