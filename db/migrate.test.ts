import assert from 'node:assert/strict';
import { readdir } from 'node:fs/promises';
import { after, before, describe, it } from 'node:test';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { migrate, MIGRATIONS_DIR } from './migrate.ts';

describe('migrations', () => {
  let database: TestDatabase;
  before(async () => {
    database = await createTestDatabase({ empty: true, poolMax: 10 });
  });
  after(async () => database.drop());

  it('apply every numbered file exactly once, even with concurrent migrators', async () => {
    const files = (await readdir(MIGRATIONS_DIR)).filter((name) => /^\d{5}_/.test(name)).sort();
    assert.ok(files.length > 0);
    await Promise.all([migrate(database.sql), migrate(database.sql), migrate(database.sql)]);
    await migrate(database.sql); // a later start finds nothing to do
    const rows = await database.sql<{ migration_id: number }[]>`select migration_id from migrations order by migration_id`;
    assert.deepEqual(
      rows.map((row) => row.migration_id),
      files.map((_, index) => index + 1),
    );
  });

  it('leave an outbox whose constraints hold even against bad writes', async () => {
    await database.sql`insert into outbox (workflow_type, workflow_id, task_queue) values ('t', 'wf-1', 'q')`;
    await assert.rejects(
      database.sql`insert into outbox (workflow_type, workflow_id, task_queue) values ('t', 'wf-1', 'q')`,
      /outbox_workflow_id_unique/,
    );
    await assert.rejects(
      database.sql`update outbox set dispatched_at = created_at - interval '1 second' where workflow_id = 'wf-1'`,
      /outbox_dispatched_after_created/,
    );
    await assert.rejects(database.sql`update outbox set attempts = -1 where workflow_id = 'wf-1'`, /attempts_check/);
  });
});
