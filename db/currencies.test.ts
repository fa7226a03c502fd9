import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { CURRENCIES } from '../workflows/shared/money.ts';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';

describe('currency registry', () => {
  let database: TestDatabase;
  before(async () => {
    database = await createTestDatabase();
  });
  after(async () => database.drop());

  it('is the same in code and in the database (codes, scales, kinds)', async () => {
    const rows = await database.sql<{ code: string; scale: number; kind: string }[]>`select code, scale, kind from currencies order by code`;
    assert.deepEqual(
      rows.map((row) => ({ code: row.code, scale: row.scale, kind: row.kind })),
      Object.values(CURRENCIES)
        .map((info) => ({ code: info.code, scale: info.scale, kind: info.kind }))
        .sort((a, b) => a.code.localeCompare(b.code)),
    );
  });
});
