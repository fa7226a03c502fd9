import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { findStrandedOutboxEntries, insertOutboxEntries, recordOutboxFailures } from './outbox.ts';

describe('the outbox relay’s batch of stranded entries', () => {
  let database: TestDatabase;
  before(async () => {
    database = await createTestDatabase();
  });
  after(async () => database.drop());

  it('takes the least tried first, so entries that keep failing cannot starve newer ones', async () => {
    const entry = (workflowId: string) => ({
      companyId: null,
      workflowType: 'probe',
      workflowId,
      taskQueue: 'q',
      payload: {},
    });
    await insertOutboxEntries(database.sql, [entry('failing-1'), entry('failing-2')]);
    await database.sql`update outbox set created_at = now() - interval '1 hour'`;
    await insertOutboxEntries(database.sql, [entry('newer')]);
    await database.sql`update outbox set created_at = now() - interval '10 minutes' where workflow_id = 'newer'`;
    for (let attempt = 0; attempt < 3; attempt++) {
      await database.sql.begin((tx) =>
        recordOutboxFailures(tx, [
          { workflowId: 'failing-1', error: 'refused' },
          { workflowId: 'failing-2', error: 'refused' },
        ]),
      );
    }
    const batch = await database.sql.begin((tx) =>
      findStrandedOutboxEntries(tx, { olderThan: new Date(Date.now() - 60_000), limit: 2 }),
    );
    assert.deepEqual(
      batch.map((row) => [row.workflowId, row.attempts]),
      [
        ['newer', 0],
        ['failing-1', 3],
      ],
    );
  });
});
