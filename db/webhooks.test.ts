import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { provisionTenant } from '../services/tenants.ts';
import { generateWebhookSecret } from '../services/webhook-endpoints.ts';
import { newId } from '../platform/ids.ts';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { withSystemScope } from './tenant.ts';
import { closeAttempt, disableFailingEndpoint, lockDeliveryContext, openAttempt } from './webhooks.ts';

describe('an endpoint\'s last success, recorded at most once a minute', () => {
  let database: TestDatabase;
  let companyId: string;
  let eventId: string;

  before(async () => {
    database = await createTestDatabase();
    const tenant = await provisionTenant(database.sql, { name: 'Last success', ownerEmail: 'last-success@example.com' }, SYSTEM_ACTOR);
    companyId = tenant.company.id;
    const [event] = await database.sql<{ id: string }[]>`select id from events where company_id = ${companyId} limit 1`;
    eventId = event!.id;
  });
  after(async () => database.drop());

  /** An endpoint whose last success was `secondsAgo` ago (null: never), with a delivery of the event. */
  async function endpointWithDelivery(lastSuccessSecondsAgo: number | null) {
    const [endpoint] = await database.sql<{ id: string }[]>`
      insert into webhook_endpoints (id, company_id, environment, url, secret, last_success_at)
      values (${newId('we')}, ${companyId}, 'sandbox', 'https://hooks.example.com', ${generateWebhookSecret()},
              ${lastSuccessSecondsAgo === null ? null : database.sql`now() - ${lastSuccessSecondsAgo} * interval '1 second'`})
      returning id`;
    const [delivery] = await database.sql<{ id: string; created_at: Date }[]>`
      insert into webhook_deliveries (company_id, environment, event_id, endpoint_id)
      values (${companyId}, 'sandbox', ${eventId}, ${endpoint!.id}) returning id, created_at`;
    return { endpointId: endpoint!.id, deliveryId: delivery!.id, createdAt: delivery!.created_at };
  }

  const lastSuccessAt = async (endpointId: string) =>
    (await database.sql<{ at: Date | null }[]>`select last_success_at as at from webhook_endpoints where id = ${endpointId}`)[0]!.at;

  async function succeed(target: { endpointId: string; deliveryId: string }, key: string) {
    await withSystemScope(database.sql, async (tx) => {
      await lockDeliveryContext(tx, eventId, target.endpointId);
      const opened = await openAttempt(tx, {
        deliveryId: target.deliveryId,
        companyId,
        endpointId: target.endpointId,
        eventId,
        attemptKey: `${key}#1`,
        supersedes: key,
        trigger: 'scheduled',
        url: 'https://hooks.example.com',
        leaseMs: 60_000,
        maxInFlight: 10,
      });
      assert.notEqual(opened, 'busy');
      if (opened === 'busy') return;
      await closeAttempt(tx, opened.attemptId, { id: target.deliveryId, endpointId: target.endpointId }, {
        ok: true,
        statusCode: 200,
        latencyMs: 5,
        error: null,
        responseBody: 'ok',
      });
    });
  }

  it('writes it on a success when it is unset or more than a minute old, and leaves it otherwise', async () => {
    const never = await endpointWithDelivery(null);
    await succeed(never, 'scheduled:1');
    assert.ok(await lastSuccessAt(never.endpointId));

    const recent = await endpointWithDelivery(30);
    const before = await lastSuccessAt(recent.endpointId);
    await succeed(recent, 'scheduled:1');
    assert.deepEqual(await lastSuccessAt(recent.endpointId), before, 'a success within the minute is not written again');

    const stale = await endpointWithDelivery(120);
    const old = await lastSuccessAt(stale.endpointId);
    await succeed(stale, 'scheduled:1');
    assert.ok((await lastSuccessAt(stale.endpointId))! > old!);
  });

  it('does not disable an endpoint whose recorded success is within a minute of the delivery, and disables one older', async () => {
    // A success recorded 30 s before the delivery began may stand for an unrecorded one after it.
    const withinMinute = await endpointWithDelivery(30);
    const kept = await withSystemScope(database.sql, (tx) => disableFailingEndpoint(tx, withinMinute, 'failing'));
    assert.equal(kept, false);

    const longAgo = await endpointWithDelivery(120);
    const disabled = await withSystemScope(database.sql, (tx) => disableFailingEndpoint(tx, longAgo, 'failing'));
    assert.equal(disabled, true);

    const never = await endpointWithDelivery(null);
    assert.equal(await withSystemScope(database.sql, (tx) => disableFailingEndpoint(tx, never, 'failing')), true);
  });
});
