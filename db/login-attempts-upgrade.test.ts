// Migration 00017 on a database at 00016: the blocks 00016's uncapped doubling already wrote (days,
// up to 2^49 s) end no later than the lock time after their attempt, as new ones do.
import assert from 'node:assert/strict';
import { copyFile, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import shift from 'postgres-shift';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { migrate, MIGRATIONS_DIR } from './migrate.ts';
import { claimLoginAttemptPair } from './operators.ts';

describe('00017 on a database at 00016', () => {
  let database: TestDatabase;
  let upTo16: string;
  before(async () => {
    database = await createTestDatabase({ empty: true, poolMax: 4 });
    upTo16 = await mkdtemp(join(tmpdir(), 'mig16-'));
    for (const name of (await readdir(MIGRATIONS_DIR)).filter((n) => /^000(0\d|1[0-6])_/.test(n))) {
      await copyFile(join(MIGRATIONS_DIR, name), join(upTo16, name));
    }
  });
  after(async () => {
    await database.drop();
    await rm(upTo16, { recursive: true, force: true });
  });

  it('no block written before the upgrade outlasts the lock time after it', async () => {
    await shift({ sql: database.sql, path: upTo16 });
    const email = 'blocked-before@example.com';
    // 00016's email-wide count at its 70th failure: 2^20 s (about 12 days) from its last attempt.
    await database.sql`select set_config('app.scope', 'system', false)`;
    await database.sql`
      insert into login_attempts (email_hash, failures, locked_until, updated_at)
      values (sha256(convert_to(${email}, 'UTF8')), 70, now() + interval '1048576 seconds', now())`;
    await migrate(database.sql);
    const claim = await claimLoginAttemptPair(
      database.sql,
      { client: `${email}\n192.0.2.1`, email },
      {
        throttleBaseMs: 1000,
        lockMs: 3_600_000,
        client: { throttleAfterFailures: 5, lockAfterFailures: 10 },
        email: { throttleAfterFailures: 50, lockAfterFailures: 100 },
      },
    );
    const blockedFor = claim.claimed ? 0 : claim.lockedUntil!.getTime() - Date.now();
    assert.ok(blockedFor <= 3_600_000, `still blocked for ${Math.round(blockedFor / 86_400_000)} days`);
  });
});
