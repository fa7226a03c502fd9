import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, it } from 'node:test';
import { MockActivityEnvironment } from '@temporalio/testing';
import { createAppRoleSql, createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import type { Sql } from '../db/client.ts';
import { RETENTION_POLICIES } from '../db/retention.ts';
import { createDataRetentionActivities } from './data-retention.ts';
import { newId } from '../platform/ids.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { provisionTenant } from '../services/tenants.ts';
import { generateWebhookSecret } from '../services/webhook-endpoints.ts';

const DAY_MS = 24 * 60 * 60 * 1000;

async function seed(database: TestDatabase, rows: { id: string; dispatchedDaysAgo: number | null }[], now: number) {
  for (const row of rows) {
    const created = new Date(now - 30 * DAY_MS);
    const dispatched = row.dispatchedDaysAgo === null ? null : new Date(now - row.dispatchedDaysAgo * DAY_MS);
    await database.sql`
      insert into outbox (workflow_type, workflow_id, task_queue, created_at, dispatched_at)
      values ('transferSettlement', ${row.id}, 'payments-core', ${created}, ${dispatched})`;
  }
}

async function remaining(database: TestDatabase): Promise<string[]> {
  const rows = await database.sql<{ workflow_id: string }[]>`select workflow_id from outbox order by workflow_id`;
  return rows.map((row) => row.workflow_id);
}

describe('purgeExpiredRows activity', () => {
  let database: TestDatabase;
  /** The worker's role (payments_app, under row-level security): the sweep runs as the worker runs it. */
  let workerSql: Sql;
  before(async () => {
    database = await createTestDatabase();
    workerSql = createAppRoleSql(database.url, { applicationName: 'payments-test-retention' });
  });
  beforeEach(async () => {
    await database.sql`delete from outbox`;
  });
  after(async () => {
    await workerSql.end({ timeout: 5 });
    await database.drop();
  });

  it('deletes only dispatched outbox rows past their retention, counted back from asOf', async () => {
    const now = Date.now();
    await seed(
      database,
      [
        { id: 'old-dispatched', dispatchedDaysAgo: 8 },
        { id: 'recent-dispatched', dispatchedDaysAgo: 6 },
        { id: 'old-pending', dispatchedDaysAgo: null },
      ],
      now,
    );
    const activities = createDataRetentionActivities({ sql: workerSql, policies: RETENTION_POLICIES });
    const result = await new MockActivityEnvironment().run(activities.purgeExpiredRows, {
      asOfMs: now,
      batchSize: 100,
      maxBatches: 5,
    });
    assert.deepEqual(result, {
      deleted: { 'outbox.dispatched': 1, 'webhook_attempts.finished': 0, 'login_attempts.stale': 0 },
      backlog: false,
    });
    assert.deepEqual(await remaining(database), ['old-pending', 'recent-dispatched']);

    // Idempotent: the same sweep retried deletes nothing more.
    const retry = await activities.purgeExpiredRows({ asOfMs: now, batchSize: 100, maxBatches: 5 });
    assert.deepEqual(retry, {
      deleted: { 'outbox.dispatched': 0, 'webhook_attempts.finished': 0, 'login_attempts.stale': 0 },
      backlog: false,
    });

    // Two days later the other dispatched row has expired too; the pending one never does.
    const later = await activities.purgeExpiredRows({ asOfMs: now + 2 * DAY_MS, batchSize: 100, maxBatches: 5 });
    assert.deepEqual(later.deleted, {
      'outbox.dispatched': 1,
      'webhook_attempts.finished': 0,
      'login_attempts.stale': 0,
    });
    assert.deepEqual(await remaining(database), ['old-pending']);
  });

  it('works in bounded batches and reports a backlog when it stops early', async () => {
    const now = Date.now();
    await seed(
      database,
      Array.from({ length: 7 }, (_, index) => ({ id: `wf-${index}`, dispatchedDaysAgo: 10 })),
      now,
    );
    const activities = createDataRetentionActivities({ sql: workerSql, policies: RETENTION_POLICIES });
    const first = await activities.purgeExpiredRows({ asOfMs: now, batchSize: 2, maxBatches: 2 });
    assert.deepEqual(first, {
      deleted: { 'outbox.dispatched': 4, 'webhook_attempts.finished': 0, 'login_attempts.stale': 0 },
      backlog: true,
    });
    const second = await activities.purgeExpiredRows({ asOfMs: now, batchSize: 2, maxBatches: 2 });
    assert.deepEqual(second, {
      deleted: { 'outbox.dispatched': 3, 'webhook_attempts.finished': 0, 'login_attempts.stale': 0 },
      backlog: false,
    });
    assert.deepEqual(await remaining(database), []);
  });

  it('deletes webhook attempts finished more than 30 days ago, never one in flight', async () => {
    const now = Date.now();
    const tenant = await provisionTenant(
      database.sql,
      { name: 'Retention', ownerEmail: 'retention@example.com' },
      SYSTEM_ACTOR,
    );
    const companyId = tenant.company.id;
    const [endpoint] = await database.sql<{ id: string }[]>`
      insert into webhook_endpoints (id, company_id, environment, url, secret)
      values (${newId('we')}, ${companyId}, 'sandbox', 'https://hooks.example.com', ${generateWebhookSecret()}) returning id`;
    const [event] = await database.sql<{ id: string }[]>`select id from events where company_id = ${companyId} limit 1`;
    const [delivery] = await database.sql<{ id: string }[]>`
      insert into webhook_deliveries (company_id, environment, event_id, endpoint_id)
      values (${companyId}, 'sandbox', ${event!.id}, ${endpoint!.id}) returning id`;
    for (const [key, finishedDaysAgo] of [
      ['old', 31],
      ['recent', 29],
      ['in-flight', null],
    ] as const) {
      const finished = finishedDaysAgo === null ? null : new Date(now - finishedDaysAgo * DAY_MS);
      await database.sql`
        insert into webhook_attempts (company_id, delivery_id, endpoint_id, event_id, attempt_key, trigger, url, state,
                                      started_at, lease_until, finished_at)
        values (${companyId}, ${delivery!.id}, ${endpoint!.id}, ${event!.id}, ${key}, 'scheduled', 'https://hooks.example.com',
                ${finished ? 'failed' : 'in_flight'}, ${new Date(now - 40 * DAY_MS)}, ${new Date(now - 40 * DAY_MS)}, ${finished})`;
    }
    const activities = createDataRetentionActivities({ sql: workerSql, policies: RETENTION_POLICIES });
    const result = await activities.purgeExpiredRows({ asOfMs: now, batchSize: 100, maxBatches: 5 });
    assert.equal(result.deleted['webhook_attempts.finished'], 1);
    const left = await database.sql<
      { attempt_key: string }[]
    >`select attempt_key from webhook_attempts order by attempt_key`;
    assert.deepEqual(
      left.map((row) => row.attempt_key),
      ['in-flight', 'recent'],
    );
  });

  it('deletes sign-in counters a day after their last attempt, never one still locked', async () => {
    const now = Date.now();
    const rows = [
      ['stale', 2 * DAY_MS, null],
      ['recent', DAY_MS / 2, null],
      ['stale-but-locked', 2 * DAY_MS, now + 60_000],
      ['stale-lock-over', 3 * DAY_MS, now - 2 * DAY_MS],
    ] as const;
    for (const [email, ago, lockedUntil] of rows) {
      await database.sql`
        insert into login_attempts (email_hash, failures, locked_until, updated_at)
        values (sha256(convert_to(${email}, 'UTF8')), 3, ${lockedUntil === null ? null : new Date(lockedUntil)},
                ${new Date(now - ago)})`;
    }
    const activities = createDataRetentionActivities({ sql: workerSql, policies: RETENTION_POLICIES });
    const result = await activities.purgeExpiredRows({ asOfMs: now, batchSize: 100, maxBatches: 5 });
    assert.equal(result.deleted['login_attempts.stale'], 2);
    const left = await database.sql<{ email: string }[]>`
      select e.email from login_attempts a
      join (values ('stale'), ('recent'), ('stale-but-locked'), ('stale-lock-over')) as e(email)
        on a.email_hash = sha256(convert_to(e.email, 'UTF8'))
      order by e.email`;
    assert.deepEqual(
      left.map((row) => row.email),
      ['recent', 'stale-but-locked'],
    );
  });
});
