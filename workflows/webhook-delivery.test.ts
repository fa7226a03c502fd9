import assert from 'node:assert/strict';
import { readdir, readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import type { Client, WorkflowHandle } from '@temporalio/client';
import { historyFromJSON, historyToJSON } from '@temporalio/common/lib/proto-utils.js';
import type { temporal } from '@temporalio/proto';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker } from '@temporalio/worker';
import { Webhook } from 'standardwebhooks';
import { createActivities } from '../activities/index.ts';
import { createWebhookSender } from '../activities/webhooks/http.ts';
import { type Sql } from '../db/client.ts';
import { insertRunningIdempotencyKey, type IdempotencyKeyId } from '../db/idempotency.ts';
import { withSystemScope, withTenant } from '../db/tenant.ts';
import { findWebhookEndpoint, listAttempts, lockDeliveryContext, openAttempt } from '../db/webhooks.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { createTransferSigner, type TransferSigner } from '../services/signing.ts';
import { provisionTenant } from '../services/tenants.ts';
import { createLedgerTransfer } from '../services/transfers.ts';
import { dispatchWebhookEvents } from '../services/webhook-dispatch.ts';
import {
  changeWebhookEndpoint,
  createWebhookEndpoint,
  deleteWebhookEndpoint,
  resendWebhookEvent,
  rotateWebhookEndpointSecret,
  type WebhookEndpointPolicy,
} from '../services/webhook-endpoints.ts';
import { createTestDatabase, type TestDatabase, createAppRoleSql } from '../test-support/db.ts';
import { createTimeSkippingEnv, testWorkflowBundle } from '../test-support/temporal.ts';
import { startWebhookReceiver, type ReceivedWebhook, type WebhookReceiver } from '../test-support/webhook-receiver.ts';
import { pino } from 'pino';
import { SEARCH_ATTRIBUTES } from './shared/search-attributes.ts';
import { TASK_QUEUES } from './shared/task-queues.ts';
import { WEBHOOK_RETRY_DELAYS_MS, webhookDeliveryWorkflowId, type WebhookDeliveryResult } from './shared/webhooks.ts';
import type { webhookDeliveryWorkflow, webhookResendWorkflow } from './webhook-delivery.ts';

const HISTORIES_DIR = join(dirname(fileURLToPath(import.meta.url)), 'histories');
const HISTORY_PREFIX = 'webhook-delivery-';
const RECORDED_PATHS = ['delivered', 'retried', 'exhausted', 'endpoint-deleted', 'resend'];
const POLICY: WebhookEndpointPolicy = { allowPrivateUrls: true, maxEndpoints: 16 };
const ATTEMPT_TIMEOUT_MS = 1_500;

interface Tenant {
  companyId: string;
  walletId: string;
  accountId: string;
}

describe('webhookDeliveryWorkflow (time-skipping, real PostgreSQL, real HTTP receiver)', () => {
  let env: TestWorkflowEnvironment;
  let database: TestDatabase;
  let appSql: Sql;
  let signer: TransferSigner;
  let worker: Worker;
  let running: Promise<void>;
  let tenantNumber = 0;
  const receivers: WebhookReceiver[] = [];

  before(async () => {
    [env, database] = await Promise.all([createTimeSkippingEnv(), createTestDatabase()]);
    appSql = createAppRoleSql(database.url, { applicationName: 'payments-test-worker', poolMax: 5 });
    signer = createTransferSigner({ sql: appSql });
    worker = await Worker.create({
      connection: env.nativeConnection,
      taskQueue: TASK_QUEUES.core,
      workflowBundle: await testWorkflowBundle(),
      activities: createActivities({
        sql: appSql,
        webhooks: {
          sender: createWebhookSender({ allowPrivate: true }),
          signer,
          limits: { attemptTimeoutMs: ATTEMPT_TIMEOUT_MS, maxPayloadBytes: 64 * 1024 },
        },
      }),
    });
    running = worker.run();
  });

  after(async () => {
    worker?.shutdown();
    await running;
    await Promise.all(receivers.map((receiver) => receiver.close()));
    await appSql?.end({ timeout: 5 });
    await env?.teardown();
    await database?.drop();
  });

  async function newTenant(): Promise<Tenant> {
    tenantNumber += 1;
    const tenant = await provisionTenant(
      database.sql,
      { name: `Hooks ${tenantNumber}`, ownerEmail: `hooks${tenantNumber}@example.com` },
      SYSTEM_ACTOR,
    );
    return {
      companyId: tenant.company.id,
      walletId: tenant.sandbox.usdWalletId,
      accountId: tenant.sandbox.usdAccountId,
    };
  }

  async function receiver(...args: Parameters<typeof startWebhookReceiver>): Promise<WebhookReceiver> {
    const started = await startWebhookReceiver(...args);
    receivers.push(started);
    return started;
  }

  /** A fresh tenant with one endpoint, for every event, on a new receiver answering as `respond` says. */
  async function subscribedTenant(...respond: Parameters<typeof startWebhookReceiver>) {
    const tenant = await newTenant();
    const scope = { companyId: tenant.companyId, environment: 'sandbox' as const };
    const hooks = await receiver(...respond);
    const endpoint = await createWebhookEndpoint(appSql, scope, { url: hooks.url }, POLICY);
    return { tenant, scope, hooks, endpoint };
  }

  async function transfer(tenant: Tenant, amount = 100n): Promise<{ transferId: string; eventId: string }> {
    const created = await createLedgerTransfer(
      appSql,
      { companyId: tenant.companyId, environment: 'sandbox' },
      { amount, currency: 'USD', source: tenant.walletId, destination: tenant.accountId },
      `hook-${Math.random()}`,
    );
    const [event] = await database.sql<{ id: string }[]>`select id from events where object_id = ${created.id}`;
    return { transferId: created.id, eventId: event!.id };
  }

  /** Dispatches pending events (as the worker's dispatcher loop does) and returns the delivery's handle. */
  async function dispatch(
    eventId: string,
    endpointId: string,
  ): Promise<WorkflowHandle<typeof webhookDeliveryWorkflow>> {
    const result = await dispatchWebhookEvents({ sql: database.sql, temporal: env.client }, { batchSize: 100 });
    assert.equal(result.failed, 0);
    return env.client.workflow.getHandle<typeof webhookDeliveryWorkflow>(
      webhookDeliveryWorkflowId(eventId, endpointId),
    );
  }

  function verify(
    secret: string,
    request: ReceivedWebhook,
  ): { id: string; type: string; data: { object: Record<string, unknown>; version: number } } {
    return new Webhook(secret).verify(request.body, request.headers) as never;
  }

  async function replay(
    handle: { fetchHistory(): Promise<temporal.api.history.v1.IHistory>; workflowId: string },
    recordAs?: string,
  ) {
    const history = await handle.fetchHistory();
    await Worker.runReplayHistory({ workflowBundle: await testWorkflowBundle() }, history, handle.workflowId);
    if (recordAs && process.env.UPDATE_HISTORIES === '1') {
      await writeFile(join(HISTORIES_DIR, `${HISTORY_PREFIX}${recordAs}.history.json`), historyToJSON(history));
    }
    return history;
  }

  /** The durations of the workflow's timers, in order. */
  function timers(history: temporal.api.history.v1.IHistory): number[] {
    return (history.events ?? [])
      .filter((event) => event.timerStartedEventAttributes)
      .map((event) => {
        const timeout = event.timerStartedEventAttributes!.startToFireTimeout!;
        return Number(timeout.seconds ?? 0) * 1000 + Math.floor((timeout.nanos ?? 0) / 1e6);
      });
  }

  async function attemptsOf(companyId: string, endpointId: string) {
    return withTenant(database.sql, companyId, (tx) => listAttempts(tx, endpointId, { limit: 100 }));
  }

  it('delivers a transfer event at once, signed the Standard Webhooks way, with the signed transfer inside', async () => {
    const { tenant, hooks, endpoint } = await subscribedTenant();
    const { transferId, eventId } = await transfer(tenant);
    const handle = await dispatch(eventId, endpoint.id);
    const result: WebhookDeliveryResult = await handle.result();
    assert.deepEqual(result, { status: 'succeeded', attempts: 1 });

    assert.equal(hooks.received.length, 1);
    const request = hooks.received[0]!;
    assert.equal(request.headers['webhook-id'], eventId);
    assert.equal(request.headers['content-type'], 'application/json');
    const payload = verify(endpoint.secret, request);
    assert.equal(payload.id, eventId);
    assert.equal(payload.type, 'transfer.settled');
    assert.equal(payload.data.version, 1);
    assert.equal(payload.data.object.id, transferId);
    assert.equal(payload.data.object.status, 'settled');
    const { signature, ...object } = payload.data.object;
    assert.equal(await signer.verify(object, signature as string), true, 'the transfer inside the event is signed');
    // A forged body or a wrong secret does not verify.
    assert.throws(() =>
      new Webhook(endpoint.secret).verify(request.body.replace('settled', 'failed'), request.headers),
    );

    const attempts = await attemptsOf(tenant.companyId, endpoint.id);
    assert.equal(attempts.length, 1);
    assert.equal(attempts[0]!.state, 'succeeded');
    assert.equal(attempts[0]!.statusCode, 200);
    assert.equal(attempts[0]!.responseBody, 'ok');
    const [delivery] = await database.sql<{ status: string; attempts: number }[]>`
      select status, attempts from webhook_deliveries where event_id = ${eventId}`;
    assert.deepEqual({ ...delivery }, { status: 'succeeded', attempts: 1 });
    const attributes = (await handle.describe()).typedSearchAttributes;
    assert.equal(attributes.get(SEARCH_ATTRIBUTES.objectStatus), 'succeeded');
    assert.equal(attributes.get(SEARCH_ATTRIBUTES.companyId), tenant.companyId);
    assert.equal(attributes.get(SEARCH_ATTRIBUTES.objectId), eventId);
    await replay(handle, 'delivered');
  });

  it('walks the whole schedule: seven failures then success, same webhook-id, every signature valid', async () => {
    const big = 'x'.repeat(4096) + 'é';
    const { tenant, hooks, endpoint } = await subscribedTenant((_request, index) =>
      index < 7 ? { status: index % 2 ? 500 : 404, body: big } : { status: 204 },
    );
    const { eventId } = await transfer(tenant);
    const handle = await dispatch(eventId, endpoint.id);
    const started = Date.now();
    assert.deepEqual(await handle.result(), { status: 'succeeded', attempts: 8 });
    assert.ok(Date.now() - started < 60_000, 'more than a day of schedule passes in seconds');

    assert.equal(hooks.received.length, 8);
    for (const request of hooks.received) {
      assert.equal(request.headers['webhook-id'], eventId);
      assert.equal(verify(endpoint.secret, request).id, eventId);
    }
    const history = await replay(handle, 'retried');
    assert.deepEqual(timers(history), WEBHOOK_RETRY_DELAYS_MS.slice(1));

    const attempts = (await attemptsOf(tenant.companyId, endpoint.id)).reverse();
    assert.deepEqual(
      attempts.map((attempt) => [attempt.state, attempt.statusCode]),
      [...Array.from({ length: 7 }, (_, index) => ['failed', index % 2 ? 500 : 404]), ['succeeded', 204]],
    );
    for (const attempt of attempts.slice(0, 7)) {
      assert.ok(Buffer.byteLength(attempt.responseBody ?? '') <= 1024, 'at most 1 KiB of the answer is kept');
      assert.ok(attempt.responseBody!.startsWith('xxxx'));
      assert.match(attempt.error ?? '', /HTTP (404|500)/);
      assert.ok(attempt.latencyMs !== null && attempt.latencyMs >= 0);
    }
    const current = await withTenant(database.sql, tenant.companyId, (tx) =>
      findWebhookEndpoint(tx, { companyId: tenant.companyId, environment: 'sandbox' }, endpoint.id),
    );
    assert.equal(current?.status, 'enabled');
  });

  it('disables an endpoint that fails the whole schedule and tells the company with an event', async () => {
    const tenant = await newTenant();
    const hooks = await receiver(() => ({ status: 503, body: 'down' }));
    const watcher = await receiver();
    const scope = { companyId: tenant.companyId, environment: 'sandbox' as const };
    const endpoint = await createWebhookEndpoint(appSql, scope, { url: hooks.url }, POLICY);
    const other = await createWebhookEndpoint(
      appSql,
      scope,
      { url: watcher.url, events: ['webhook_endpoint.disabled'] },
      POLICY,
    );
    const { eventId } = await transfer(tenant);
    const handle = await dispatch(eventId, endpoint.id);
    assert.deepEqual(await handle.result(), { status: 'failed', attempts: 8, endpointDisabled: true });
    assert.equal(hooks.received.length, 8);

    const current = await withTenant(database.sql, tenant.companyId, (tx) =>
      findWebhookEndpoint(tx, scope, endpoint.id),
    );
    assert.equal(current?.status, 'disabled');
    assert.match(current?.disabledReason ?? '', /Every attempt to deliver/);
    const [disabled] = await database.sql<{ id: string; object_version: number }[]>`
      select id, object_version from events where object_id = ${endpoint.id} and type = 'webhook_endpoint.disabled'`;
    assert.ok(disabled, 'the company is told by an event');
    assert.equal(disabled.object_version, 2);
    // The other endpoint subscribed to exactly that event gets it; it never got the transfer event.
    const notice = await dispatch(disabled.id, other.id);
    assert.deepEqual(await notice.result(), { status: 'succeeded', attempts: 1 });
    assert.equal(watcher.received.length, 1);
    const payload = verify(other.secret, watcher.received[0]!);
    assert.equal(payload.type, 'webhook_endpoint.disabled');
    assert.equal(payload.data.object.id, endpoint.id);
    assert.equal(payload.data.object.enabled, false);
    assert.equal('secret' in payload.data.object, false);
    const [delivery] = await database.sql<
      { status: string }[]
    >`select status from webhook_deliveries where event_id = ${eventId}`;
    assert.equal(delivery?.status, 'failed');
    await replay(handle, 'exhausted');

    // A disabled endpoint gets nothing new; enabling it again is an event too.
    await transfer(tenant);
    const fanned = await dispatchWebhookEvents({ sql: database.sql, temporal: env.client }, { batchSize: 100 });
    assert.equal(fanned.deliveries, 0);
    await changeWebhookEndpoint(appSql, scope, endpoint.id, { enabled: true }, POLICY);
    const [enabled] =
      await database.sql`select 1 from events where object_id = ${endpoint.id} and type = 'webhook_endpoint.enabled'`;
    assert.ok(enabled);
  });

  it('does not disable an endpoint that succeeded since the failed delivery began', async () => {
    let doomed = '';
    const { tenant, scope, endpoint } = await subscribedTenant((request) =>
      request.headers['webhook-id'] === doomed ? { status: 500 } : { status: 200 },
    );
    const first = await transfer(tenant);
    doomed = first.eventId;
    const handle = await dispatch(first.eventId, endpoint.id);
    // While the first delivery waits between attempts, another event gets through.
    await waitForAttempts(tenant.companyId, endpoint.id, 1);
    const second = await transfer(tenant);
    const secondHandle = await dispatch(second.eventId, endpoint.id);
    assert.equal((await secondHandle.result()).status, 'succeeded');
    assert.deepEqual(await handle.result(), { status: 'failed', attempts: 8, endpointDisabled: false });
    const current = await withTenant(database.sql, tenant.companyId, (tx) =>
      findWebhookEndpoint(tx, scope, endpoint.id),
    );
    assert.equal(current?.status, 'enabled');
  });

  async function waitForAttempts(companyId: string, endpointId: string, count: number): Promise<void> {
    for (let i = 0; i < 200; i++) {
      const finished = (await attemptsOf(companyId, endpointId)).filter((attempt) => attempt.state !== 'in_flight');
      if (finished.length >= count) return;
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    throw new Error(`fewer than ${count} attempts`);
  }

  it('stops when the endpoint is deleted between attempts', async () => {
    const { tenant, scope, hooks, endpoint } = await subscribedTenant(() => ({ status: 500 }));
    const { eventId } = await transfer(tenant);
    const handle = await dispatch(eventId, endpoint.id);
    await waitForAttempts(tenant.companyId, endpoint.id, 1);
    await deleteWebhookEndpoint(appSql, scope, endpoint.id);
    const result = await handle.result();
    assert.equal(result.status, 'canceled');
    assert.ok(result.attempts <= 2);
    assert.ok(hooks.received.length <= 1);
    const [delivery] = await database.sql<
      { status: string }[]
    >`select status from webhook_deliveries where event_id = ${eventId}`;
    assert.equal(delivery?.status, 'canceled');
    await replay(handle, 'endpoint-deleted');
  });

  it('counts no answer within the timeout as a failure', async () => {
    let hang = true;
    const { tenant, endpoint } = await subscribedTenant(() => (hang ? 'hang' : { status: 200 }));
    const { eventId } = await transfer(tenant);
    const handle = await dispatch(eventId, endpoint.id);
    await waitForAttempts(tenant.companyId, endpoint.id, 1);
    hang = false;
    assert.deepEqual(await handle.result(), { status: 'succeeded', attempts: 2 });
    const attempts = (await attemptsOf(tenant.companyId, endpoint.id)).reverse();
    assert.equal(attempts[0]!.state, 'failed');
    assert.match(attempts[0]!.error ?? '', /timeout/);
    assert.equal(attempts[1]!.state, 'succeeded');
  });

  it('signs with both secrets during a rotation overlap, and with the new one alone after', async () => {
    const { tenant, scope, hooks, endpoint } = await subscribedTenant();
    const rotated = await rotateWebhookEndpointSecret(appSql, scope, endpoint.id, 3600);
    assert.notEqual(rotated.secret, endpoint.secret);
    const first = await transfer(tenant);
    await (await dispatch(first.eventId, endpoint.id)).result();
    const during = hooks.received[0]!;
    assert.equal(during.headers['webhook-signature']!.split(' ').length, 2);
    verify(endpoint.secret, during); // a receiver still on the old secret accepts it
    verify(rotated.secret, during); // and one already on the new secret too

    const retired = await rotateWebhookEndpointSecret(appSql, scope, endpoint.id, 0);
    const second = await transfer(tenant);
    await (await dispatch(second.eventId, endpoint.id)).result();
    const afterwards = hooks.received[1]!;
    assert.equal(afterwards.headers['webhook-signature']!.split(' ').length, 1);
    verify(retired.secret, afterwards);
    assert.throws(() => verify(rotated.secret, afterwards));
  });

  /** A key claimed as the idempotency layer claims it before the resend route runs. */
  async function claimedKey(scope: { companyId: string; environment: 'sandbox' | 'live' }, key: string) {
    const id: IdempotencyKeyId = { ...scope, key };
    await withTenant(appSql, scope.companyId, (tx) =>
      insertRunningIdempotencyKey(tx, {
        ...id,
        requestMethod: 'POST',
        requestPath: '/v1/webhook_endpoints/resend',
        requestHash: Buffer.alloc(32),
        leaseMs: 60_000,
        ttlMs: 24 * 60 * 60 * 1000,
      }),
    );
    return id;
  }

  it('resends by hand: one manual attempt with the original webhook-id, once per idempotency key', async () => {
    const { tenant, scope, hooks, endpoint } = await subscribedTenant();
    const { eventId } = await transfer(tenant);
    await (await dispatch(eventId, endpoint.id)).result();
    const deps = { sql: appSql, temporal: env.client, logger: pino({ level: 'silent' }) };
    const key = await claimedKey(scope, 'resend-1');
    const resend = await resendWebhookEvent(deps, scope, { endpointId: endpoint.id, eventId, idempotencyKey: key });
    // The request runs again under the same claim (its first run died after starting the workflow).
    const again = await resendWebhookEvent(deps, scope, { endpointId: endpoint.id, eventId, idempotencyKey: key });
    assert.equal(again.workflowId, resend.workflowId);
    const handle = env.client.workflow.getHandle<typeof webhookResendWorkflow>(resend.workflowId);
    assert.deepEqual(await handle.result(), { kind: 'delivered', statusCode: 200 });
    // The same claim again after the resend finished: refused by Temporal (REJECT_DUPLICATE), nothing sent.
    await resendWebhookEvent(deps, scope, { endpointId: endpoint.id, eventId, idempotencyKey: key });
    await new Promise((resolve) => setTimeout(resolve, 300));
    // Exactly one logical resend for the key. Delivery is at least once: if an activity try is
    // retried (the time-skipping server may skip past its heartbeat timeout while it runs), the
    // request is made again under the same webhook-id, which is what receivers deduplicate on.
    const keys = await database.sql<{ attempt_key: string }[]>`
      select attempt_key from webhook_attempts where endpoint_id = ${endpoint.id} order by started_at`;
    const logical = [...new Set(keys.map((row) => row.attempt_key.split('#')[0]!))]
      .map((key) => key.split(':')[0])
      .sort();
    assert.deepEqual(
      logical,
      ['manual', 'scheduled'],
      `one scheduled and one manual attempt; tries: ${JSON.stringify(keys)}`,
    );
    assert.ok(hooks.received.length >= 2);
    for (const request of hooks.received) {
      assert.equal(request.headers['webhook-id'], eventId);
      verify(endpoint.secret, request);
    }
    await replay(handle, 'resend');
  });

  it('resends again under a key reused after its first use was purged, for the same event', async () => {
    const { tenant, scope, hooks, endpoint } = await subscribedTenant();
    const { eventId } = await transfer(tenant);
    const deps = { sql: appSql, temporal: env.client, logger: pino({ level: 'silent' }) };
    const resend = async () => {
      const started = await resendWebhookEvent(deps, scope, {
        endpointId: endpoint.id,
        eventId,
        idempotencyKey: await claimedKey(scope, 'resend-reused'),
      });
      const handle = env.client.workflow.getHandle<typeof webhookResendWorkflow>(started.workflowId);
      assert.deepEqual(await handle.result(), { kind: 'delivered', statusCode: 200 });
      return started;
    };
    const first = await resend();
    // The key's retention ended and the purge removed it; the client uses the same key again.
    await database.sql`
      delete from idempotency_keys where company_id = ${scope.companyId} and key = 'resend-reused'`;
    const second = await resend();
    assert.notEqual(second.workflowId, first.workflowId, 'a new claim of the key is a new resend');
    assert.notEqual(second.resendId, first.resendId);
    const manual = await database.sql<{ attempt_key: string }[]>`
      select attempt_key from webhook_attempts where endpoint_id = ${endpoint.id} and attempt_key like 'manual:%'`;
    assert.equal(new Set(manual.map((row) => row.attempt_key.split('#')[0])).size, 2, 'two manual attempts were made');
    assert.ok(hooks.received.length >= 2);
  });

  it('still delivers on schedule an event resent by hand before it was dispatched, when the resend failed', async () => {
    let down = true;
    const { tenant, scope, hooks, endpoint } = await subscribedTenant(() =>
      down ? { status: 503, body: 'down' } : { status: 200 },
    );
    const { eventId } = await transfer(tenant);
    // The resend creates the delivery before the dispatcher has seen the event.
    const deps = { sql: appSql, temporal: env.client, logger: pino({ level: 'silent' }) };
    const resend = await resendWebhookEvent(deps, scope, {
      endpointId: endpoint.id,
      eventId,
      idempotencyKey: await claimedKey(scope, 'resend-before-dispatch'),
    });
    const resendHandle = env.client.workflow.getHandle<typeof webhookResendWorkflow>(resend.workflowId);
    assert.equal((await resendHandle.result()).kind, 'failed');
    down = false;

    // The dispatcher still fans the event out to that delivery and starts its schedule.
    const handle = await dispatch(eventId, endpoint.id);
    assert.deepEqual(await handle.result(), { status: 'succeeded', attempts: 1 });
    const deliveries = await database.sql<{ id: string; status: string }[]>`
      select id, status from webhook_deliveries where event_id = ${eventId}`;
    assert.deepEqual(
      deliveries.map((row) => ({ ...row })),
      [{ id: resend.deliveryId, status: 'succeeded' }],
    );
    // The resend's tries failed (a retried try is a row of its own); then the scheduled attempt got through.
    const attempts = (await attemptsOf(tenant.companyId, endpoint.id)).reverse();
    assert.equal(attempts[0]!.trigger, 'manual');
    assert.ok(
      attempts.filter((attempt) => attempt.trigger === 'manual').every((attempt) => attempt.state === 'failed'),
    );
    assert.deepEqual([attempts.at(-1)!.trigger, attempts.at(-1)!.state], ['scheduled', 'succeeded']);
    assert.equal(hooks.received.at(-1)!.headers['webhook-id'], eventId);
  });

  it('sends nothing more on schedule for an event a resend delivered before it was dispatched', async () => {
    const { tenant, scope, hooks, endpoint } = await subscribedTenant();
    const { eventId } = await transfer(tenant);
    const deps = { sql: appSql, temporal: env.client, logger: pino({ level: 'silent' }) };
    const resend = await resendWebhookEvent(deps, scope, {
      endpointId: endpoint.id,
      eventId,
      idempotencyKey: await claimedKey(scope, 'resend-delivered-before-dispatch'),
    });
    assert.equal(
      (await env.client.workflow.getHandle<typeof webhookResendWorkflow>(resend.workflowId).result()).kind,
      'delivered',
    );
    const received = hooks.received.length;

    const handle = await dispatch(eventId, endpoint.id);
    assert.deepEqual(await handle.result(), { status: 'succeeded', attempts: 1 });
    assert.equal(hooks.received.length, received, 'the delivery had got through: no second request');
    const [delivery] = await database.sql<
      { status: string }[]
    >`select status from webhook_deliveries where event_id = ${eventId}`;
    assert.equal(delivery?.status, 'succeeded');
  });

  it('holds an endpoint to its in-flight limit', async () => {
    const { tenant, hooks, endpoint } = await subscribedTenant();
    // Ten leases held by attempts in flight for another delivery (the default limit): this one waits.
    // The blocker's event counts as dispatched, so the dispatcher starts no workflow for it.
    const blocker = await transfer(tenant);
    await database.sql`update events set dispatched_at = now() where id = ${blocker.eventId}`;
    const [delivery] = await database.sql<{ id: string }[]>`
      insert into webhook_deliveries (company_id, environment, event_id, endpoint_id)
      values (${tenant.companyId}, 'sandbox', ${blocker.eventId}, ${endpoint.id}) returning id`;
    await database.sql`
      insert into webhook_attempts (company_id, delivery_id, endpoint_id, event_id, attempt_key, trigger, url, lease_until)
      select ${tenant.companyId}, ${delivery!.id}, ${endpoint.id}, ${blocker.eventId}, 'blocker:' || n, 'scheduled', 'x',
             now() + interval '1500 milliseconds'
      from generate_series(1, 10) as n`;
    const { eventId } = await transfer(tenant);
    const handle = await dispatch(eventId, endpoint.id);
    // Real time passes until the leases expire (awaiting the result would skip time, and the
    // activity's retries with it, faster than the real clock the leases run on).
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    assert.deepEqual(await handle.result(), { status: 'succeeded', attempts: 1 });
    assert.equal(hooks.received.length, 1);
    const [lease] = await database.sql<{ until: Date }[]>`
      select max(lease_until) as until from webhook_attempts where attempt_key like 'blocker:%'`;
    assert.ok(hooks.received[0]!.receivedAt >= lease!.until.getTime() - 50, 'no request before a lease was free');
  });

  it('starts a delivery a dead dispatcher recorded but never started, on a later pass', async () => {
    const { tenant, scope, endpoint } = await subscribedTenant();
    const { eventId } = await transfer(tenant);
    // What a dispatcher that died between its commit and its starts leaves: delivery, outbox row, no run.
    const workflowId = webhookDeliveryWorkflowId(eventId, endpoint.id);
    await database.sql.begin(async (tx) => {
      await tx`update events set dispatched_at = now() where id = ${eventId}`;
      await tx`insert into webhook_deliveries (company_id, environment, event_id, endpoint_id) values (${tenant.companyId}, 'sandbox', ${eventId}, ${endpoint.id})`;
      await tx`
        insert into outbox (company_id, workflow_type, workflow_id, task_queue, payload, created_at)
        values (${tenant.companyId}, 'webhookDeliveryWorkflow', ${workflowId}, ${TASK_QUEUES.core},
                ${tx.json({ ...scope, eventId, endpointId: endpoint.id })}, now() - interval '10 seconds')`;
    });
    const pass = await dispatchWebhookEvents({ sql: database.sql, temporal: env.client }, { batchSize: 100 });
    assert.ok(pass.started >= 1);
    const handle = env.client.workflow.getHandle<typeof webhookDeliveryWorkflow>(workflowId);
    assert.deepEqual(await handle.result(), { status: 'succeeded', attempts: 1 });
    const [outbox] = await database.sql<
      { dispatched_at: Date | null }[]
    >`select dispatched_at from outbox where workflow_id = ${workflowId}`;
    assert.ok(outbox?.dispatched_at);
  });

  it('records a start Temporal refused on its outbox row, and restarts it on a pass that looks for stranded deliveries', async () => {
    const { tenant, endpoint } = await subscribedTenant();
    const { eventId } = await transfer(tenant);
    const workflowId = webhookDeliveryWorkflowId(eventId, endpoint.id);
    const refusing = {
      workflow: {
        start: async () => {
          throw new Error('Temporal is unavailable');
        },
      },
    } as unknown as Client;
    const outboxRow = async () => {
      const [row] = await database.sql<{ dispatched_at: Date | null; attempts: number; last_error: string | null }[]>`
        select dispatched_at, attempts, last_error from outbox where workflow_id = ${workflowId}`;
      return row;
    };

    const refused = await dispatchWebhookEvents({ sql: database.sql, temporal: refusing }, { batchSize: 100 });
    assert.ok(refused.deliveries >= 1 && refused.failed >= 1, JSON.stringify(refused));
    assert.deepEqual(
      { ...(await outboxRow()) },
      { dispatched_at: null, attempts: 1, last_error: 'Error: Temporal is unavailable' },
    );

    // Once it is old enough to count as stranded, a pass that does not look for stranded deliveries
    // leaves it; one that looks starts it, counted as a restart, not as a new delivery.
    await database.sql`update outbox set created_at = now() - interval '10 seconds' where workflow_id = ${workflowId}`;
    await dispatchWebhookEvents({ sql: database.sql, temporal: refusing }, { batchSize: 100, restartStranded: false });
    assert.equal((await outboxRow())?.attempts, 1);
    const pass = await dispatchWebhookEvents({ sql: database.sql, temporal: env.client }, { batchSize: 100 });
    assert.equal(pass.deliveries, 0);
    assert.ok(pass.restarted >= 1 && pass.started >= pass.restarted, JSON.stringify(pass));
    const handle = env.client.workflow.getHandle<typeof webhookDeliveryWorkflow>(workflowId);
    assert.deepEqual(await handle.result(), { status: 'succeeded', attempts: 1 });
    const row = await outboxRow();
    assert.ok(row?.dispatched_at);
    assert.equal(row.attempts, 2);
  });

  it('closes as lost only the earlier tries of the same attempt, never a resend running beside it', async () => {
    const tenant = await newTenant();
    const scope = { companyId: tenant.companyId, environment: 'sandbox' as const };
    const endpoint = await createWebhookEndpoint(appSql, scope, { url: 'http://127.0.0.1:9/never' }, POLICY);
    const { eventId } = await transfer(tenant);
    // A delivery with no workflow: its event counts as dispatched, so no later dispatch starts one.
    await database.sql`update events set dispatched_at = now() where id = ${eventId}`;
    const [delivery] = await database.sql<{ id: string }[]>`
      insert into webhook_deliveries (company_id, environment, event_id, endpoint_id)
      values (${tenant.companyId}, 'sandbox', ${eventId}, ${endpoint.id}) returning id`;
    const open = (attemptKey: string, supersedes: string) =>
      withSystemScope(database.sql, async (tx) => {
        await lockDeliveryContext(tx, eventId, endpoint.id); // as the activity does: the endpoint locked first
        return openAttempt(tx, {
          deliveryId: delivery!.id,
          companyId: tenant.companyId,
          endpointId: endpoint.id,
          eventId,
          attemptKey,
          supersedes,
          trigger: 'scheduled',
          url: endpoint.url,
          leaseMs: 60_000,
          maxInFlight: 10,
        });
      });
    await open('scheduled:2#1', 'scheduled:2');
    await open('manual:rs_1#1', 'manual:rs_1');
    const retry = await open('scheduled:2#2', 'scheduled:2');
    assert.notEqual(retry, 'busy');
    const again = await open('scheduled:2#2', 'scheduled:2');
    assert.deepEqual(again, retry, 'the same key opens the same attempt');
    const states = await database.sql<{ attempt_key: string; state: string }[]>`
      select attempt_key, state from webhook_attempts where delivery_id = ${delivery!.id} order by attempt_key`;
    assert.deepEqual(
      states.map((row) => [row.attempt_key, row.state]),
      [
        ['manual:rs_1#1', 'in_flight'],
        ['scheduled:2#1', 'failed'],
        ['scheduled:2#2', 'in_flight'],
      ],
    );
  });

  /**
   * A database-level fault on `table`: rows matching `condition` (SQL over `new`) fail to be written,
   * `times` times, as during an outage (security definer: the worker's role need not see the sequence).
   */
  async function failWrites(
    name: string,
    table: string,
    condition: string,
    times: number,
  ): Promise<() => Promise<void>> {
    await database.sql.unsafe(`
      create sequence ${name}_seq;
      create function ${name}() returns trigger language plpgsql security definer as $$
      begin
        if (${condition}) and nextval('${name}_seq') <= ${times} then
          raise exception 'injected: the database is unavailable' using errcode = '57P01';
        end if;
        return new;
      end $$;
      create trigger ${name} before update on ${table} for each row execute function ${name}();`);
    return async () => {
      await database.sql.unsafe(
        `drop trigger ${name} on ${table}; drop function ${name}(); drop sequence ${name}_seq;`,
      );
    };
  }

  it('concludes an exhausted delivery however long the database stays unavailable (more than the 30 tries of ~2 h)', async () => {
    const { tenant, scope, hooks, endpoint } = await subscribedTenant(() => ({ status: 503 }));
    const { eventId } = await transfer(tenant);
    const heal = await failWrites(
      'fault_conclude',
      'webhook_deliveries',
      `new.event_id = '${eventId}' and new.status = 'failed'`,
      40,
    );
    try {
      const handle = await dispatch(eventId, endpoint.id);
      assert.deepEqual(await handle.result(), { status: 'failed', attempts: 8, endpointDisabled: true });
    } finally {
      await heal();
    }
    assert.equal(hooks.received.length, 8);
    const [delivery] = await database.sql<
      { status: string }[]
    >`select status from webhook_deliveries where event_id = ${eventId}`;
    assert.equal(delivery?.status, 'failed');
    const current = await withTenant(database.sql, tenant.companyId, (tx) =>
      findWebhookEndpoint(tx, scope, endpoint.id),
    );
    assert.equal(current?.status, 'disabled');
  });

  it('records as succeeded a last attempt answered 2xx whose closing write failed for longer than 12 tries, and disables nothing', async () => {
    const { tenant, scope, hooks, endpoint } = await subscribedTenant((_request, index) =>
      index < 7 ? { status: 503 } : { status: 200 },
    );
    const { eventId } = await transfer(tenant);
    const heal = await failWrites(
      'fault_close',
      'webhook_attempts',
      `new.event_id = '${eventId}' and new.state = 'succeeded'`,
      15,
    );
    try {
      const handle = await dispatch(eventId, endpoint.id);
      assert.deepEqual(await handle.result(), { status: 'succeeded', attempts: 8 });
    } finally {
      await heal();
    }
    // The 2xx was sent again (at least once, same webhook-id) until it could be recorded.
    assert.ok(hooks.received.length > 8);
    for (const request of hooks.received) assert.equal(request.headers['webhook-id'], eventId);
    const [delivery] = await database.sql<
      { status: string }[]
    >`select status from webhook_deliveries where event_id = ${eventId}`;
    assert.equal(delivery?.status, 'succeeded');
    const current = await withTenant(database.sql, tenant.companyId, (tx) =>
      findWebhookEndpoint(tx, scope, endpoint.id),
    );
    assert.equal(current?.status, 'enabled');
    const open = await database.sql`select 1 from webhook_attempts where event_id = ${eventId} and state = 'in_flight'`;
    assert.equal(open.length, 0, 'no attempt is left in flight');
  });

  it('cancels a delivery whose payload is over the size limit, recording why', async () => {
    const { tenant, hooks, endpoint } = await subscribedTenant();
    // A stored event whose object is larger than the worker's 64 KiB limit.
    const { eventId } = await transfer(tenant);
    await database.sql`alter table events disable trigger events_guard`;
    await database.sql`
      update events set snapshot = jsonb_set(snapshot, '{currency}', to_jsonb(repeat('X', 70000))) where id = ${eventId}`;
    await database.sql`alter table events enable trigger events_guard`;
    const handle = await dispatch(eventId, endpoint.id);
    assert.deepEqual(await handle.result(), { status: 'canceled', attempts: 1 });
    assert.equal(hooks.received.length, 0);
    const [attempt] = await attemptsOf(tenant.companyId, endpoint.id);
    assert.match(attempt?.error ?? '', /exceeds the 65536-byte limit/);
  });
});

describe('webhook delivery histories', () => {
  it('replays every recorded history without non-determinism', async () => {
    const files = (await readdir(HISTORIES_DIR)).filter((file) => file.startsWith(HISTORY_PREFIX)).sort();
    assert.deepEqual(
      files,
      RECORDED_PATHS.map((path) => `${HISTORY_PREFIX}${path}.history.json`).sort(),
      'one recorded history per main path (record them with UPDATE_HISTORIES=1)',
    );
    for (const file of files) {
      const history = historyFromJSON(JSON.parse(await readFile(join(HISTORIES_DIR, file), 'utf8')));
      await Worker.runReplayHistory({ workflowBundle: await testWorkflowBundle() }, history, `recorded/${file}`);
    }
  });
});
