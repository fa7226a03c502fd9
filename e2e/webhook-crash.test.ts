// Crash test for webhooks (issue 5): the real worker process (`workers/main.ts`) against a real
// Temporal dev server, SIGKILLed (its whole process group) once between the commit of events and
// their dispatch and twice while deliveries are in flight, restarted each time. Afterwards: no event
// lost (every one answered 200 by each endpoint), none delivered under an ID other than its own
// (every request verifies, and its webhook-id and body id are the event's ID), one delivery row per
// (event, endpoint), all succeeded, the dead workers' attempts closed as lost, no workflow running.
import assert from 'node:assert/strict';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { Client, Connection } from '@temporalio/client';
import { Webhook } from 'standardwebhooks';
import type { Sql } from '../db/client.ts';
import { descendants, killAndTrack, processAlive } from '../platform/processes.ts';
import { startService, type ServiceProcess } from '../platform/services.ts';
import type { DevServerHandle } from '../platform/temporal-dev-server.ts';
import { startScratchDevServer } from '../test-support/dev-server.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { provisionTenant } from '../services/tenants.ts';
import { createLedgerTransfer } from '../services/transfers.ts';
import { createWebhookEndpoint } from '../services/webhook-endpoints.ts';
import { createAppRoleSql, createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { testEnv } from '../test-support/env.ts';
import { freePort } from '../test-support/ports.ts';
import { waitFor } from '../test-support/wait.ts';
import { startWebhookReceiver, type ReceivedWebhook, type WebhookReceiver } from '../test-support/webhook-receiver.ts';
import { seedWorkflowBundleCache } from '../workers/bundle.ts';
import { webhookDeliveryWorkflowId } from '../workflows/shared/webhooks.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

/** Transfers (each writes at least one event) per phase: made while the worker is dead, then two in-flight rounds. */
const BATCH = { whileDead: 8, firstInFlight: 10, secondInFlight: 10 };
/** Everything must be delivered this long after the last restart. */
const SETTLE_DEADLINE_MS = 90_000;
/** Hung requests must still be out when the worker is killed: the attempt timeout never fires first. */
const ATTEMPT_TIMEOUT_MS = 30_000;
const WORKER_READY_TIMEOUT_MS = 60_000;

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** `workers/main.ts` in its own process group, so a kill takes tsx's helpers with it. */
class WorkerProcess {
  private process: ServiceProcess<unknown> | undefined;
  readonly pids = new Set<number>();
  kills = 0;

  constructor(private readonly env: NodeJS.ProcessEnv) {}

  tail(): string {
    return this.process?.tail(40) ?? '';
  }

  async start(): Promise<void> {
    this.process = startService({
      name: 'worker',
      script: join(root, 'workers/main.ts'),
      cwd: root,
      env: this.env,
      detached: true,
      readyTimeoutMs: WORKER_READY_TIMEOUT_MS,
      captureOutput: true,
    });
    if (this.process.child.pid) this.pids.add(this.process.child.pid);
    await this.process.ready;
  }

  /** SIGKILL to the whole process group; resolves once the worker itself is gone. */
  async kill(): Promise<void> {
    if (!this.process) return;
    const pids = await killAndTrack(this.process, { group: true });
    if (pids.length === 0) return;
    for (const pid of pids) this.pids.add(pid);
    this.kills += 1;
  }
}

/** The test runner's workflow bundle, in the worker's cache folder, so the worker does not run webpack. */
async function prepareBundle(dataDir: string): Promise<void> {
  await seedWorkflowBundleCache(join(dataDir, 'cache'), testEnv().TEST_WORKFLOW_BUNDLE_PATH);
}

interface Endpoint {
  id: string;
  secret: string;
  receiver: WebhookReceiver;
  /** Indexes (in receiver.received) of the requests answered 200. */
  answered: Set<number>;
}

describe('webhooks survive a worker killed mid-delivery (real worker process, Temporal dev server)', { timeout: 240_000 }, () => {
  let dataDir: string | undefined;
  let database: TestDatabase | undefined;
  let appSql: Sql | undefined;
  let temporal: DevServerHandle | undefined;
  let connection: Connection | undefined;
  let worker: WorkerProcess | undefined;
  const endpoints: Endpoint[] = [];
  const baseline = new Set(descendants(process.pid).map((child) => child.pid));

  before(async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'payments-webhook-crash-'));
    await chmod(dataDir, 0o755);
    const [temporalPort, uiPort] = await Promise.all([freePort(), freePort()]);
    [database, temporal] = await Promise.all([
      createTestDatabase(),
      startScratchDevServer({
        dataDir: join(dataDir, 'temporal'),
        port: temporalPort,
        uiPort,
        readyTimeoutMs: 60_000,
      }),
      prepareBundle(dataDir),
    ]);
    appSql = createAppRoleSql(database.url, { applicationName: 'webhook-crash-test', poolMax: 4 });
    connection = await Connection.connect({ address: temporal.address });
    const env: NodeJS.ProcessEnv = { ...process.env };
    for (const name of Object.keys(env)) if (name.startsWith('TEST_')) delete env[name];
    Object.assign(env, {
      NODE_ENV: 'test',
      LOG_LEVEL: 'warn',
      DATA_DIR: dataDir,
      DATABASE_URL: database.url,
      DATABASE_POOL_MAX: '10',
      TEMPORAL_ADDRESS: temporal.address,
      ALLOW_PRIVATE_WEBHOOK_URLS: '1',
      WEBHOOK_ATTEMPT_TIMEOUT_MS: String(ATTEMPT_TIMEOUT_MS),
      // Every delivery may be in flight at once: the kills, not the endpoint's limit, decide.
      WEBHOOK_MAX_IN_FLIGHT_PER_ENDPOINT: '100',
      WEBHOOK_DISPATCH_INTERVAL_MS: '250',
    });
    worker = new WorkerProcess(env);
  });

  after(async () => {
    await worker?.kill().catch(() => undefined);
    await connection?.close().catch(() => undefined);
    await temporal?.stop().catch(() => undefined);
    await Promise.all(endpoints.map((endpoint) => endpoint.receiver.close().catch(() => undefined)));
    await appSql?.end({ timeout: 5 }).catch(() => undefined);
    await database?.drop().catch(() => undefined);
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
    // Nothing this test started may outlive it (the killed workers' groups, the dev server).
    const leftovers = [...(worker?.pids ?? [])].filter(processAlive);
    for (const pid of leftovers) process.kill(pid, 'SIGKILL');
    assert.deepEqual(leftovers, [], 'no worker process left behind');
    const strays = descendants(process.pid).filter((child) => !baseline.has(child.pid));
    assert.deepEqual(strays, [], 'no process left behind');
  });

  it('loses no event and never delivers one under another ID', async (t) => {
    assert.ok(database && appSql && temporal && connection && worker);
    const sql = database.sql;
    const app = appSql;
    const proc = worker;
    const client = new Client({ connection });
    const startedAt = Date.now();
    const timeline: string[] = [];
    const mark = (what: string) => timeline.push(`+${((Date.now() - startedAt) / 1000).toFixed(1)}s ${what}`);

    const tenant = await provisionTenant(sql, { name: 'Webhook crash', ownerEmail: `webhook-crash-${Date.now()}@example.com` }, SYSTEM_ACTOR);
    const scope = { companyId: tenant.company.id, environment: 'sandbox' as const };
    let mode: 'hang' | 'ok' = 'hang';
    for (let index = 0; index < 2; index++) {
      const answered = new Set<number>();
      const receiver = await startWebhookReceiver((_request, requestIndex) => {
        if (mode === 'hang') return 'hang';
        answered.add(requestIndex);
        return { status: 200, body: 'ok' };
      });
      const endpoint = await createWebhookEndpoint(sql, scope, { url: receiver.url, description: `crash ${index}` }, { allowPrivateUrls: true, maxEndpoints: 16 });
      endpoints.push({ id: endpoint.id, secret: endpoint.secret, receiver, answered });
    }
    const endpointIds = endpoints.map((endpoint) => endpoint.id);

    let transferNumber = 0;
    const createTransfers = async (count: number) => {
      for (let index = 0; index < count; index++) {
        transferNumber += 1;
        await createLedgerTransfer(
          app,
          scope,
          { amount: 100n + BigInt(transferNumber), currency: 'USD', source: tenant.sandbox.usdWalletId, destination: tenant.sandbox.usdAccountId },
          `webhook-crash-${transferNumber}`,
        );
      }
    };
    /** The events the endpoints must get: everything the company wrote since they exist. */
    const ourEvents = async () =>
      (
        await sql<{ id: string; dispatched: boolean }[]>`
          select id, dispatched_at is not null as dispatched from events
          where company_id = ${scope.companyId} and created_at >= (select max(created_at) from webhook_endpoints where company_id = ${scope.companyId})
          order by id`
      ).map((row) => ({ id: row.id, dispatched: row.dispatched }));
    /** Deliveries of our events with no attempt in flight that a live worker opened after `since`. */
    const deliveriesNotInFlightSince = async (since: Date) =>
      (
        await sql<{ id: string }[]>`
          select d.id from webhook_deliveries d
          where d.company_id = ${scope.companyId} and d.status = 'pending'
            and not exists (select 1 from webhook_attempts a where a.delivery_id = d.id and a.state = 'in_flight' and a.started_at >= ${since})`
      ).length;
    /** Waits until every event is fanned out, every start handed to Temporal, and every delivery's request is out (and hanging). */
    const waitAllInFlight = async (since: Date, expectedEvents: number) => {
      await waitFor(
        `${expectedEvents} events dispatched, their workflows started and every delivery's request hanging`,
        async () => {
          const events = await ourEvents();
          if (events.length !== expectedEvents || events.some((event) => !event.dispatched)) return false;
          const [outbox] = await sql<{ stranded: number }[]>`
            select count(*)::int as stranded from outbox where company_id = ${scope.companyId} and dispatched_at is null`;
          if (outbox!.stranded > 0) return false;
          const [deliveries] = await sql<{ count: number }[]>`select count(*)::int as count from webhook_deliveries where company_id = ${scope.companyId}`;
          if (deliveries!.count !== expectedEvents * endpoints.length) return false;
          return (await deliveriesNotInFlightSince(since)) === 0;
        },
        45_000,
      );
    };

    // ---- Worker 1 runs; kill 1 happens with no delivery yet; events are committed while it is dead.
    await proc.start();
    mark('worker 1 ready');
    await proc.kill();
    mark('kill 1 (idle worker)');
    await createTransfers(BATCH.whileDead);
    const committed = await ourEvents();
    assert.ok(committed.length >= BATCH.whileDead, 'each transfer wrote an event');
    assert.ok(committed.every((event) => !event.dispatched), 'the events are committed and not dispatched');
    const eventsPerTransfer = committed.length / BATCH.whileDead;
    mark(`${committed.length} events committed while no worker runs`);

    // ---- Worker 2 dispatches them; with more events, every delivery hangs at the receiver; kill 2.
    let since = new Date();
    await proc.start();
    mark('worker 2 ready');
    await createTransfers(BATCH.firstInFlight);
    await waitAllInFlight(since, eventsPerTransfer * (BATCH.whileDead + BATCH.firstInFlight));
    mark('every delivery in flight');
    await proc.kill();
    mark('kill 2 (mid-delivery)');

    // ---- Worker 3: new events, and the retried attempts (same webhook-id) hang again; kill 3.
    since = new Date();
    await proc.start();
    mark('worker 3 ready');
    await createTransfers(BATCH.secondInFlight);
    const totalEvents = eventsPerTransfer * (BATCH.whileDead + BATCH.firstInFlight + BATCH.secondInFlight);
    await waitAllInFlight(since, totalEvents);
    mark('every delivery in flight again (retries included)');
    await proc.kill();
    mark('kill 3 (mid-delivery)');

    // ---- The receivers answer now; worker 4 must finish every delivery.
    mode = 'ok';
    await proc.start();
    const lastRestartAt = Date.now();
    mark('worker 4 ready; receivers answer 200');
    const eventIds = (await ourEvents()).map((event) => event.id);
    assert.equal(eventIds.length, totalEvents);
    await waitFor(
      'every delivery succeeded',
      async () => {
        const [row] = await sql<{ pending: number }[]>`
          select count(*)::int as pending from webhook_deliveries where company_id = ${scope.companyId} and status <> 'succeeded'`;
        return row!.pending === 0;
      },
      SETTLE_DEADLINE_MS,
    ).catch((error: unknown) => {
      throw new Error(`${String(error)}\n${timeline.join('\n')}\nworker output:\n${proc.tail()}`);
    });
    const settledMs = Date.now() - lastRestartAt;
    mark('every delivery succeeded');

    // ---- What the receivers got.
    const eventSet = new Set(eventIds);
    let requests = 0;
    let duplicates = 0;
    for (const endpoint of endpoints) {
      const webhook = new Webhook(endpoint.secret);
      const byEvent = new Map<string, number>();
      const answeredEvents = new Set<string>();
      endpoint.receiver.received.forEach((request: ReceivedWebhook, index) => {
        requests += 1;
        const id = request.headers['webhook-id'];
        assert.ok(id && eventSet.has(id), `request ${index} to ${endpoint.id} carries webhook-id ${id}, not one of the events`);
        const body = webhook.verify(request.body, request.headers) as { id: string };
        assert.equal(body.id, id, 'the body is the event its webhook-id names');
        byEvent.set(id, (byEvent.get(id) ?? 0) + 1);
        if (endpoint.answered.has(index)) answeredEvents.add(id);
      });
      const missing = eventIds.filter((id) => !answeredEvents.has(id));
      assert.deepEqual(missing, [], `${endpoint.id} got (and answered 200) every event`);
      for (const count of byEvent.values()) duplicates += count - 1;
    }

    // ---- What the database says.
    const deliveries = await sql<{ event_id: string; endpoint_id: string; status: string }[]>`
      select event_id, endpoint_id, status from webhook_deliveries where company_id = ${scope.companyId}`;
    assert.equal(deliveries.length, eventIds.length * endpoints.length, 'one delivery per (event, endpoint)');
    const pairs = new Set(deliveries.map((delivery) => `${delivery.event_id}|${delivery.endpoint_id}`));
    for (const eventId of eventIds) for (const endpointId of endpointIds) assert.ok(pairs.has(`${eventId}|${endpointId}`), `a delivery of ${eventId} to ${endpointId}`);
    assert.ok(deliveries.every((delivery) => delivery.status === 'succeeded'));
    const attempts = await sql<{ state: string; error: string | null; count: number }[]>`
      select state, error, count(*)::int as count from webhook_attempts where company_id = ${scope.companyId} group by state, error`;
    const count = (state: string, error?: string) =>
      attempts.filter((row) => row.state === state && (error === undefined || (row.error ?? '').startsWith(error))).reduce((sum, row) => sum + row.count, 0);
    assert.equal(count('in_flight'), 0, 'no attempt left in flight');
    const lost = count('failed', 'the worker was lost');
    assert.ok(lost >= eventIds.length * endpoints.length, 'every attempt the dead workers left in flight is closed as lost');
    assert.equal(count('failed') - lost, 0, 'no attempt failed for another reason');
    const perDelivery = await sql<{ succeeded: number }[]>`
      select count(*) filter (where a.state = 'succeeded')::int as succeeded
      from webhook_deliveries d left join webhook_attempts a on a.delivery_id = d.id
      where d.company_id = ${scope.companyId} group by d.id`;
    assert.ok(perDelivery.every((row) => row.succeeded >= 1), 'each delivery has its successful attempt');

    // ---- What Temporal says: every delivery workflow completes with success (the activity records the
    // success before the workflow hears of it, so this may trail the database by a moment).
    const describeAll = () =>
      Promise.all(
        eventIds.flatMap((eventId) =>
          endpointIds.map(async (endpointId) => {
            const handle = client.workflow.getHandle(webhookDeliveryWorkflowId(eventId, endpointId));
            const description = await handle.describe();
            const result = description.status.name === 'COMPLETED' ? ((await handle.result()) as { status: string }) : undefined;
            return { workflowId: handle.workflowId, status: description.status.name, result: result?.status };
          }),
        ),
      );
    let descriptions = await describeAll();
    const workflowsDeadline = lastRestartAt + SETTLE_DEADLINE_MS;
    while (descriptions.some((description) => description.status === 'RUNNING') && Date.now() < workflowsDeadline) {
      await sleep(250);
      descriptions = await describeAll();
    }
    const workflowsDoneMs = Date.now() - lastRestartAt;
    mark('every delivery workflow closed');
    assert.deepEqual(
      descriptions.filter((description) => description.status !== 'COMPLETED' || description.result !== 'succeeded'),
      [],
      'every delivery workflow completed, succeeded',
    );

    t.diagnostic(
      JSON.stringify({
        events: eventIds.length,
        deliveries: deliveries.length,
        kills: proc.kills,
        requests,
        duplicatesSameId: duplicates,
        attemptsLostClosed: lost,
        lastRestartToAllSucceededMs: settledMs,
        lastRestartToAllWorkflowsClosedMs: workflowsDoneMs,
        totalMs: Date.now() - startedAt,
      }),
    );
    t.diagnostic(timeline.join(' | '));
    assert.equal(proc.kills, 3);
  });
});
