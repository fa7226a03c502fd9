import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readdir } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import postgres from 'postgres';
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
    const rows = await database.sql<
      { migration_id: number }[]
    >`select migration_id from migrations order by migration_id`;
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

  it('let payments_app log in with DATABASE_APP_PASSWORD (npm run db:migrate), a login that cannot become the owner', async () => {
    const password = 'compose: p@ss/word%with?odd#chars';
    const run = spawnSync(
      process.execPath,
      ['--import', import.meta.resolve('tsx'), join(dirname(fileURLToPath(import.meta.url)), 'migrate-cli.ts')],
      {
        encoding: 'utf8',
        env: { ...process.env, DATABASE_URL: database.url, DATABASE_APP_PASSWORD: password, LOG_LEVEL: 'info' },
        timeout: 60_000,
      },
    );
    assert.equal(run.status, 0, run.stderr + run.stdout);
    assert.match(run.stdout, /payments_app may log in with DATABASE_APP_PASSWORD/);
    const url = new URL(database.url);
    url.username = 'payments_app';
    url.password = encodeURIComponent(password);
    const app = postgres(url.toString(), { max: 1, onnotice: () => undefined });
    try {
      const [row] = await app<{ user: string }[]>`select current_user as user`;
      assert.equal(row?.user, 'payments_app');
      await assert.rejects(app`set role postgres`, { code: '42501' });
      await assert.rejects(app`alter role payments_app with superuser`, { code: '42501' });
    } finally {
      await app.end({ timeout: 5 });
    }
    // As docker-compose.yml hands it to the API and the worker: a URL without the password, and the
    // password itself, unencoded, in PGPASSWORD.
    const bare = new URL(database.url);
    bare.username = 'payments_app';
    bare.password = '';
    const saved = process.env.PGPASSWORD;
    process.env.PGPASSWORD = password;
    const composed = postgres(bare.toString(), { max: 1, onnotice: () => undefined });
    try {
      const [row] = await composed<{ user: string }[]>`select current_user as user`;
      assert.equal(row?.user, 'payments_app');
    } finally {
      await composed.end({ timeout: 5 });
      if (saved === undefined) delete process.env.PGPASSWORD;
      else process.env.PGPASSWORD = saved;
    }
  });
});
