// The sign-in attempt counter (migrations 00013 and 00016), called as the API calls it: as
// payments_app, under row-level security, the function declaring its own system scope.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from './client.ts';
import { claimLoginAttempt } from './operators.ts';
import { createAppRoleSql, createTestDatabase, type TestDatabase } from '../test-support/db.ts';

describe('sign-in attempts per email', () => {
  let database: TestDatabase;
  let appSql: Sql;
  before(async () => {
    database = await createTestDatabase();
    appSql = createAppRoleSql(database.url, { applicationName: 'login-attempts-test', poolMax: 10 });
  });
  after(async () => {
    await appSql.end({ timeout: 5 });
    await database.drop();
  });

  it('counts every one of a concurrent burst: no more claimed than the lock allows', async () => {
    const policy = { throttleAfterFailures: 100, throttleBaseMs: 1, lockAfterFailures: 5, lockMs: 60_000 };
    const claims = await Promise.all(
      Array.from({ length: 30 }, () => claimLoginAttempt(appSql, 'Burst@Example.com', policy)),
    );
    assert.equal(claims.filter((claim) => claim.claimed).length, 5);
    assert.deepEqual(
      claims
        .filter((claim) => claim.claimed)
        .map((claim) => claim.failures)
        .sort((a, b) => a - b),
      [1, 2, 3, 4, 5],
    );
    // The same email in another case is the same counter.
    assert.equal((await claimLoginAttempt(appSql, 'burst@example.com', policy)).claimed, false);
  });

  it('starts the count again once a lock has run out, instead of locking again at the next failure', async () => {
    const policy = { throttleAfterFailures: 100, throttleBaseMs: 1, lockAfterFailures: 3, lockMs: 200 };
    const email = 'lock-runs-out@example.com';
    for (const expected of [1, 2, 3]) {
      const claim = await claimLoginAttempt(appSql, email, policy);
      assert.deepEqual([claim.claimed, claim.failures], [true, expected]);
    }
    assert.equal((await claimLoginAttempt(appSql, email, policy)).claimed, false, 'locked');
    await new Promise((resolve) => setTimeout(resolve, 300));
    const after = await claimLoginAttempt(appSql, email, policy);
    assert.deepEqual([after.claimed, after.failures, after.lockedUntil], [true, 1, null]);
  });
});
