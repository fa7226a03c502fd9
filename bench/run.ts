// `npm run bench`: Shape B and Shape A throughput and latency of the real API, beside ceilings
// measured in the same run on the same database and Temporal server (see README, "Benchmark"):
// pgbench running the transfer's SQL as one statement, a bare Koa + postgres.js route running it,
// and a bare update-with-start workflow with one local activity; also pgbench on the API's own
// hot-path function, and the CPU each process used per request in each phase. One embedded
// PostgreSQL (durable: fsync on, as in production) and one Temporal dev server; everything started
// here is stopped here.
import { execFile } from 'node:child_process';
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { cpus, totalmem, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as delay } from 'node:timers/promises';
import { promisify } from 'node:util';
import {
  Client,
  Connection,
  WithStartWorkflowOperation,
  WorkflowUpdateRPCTimeoutOrCancelledError,
} from '@temporalio/client';
import { WorkflowIdConflictPolicy } from '@temporalio/common';
import { descendants } from '../platform/processes.ts';
import { startService, stopService, type ServiceProcess } from '../platform/services.ts';
import { freePort } from '../test-support/ports.ts';
import { waitFor } from '../test-support/wait.ts';
import { APP_ROLE, createSql, type Sql } from '../db/client.ts';
import { startEmbeddedPostgres, type EmbeddedPostgresHandle } from '../db/embedded.ts';
import { migrate } from '../db/migrate.ts';
import type { DevServerHandle } from '../platform/temporal-dev-server.ts';
import { startScratchDevServer } from '../test-support/dev-server.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { provisionTenant } from '../services/tenants.ts';
import { loadWorkflowBundle } from '../workers/bundle.ts';
import { benchAwaitUpdate } from './baseline-workflow.ts';
import { pgbenchHotPathScript, pgbenchScript } from './transfer-sql.ts';
import {
  BENCH_TASK_QUEUE,
  summarize,
  undispatchedEvents,
  type LatencySummary,
  type LoadPlan,
  type LoadResult,
} from './types.ts';
import { openFundedSandboxAccounts } from '../services/sandbox.ts';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..');
const run = promisify(execFile);

const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 32);
const PHASE_MS = Number(process.env.BENCH_PHASE_MS ?? 10_000);
const WARMUP_MS = Number(process.env.BENCH_WARMUP_MS ?? 2_000);
// Rounds of the compared pairs (bare route and API Shape B; bare workflow and API Shape A).
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 2);
// Development knobs (the figures in the README come from a plain `npm run bench`):
// BENCH_PHASES=ceilings,shapeB,replay,shapeA picks phases (default all); BENCH_CPU_PROF=dir writes V8
// CPU profiles of the API and worker processes (`node --cpu-prof`) to dir when they stop, at the end
// (pick the phase to profile with BENCH_PHASES). V8's profiles sample wall time, so on a saturated
// machine they charge a function for the time it was preempted (a socket write that wakes PostgreSQL
// looks expensive); BENCH_PERF=1 runs the API and the worker with --perf-basic-prof instead, for
// `perf record -a -g` (on-CPU samples, JavaScript frames named). Partial and profiled runs, and runs
// without pgbench, print their table but leave bench/results.* alone.
const PHASES = new Set(
  (process.env.BENCH_PHASES ?? 'ceilings,shapeB,replay,shapeA').split(',').map((name) => name.trim()),
);
const CPU_PROF = process.env.BENCH_CPU_PROF;
// BENCH_API_POOL_MAX overrides the API's DATABASE_POOL_MAX (default: the API's own default).
const API_POOL_MAX = process.env.BENCH_API_POOL_MAX;
// The pgbench ceilings need a pgbench (postgresql-client): the one on PATH, or PGBENCH=/path.
const PGBENCH = process.env.PGBENCH ?? 'pgbench';
const ACCOUNTS = 200;
const HOT_ACCOUNTS = 10;
const FUNDING_MINOR = 1_000_000_000_000n; // 10 billion USD each: no phase can drain one
const DATABASE = 'payments';
const USER = 'postgres';

const log = (line: string) => console.error(`[bench +${((Date.now() - startedAt) / 1000).toFixed(1)}s] ${line}`);
const startedAt = Date.now();

// ---------------------------------------------------------------------------------------------
// Child processes

const children: ServiceProcess<Record<string, unknown>>[] = [];

/** Forks a TypeScript file (output kept for errors), and waits for its { type: 'ready' } message. */
async function forkReady(
  name: string,
  script: string,
  env: NodeJS.ProcessEnv,
  timeoutMs = 180_000,
  execArgv: string[] = [],
): Promise<{ child: ServiceProcess<Record<string, unknown>>; ready: Record<string, unknown> }> {
  const child = startService<Record<string, unknown>>({
    name,
    script: join(root, script),
    cwd: root,
    env,
    execArgv,
    detached: false,
    readyTimeoutMs: timeoutMs,
    captureOutput: true,
  });
  children.push(child);
  return { child, ready: await child.ready };
}

const stopChild = (child: ServiceProcess<unknown>) => stopService(child, { signal: 'SIGTERM', timeoutMs: 10_000 });

/** Runs one load plan in a fresh generator process (its own event loop). */
async function load(plan: LoadPlan): Promise<LoadResult> {
  const { child } = await forkReady(`load-${plan.mode}`, 'bench/load.ts', { ...process.env }, 60_000);
  try {
    return await new Promise<LoadResult>((resolve, reject) => {
      child.child.on('message', (message: { type: string; result?: LoadResult; error?: string }) => {
        if (message.type === 'result' && message.result) resolve(message.result);
        if (message.type === 'error') reject(new Error(`load generator: ${message.error}`));
      });
      void child.exited.then(({ code }) => reject(new Error(`load generator exited (${code}):\n${child.tail()}`)));
      child.child.send(plan);
    });
  } finally {
    await stopChild(child);
  }
}

// ---------------------------------------------------------------------------------------------
// CPU accounting: where the machine's cores went during a phase, per process group.

const CLOCK_TICKS_PER_S = 100; // USER_HZ on Linux

/** utime + stime (clock ticks) of every descendant, from /proc. */
async function cpuSnapshot(): Promise<Map<number, { command: string; ticks: number }>> {
  const snapshot = new Map<number, { command: string; ticks: number }>();
  for (const entry of descendants(process.pid)) {
    const stat = await readFile(`/proc/${entry.pid}/stat`, 'utf8').catch(() => undefined);
    if (!stat) continue;
    // Fields after the parenthesised command: state is field 3, utime 14 and stime 15.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    snapshot.set(entry.pid, { command: entry.command, ticks: Number(fields[11]) + Number(fields[12]) });
  }
  return snapshot;
}

/** PostgreSQL backends by pid: whose connection each one serves (application_name), or its background role. */
const backendLabels = new Map<number, string>();

async function refreshBackendLabels(sql: Sql): Promise<void> {
  const rows = await sql<{ pid: number; application_name: string; backend_type: string }[]>`
    select pid, application_name, backend_type from pg_stat_activity`;
  for (const row of rows) {
    const label =
      row.backend_type !== 'client backend'
        ? 'background'
        : row.application_name.startsWith('payments-api')
          ? 'api'
          : row.application_name.startsWith('payments-worker')
            ? 'worker'
            : row.application_name.startsWith('bench-bare')
              ? 'bare-koa'
              : 'other';
    backendLabels.set(row.pid, label);
  }
}

function groupOf(pid: number, command: string): string {
  const child = children.find((candidate) => candidate.child.pid === pid);
  if (child) return child.name.startsWith('load-') ? 'load generator' : child.name;
  if (command.startsWith('postgres')) return `postgres (${backendLabels.get(pid) ?? 'other'})`;
  return command;
}

/** CPU seconds per process group between two snapshots (processes that exited in between are missed). */
function cpuSeconds(
  before: Map<number, { command: string; ticks: number }>,
  after: Map<number, { command: string; ticks: number }>,
): Record<string, number> {
  const groups: Record<string, number> = {};
  for (const [pid, entry] of after) {
    const ticks = entry.ticks - (before.get(pid)?.ticks ?? 0);
    if (ticks <= 0) continue;
    const group = groupOf(pid, entry.command);
    groups[group] = (groups[group] ?? 0) + ticks / CLOCK_TICKS_PER_S;
  }
  return groups;
}

/** Busy CPU seconds of the whole machine (every core, every process), from /proc/stat. */
async function machineBusySeconds(): Promise<number> {
  const line = (await readFile('/proc/stat', 'utf8')).split('\n')[0]!;
  // cpu user nice system idle iowait irq softirq steal ...
  const [user, nice, system, , , irq, softirq, steal] = line.trim().split(/\s+/).slice(1).map(Number);
  return (user! + nice! + system! + irq! + softirq! + steal!) / CLOCK_TICKS_PER_S;
}

/** Runs a load phase and records the CPU each process group used during it. */
async function measured<T extends Pick<LoadResult, 'answeredTotal' | 'cpuSeconds'>>(
  sql: Sql,
  name: string,
  phase: () => Promise<T>,
): Promise<T> {
  await refreshBackendLabels(sql);
  const before = await cpuSnapshot();
  const machineBefore = await machineBusySeconds();
  const started = performance.now();
  const result = await phase();
  const wallS = (performance.now() - started) / 1000;
  const machine = (await machineBusySeconds()) - machineBefore;
  await refreshBackendLabels(sql);
  const cpu = cpuSeconds(before, await cpuSnapshot());
  // The generator process exits before the second snapshot: its own CPU comes back in the result.
  if (result.cpuSeconds !== undefined) cpu['load generator'] = result.cpuSeconds;
  // What the machine did besides this benchmark (another user's processes, the kernel's own work).
  const ours = Object.values(cpu).reduce((sum, seconds) => sum + seconds, 0);
  cpu['outside the bench'] = Math.max(0, machine - ours);
  cpuByPhase[name] = { wallS, requests: result.answeredTotal, cpuSeconds: cpu };
  return result;
}

const cpuByPhase: Record<string, { wallS: number; requests: number; cpuSeconds: Record<string, number> }> = {};

/** Markdown: CPU milliseconds per request, per process group, for each measured phase. */
function cpuTable(): string {
  const groups = [
    'postgres (api)',
    'postgres (bare-koa)',
    'postgres (worker)',
    'postgres (background)',
    'api',
    'bare-koa',
    'load generator',
    'worker',
    'baseline-worker',
    'temporal',
  ];
  const OUTSIDE = 'outside the bench';
  const lines = [
    `| CPU ms per request (whole phase, warm-up included) | requests | ${groups.join(' | ')} | other | total | ${OUTSIDE} | machine busy |`,
    `|---|---:|${groups.map(() => '---:').join('|')}|---:|---:|---:|---:|`,
  ];
  for (const [name, phase] of Object.entries(cpuByPhase)) {
    const perRequest = (seconds: number) => ((seconds * 1000) / Math.max(1, phase.requests)).toFixed(2);
    const entries = Object.entries(phase.cpuSeconds).filter(([group]) => group !== OUTSIDE);
    const other = entries.filter(([group]) => !groups.includes(group)).reduce((sum, [, seconds]) => sum + seconds, 0);
    const total = entries.reduce((sum, [, seconds]) => sum + seconds, 0);
    const outside = phase.cpuSeconds[OUTSIDE] ?? 0;
    const busy = (100 * (total + outside)) / (phase.wallS * cpus().length);
    lines.push(
      `| ${name} | ${phase.requests} | ${groups.map((group) => (phase.cpuSeconds[group] ? perRequest(phase.cpuSeconds[group]) : '')).join(' | ')} | ${perRequest(other)} | ${perRequest(total)} | ${perRequest(outside)} | ${busy.toFixed(0)} % |`,
    );
  }
  return lines.join('\n');
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
  role?: string,
): Promise<Figure & { raw: string }> {
  const file = join(dir, `${name}.sql`);
  await writeFile(file, script);
  const logDir = join(dir, `log-${name}`);
  await mkdir(logDir, { recursive: true });
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
  const { stdout, stderr } = await run(PGBENCH, args, {
    env: { ...process.env, PGPASSWORD: database.password, ...(role ? { PGOPTIONS: `-c role=${role}` } : {}) },
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

type Round = Pick<LoadResult, 'answeredTotal' | 'cpuSeconds' | 'ok' | 'completed' | 'measuredMs' | 'networkErrors'> & {
  latencies: number[];
};

const BASELINE_CALL_DEADLINE_MS = 5_000;

async function temporalBaseline(address: string): Promise<Round> {
  const cpuBefore = process.cpuUsage();
  const connection = await Connection.connect({ address });
  const client = new Client({ connection, namespace: 'default' });
  const runId = Math.random().toString(16).slice(2, 10);
  let counter = 0;
  const latencies: number[] = [];
  let ok = 0;
  let errors = 0;
  let answeredTotal = 0;
  let pastDeadline = 0;
  const sampleErrors: string[] = [];
  const t = performance.now();
  const measureFrom = t + WARMUP_MS;
  const end = measureFrom + PHASE_MS;
  const worker = async () => {
    while (performance.now() < end) {
      const id = `bench-${runId}-${++counter}`;
      const t0 = performance.now();
      try {
        // Bounded as the API bounds a payout's update-with-start (3 s outcome wait + 2 s margin): a
        // call the server stalls ends the round as late as a stalled payout would, and counts as
        // answered, as the API's payout answered `pending` at that point does.
        await connection.withDeadline(Date.now() + BASELINE_CALL_DEADLINE_MS, () =>
          client.workflow.executeUpdateWithStart(benchAwaitUpdate, {
            startWorkflowOperation: new WithStartWorkflowOperation('benchWorkflow', {
              workflowId: id,
              taskQueue: BENCH_TASK_QUEUE,
              args: [id],
              workflowIdConflictPolicy: WorkflowIdConflictPolicy.USE_EXISTING,
            }),
          }),
        );
        answeredTotal++;
        if (t0 >= measureFrom) {
          ok++;
          latencies.push(performance.now() - t0);
        }
      } catch (error) {
        if (error instanceof WorkflowUpdateRPCTimeoutOrCancelledError) {
          answeredTotal++;
          pastDeadline++;
          if (t0 >= measureFrom) {
            ok++;
            latencies.push(performance.now() - t0);
          }
          continue;
        }
        if (t0 >= measureFrom) errors++;
        if (sampleErrors.length < 3) sampleErrors.push(String(error));
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, () => worker()));
  const measuredMs = performance.now() - measureFrom;
  await connection.close();
  if (sampleErrors.length > 0) log(`temporal baseline errors: ${sampleErrors.join(' | ')}`);
  if (pastDeadline > 0)
    log(`temporal baseline: ${pastDeadline} calls unanswered after ${BASELINE_CALL_DEADLINE_MS} ms`);
  const cpu = process.cpuUsage(cpuBefore);
  return {
    ok,
    completed: ok + errors,
    networkErrors: 0,
    measuredMs,
    latencies,
    // This process is the baseline's client: its CPU goes in the load generator's column.
    answeredTotal,
    cpuSeconds: (cpu.user + cpu.system) / 1e6,
  };
}

/** One figure from several rounds: requests and measured time summed, latencies pooled. */
function pooled(name: string, rounds: Round[]): Figure {
  const ok = rounds.reduce((sum, round) => sum + round.ok, 0);
  const measuredMs = rounds.reduce((sum, round) => sum + round.measuredMs, 0);
  const errors = rounds.reduce((sum, round) => sum + round.completed - round.ok + round.networkErrors, 0);
  return {
    name,
    throughput: (ok * 1000) / Math.max(1, measuredMs),
    latency: summarize(rounds.flatMap((round) => round.latencies)),
    errors,
  };
}

// ---------------------------------------------------------------------------------------------

interface StatementStat {
  calls: number;
  meanMs: number;
  query: string;
}

interface DatabaseCounters {
  /** Transactions committed in the benchmark's database (pg_stat_database, cumulative). */
  commits: number;
  /** Statements the clients sent since the last pg_stat_statements_reset() (statementsSent). */
  statements: number;
  /** The company's transfers on the rail. */
  transfers: number;
}

async function databaseCounters(sql: Sql, companyId: string, rail: 'ledger' | 'ach'): Promise<DatabaseCounters> {
  // Backends report their commits to pg_stat_database when idle, at most once a second.
  await delay(1_100);
  const [row] = await sql<{ commits: number; transfers: number }[]>`
    select (select xact_commit::int from pg_stat_database where datname = current_database()) as commits,
           (select count(*)::int from transfers where company_id = ${companyId} and rail = ${rail}) as transfers`;
  return { commits: row!.commits, transfers: row!.transfers, statements: await statementsSent(sql) };
}

/** The counters' growth from `before` to `after`, added to `sum` (Shape A counts its rounds only). */
function addCounters(sum: DatabaseCounters, before: DatabaseCounters, after: DatabaseCounters): DatabaseCounters {
  return {
    commits: sum.commits + after.commits - before.commits,
    statements: sum.statements + after.statements - before.statements,
    transfers: sum.transfers + after.transfers - before.transfers,
  };
}

/**
 * What PostgreSQL received per transfer over counted work: statements the clients sent and
 * transactions committed (every client's, the benchmark's own few included). Counted, not timed.
 */
function workPerTransfer(work: DatabaseCounters) {
  const per = (count: number) => (work.transfers > 0 ? Number((count / work.transfers).toFixed(2)) : null);
  return { transfers: work.transfers, statements: per(work.statements), transactions: per(work.commits) };
}

/**
 * Statements the clients sent since the last pg_stat_statements_reset() (plpgsql's own trigger
 * expressions, which pg_stat_statements also counts, left out). Unlike CPU time, the count does not
 * drift with the machine: what a change to the number of round trips did shows here exactly.
 */
async function statementsSent(sql: Sql): Promise<number> {
  const [row] = await sql<{ calls: bigint }[]>`
    select coalesce(sum(calls), 0)::bigint as calls from pg_stat_statements
    where dbid = (select oid from pg_database where datname = current_database()) and toplevel
      and query !~ '^(exists|new\.)'`;
  return Number(row!.calls);
}

/** The top-level statements since the last pg_stat_statements_reset(), most called first. */
async function topStatements(sql: Sql): Promise<StatementStat[]> {
  const statements = await sql<{ calls: bigint; mean_ms: number; query: string }[]>`
    select calls::bigint as calls, mean_exec_time as mean_ms, query from pg_stat_statements
    where dbid = (select oid from pg_database where datname = current_database()) and toplevel
    order by calls desc limit 25`;
  return statements.map((row) => ({
    calls: Number(row.calls),
    meanMs: row.mean_ms,
    query: row.query.replace(/\s+/g, ' ').slice(0, 160),
  }));
}

interface TableScans {
  seqScan: number;
  seqRowsRead: number;
  indexScan: number;
}

/** Sequential and index scans per table so far (pg_stat_user_tables, cumulative). */
async function tableScans(sql: Sql): Promise<Map<string, TableScans>> {
  const rows = await sql<{ relname: string; seq_scan: bigint; seq_tup_read: bigint; idx_scan: bigint | null }[]>`
    select relname, seq_scan::bigint, seq_tup_read::bigint, idx_scan::bigint from pg_stat_user_tables`;
  return new Map(
    rows.map((row) => [
      row.relname,
      { seqScan: Number(row.seq_scan), seqRowsRead: Number(row.seq_tup_read), indexScan: Number(row.idx_scan ?? 0) },
    ]),
  );
}

/**
 * The tables read sequentially between two snapshots, most rows read first: on a hot path every
 * lookup on a table that grows should be an index scan (small, fixed tables may be scanned).
 */
function scansSince(before: Map<string, TableScans>, after: Map<string, TableScans>) {
  return [...after]
    .map(([table, now]) => {
      const then = before.get(table) ?? { seqScan: 0, seqRowsRead: 0, indexScan: 0 };
      return {
        table,
        seqScans: now.seqScan - then.seqScan,
        seqRowsRead: now.seqRowsRead - then.seqRowsRead,
        indexScans: now.indexScan - then.indexScan,
      };
    })
    .filter((row) => row.seqScans > 0)
    .sort((a, b) => b.seqRowsRead - a.seqRowsRead);
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
  let pgbenchMissing = false;
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
      startScratchDevServer({
        dataDir: join(dataDir, 'temporal'),
        port: temporalPort,
        uiPort,
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

    // ---- 2. pgbench ceilings (skipped when there is no pgbench: the API's ratios to them stay empty)
    let bare: Awaited<ReturnType<typeof forkReady>> | undefined;
    if (PHASES.has('ceilings')) {
      const pgbenchVersion = await run(PGBENCH, ['--version']).then(
        ({ stdout }) => stdout.trim(),
        () => undefined,
      );
      if (!pgbenchVersion) {
        pgbenchMissing = true;
        log(
          `no pgbench at "${PGBENCH}": skipping the pgbench ceilings (install postgresql-client, or set PGBENCH=/path/to/pgbench)`,
        );
      } else {
        log(pgbenchVersion);
        const ceilings = [
          {
            figure: 'pgbenchSpread',
            output: 'spread',
            script: pgbenchScript(companyId, accounts),
            name: `pgbench: the transfer statement, ${ACCOUNTS} accounts`,
          },
          {
            figure: 'pgbenchHot',
            output: 'hot',
            script: pgbenchScript(companyId, hot),
            name: `pgbench: the transfer statement, ${HOT_ACCOUNTS} hot accounts`,
          },
          {
            figure: 'pgbenchHotPath',
            output: 'hotPath',
            script: pgbenchHotPathScript(companyId, accounts),
            role: APP_ROLE,
            name: `pgbench: the API's hot-path function as payments_app, ${ACCOUNTS} accounts`,
          },
        ];
        const outputs: Record<string, string> = {};
        for (const ceiling of ceilings) {
          const { raw, ...figure } = await pgbench(
            ceiling.output,
            { port: pgPort, password },
            ceiling.script,
            dataDir,
            ceiling.role,
          );
          figures[ceiling.figure] = { ...figure, name: ceiling.name };
          outputs[ceiling.output] = raw;
          log(`${ceiling.name}: ${figure.throughput.toFixed(0)} tps`);
        }
        results.pgbenchOutput = outputs;
      }

      // ---- 3. bare Koa + postgres.js route (measured below, in rounds with the API's Shape B)
      bare = await forkReady('bare-koa', 'bench/bare-server.ts', {
        ...process.env,
        BENCH_DATABASE_URL: database.url,
        BENCH_COMPANY_ID: companyId,
        BENCH_POOL_MAX: String(CONCURRENCY),
      });
    }

    // ---- 4. the real API (the worker starts for Shape A: until then nothing dispatches events, in
    //      the bare route's phases and the API's alike)
    const env: NodeJS.ProcessEnv = { ...process.env };
    for (const name of Object.keys(env)) if (name.startsWith('TEST_') || name.startsWith('BENCH_')) delete env[name];
    Object.assign(env, {
      NODE_ENV: 'development',
      DATABASE_URL: database.url,
      TEMPORAL_ADDRESS: temporal.address,
      PORT: String(apiPort),
      DATA_DIR: dataDir,
      LOG_LEVEL: 'warn',
      ...(API_POOL_MAX ? { DATABASE_POOL_MAX: API_POOL_MAX } : {}),
    });
    const apiUrl = `http://127.0.0.1:${apiPort}`;
    const profile = CPU_PROF
      ? ['--cpu-prof', `--cpu-prof-dir=${CPU_PROF}`]
      : process.env.BENCH_PERF
        ? ['--perf-basic-prof']
        : [];
    await forkReady('api', 'api/main.ts', env, 180_000, profile);
    await waitFor(
      "the API's /readyz to answer 200",
      async () => (await fetch(`${apiUrl}/readyz`, { signal: AbortSignal.timeout(5_000) })).status === 200,
      60_000,
    );
    log('api ready');
    // Every transfer writes an event (the webhook outbox, migration 00005) that the worker then
    // dispatches. Before Shape A the worker works through every event written so far, so that Shape
    // A pays for its own only.
    const drainEvents = async (whose: string) => {
      const backlog = await undispatchedEvents(sql);
      const drainStarted = performance.now();
      await waitFor(
        `the worker to dispatch the ${whose} events`,
        async () => (await undispatchedEvents(sql)) === 0,
        180_000,
      );
      log(
        `worker dispatched the ${whose} ${backlog} events in ${((performance.now() - drainStarted) / 1000).toFixed(1)} s`,
      );
    };
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

    // One request alone before each Shape B phase, so that the phase starts with the signer's key set
    // and the API key in memory. (The first run of this benchmark found the API deadlocking when the
    // signer loaded its keys from inside a transfer's transaction; it now signs before the statement.)
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
    const barePlan = (list: string[], prefix: string): LoadPlan => ({
      baseUrl: `http://127.0.0.1:${String(bare?.ready.port)}`,
      path: '/transfers',
      mode: 'bare',
      concurrency: CONCURRENCY,
      warmupMs: WARMUP_MS,
      durationMs: PHASE_MS,
      accounts: list,
      keyPrefix: prefix,
      keepLatencies: true,
    });
    const roundOf = (result: LoadResult): Round => ({ ...result, latencies: result.latencies ?? [] });
    // Spread: rounds alternate the bare route and the API, and each side pools its rounds. One phase
    // of each, always in the same order, measured the order (the ledger grows with every phase) and
    // the machine's drift as much as the difference.
    const bareRounds: Round[] = [];
    const apiRounds: LoadResult[] = [];
    const counters = () => databaseCounters(sql, companyId, 'ledger');
    // First an unmeasured round of each, half as long: both servers reach their JIT-compiled steady
    // state before anything counts (the API, with more code on its path, was still warming up in
    // round 1: 1.2 ms of its own CPU per transfer against 0.7 ms in round 2).
    const warmUp = { durationMs: Math.max(1_000, PHASE_MS / 2), keepLatencies: false };
    if (bare) await load({ ...barePlan(accounts, 'bare-warm-up'), ...warmUp });
    if (PHASES.has('shapeB')) {
      await prime();
      await load({ ...apiPlan('shapeB', { accounts }, 'api-warm-up'), ...warmUp });
    }
    if (bare || PHASES.has('shapeB')) log('warm-up rounds done');
    for (let round = 1; round <= ROUNDS && (bare || PHASES.has('shapeB')); round++) {
      if (bare) {
        const result = await measured(sql, `bare Koa, spread, round ${round}`, () =>
          load(barePlan(accounts, `bare-spread-${round}`)),
        );
        bareRounds.push(roundOf(result));
        log(`bare koa spread, round ${round}: ${result.throughput.toFixed(0)}/s ${JSON.stringify(result.byStatus)}`);
      }
      if (PHASES.has('shapeB')) {
        await prime();
        // The statements of the last round (pg_stat_statements counts every client's).
        await sql`select pg_stat_statements_reset()`;
        const before = await counters();
        const scansBefore = await tableScans(sql);
        const result = await measured(sql, `API Shape B, spread, round ${round}`, () =>
          load(apiPlan('shapeB', { accounts, recordLimit: 200_000, keepLatencies: true }, `api-spread-${round}`)),
        );
        apiRounds.push(result);
        const after = await counters();
        results.shapeBSequentialScans = scansSince(scansBefore, await tableScans(sql));
        // Transfers are counted in their table, not from the statements: the hot path is one call of
        // a SQL function. Statements are the top-level ones sent by clients, not those run inside
        // functions and triggers.
        results.shapeBStatements = {
          ...workPerTransfer(addCounters({ commits: 0, statements: 0, transfers: 0 }, before, after)),
          top: await topStatements(sql),
        };
        log(
          `api shape B spread, round ${round}: ${result.throughput.toFixed(0)}/s ${JSON.stringify(result.byStatus)} ${result.sampleErrors.join(' | ')}`,
        );
      }
    }
    if (bareRounds.length > 0) {
      figures.bareSpread = pooled(`bare Koa + postgres.js route, ${ACCOUNTS} accounts, ${ROUNDS} rounds`, bareRounds);
    }
    const apiSent = apiRounds.flatMap((result) => result.sent);
    if (apiRounds.length > 0) {
      figures.apiSpread = pooled(`API Shape B, ${ACCOUNTS} accounts, ${ROUNDS} rounds`, apiRounds.map(roundOf));
    }

    // Hot accounts: one phase each, side by side.
    if (bare) {
      const bareHot = await load(barePlan(hot, 'bare-hot'));
      figures.bareHot = figureOf(`bare Koa + postgres.js route, ${HOT_ACCOUNTS} hot accounts`, bareHot);
      log(`bare koa hot: ${bareHot.throughput.toFixed(0)}/s ${JSON.stringify(bareHot.byStatus)}`);
      await stopChild(bare.child);
    }
    if (PHASES.has('shapeB')) {
      await prime();
      const apiHot = await measured(sql, 'API Shape B, hot', () =>
        load(apiPlan('shapeB', { accounts: hot }, 'api-hot')),
      );
      figures.apiHot = figureOf(`API Shape B, ${HOT_ACCOUNTS} hot accounts`, apiHot);
      log(
        `api shape B hot: ${apiHot.throughput.toFixed(0)}/s ${JSON.stringify(apiHot.byStatus)} ${apiHot.sampleErrors.join(' | ')}`,
      );
    }

    if (PHASES.has('replay') && apiSent.length > 0) {
      // A retry that reaches the process that answered it: from its replay cache.
      const replay = await measured(sql, 'API Shape B, replay', () =>
        load(apiPlan('replay', { replay: apiSent }, 'api-replay')),
      );
      figures.apiReplay = figureOf(
        'API Shape B idempotent replay, same process (replay cache)',
        replay,
        `${replay.replayed} replayed`,
      );
      log(
        `api replay: ${replay.throughput.toFixed(0)}/s replayed=${replay.replayed} ${JSON.stringify(replay.byStatus)}`,
      );
      // A retry that reaches another API process (behind a load balancer, or after a restart): a
      // second API, its cache off, answers the same requests from the keys' rows.
      const coldPort = await freePort();
      const cold = await forkReady(
        'api',
        'api/main.ts',
        { ...env, PORT: String(coldPort), IDEMPOTENCY_REPLAY_CACHE_SECONDS: '0' },
        180_000,
        profile,
      );
      const coldUrl = `http://127.0.0.1:${coldPort}`;
      await waitFor(
        "the second API's /readyz to answer 200",
        async () => (await fetch(`${coldUrl}/readyz`, { signal: AbortSignal.timeout(5_000) })).status === 200,
        60_000,
      );
      const coldReplay = await measured(sql, 'API Shape B, replay, another process', () =>
        load({ ...apiPlan('replay', { replay: apiSent }, 'api-replay-cold'), baseUrl: coldUrl }),
      );
      await stopChild(cold.child);
      figures.apiReplayCold = figureOf(
        'API Shape B idempotent replay, another process (from the database)',
        coldReplay,
        `${coldReplay.replayed} replayed`,
      );
      log(
        `api replay, another process: ${coldReplay.throughput.toFixed(0)}/s replayed=${coldReplay.replayed} ${JSON.stringify(coldReplay.byStatus)}`,
      );
    }
    // ---- 5. Shape A, and the bare Temporal baseline
    if (PHASES.has('shapeA')) {
      await forkReady('worker', 'workers/main.ts', env, 180_000, profile);
      log('worker ready');
      await drainEvents("earlier phases'");
      await sql`select pg_stat_statements_reset()`;
      const scansBefore = await tableScans(sql);
      // Database work is counted over the Shape A rounds only, not the baseline's in between (where
      // the worker's idle polling would be charged to no payout).
      let shapeAWork: DatabaseCounters = { commits: 0, statements: 0, transfers: 0 };
      await forkReady('baseline-worker', 'bench/baseline-worker.ts', {
        ...process.env,
        BENCH_TEMPORAL_ADDRESS: temporal.address,
      });
      // Rounds alternate Shape A and the bare workflow on the same Temporal server, and each side's
      // figure pools its rounds: the dev server's latency drifts as its SQLite store grows, and a
      // single pair of phases measured that drift as much as the difference.
      const shapeARounds: Round[] = [];
      const baselineRounds: Round[] = [];
      for (let round = 1; round <= ROUNDS; round++) {
        const roundBefore = await databaseCounters(sql, companyId, 'ach');
        const shapeA = await measured(sql, `API Shape A, round ${round}`, () =>
          load(
            apiPlan(
              'shapeA',
              { achAccountId: tenant.sandbox.achAccountId, keepLatencies: true },
              `api-shape-a-${round}`,
            ),
          ),
        );
        shapeAWork = addCounters(shapeAWork, roundBefore, await databaseCounters(sql, companyId, 'ach'));
        shapeARounds.push({ ...shapeA, latencies: shapeA.latencies ?? [] });
        log(
          `api shape A, round ${round}: ${shapeA.throughput.toFixed(0)}/s ${JSON.stringify(shapeA.byStatus)} ${shapeA.sampleErrors.join(' | ')}`,
        );
        const baseline = await measured(sql, `Temporal baseline, round ${round}`, () =>
          temporalBaseline(temporal!.address),
        );
        baselineRounds.push(baseline);
        log(`temporal baseline, round ${round}: ${((baseline.ok * 1000) / baseline.measuredMs).toFixed(0)}/s`);
      }
      results.shapeADatabaseWorkPerPayout = workPerTransfer(shapeAWork);
      log(`PostgreSQL per Shape A payout: ${JSON.stringify(results.shapeADatabaseWorkPerPayout)}`);
      results.shapeAStatements = await topStatements(sql);
      results.shapeASequentialScans = scansSince(scansBefore, await tableScans(sql));
      results.shapeARounds = shapeARounds.map(({ latencies: _latencies, ...round }) => round);
      results.baselineRounds = baselineRounds.map(({ latencies: _latencies, ...round }) => round);
      figures.apiShapeA = pooled(`API Shape A payout (workflow), ${ROUNDS} rounds`, shapeARounds);
      figures.temporalBaseline = pooled(
        `Temporal: bare update-with-start, 1 local activity, ${ROUNDS} rounds`,
        baselineRounds,
      );
      const [aStatus] = await sql<{ statuses: Record<string, number> }[]>`
      select coalesce(jsonb_object_agg(status, n), '{}') as statuses
      from (select status, count(*)::int as n from transfers where company_id = ${companyId} and rail = 'ach' group by status) s`;
      results.shapeAStatusesAfterRun = aStatus?.statuses;
    }
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
    { figure: figures.pgbenchHotPath },
    { figure: figures.bareSpread },
    { figure: figures.bareHot },
    { figure: figures.apiSpread, ceiling: figures.pgbenchSpread, target: 0.5, p99Max: 50, label: '× pgbench' },
    { figure: figures.apiSpread, ceiling: figures.bareSpread, target: 0.8, label: '× bare Koa' },
    { figure: figures.apiHot, ceiling: figures.pgbenchHot, target: 0.5, label: '× pgbench hot' },
    { figure: figures.apiReplay, ceiling: figures.apiSpread, target: 1.5, label: '× new transfer' },
    { figure: figures.apiReplayCold, ceiling: figures.apiSpread, target: 1.5, label: '× new transfer' },
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
      // A side with errors (a stalled server, refused requests) measured something else: no verdict.
      const clean = figure.errors === 0 && row.ceiling.errors === 0;
      const ok = clean && value >= row.target && p99Ok;
      ratio = `${fmt(value, 2)} ${row.label ?? ''}`;
      target = `≥ ${row.target}${row.p99Max !== undefined ? `, p99 ≤ ${row.p99Max} ms` : ''}`;
      met = !clean ? 'void (errors)' : ok ? 'yes' : 'no';
      verdicts[`${figure.name} ${row.label ?? ''}`] = ok;
    }
    lines.push(
      `| ${figure.name}${figure.note ? ` (${figure.note})` : ''} | ${fmt(figure.throughput, 0)} | ${fmt(figure.latency.p50Ms)} | ${fmt(figure.latency.p99Ms)} | ${figure.errors} | ${ratio} | ${target} | ${met} |`,
    );
  }
  const cpu = cpus();
  const machine = `${cpu.length} × ${cpu[0]?.model ?? 'cpu'}, ${(totalmem() / 2 ** 30).toFixed(1)} GiB, Node ${process.version}, ${new Date().toISOString().slice(0, 10)}`;
  const work = results.shapeADatabaseWorkPerPayout as { statements: number; transactions: number } | undefined;
  const perPayout = work
    ? `PostgreSQL per Shape A payout (everything the API, the worker and its dispatcher sent during the Shape A rounds): ${work.statements} statements, ${work.transactions} transactions.\n\n`
    : '';
  const table = `${lines.join('\n')}\n\n${perPayout}${cpuTable()}`;
  console.log(`\n${machine}\n\n${table}\n`);
  const json = {
    machine,
    concurrency: CONCURRENCY,
    phaseMs: PHASE_MS,
    warmupMs: WARMUP_MS,
    figures,
    verdicts,
    cpuByPhase,
    ...results,
  };
  if (PHASES.size === 4 && !CPU_PROF && !pgbenchMissing) {
    await writeFile(join(here, 'results.json'), `${JSON.stringify(json, null, 2)}\n`);
    await writeFile(join(here, 'results.md'), `# Benchmark results\n\n${machine}\n\n${table}\n`);
  } else log('partial or profiled run, or no pgbench: bench/results.* left as they are');
  console.log(`statements per Shape B transfer: ${JSON.stringify(results.shapeBStatements, null, 2)}`);
  console.log(`sequential scans during Shape B: ${JSON.stringify(results.shapeBSequentialScans, null, 2)}`);
  console.log(`statements during Shape A: ${JSON.stringify(results.shapeAStatements, null, 2)}`);
  console.log(`sequential scans during Shape A: ${JSON.stringify(results.shapeASequentialScans, null, 2)}`);
}

await main();
process.exit(0);
