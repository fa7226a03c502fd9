// `npm run bench:webhooks`: webhook deliveries per second end to end on this machine. One durable
// embedded PostgreSQL, one Temporal dev server (SQLite), the real worker process (`workers/main.ts`:
// dispatcher loop + delivery workflows + attempt activity) and local receivers that answer 200 at
// once. Each scenario creates K events (ledger transfers) as fast as it can and measures from the
// first event's commit until the receivers have every one. Beside it, on the same Temporal server,
// the bare ceiling: K trivial workflows (one local activity each) started at once and awaited.
// Writes bench/webhooks-results.md; everything started here is stopped here.
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { cpus, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client, Connection, type WorkflowHandle } from '@temporalio/client';
import { APP_ROLE, createSql, type Sql } from '../db/client.ts';
import { startEmbeddedPostgres, type EmbeddedPostgresHandle } from '../db/embedded.ts';
import { migrate } from '../db/migrate.ts';
import { startService, stopService, type ServiceProcess } from '../platform/services.ts';
import type { DevServerHandle } from '../platform/temporal-dev-server.ts';
import { startScratchDevServer } from '../test-support/dev-server.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { openFundedSandboxAccounts } from '../services/sandbox.ts';
import { provisionTenant } from '../services/tenants.ts';
import { createLedgerTransfer } from '../services/transfers.ts';
import { createWebhookEndpoint } from '../services/webhook-endpoints.ts';
import { freePort } from '../test-support/ports.ts';
import { waitFor } from '../test-support/wait.ts';
import { startWebhookReceiver, type WebhookReceiver } from '../test-support/webhook-receiver.ts';
import { loadWorkflowBundle } from '../workers/bundle.ts';
import { BENCH_TASK_QUEUE, summarize, undispatchedEvents, type LatencySummary } from './types.ts';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..');

/** Scenarios: K events, spread over this many endpoints (one company each, so each event goes to one endpoint). */
const SCENARIOS = (process.env.BENCH_WEBHOOK_SCENARIOS ?? '500x1,500x10,2000x1,2000x10').split(',').map((spec) => {
  const [events, endpoints] = spec.split('x').map(Number);
  return { events: events!, endpoints: endpoints! };
});
/** Concurrent transfer creators (each its own connection from the pool). */
const CREATE_CONCURRENCY = 16;
/** Source/destination accounts per company: transfers between few accounts would queue on row locks. */
const ACCOUNTS_PER_COMPANY = 16;
/** Starts in flight at once for the ceiling (the dispatcher starts a batch of up to 100 at once). */
const CEILING_START_CONCURRENCY = 100;
/** A scenario that has not drained by then is reported as such. */
const DRAIN_TIMEOUT_MS = 600_000;
/** The setup's own events (funding) must be dispatched by then (else the worker is stuck or dead). */
const SETUP_DISPATCH_TIMEOUT_MS = 120_000;

const startedAt = Date.now();
const log = (line: string) => console.error(`[bench:webhooks +${((Date.now() - startedAt) / 1000).toFixed(1)}s] ${line}`);
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------------------------
// Child processes

const children: ServiceProcess<unknown>[] = [];

/** Forks a TypeScript file (output kept for errors), and waits for its { type: 'ready' } message. */
async function forkReady(name: string, script: string, env: NodeJS.ProcessEnv, timeoutMs = 180_000): Promise<ServiceProcess<unknown>> {
  const child = startService({ name, script: join(root, script), cwd: root, env, detached: false, readyTimeoutMs: timeoutMs, captureOutput: true });
  children.push(child);
  await child.ready;
  return child;
}

const stopChild = (child: ServiceProcess<unknown>) => stopService(child, { signal: 'SIGTERM', timeoutMs: 15_000 });

// ---------------------------------------------------------------------------------------------
// Measures

interface CeilingFigure {
  workflows: number;
  seconds: number;
  perSecond: number;
  latency: LatencySummary;
}

/**
 * K bare workflows (one local activity) started at once (CEILING_START_CONCURRENCY starts in flight),
 * awaited: the Temporal dev server's ceiling. Results are awaited CEILING_START_CONCURRENCY at a time
 * (thousands of long polls at once exceed the dev server's poller limit), so each workflow's latency
 * is its own start → close time as the server recorded it, read back from visibility.
 */
async function ceiling(client: Client, count: number, label: string): Promise<CeilingFigure> {
  const prefix = `bench-webhooks-ceiling-${label}-`;
  const t0 = Date.now();
  let nextStart = 0;
  const handles: WorkflowHandle[] = [];
  await Promise.all(
    Array.from({ length: CEILING_START_CONCURRENCY }, async () => {
      while (nextStart < count) {
        const index = nextStart++;
        handles.push(await client.workflow.start('benchWorkflow', { workflowId: `${prefix}${index}`, taskQueue: BENCH_TASK_QUEUE, args: [String(index)] }));
      }
    }),
  );
  let nextResult = 0;
  await Promise.all(
    Array.from({ length: CEILING_START_CONCURRENCY }, async () => {
      while (nextResult < handles.length) await handles[nextResult++]!.result();
    }),
  );
  const latencies: number[] = [];
  let lastClose = 0;
  for (let tries = 0; tries < 100 && latencies.length < count; tries++) {
    latencies.length = 0;
    for await (const execution of client.workflow.list({ query: `WorkflowType = 'benchWorkflow' AND ExecutionStatus = 'Completed'` })) {
      if (!execution.workflowId.startsWith(prefix) || !execution.closeTime) continue;
      latencies.push(execution.closeTime.getTime() - execution.startTime.getTime());
      lastClose = Math.max(lastClose, execution.closeTime.getTime());
    }
    if (latencies.length < count) await sleep(200);
  }
  const seconds = (lastClose - t0) / 1000;
  return { workflows: count, seconds, perSecond: count / seconds, latency: summarize(latencies) };
}

interface Company {
  companyId: string;
  accounts: string[];
  endpointId: string;
  receiver: WebhookReceiver;
}

interface ScenarioFigure {
  events: number;
  endpoints: number;
  createSeconds: number;
  createPerSecond: number;
  deliverSeconds: number;
  perSecond: number;
  /** received − event created_at, first receipt of each event */
  latency: LatencySummary;
  /** delivery row created − event created_at: the dispatcher's polling and batching */
  dispatch: LatencySummary;
  /** first attempt opened − delivery created: workflow start, first workflow task, activity scheduled and picked up, context read, attempt row */
  toAttempt: LatencySummary;
  /** received − first attempt opened: render, sign, HTTP */
  http: LatencySummary;
  /** from the first commit until no delivery workflow of the scenario is running (seconds) */
  workflowsClosedSeconds: number | undefined;
  activityAttemptsPerDelivery: number;
  duplicates: number;
}

async function setUpCompanies(ownerSql: Sql, count: number, label: string): Promise<Company[]> {
  const companies: Company[] = [];
  for (let index = 0; index < count; index++) {
    const tenant = await provisionTenant(ownerSql, { name: `Bench hooks ${label} ${index}`, ownerEmail: `bench-hooks-${label}-${index}-${Date.now()}@example.com` }, SYSTEM_ACTOR);
    const companyId = tenant.company.id;
    const extra = await openFundedSandboxAccounts(ownerSql, companyId, {
      count: ACCOUNTS_PER_COMPANY,
      amountMinor: 1_000_000_000n,
      currency: 'USD',
      namePrefix: 'Bench',
    });
    const receiver = await startWebhookReceiver(() => ({ status: 200, body: 'ok' }));
    const endpoint = await createWebhookEndpoint(ownerSql, { companyId, environment: 'sandbox' }, { url: receiver.url }, { allowPrivateUrls: true, maxEndpoints: 16 });
    companies.push({ companyId, accounts: extra, endpointId: endpoint.id, receiver });
  }
  return companies;
}

async function scenario(ownerSql: Sql, appSql: Sql, client: Client, events: number, endpoints: number, label: string): Promise<ScenarioFigure> {
  const companies = await setUpCompanies(ownerSql, endpoints, label);
  // The setup's own events (funding) are dispatched (to no endpoint) before the clock starts.
  await waitFor("the worker to dispatch the setup's events", async () => (await undispatchedEvents(ownerSql)) === 0, SETUP_DISPATCH_TIMEOUT_MS);
  const companyIds = companies.map((company) => company.companyId);

  // ---- K transfers, as fast as possible, round-robin over the companies and their accounts.
  let next = 0;
  const createStart = Date.now();
  await Promise.all(
    Array.from({ length: CREATE_CONCURRENCY }, async () => {
      while (next < events) {
        const index = next++;
        const company = companies[index % companies.length]!;
        const turn = Math.floor(index / companies.length);
        const source = company.accounts[turn % company.accounts.length]!;
        const destination = company.accounts[(turn + 1) % company.accounts.length]!;
        await createLedgerTransfer(
          appSql,
          { companyId: company.companyId, environment: 'sandbox' },
          { amount: 1n, currency: 'USD', source, destination },
          `bench-hooks-${label}-${index}`,
        );
      }
    }),
  );
  const createSeconds = (Date.now() - createStart) / 1000;

  // ---- Until every event has reached its endpoint.
  const eventRows = await ownerSql<{ id: string; created_at: Date }[]>`
    select id, created_at from events where company_id = any (${companyIds}::text[]) and object_type = 'transfer'
      and created_at >= (select max(created_at) from webhook_endpoints where company_id = any (${companyIds}::text[]))`;
  if (eventRows.length !== events) throw new Error(`expected ${events} events, found ${eventRows.length}`);
  const createdAt = new Map(eventRows.map((row) => [row.id, row.created_at.getTime()]));
  const firstReceived = new Map<string, number>();
  const collect = () => {
    for (const company of companies) {
      for (const request of company.receiver.received) {
        const id = request.headers['webhook-id'];
        if (id && createdAt.has(id) && !firstReceived.has(id)) firstReceived.set(id, request.receivedAt);
      }
    }
  };
  const deadline = Date.now() + DRAIN_TIMEOUT_MS;
  for (collect(); firstReceived.size < events; collect()) {
    if (Date.now() > deadline) throw new Error(`only ${firstReceived.size} of ${events} events received in ${DRAIN_TIMEOUT_MS} ms`);
    await sleep(20);
  }
  const firstCommit = Math.min(...createdAt.values());
  const lastReceived = Math.max(...firstReceived.values());
  const deliverSeconds = (lastReceived - firstCommit) / 1000;

  // ---- Until every delivery workflow of the scenario has closed (the run's tail after the last request).
  let workflowsClosedSeconds: number | undefined;
  const closeDeadline = Date.now() + 120_000;
  while (Date.now() < closeDeadline) {
    const query = `WorkflowType = 'webhookDeliveryWorkflow' AND ExecutionStatus = 'Running' AND CompanyId IN (${companyIds.map((id) => `'${id}'`).join(', ')})`;
    const { count } = await client.workflow.count(query);
    if (count === 0) {
      workflowsClosedSeconds = (Date.now() - firstCommit) / 1000;
      break;
    }
    await sleep(100);
  }

  // ---- Where the time went, from the rows.
  const rows = await ownerSql<{ event_id: string; event_at: Date; delivery_at: Date; attempt_at: Date | null; attempts: number }[]>`
    select e.id as event_id, e.created_at as event_at, d.created_at as delivery_at,
           (select min(a.started_at) from webhook_attempts a where a.delivery_id = d.id) as attempt_at,
           (select count(*)::int from webhook_attempts a where a.delivery_id = d.id) as attempts
    from webhook_deliveries d join events e on e.id = d.event_id
    where d.company_id = any (${companyIds}::text[])`;
  const dispatch: number[] = [];
  const toAttempt: number[] = [];
  const http: number[] = [];
  for (const row of rows) {
    dispatch.push(row.delivery_at.getTime() - row.event_at.getTime());
    if (row.attempt_at) {
      toAttempt.push(row.attempt_at.getTime() - row.delivery_at.getTime());
      http.push(firstReceived.get(row.event_id)! - row.attempt_at.getTime());
    }
  }
  const requests = companies.reduce((sum, company) => sum + company.receiver.received.length, 0);
  const [attemptCount] = await ownerSql<{ count: number }[]>`select count(*)::int as count from webhook_attempts where company_id = any (${companyIds}::text[])`;
  await Promise.all(companies.map((company) => company.receiver.close()));
  return {
    events,
    endpoints,
    createSeconds,
    createPerSecond: events / createSeconds,
    deliverSeconds,
    perSecond: events / deliverSeconds,
    latency: summarize([...firstReceived].map(([id, at]) => at - createdAt.get(id)!)),
    dispatch: summarize(dispatch),
    toAttempt: summarize(toAttempt),
    http: summarize(http),
    workflowsClosedSeconds,
    activityAttemptsPerDelivery: attemptCount!.count / rows.length,
    duplicates: requests - events,
  };
}

// ---------------------------------------------------------------------------------------------
// Report

const f0 = (value: number) => value.toFixed(0);
const f1 = (value: number) => value.toFixed(1);

function table(figures: ScenarioFigure[], ceilings: Map<number, CeilingFigure>): string {
  const lines = [
    '| Measure | K | endpoints | per s | p50 ms | p99 ms | wall s | ratio to ceiling |',
    '|---|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const [count, figure] of [...ceilings].sort((a, b) => a[0] - b[0])) {
    lines.push(`| Temporal ceiling: start K bare workflows (1 local activity) at once, until the last closes (close − start) | ${count} | – | ${f0(figure.perSecond)} | ${f0(figure.latency.p50Ms)} | ${f0(figure.latency.p99Ms)} | ${f1(figure.seconds)} | |`);
  }
  for (const figure of figures) {
    const ceilingFigure = ceilings.get(figure.events);
    lines.push(
      `| Webhooks: first commit → receiver has every event (received − created_at) | ${figure.events} | ${figure.endpoints} | ${f0(figure.perSecond)} | ${f0(figure.latency.p50Ms)} | ${f0(figure.latency.p99Ms)} | ${f1(figure.deliverSeconds)} | ${ceilingFigure ? `${(figure.perSecond / ceilingFigure.perSecond).toFixed(2)} ×` : ''} |`,
    );
  }
  return lines.join('\n');
}

function breakdown(figures: ScenarioFigure[]): string {
  const lines = [
    '| K × endpoints | events created per s | dispatch p50 / p99 ms | → first attempt p50 / p99 ms | HTTP p50 / p99 ms | all workflows closed s | activity attempts per delivery | duplicate requests |',
    '|---|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const figure of figures) {
    lines.push(
      `| ${figure.events} × ${figure.endpoints} | ${f0(figure.createPerSecond)} | ${f0(figure.dispatch.p50Ms)} / ${f0(figure.dispatch.p99Ms)} | ${f0(figure.toAttempt.p50Ms)} / ${f0(figure.toAttempt.p99Ms)} | ${f0(figure.http.p50Ms)} / ${f0(figure.http.p99Ms)} | ${figure.workflowsClosedSeconds === undefined ? 'not within 120 s' : f1(figure.workflowsClosedSeconds)} | ${figure.activityAttemptsPerDelivery.toFixed(2)} | ${figure.duplicates} |`,
    );
  }
  return lines.join('\n');
}

// ---------------------------------------------------------------------------------------------
// The run

const dataDir = await mkdtemp(join(tmpdir(), 'payments-bench-webhooks-'));
await chmod(dataDir, 0o755);
let database: EmbeddedPostgresHandle | undefined;
let temporal: DevServerHandle | undefined;
let ownerSql: Sql | undefined;
let appSql: Sql | undefined;
let connection: Connection | undefined;
let exitCode = 0;
try {
  const [pgPort, temporalPort, uiPort] = await Promise.all([freePort(), freePort(), freePort()]);
  [database, temporal] = await Promise.all([
    // Durable (fsync on), as in production and as `npm run bench`.
    startEmbeddedPostgres({ dir: join(dataDir, 'postgres'), port: pgPort, database: 'payments' }),
    startScratchDevServer({
      dataDir: join(dataDir, 'temporal'),
      port: temporalPort,
      uiPort,
      readyTimeoutMs: 120_000,
    }),
    loadWorkflowBundle(join(dataDir, 'cache')),
  ]);
  ownerSql = createSql({ url: database.url, poolMax: 4, connectTimeoutS: 10, idleTimeoutS: 30, statementTimeoutMs: 60_000, applicationName: 'bench-webhooks' });
  await migrate(ownerSql);
  appSql = createSql({
    url: database.url,
    poolMax: CREATE_CONCURRENCY,
    connectTimeoutS: 10,
    idleTimeoutS: 30,
    statementTimeoutMs: 60_000,
    applicationName: 'bench-webhooks-app',
    role: APP_ROLE,
  });
  connection = await Connection.connect({ address: temporal.address });
  const client = new Client({ connection, namespace: 'default' });
  log(`PostgreSQL and Temporal ready; ${cpus().length} cores`);

  // ---- The ceiling first, alone on the machine.
  const ceilings = new Map<number, CeilingFigure>();
  const baselineWorker = await forkReady('baseline-worker', 'bench/baseline-worker.ts', { ...process.env, BENCH_TEMPORAL_ADDRESS: temporal.address });
  await ceiling(client, 50, 'warmup');
  for (const count of [...new Set(SCENARIOS.map((entry) => entry.events))].sort((a, b) => a - b)) {
    const figure = await ceiling(client, count, String(count));
    ceilings.set(count, figure);
    log(`ceiling K=${count}: ${f0(figure.perSecond)}/s, p50 ${f0(figure.latency.p50Ms)} ms, p99 ${f0(figure.latency.p99Ms)} ms`);
  }
  await stopChild(baselineWorker);

  // ---- The real worker: dispatcher loop, delivery workflows, attempt activity.
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    NODE_ENV: 'production',
    LOG_LEVEL: 'warn',
    DATA_DIR: dataDir,
    DATABASE_URL: database.url,
    TEMPORAL_ADDRESS: temporal.address,
    ALLOW_PRIVATE_WEBHOOK_URLS: '1',
  };
  const worker = await forkReady('worker', 'workers/main.ts', env);
  log('worker ready');
  // Warm-up: a few deliveries so the first scenario does not pay for JIT and connections.
  await scenario(ownerSql, appSql, client, 20, 1, 'warmup');
  const figures: ScenarioFigure[] = [];
  for (const [index, entry] of SCENARIOS.entries()) {
    const figure = await scenario(ownerSql, appSql, client, entry.events, entry.endpoints, `s${index}`);
    figures.push(figure);
    log(
      `K=${entry.events} × ${entry.endpoints} endpoints: ${f0(figure.perSecond)} deliveries/s, p50 ${f0(figure.latency.p50Ms)} ms, p99 ${f0(figure.latency.p99Ms)} ms (created at ${f0(figure.createPerSecond)}/s)`,
    );
  }
  await stopChild(worker);

  const summary = table(figures, ceilings);
  const details = breakdown(figures);
  console.log(`\n${summary}\n\n${details}\n`);
  const [cpu] = cpus();
  // The hand-written notes survive a re-run: everything from "## Notes" to "## Raw figures" is kept.
  const previous = await readFile(join(here, 'webhooks-results.md'), 'utf8').catch(() => '');
  const notes = /## Notes[\s\S]*?(?=\n## Raw figures)/.exec(previous)?.[0].trimEnd() ?? '## Notes\n\n(none yet)';
  await writeFile(
    join(here, 'webhooks-results.md'),
    [
      '# Webhook delivery benchmark',
      '',
      `\`npm run bench:webhooks\` on ${new Date().toISOString().slice(0, 10)}: ${cpus().length} cores (${cpu?.model ?? 'unknown CPU'}), Node ${process.version}; durable embedded PostgreSQL, Temporal dev server on SQLite, the real worker process (defaults: dispatcher poll 250 ms, batch 100, 10 in flight per endpoint, 100 concurrent activities), receivers on 127.0.0.1 answering 200 at once. K events = K ledger transfers created by ${CREATE_CONCURRENCY} concurrent callers; with 10 endpoints, 10 companies with one endpoint each, so every event has exactly one delivery. Latency = first receipt − event \`created_at\`; throughput = K / (last first-receipt − first event's \`created_at\`).`,
      '',
      summary,
      '',
      'Where the time goes (per delivery, from the rows: event `created_at` → delivery row `created_at` → first attempt row `started_at` → receipt):',
      '',
      details,
      '',
      notes,
      '',
      '## Raw figures',
      '',
      '```json',
      JSON.stringify({ ceilings: Object.fromEntries(ceilings), figures }, null, 2),
      '```',
      '',
    ].join('\n'),
  );
  log('wrote bench/webhooks-results.md');
} catch (error) {
  exitCode = 1;
  console.error(error);
  for (const child of children) console.error(`--- ${child.name}\n${child.tail()}`);
} finally {
  for (const child of children) await stopChild(child).catch(() => undefined);
  await connection?.close().catch(() => undefined);
  await appSql?.end({ timeout: 5 }).catch(() => undefined);
  await ownerSql?.end({ timeout: 5 }).catch(() => undefined);
  await temporal?.stop().catch(() => undefined);
  await database?.stop().catch(() => undefined);
  await rm(dataDir, { recursive: true, force: true });
}
process.exit(exitCode);
