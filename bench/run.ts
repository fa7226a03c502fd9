// `npm run bench`: Shape B and Shape A throughput and latency of the real API, beside ceilings
// measured in the same run on the same database and Temporal server (see README, "Benchmark"):
// pgbench running the transfer's SQL as one statement, a bare Koa + postgres.js route running it,
// and a bare update-with-start workflow with one local activity. One embedded PostgreSQL (durable:
// fsync on, as in production) and one Temporal dev server; everything started here is stopped here.
import { execFile, fork, type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { cpus, totalmem, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Client, Connection, WithStartWorkflowOperation } from '@temporalio/client';
import { WorkflowIdConflictPolicy } from '@temporalio/common';
import { descendants } from '../platform/processes.ts';
import { freePort } from '../test-support/ports.ts';
import { createSql, type Sql } from '../db/client.ts';
import { startEmbeddedPostgres, type EmbeddedPostgresHandle } from '../db/embedded.ts';
import { migrate } from '../db/migrate.ts';
import { resolveTemporalCli } from '../platform/temporal.ts';
import { startTemporalDevServer, type DevServerHandle } from '../platform/temporal-dev-server.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { provisionTenant } from '../services/tenants.ts';
import { loadWorkflowBundle } from '../workers/bundle.ts';
import { SEARCH_ATTRIBUTE_FLAGS } from '../workflows/shared/search-attributes.ts';
import { benchAwaitUpdate } from './baseline-workflow.ts';
import { pgbenchScript } from './transfer-sql.ts';
import { BENCH_TASK_QUEUE, summarize, type LatencySummary, type LoadPlan, type LoadResult } from './types.ts';
import { openFundedSandboxAccounts } from '../services/sandbox.ts';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..');
const TSX = import.meta.resolve('tsx');
const run = promisify(execFile);

const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 32);
const PHASE_MS = Number(process.env.BENCH_PHASE_MS ?? 10_000);
const WARMUP_MS = Number(process.env.BENCH_WARMUP_MS ?? 2_000);
const ACCOUNTS = 200;
const HOT_ACCOUNTS = 10;
const FUNDING_MINOR = 1_000_000_000_000n; // 10 billion USD each: no phase can drain one
const DATABASE = 'payments';
const USER = 'postgres';

const log = (line: string) => console.error(`[bench +${((Date.now() - startedAt) / 1000).toFixed(1)}s] ${line}`);
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const startedAt = Date.now();

// ---------------------------------------------------------------------------------------------
// Child processes

interface Child {
  name: string;
  process: ChildProcess;
  output: string[];
}

const children: Child[] = [];

/** Forks a TypeScript file with IPC and waits for its { type: 'ready' } message. */
async function forkReady(
  name: string,
  script: string,
  env: NodeJS.ProcessEnv,
  timeoutMs = 180_000,
): Promise<{ child: Child; ready: Record<string, unknown> }> {
  const process_ = fork(join(root, script), [], {
    cwd: root,
    env,
    execArgv: ['--import', TSX],
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  const child: Child = { name, process: process_, output: [] };
  children.push(child);
  const keep = (chunk: Buffer) => {
    for (const line of chunk.toString('utf8').split('\n')) if (line.trim()) child.output.push(line);
    if (child.output.length > 200) child.output.splice(0, child.output.length - 100);
  };
  process_.stdout?.on('data', keep);
  process_.stderr?.on('data', keep);
  const ready = await new Promise<Record<string, unknown>>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${name} not ready in ${timeoutMs} ms:\n${tail(child)}`)),
      timeoutMs,
    );
    process_.on('message', (message: Record<string, unknown>) => {
      if (message.type === 'ready') {
        clearTimeout(timer);
        resolve(message);
      }
    });
    process_.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited before ready (${code ?? signal}):\n${tail(child)}`));
    });
  });
  return { child, ready };
}

const tail = (child: Child) => child.output.slice(-30).join('\n');

async function stopChild(child: Child): Promise<void> {
  const process_ = child.process;
  if (process_.exitCode !== null || process_.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => process_.once('exit', () => resolve()));
  process_.kill('SIGTERM');
  const timer = setTimeout(() => process_.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
}

/** Runs one load plan in a fresh generator process (its own event loop). */
async function load(plan: LoadPlan): Promise<LoadResult> {
  const { child } = await forkReady(`load-${plan.mode}`, 'bench/load.ts', { ...process.env }, 60_000);
  try {
    return await new Promise<LoadResult>((resolve, reject) => {
      child.process.on('message', (message: { type: string; result?: LoadResult; error?: string }) => {
        if (message.type === 'result' && message.result) resolve(message.result);
        if (message.type === 'error') reject(new Error(`load generator: ${message.error}`));
      });
      child.process.once('exit', (code) => reject(new Error(`load generator exited (${code}):\n${tail(child)}`)));
      child.process.send(plan);
    });
  } finally {
    await stopChild(child);
  }
}

// ---------------------------------------------------------------------------------------------
// Results

interface Figure {
  name: string;
  throughput: number;
  latency: LatencySummary;
  errors: number;
  note?: string;
}

function figureOf(name: string, result: LoadResult, note?: string): Figure {
  const errors = result.completed - result.ok + result.networkErrors;
  return { name, throughput: result.throughput, latency: result.latency, errors, ...(note ? { note } : {}) };
}

/** pgbench: tps from its summary, latency percentiles from its per-transaction log. */
async function pgbench(
  name: string,
  database: { port: number; password: string },
  script: string,
  dir: string,
): Promise<Figure & { raw: string }> {
  const file = join(dir, `${name}.sql`);
  await writeFile(file, script);
  const logDir = join(dir, `log-${name}`);
  await run('mkdir', ['-p', logDir]);
  const args = [
    '-n',
    '-M',
    'prepared',
    '-c',
    String(CONCURRENCY),
    '-j',
    '2',
    '-T',
    String(Math.round(PHASE_MS / 1000)),
    '-f',
    file,
    '-l',
    '--log-prefix',
    join(logDir, 'pgbench'),
    '-h',
    '127.0.0.1',
    '-p',
    String(database.port),
    '-U',
    USER,
    DATABASE,
  ];
  const { stdout, stderr } = await run(process.env.PGBENCH ?? '/usr/bin/pgbench', args, {
    env: { ...process.env, PGPASSWORD: database.password },
    maxBuffer: 16 * 1024 * 1024,
  });
  const raw = `${stdout}\n${stderr}`;
  const tps = Number(/tps = ([\d.]+) \(without initial connection time\)/.exec(raw)?.[1] ?? NaN);
  const failed = Number(/number of failed transactions: (\d+)/.exec(raw)?.[1] ?? 0);
  const latencies: number[] = [];
  for (const entry of await readdir(logDir)) {
    for (const line of (await readFile(join(logDir, entry), 'utf8')).split('\n')) {
      const fields = line.trim().split(/\s+/);
      if (fields.length >= 3) latencies.push(Number(fields[2]) / 1000);
    }
  }
  return { name, throughput: tps, latency: summarize(latencies), errors: failed, raw };
}

// ---------------------------------------------------------------------------------------------
// Temporal baseline: update-with-start of a one-local-activity workflow, closed loop.

async function temporalBaseline(address: string): Promise<Figure> {
  const connection = await Connection.connect({ address });
  const client = new Client({ connection, namespace: 'default' });
  const runId = Math.random().toString(16).slice(2, 10);
  let counter = 0;
  const latencies: number[] = [];
  let ok = 0;
  let errors = 0;
  const sampleErrors: string[] = [];
  const t = performance.now();
  const measureFrom = t + WARMUP_MS;
  const end = measureFrom + PHASE_MS;
  const worker = async () => {
    while (performance.now() < end) {
      const id = `bench-${runId}-${++counter}`;
      const t0 = performance.now();
      try {
        await client.workflow.executeUpdateWithStart(benchAwaitUpdate, {
          startWorkflowOperation: new WithStartWorkflowOperation('benchWorkflow', {
            workflowId: id,
            taskQueue: BENCH_TASK_QUEUE,
            args: [id],
            workflowIdConflictPolicy: WorkflowIdConflictPolicy.USE_EXISTING,
          }),
        });
        if (t0 >= measureFrom) {
          ok++;
          latencies.push(performance.now() - t0);
        }
      } catch (error) {
        if (t0 >= measureFrom) errors++;
        if (sampleErrors.length < 3) sampleErrors.push(String(error));
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, () => worker()));
  const measuredMs = performance.now() - measureFrom;
  await connection.close();
  if (sampleErrors.length > 0) log(`temporal baseline errors: ${sampleErrors.join(' | ')}`);
  return {
    name: 'Temporal: bare update-with-start, 1 local activity',
    throughput: (ok * 1000) / measuredMs,
    latency: summarize(latencies),
    errors,
  };
}

// ---------------------------------------------------------------------------------------------

interface StatementStat {
  calls: number;
  meanMs: number;
  query: string;
}

async function main(): Promise<void> {
  const dataDir = await mkdtemp(join(tmpdir(), 'payments-bench-'));
  await chmod(dataDir, 0o755);
  const baseline = new Set(descendants(process.pid).map((entry) => entry.pid));
  let database: EmbeddedPostgresHandle | undefined;
  let temporal: DevServerHandle | undefined;
  let ownerSql: Sql | undefined;
  const results: Record<string, unknown> = {};
  const figures: Record<string, Figure> = {};
  try {
    const [pgPort, temporalPort, uiPort, apiPort] = await Promise.all([freePort(), freePort(), freePort(), freePort()]);
    const pgDir = join(dataDir, 'postgres');
    const pgOptions = { dir: pgDir, port: pgPort, database: DATABASE, onLog: () => undefined };
    const [db, dev] = await Promise.all([
      (async () => {
        // Durable, as production (no `ephemeral`); restarted once to load pg_stat_statements.
        const first = await startEmbeddedPostgres(pgOptions);
        const admin = createSql({
          url: first.url,
          poolMax: 1,
          connectTimeoutS: 10,
          idleTimeoutS: 5,
          statementTimeoutMs: 30_000,
          applicationName: 'bench',
        });
        await admin`alter system set shared_preload_libraries = 'pg_stat_statements'`;
        await admin.end({ timeout: 5 });
        await first.stop();
        return startEmbeddedPostgres(pgOptions);
      })(),
      startTemporalDevServer({
        cliPath: resolveTemporalCli({ TEMPORAL_CLI_PATH: process.env.TEMPORAL_CLI_PATH }, process.env.PATH),
        dataDir: join(dataDir, 'temporal'),
        port: temporalPort,
        uiPort,
        namespace: 'default',
        searchAttributes: SEARCH_ATTRIBUTE_FLAGS,
        readyTimeoutMs: 120_000,
      }),
      loadWorkflowBundle(join(dataDir, 'cache')),
    ]);
    database = db;
    temporal = dev;
    const password = (await readFile(join(pgDir, 'password'), 'utf8')).trim();
    ownerSql = createSql({
      url: database.url,
      poolMax: 4,
      connectTimeoutS: 10,
      idleTimeoutS: 30,
      statementTimeoutMs: 60_000,
      applicationName: 'bench',
    });
    const sql = ownerSql;
    await migrate(sql);
    await sql`create extension if not exists pg_stat_statements`;
    const [settings] = await sql<{ fsync: string; synchronous_commit: string; version: string }[]>`
      select current_setting('fsync') as fsync, current_setting('synchronous_commit') as synchronous_commit,
             current_setting('server_version') as version`;
    log(`postgres ${settings?.version} fsync=${settings?.fsync} synchronous_commit=${settings?.synchronous_commit}`);

    // ---- 1. a tenant and its funded accounts
    const tenant = await provisionTenant(
      sql,
      { name: 'Bench', ownerEmail: `bench-${Date.now()}@example.com` },
      SYSTEM_ACTOR,
    );
    const companyId = tenant.company.id;
    const accounts = await openFundedSandboxAccounts(sql, companyId, {
      count: ACCOUNTS,
      amountMinor: FUNDING_MINOR,
      currency: 'USD',
      namePrefix: 'Bench',
    });
    const hot = accounts.slice(0, HOT_ACCOUNTS);
    await sql`vacuum analyze`;
    log(`tenant ${companyId}: ${ACCOUNTS} funded accounts`);

    // ---- 2. pgbench ceilings
    const pgbenchSpread = await pgbench(
      'pgbench-spread',
      { port: pgPort, password },
      pgbenchScript(companyId, accounts),
      dataDir,
    );
    figures.pgbenchSpread = { ...pgbenchSpread, name: `pgbench: the transfer statement, ${ACCOUNTS} accounts` };
    log(`pgbench spread: ${pgbenchSpread.throughput.toFixed(0)} tps`);
    const pgbenchHot = await pgbench('pgbench-hot', { port: pgPort, password }, pgbenchScript(companyId, hot), dataDir);
    figures.pgbenchHot = { ...pgbenchHot, name: `pgbench: the transfer statement, ${HOT_ACCOUNTS} hot accounts` };
    log(`pgbench hot: ${pgbenchHot.throughput.toFixed(0)} tps`);
    results.pgbenchOutput = { spread: pgbenchSpread.raw, hot: pgbenchHot.raw };

    // ---- 3. bare Koa + postgres.js route
    const bare = await forkReady('bare-koa', 'bench/bare-server.ts', {
      ...process.env,
      BENCH_DATABASE_URL: database.url,
      BENCH_COMPANY_ID: companyId,
      BENCH_POOL_MAX: String(CONCURRENCY),
    });
    const bareUrl = `http://127.0.0.1:${String(bare.ready.port)}`;
    const barePlan = (mode: 'bare', list: string[], prefix: string): LoadPlan => ({
      baseUrl: bareUrl,
      path: '/transfers',
      mode,
      concurrency: CONCURRENCY,
      warmupMs: WARMUP_MS,
      durationMs: PHASE_MS,
      accounts: list,
      keyPrefix: prefix,
    });
    const bareSpread = await load(barePlan('bare', accounts, 'bare-spread'));
    figures.bareSpread = figureOf(`bare Koa + postgres.js route, ${ACCOUNTS} accounts`, bareSpread);
    log(`bare koa spread: ${bareSpread.throughput.toFixed(0)}/s ${JSON.stringify(bareSpread.byStatus)}`);
    const bareHot = await load(barePlan('bare', hot, 'bare-hot'));
    figures.bareHot = figureOf(`bare Koa + postgres.js route, ${HOT_ACCOUNTS} hot accounts`, bareHot);
    log(`bare koa hot: ${bareHot.throughput.toFixed(0)}/s ${JSON.stringify(bareHot.byStatus)}`);
    await stopChild(bare.child);

    // ---- 4. the real API, and the worker (for Shape A)
    const env: NodeJS.ProcessEnv = { ...process.env };
    for (const name of Object.keys(env)) if (name.startsWith('TEST_') || name.startsWith('BENCH_')) delete env[name];
    Object.assign(env, {
      NODE_ENV: 'development',
      DATABASE_URL: database.url,
      TEMPORAL_ADDRESS: temporal.address,
      PORT: String(apiPort),
      DATA_DIR: dataDir,
      LOG_LEVEL: 'warn',
    });
    const apiUrl = `http://127.0.0.1:${apiPort}`;
    await Promise.all([forkReady('api', 'api/main.ts', env), forkReady('worker', 'workers/main.ts', env)]);
    for (let waited = 0; ; waited += 200) {
      const status = await fetch(`${apiUrl}/readyz`)
        .then((response) => response.status)
        .catch(() => 0);
      if (status === 200) break;
      if (waited > 60_000) throw new Error('API never ready');
      await sleep(200);
    }
    log('api and worker ready');
    const apiPlan = (mode: LoadPlan['mode'], extra: Partial<LoadPlan>, prefix: string): LoadPlan => ({
      baseUrl: apiUrl,
      path: '/v1/transfers',
      mode,
      concurrency: CONCURRENCY,
      warmupMs: WARMUP_MS,
      durationMs: PHASE_MS,
      apiKey: tenant.sandboxApiKey,
      keyPrefix: prefix,
      ...extra,
    });

    // One request alone before each Shape B phase: the transfer signer (services/signing.ts) loads its
    // key set through the API's pool from INSIDE the transfer's transaction, on the first request and
    // whenever its 60 s cache has expired. With every pooled connection (10 by default) held by a
    // transaction waiting on that load, the load never gets a connection: the API stalls until the
    // idle-in-transaction timeout. Priming keeps the cache fresh for the ~12 s phase that follows.
    let primed = 0;
    const prime = async () => {
      const response = await fetch(`${apiUrl}/v1/transfers`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${tenant.sandboxApiKey}`,
          'content-type': 'application/json',
          'idempotency-key': `bench-prime-${++primed}`,
        },
        body: JSON.stringify({ amount: 1, currency: 'USD', source: accounts[0], destination: accounts[1] }),
        signal: AbortSignal.timeout(30_000),
      });
      if (response.status !== 201) throw new Error(`priming request: ${response.status} ${await response.text()}`);
    };
    await prime();
    await sql`select pg_stat_statements_reset()`;
    const [before] = await sql<{ commits: bigint }[]>`
      select xact_commit::bigint as commits from pg_stat_database where datname = current_database()`;
    const apiSpread = await load(apiPlan('shapeB', { accounts, recordLimit: 200_000 }, 'api-spread'));
    const [after] = await sql<{ commits: bigint }[]>`
      select xact_commit::bigint as commits from pg_stat_database where datname = current_database()`;
    const statements = await sql<{ calls: bigint; mean_ms: number; query: string }[]>`
      select calls::bigint as calls, mean_exec_time as mean_ms, query from pg_stat_statements
      where dbid = (select oid from pg_database where datname = current_database())
      order by calls desc limit 25`;
    const transferCalls = Number(
      statements.find((row) => /insert into transfers/i.test(row.query) && /ledger_entries/i.test(row.query))?.calls ??
        0,
    );
    const statementStats: StatementStat[] = statements.map((row) => ({
      calls: Number(row.calls),
      meanMs: row.mean_ms,
      query: row.query.replace(/\s+/g, ' ').slice(0, 160),
    }));
    const totalCalls = statementStats.reduce((sum, row) => sum + row.calls, 0);
    results.shapeBStatements = {
      transfers: transferCalls,
      statementsPerTransfer: transferCalls ? totalCalls / transferCalls : null,
      commitsPerTransfer: transferCalls ? Number(after!.commits - before!.commits) / transferCalls : null,
      top: statementStats,
    };
    figures.apiSpread = figureOf(`API Shape B, ${ACCOUNTS} accounts`, apiSpread);
    log(
      `api shape B spread: ${apiSpread.throughput.toFixed(0)}/s ${JSON.stringify(apiSpread.byStatus)} ${apiSpread.sampleErrors.join(' | ')}`,
    );

    await prime();
    const apiHot = await load(apiPlan('shapeB', { accounts: hot }, 'api-hot'));
    figures.apiHot = figureOf(`API Shape B, ${HOT_ACCOUNTS} hot accounts`, apiHot);
    log(
      `api shape B hot: ${apiHot.throughput.toFixed(0)}/s ${JSON.stringify(apiHot.byStatus)} ${apiHot.sampleErrors.join(' | ')}`,
    );

    const replay = await load(apiPlan('replay', { replay: apiSpread.sent }, 'api-replay'));
    figures.apiReplay = figureOf('API Shape B idempotent replay', replay, `${replay.replayed} replayed`);
    log(`api replay: ${replay.throughput.toFixed(0)}/s replayed=${replay.replayed} ${JSON.stringify(replay.byStatus)}`);

    // ---- 5. Shape A, and the bare Temporal baseline
    const shapeA = await load(apiPlan('shapeA', { achAccountId: tenant.sandbox.achAccountId }, 'api-shape-a'));
    figures.apiShapeA = figureOf('API Shape A payout (workflow)', shapeA);
    log(
      `api shape A: ${shapeA.throughput.toFixed(0)}/s ${JSON.stringify(shapeA.byStatus)} ${shapeA.sampleErrors.join(' | ')}`,
    );
    const [aStatus] = await sql<{ statuses: Record<string, number> }[]>`
      select coalesce(jsonb_object_agg(status, n), '{}') as statuses
      from (select status, count(*)::int as n from transfers where company_id = ${companyId} and rail = 'ach' group by status) s`;
    results.shapeAStatusesAfterRun = aStatus?.statuses;

    await forkReady('baseline-worker', 'bench/baseline-worker.ts', {
      ...process.env,
      BENCH_TEMPORAL_ADDRESS: temporal.address,
    });
    figures.temporalBaseline = await temporalBaseline(temporal.address);
    log(`temporal baseline: ${figures.temporalBaseline.throughput.toFixed(0)}/s`);
  } finally {
    for (const child of [...children].reverse()) await stopChild(child).catch(() => undefined);
    await ownerSql?.end({ timeout: 5 }).catch(() => undefined);
    await temporal?.stop().catch(() => undefined);
    await database?.stop().catch(() => undefined);
    const left = descendants(process.pid).filter((entry) => !baseline.has(entry.pid));
    if (left.length > 0) log(`left running: ${left.map((entry) => `${entry.pid} ${entry.command}`).join(', ')}`);
    await rm(dataDir, { recursive: true, force: true }).catch(() => undefined);
  }

  // ---- 6. the table
  const rows: {
    figure: Figure | undefined;
    ceiling?: Figure | undefined;
    target?: number;
    p99Max?: number;
    label?: string;
  }[] = [
    { figure: figures.pgbenchSpread },
    { figure: figures.pgbenchHot },
    { figure: figures.bareSpread },
    { figure: figures.bareHot },
    { figure: figures.apiSpread, ceiling: figures.pgbenchSpread, target: 0.5, p99Max: 50, label: '× pgbench' },
    { figure: figures.apiSpread, ceiling: figures.bareSpread, target: 0.8, label: '× bare Koa' },
    { figure: figures.apiHot, ceiling: figures.pgbenchHot, target: 0.5, label: '× pgbench hot' },
    { figure: figures.apiReplay, ceiling: figures.apiSpread, target: 1.5, label: '× new transfer' },
    { figure: figures.temporalBaseline },
    { figure: figures.apiShapeA, ceiling: figures.temporalBaseline, target: 0.8, label: '× bare workflow' },
  ];
  const fmt = (value: number, digits = 1) => (Number.isFinite(value) ? value.toFixed(digits) : '—');
  const lines = [
    `| Measure (concurrency ${CONCURRENCY}, ${PHASE_MS / 1000} s) | per s | p50 ms | p99 ms | errors | ratio | target | met? |`,
    '|---|---:|---:|---:|---:|---:|---:|:---:|',
  ];
  const verdicts: Record<string, boolean> = {};
  for (const row of rows) {
    const figure = row.figure;
    if (!figure) continue;
    let ratio = '';
    let target = '';
    let met = '';
    if (row.ceiling && row.target !== undefined) {
      const value = figure.throughput / row.ceiling.throughput;
      const p99Ok = row.p99Max === undefined || figure.latency.p99Ms <= row.p99Max;
      const ok = value >= row.target && p99Ok;
      ratio = `${fmt(value, 2)} ${row.label ?? ''}`;
      target = `≥ ${row.target}${row.p99Max !== undefined ? `, p99 ≤ ${row.p99Max} ms` : ''}`;
      met = ok ? 'yes' : 'no';
      verdicts[`${figure.name} ${row.label ?? ''}`] = ok;
    }
    lines.push(
      `| ${figure.name}${figure.note ? ` (${figure.note})` : ''} | ${fmt(figure.throughput, 0)} | ${fmt(figure.latency.p50Ms)} | ${fmt(figure.latency.p99Ms)} | ${figure.errors} | ${ratio} | ${target} | ${met} |`,
    );
  }
  const cpu = cpus();
  const machine = `${cpu.length} × ${cpu[0]?.model ?? 'cpu'}, ${(totalmem() / 2 ** 30).toFixed(1)} GiB, Node ${process.version}, ${new Date().toISOString().slice(0, 10)}`;
  const table = lines.join('\n');
  console.log(`\n${machine}\n\n${table}\n`);
  const json = {
    machine,
    concurrency: CONCURRENCY,
    phaseMs: PHASE_MS,
    warmupMs: WARMUP_MS,
    figures,
    verdicts,
    ...results,
  };
  await writeFile(join(here, 'results.json'), `${JSON.stringify(json, null, 2)}\n`);
  await writeFile(join(here, 'results.md'), `# Benchmark results\n\n${machine}\n\n${table}\n`);
  console.log(`statements per Shape B transfer: ${JSON.stringify(results.shapeBStatements, null, 2)}`);
}

await main();
process.exit(0);
