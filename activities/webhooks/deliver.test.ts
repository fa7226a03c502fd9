// The attempt activity on its own (MockActivityEnvironment), against real PostgreSQL and a real
// HTTP receiver: what the workflow tests cannot show, because the time-skipping server may skip
// past a heartbeat timeout while an activity runs.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { MockActivityEnvironment } from '@temporalio/testing';
import type { Sql } from '../../db/client.ts';
import { withSystemScope } from '../../db/tenant.ts';
import { ensureDelivery, findEvent } from '../../db/webhooks.ts';
import { SYSTEM_ACTOR } from '../../services/audit-context.ts';
import { createTransferSigner } from '../../services/signing.ts';
import { provisionTenant } from '../../services/tenants.ts';
import { createLedgerTransfer } from '../../services/transfers.ts';
import { createWebhookEndpoint } from '../../services/webhook-endpoints.ts';
import { createAppRoleSql, createTestDatabase, type TestDatabase } from '../../test-support/db.ts';
import { startWebhookReceiver, type WebhookReceiver } from '../../test-support/webhook-receiver.ts';
import { createWebhookActivities } from './deliver.ts';
import { createWebhookSender } from './http.ts';

/** Longer than the workflow's 5 s heartbeat timeout would allow without a heartbeat. */
const LOCK_HELD_MS = 2_600;

describe('attemptWebhookDelivery', () => {
  let database: TestDatabase;
  let appSql: Sql;
  let hooks: WebhookReceiver;

  before(async () => {
    database = await createTestDatabase();
    appSql = createAppRoleSql(database.url, { applicationName: 'payments-test-worker', poolMax: 3 });
    hooks = await startWebhookReceiver();
  });
  after(async () => {
    await hooks?.close();
    await appSql?.end({ timeout: 5 });
    await database?.drop();
  });

  it('heartbeats while it waits for the database, not only while the request is out', async () => {
    const tenant = await provisionTenant(
      database.sql,
      { name: 'Heartbeats', ownerEmail: 'heartbeats@example.com' },
      SYSTEM_ACTOR,
    );
    const scope = { companyId: tenant.company.id, environment: 'sandbox' as const };
    const endpoint = await createWebhookEndpoint(
      appSql,
      scope,
      { url: hooks.url },
      { allowPrivateUrls: true, maxEndpoints: 4 },
    );
    const transfer = await createLedgerTransfer(
      appSql,
      scope,
      { amount: 100n, currency: 'USD', source: tenant.sandbox.usdWalletId, destination: tenant.sandbox.usdAccountId },
      'heartbeat-transfer',
    );
    const eventId = await withSystemScope(database.sql, async (tx) => {
      const [row] = await tx<{ id: string }[]>`select id from events where object_id = ${transfer.id}`;
      const event = (await findEvent(tx, scope, row!.id))!;
      await ensureDelivery(tx, event, endpoint.id);
      return event.id;
    });

    const activities = createWebhookActivities({
      sql: appSql,
      sender: createWebhookSender({ allowPrivate: true }),
      signer: createTransferSigner({ sql: appSql }),
    });
    const environment = new MockActivityEnvironment();
    const heartbeats: number[] = [];
    environment.on('heartbeat', () => heartbeats.push(Date.now()));

    // Another transaction holds the endpoint's row (as a concurrent attempt's opening does).
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let locked!: () => void;
    const lockTaken = new Promise<void>((resolve) => (locked = resolve));
    const holder = withSystemScope(database.sql, async (tx) => {
      await tx`select id from webhook_endpoints where id = ${endpoint.id} for update`;
      locked();
      await released;
    });
    await lockTaken;
    const startedAt = Date.now();
    const outcome = environment.run(activities.attemptWebhookDelivery, {
      eventId,
      endpointId: endpoint.id,
      trigger: 'scheduled' as const,
      attemptKey: 'scheduled:1',
    });
    await new Promise((resolve) => setTimeout(resolve, LOCK_HELD_MS));
    release();
    await holder;
    assert.deepEqual(await outcome, { kind: 'delivered', statusCode: 200 });

    assert.equal(hooks.received.length, 1);
    const sentAt = hooks.received[0]!.receivedAt;
    const whileWaiting = heartbeats.filter((at) => at < sentAt);
    assert.ok(
      whileWaiting.length >= 2,
      `heartbeats during the ${LOCK_HELD_MS} ms wait for the lock: ${whileWaiting.map((at) => at - startedAt).join(', ')}`,
    );
    assert.ok(
      whileWaiting.every((at, index) => at - (index === 0 ? startedAt : whileWaiting[index - 1]!) < 2_000),
      'no gap of 2 s without a heartbeat',
    );
  });
});
