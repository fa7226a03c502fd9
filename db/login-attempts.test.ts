// The sign-in attempt counters (migrations 00013, 00016 and 00017), called as the API calls it: as
// payments_app, under row-level security, the function declaring its own system scope.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { Sql } from './client.ts';
import { claimLoginAttempt, claimLoginAttemptPair } from './operators.ts';
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

  it('never throttles longer than it locks: a count that throttles long before it locks stays bounded', async () => {
    // The email's own count by default: throttled from the 50th failure, locked at the 100th, for an hour.
    const policy = { throttleAfterFailures: 50, throttleBaseMs: 1000, lockAfterFailures: 100, lockMs: 3_600_000 };
    const email = 'throttle-capped@example.com';
    await database.sql`
      insert into login_attempts (email_hash, failures)
      values (sha256(convert_to(${email}, 'UTF8')), 98)`;
    const claim = await claimLoginAttempt(appSql, email, policy);
    assert.deepEqual([claim.claimed, claim.failures], [true, 99]);
    // Before: 2^49 s. Now at most the lock's hour.
    assert.ok(
      claim.lockedUntil!.getTime() - Date.now() <= 3_600_000,
      `blocked until ${claim.lockedUntil!.toISOString()}`,
    );
  });

  it('claims both counts of a pair or neither: an attempt one count refuses adds to neither', async () => {
    const policy = {
      throttleBaseMs: 1000,
      lockMs: 60_000,
      client: { throttleAfterFailures: 100, lockAfterFailures: 3 },
      email: { throttleAfterFailures: 100, lockAfterFailures: 5 },
    };
    const email = 'pair@example.com';
    const from = (client: string) => claimLoginAttemptPair(appSql, { client: `${email}\n${client}`, email }, policy);
    for (const expected of [1, 2, 3]) {
      const claim = await from('192.0.2.1');
      assert.deepEqual([claim.claimed, claim.clientFailures, claim.emailFailures], [true, expected, expected]);
    }
    const refusedHere = await from('192.0.2.1');
    assert.deepEqual([refusedHere.claimed, refusedHere.blockedBy], [false, 'client']);
    assert.equal(refusedHere.emailFailures, 3, 'the refused attempt did not add to the email’s count');
    for (const expected of [4, 5]) assert.equal((await from('192.0.2.2')).emailFailures, expected);
    const refusedEverywhere = await from('192.0.2.3');
    assert.deepEqual([refusedEverywhere.claimed, refusedEverywhere.blockedBy], [false, 'email']);
    assert.equal(refusedEverywhere.clientFailures, 0, 'the email’s lock did not count against a new address');
    // Concurrent claims of one pair: no more counted than the client's lock allows.
    const burst = await Promise.all(
      Array.from({ length: 20 }, () =>
        claimLoginAttemptPair(appSql, { client: 'burst\n192.0.2.9', email: 'burst-pair@example.com' }, policy),
      ),
    );
    assert.equal(burst.filter((claim) => claim.claimed).length, 3);
  });
});
