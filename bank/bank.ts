// The bank test: many concurrent transfers among a few accounts, with duplicate and mismatched
// Idempotency-Keys, while the API and the worker are SIGKILLed and restarted. Afterwards the
// database must show: money conserved per currency, no account below its floor, one transfer per
// key, every 201 durable, every settlement workflow terminal within 60 s of the last restart.
//
// Everything runs for real: embedded PostgreSQL, the Temporal dev server, `api/main.ts` and
// `workers/main.ts` as child processes. Everything started here is stopped here, even on failure.
import { existsSync } from 'node:fs';
import { chmod, mkdir } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { isDeepStrictEqual } from 'node:util';
import { createSql, type Sql } from '../db/client.ts';
import { startEmbeddedPostgres, type EmbeddedPostgresHandle } from '../db/embedded.ts';
import { migrate } from '../db/migrate.ts';
import type { DevServerHandle } from '../platform/temporal-dev-server.ts';
import { startScratchDevServer } from '../test-support/dev-server.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { provisionTenant } from '../services/tenants.ts';
import { loadWorkflowBundle, seedWorkflowBundleCache } from '../workers/bundle.ts';
import { descendants, killAndTrack, processAlive } from '../platform/processes.ts';
import { startService, type ServiceProcess } from '../platform/services.ts';
import { freePort } from '../test-support/ports.ts';
import { waitFor } from '../test-support/wait.ts';
import { openFundedSandboxAccounts } from '../services/sandbox.ts';
import { Client, Connection } from '@temporalio/client';
import { transferSnapshotQuery, type TransferSnapshot } from '../workflows/shared/transfer-settlement.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

export interface BankOptions {
  seed: number;
  durationMs: number;
  clients: number;
  /** The chaos loop kills something every [min, max] ms (seeded). */
  killEveryMs: [number, number];
  /** A private folder: PostgreSQL cluster, Temporal SQLite file, workflow bundle cache. */
  dataDir: string;
  /** Progress lines (default: none). */
  log?: (line: string) => void;
}

/** The children's idempotency lease: a killed request's key is taken over after this long. */
const LEASE_MS = 10_000;
/** One HTTP attempt gives up after this long (a killed API can leave a socket hanging). */
const REQUEST_TIMEOUT_MS = 15_000;
/** How long a client keeps retrying one request during the load before it moves on. */
const LOAD_RETRY_BUDGET_MS = 20_000;
/** After the load, an unanswered key is retried for this long (the lease must expire first). */
const RESOLVE_RETRY_BUDGET_MS = LEASE_MS + 40_000;
/** Every settlement workflow must be terminal this long after the last restart. */
const SETTLEMENT_DEADLINE_MS = 60_000;
const EXTRA_ACCOUNTS = 4;
const EXTRA_ACCOUNT_FUNDING_MINOR = 500_000n; // 5,000.00 USD each
const TERMINAL_A = new Set(['settled', 'failed', 'returned']);
/** The sandbox USDC wallet's preload (services/sandbox.ts), in minor units. */
const USDC_WALLET_START_MINOR = 10_000_000_000n;
type Simulation = 'settle' | 'fail' | 'return';
const SIMULATED: Record<Simulation, string> = { settle: 'settled', fail: 'failed', return: 'returned' };
const STATUS_ORDER = ['pending', 'processing', 'settled', 'returned'];

// ---------------------------------------------------------------------------------------------
// Seeded randomness

/** mulberry32: a tiny 32-bit PRNG, good enough to drive a reproducible workload. */
export function mulberry32(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

const int = (rng: () => number, min: number, max: number) => min + Math.floor(rng() * (max - min + 1));
const pick = <T>(rng: () => number, items: readonly T[]): T => items[Math.floor(rng() * items.length)]!;
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------------------------
// Processes

/** `api/main.ts` or `workers/main.ts`, forked with IPC; SIGKILLed and restarted by the chaos loop. */
class Service {
  private process: ServiceProcess<unknown> | undefined;
  starts = 0;
  /** Every process this service ever ran, with its descendants as of each kill. */
  readonly tracked = new Set<number>();

  constructor(
    readonly name: 'api' | 'worker',
    private readonly script: string,
    private readonly env: NodeJS.ProcessEnv,
    private readonly readyCheck: () => Promise<boolean>,
  ) {}

  get running(): boolean {
    const child = this.process?.child;
    return !!child && child.exitCode === null && child.signalCode === null;
  }

  tail(): string {
    return this.process?.tail() ?? '';
  }

  async start(timeoutMs = 120_000): Promise<void> {
    this.starts++;
    this.process = startService({
      name: this.name,
      script: join(root, this.script),
      cwd: root,
      env: this.env,
      detached: false,
      readyTimeoutMs: timeoutMs,
      captureOutput: true,
    });
    await this.process.ready;
    const outcome = await waitFor(
      `${this.name} to pass its readiness check`,
      async () => (!this.running ? 'exited' : (await this.readyCheck().catch(() => false)) && 'ready'),
      timeoutMs,
    ).catch((error: unknown) => {
      throw new Error(`${error instanceof Error ? error.message : String(error)}:\n${this.tail()}`);
    });
    if (outcome === 'exited') throw new Error(`${this.name} exited during its readiness check:\n${this.tail()}`);
  }

  async kill(): Promise<void> {
    // Whatever it started must die with it (checked at the end of the run).
    if (this.process) for (const pid of await killAndTrack(this.process, { group: false })) this.tracked.add(pid);
  }
}

// ---------------------------------------------------------------------------------------------
// HTTP client

type ShapeABody = {
  source: { currency: 'USDC'; rail: 'stablecoin'; amount: string };
  destination: { currency: 'USD'; rail: 'ach'; account: string };
};
type ShapeBBody = { amount: number; currency: string; source: string; destination: string };
type TransferBody = ShapeABody | ShapeBBody;

interface Answer {
  status: number;
  body: Record<string, unknown> | undefined;
  replayed: boolean;
  code: string | undefined;
}

interface Attempt {
  body: TransferBody;
  kind: 'primary' | 'replay' | 'concurrent-duplicate' | 'mismatch' | 'concurrent-mismatch';
  answer: Answer | undefined;
}

interface KeyRecord {
  key: string;
  shape: 'A' | 'B';
  primary: TransferBody;
  attempts: Attempt[];
  /** Shape A: the sandbox simulation asked for this payout, and whether the API took it (200/202). */
  simulation?: { action: Simulation; delivered: boolean };
}

interface Counters {
  requests: number;
  retries: number;
  networkErrors: number;
  status5xx: number;
  in409: number;
  replays: number;
  byStatus: Record<string, number>;
  byCode: Record<string, number>;
  created201: { A: number; B: number };
  unansweredDuringLoad: number;
  /** A request whose first try died with the API and whose retry was a replay: killed after the commit. */
  replayAfterNetworkError: number;
  /** Per key: when a try first ended without an answer (the API died or was down). */
  firstNetworkErrorAt: Map<string, number>;
}

/** The transfer ID of an answer, else its error code. */
const idOf = (answer: Answer): string =>
  typeof answer.body?.id === 'string' ? answer.body.id : (answer.code ?? `status ${answer.status}`);

const isReuseAnswer = (answer: Answer) =>
  (answer.status === 422 && answer.code === 'IDEMPOTENCY_KEY_REUSED') ||
  (answer.status === 409 && answer.code === 'IDEMPOTENCY_REQUEST_IN_PROGRESS');

class BankClient {
  constructor(
    private readonly baseUrl: () => string,
    private readonly apiKey: string,
    readonly counters: Counters,
  ) {}

  /**
   * One request, retried like a real client with the SAME key and body on a connection error, a
   * 5xx or a 409 IDEMPOTENCY_REQUEST_IN_PROGRESS, until a definite answer or the budget runs out.
   */
  async send(
    key: string,
    body: TransferBody,
    options: { budgetMs: number; inProgressIsAnswer: boolean },
  ): Promise<Answer | undefined> {
    const deadline = Date.now() + options.budgetMs;
    let sawNetworkError = false;
    for (let attempt = 0; ; attempt++) {
      if (attempt > 0) this.counters.retries++;
      this.counters.requests++;
      let answer: Answer | undefined;
      try {
        const response = await fetch(`${this.baseUrl()}/v1/transfers`, {
          method: 'POST',
          headers: {
            authorization: `Bearer ${this.apiKey}`,
            'content-type': 'application/json',
            'idempotency-key': key,
          },
          body: JSON.stringify(body),
          signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
        });
        const text = await response.text();
        let parsed: Record<string, unknown> | undefined;
        try {
          parsed = text ? (JSON.parse(text) as Record<string, unknown>) : undefined;
        } catch {
          parsed = { unparsable: text.slice(0, 200) };
        }
        answer = {
          status: response.status,
          body: parsed,
          replayed: response.headers.get('idempotent-replayed') === 'true',
          code: typeof parsed?.code === 'string' ? parsed.code : undefined,
        };
      } catch {
        this.counters.networkErrors++;
        sawNetworkError = true;
        if (!this.counters.firstNetworkErrorAt.has(key)) this.counters.firstNetworkErrorAt.set(key, Date.now());
      }
      if (answer) {
        this.counters.byStatus[answer.status] = (this.counters.byStatus[answer.status] ?? 0) + 1;
        if (answer.code) this.counters.byCode[answer.code] = (this.counters.byCode[answer.code] ?? 0) + 1;
        if (answer.status >= 500) this.counters.status5xx++;
        else if (answer.status === 409 && answer.code === 'IDEMPOTENCY_REQUEST_IN_PROGRESS') {
          this.counters.in409++;
          if (options.inProgressIsAnswer) return answer;
        } else {
          if (answer.replayed) this.counters.replays++;
          if (answer.replayed && sawNetworkError) this.counters.replayAfterNetworkError++;
          if (answer.status === 201)
            this.counters.created201['source' in body && typeof body.source === 'object' ? 'A' : 'B']++;
          return answer;
        }
      }
      if (Date.now() >= deadline) return undefined;
      await sleep(Math.min(2_000, 100 * 2 ** Math.min(attempt, 5)) * (0.5 + Math.random() / 2));
    }
  }

  /**
   * A sandbox simulation (settle, fail or return a payout), retried through kills until the API
   * takes it (200/202) or the transfer is already where it was asked to go (an earlier attempt,
   * whose answer was lost, delivered it). A 409 while the settlement is not running yet is retried.
   */
  async simulate(key: string, transferId: string, action: Simulation, budgetMs: number): Promise<boolean> {
    const deadline = Date.now() + budgetMs;
    const headers = { authorization: `Bearer ${this.apiKey}`, 'content-type': 'application/json' };
    for (let attempt = 0; Date.now() < deadline; attempt++) {
      try {
        const response = await fetch(`${this.baseUrl()}/v1/sandbox/transfers/${transferId}/${action}`, {
          method: 'POST',
          // A new key per try: a 409 about the state is a definite answer, replayed under its key.
          headers: { ...headers, 'idempotency-key': `${key}-${action}-${attempt}-${Date.now()}` },
          body: '{}',
          signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
        });
        await response.text();
        if (response.status === 200 || response.status === 202) return true;
        if (response.status === 409) {
          const current = await fetch(`${this.baseUrl()}/v1/transfers/${transferId}`, {
            headers,
            signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
          });
          const body = (await current.json()) as { status?: string };
          if (body.status === SIMULATED[action]) return true;
        }
      } catch {
        this.counters.networkErrors++;
      }
      await sleep(Math.min(2_000, 100 * 2 ** Math.min(attempt, 5)) * (0.5 + Math.random() / 2));
    }
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// The report

export interface BankReport {
  seed: number;
  durationMs: number;
  clients: number;
  killEveryMs: [number, number];
  elapsedMs: number;
  startupMs: number;
  kills: { api: number; worker: number; events: number };
  requests: number;
  retries: number;
  networkErrors: number;
  status5xx: number;
  inProgress409: number;
  replays: number;
  byStatus: Record<string, number>;
  byCode: Record<string, number>;
  created201: { A: number; B: number };
  replayAfterNetworkError: number;
  /** Transfers committed before a try of their key died unanswered: the kill landed mid-request. */
  committedBeforeLostAnswer: number;
  simulations: { asked: number; undelivered: number };
  /** Every payout's settlement workflow, by its Temporal status. */
  workflows: { running: number; completed: number; other: number };
  keys: { total: number; A: number; B: number; unansweredDuringLoad: number; unresolved: number };
  duplicates: { sameBody: number; concurrentSameBody: number; mismatched: number; concurrentMismatched: number };
  transfers: {
    total: number;
    A: number;
    B: number;
    aByStatus: Record<string, number>;
    aStatusIn201: Record<string, number>;
  };
  settlement: {
    /** From the last restart to the moment the last payout became terminal (0 if before it). */
    lastRestartToLastTerminalMs: number | null;
    /** Upper bound: when this run saw every payout terminal (after the clients drained). */
    observedAllTerminalMs: number | null;
    pendingAtDeadline: string[];
  };
  conservation: {
    companyId: string;
    environment: string;
    currency: string;
    posted: string;
    pendingDebits: string;
    pendingCredits: string;
  }[];
  leftoverProcesses: string[];
  violations: string[];
}

export class BankTestError extends Error {
  constructor(readonly report: BankReport) {
    super(`bank test: ${report.violations.length} invariant(s) violated:\n- ${report.violations.join('\n- ')}`);
  }
}

// ---------------------------------------------------------------------------------------------
// The run

interface Tenant {
  companyId: string;
  apiKey: string;
  usdAccounts: string[];
  usdcWalletId: string;
  achAccountId: string;
}

async function setUpTenant(sql: Sql, seed: number): Promise<Tenant> {
  const tenant = await provisionTenant(
    sql,
    { name: `Bank test ${seed}`, ownerEmail: `bank-${seed}-${Date.now()}@example.com` },
    SYSTEM_ACTOR,
  );
  const companyId = tenant.company.id;
  const extra = await openFundedSandboxAccounts(sql, companyId, {
    count: EXTRA_ACCOUNTS,
    amountMinor: EXTRA_ACCOUNT_FUNDING_MINOR,
    currency: 'USD',
    namePrefix: 'Bank',
  });
  return {
    companyId,
    apiKey: tenant.sandboxApiKey,
    usdAccounts: [tenant.sandbox.usdWalletId, tenant.sandbox.usdAccountId, ...extra],
    usdcWalletId: tenant.sandbox.usdcWalletId,
    achAccountId: tenant.sandbox.achAccountId,
  };
}

/** The workflow bundle in the worker's cache folder: copied from the test runner's, else built once here. */
async function prepareBundle(dataDir: string): Promise<void> {
  const cacheDir = join(dataDir, 'cache');
  const fromRunner = process.env.TEST_WORKFLOW_BUNDLE_PATH;
  if (fromRunner && existsSync(fromRunner)) await seedWorkflowBundleCache(cacheDir, fromRunner);
  else await loadWorkflowBundle(cacheDir);
}

export async function runBankTest(options: BankOptions): Promise<BankReport> {
  const log = options.log ?? (() => undefined);
  const startedAt = Date.now();
  const counters: Counters = {
    requests: 0,
    retries: 0,
    networkErrors: 0,
    status5xx: 0,
    in409: 0,
    replays: 0,
    byStatus: {},
    byCode: {},
    created201: { A: 0, B: 0 },
    unansweredDuringLoad: 0,
    replayAfterNetworkError: 0,
    firstNetworkErrorAt: new Map(),
  };
  const kills = { api: 0, worker: 0, events: 0 };
  const duplicates = { sameBody: 0, concurrentSameBody: 0, mismatched: 0, concurrentMismatched: 0 };
  const violations: string[] = [];
  const keys = new Map<string, KeyRecord>();

  let database: EmbeddedPostgresHandle | undefined;
  let temporal: DevServerHandle | undefined;
  let ownerSql: Sql | undefined;
  const services: Service[] = [];
  let report: BankReport | undefined;
  // Processes already under this one (tsx's esbuild service) are not ours to account for.
  const baseline = new Set(descendants(process.pid).map((process_) => process_.pid));
  const tracked = new Set<number>();

  try {
    await mkdir(options.dataDir, { recursive: true });
    await chmod(options.dataDir, 0o755); // embedded PostgreSQL runs as the postgres user when we are root
    const [pgPort, temporalPort, uiPort, apiPort] = await Promise.all([freePort(), freePort(), freePort(), freePort()]);
    const [db, dev] = await Promise.all([
      startEmbeddedPostgres({
        dir: join(options.dataDir, 'postgres'),
        port: pgPort,
        database: 'payments',
        ephemeral: true,
      }),
      startScratchDevServer({
        dataDir: join(options.dataDir, 'temporal'),
        port: temporalPort,
        uiPort,
        readyTimeoutMs: 120_000,
      }),
      prepareBundle(options.dataDir),
    ]);
    database = db;
    temporal = dev;
    ownerSql = createSql({
      url: database.url,
      poolMax: 4,
      connectTimeoutS: 10,
      idleTimeoutS: 30,
      statementTimeoutMs: 30_000,
      applicationName: 'bank-test',
    });
    await migrate(ownerSql);
    const tenant = await setUpTenant(ownerSql, options.seed);
    log(`infrastructure ready in ${Date.now() - startedAt} ms`);

    const env: NodeJS.ProcessEnv = { ...process.env };
    for (const name of Object.keys(env)) if (name.startsWith('TEST_')) delete env[name];
    Object.assign(env, {
      NODE_ENV: 'development',
      DATABASE_URL: database.url,
      TEMPORAL_ADDRESS: temporal.address,
      PORT: String(apiPort),
      DATA_DIR: options.dataDir,
      LOG_LEVEL: 'warn',
      IDEMPOTENCY_LEASE_MS: String(LEASE_MS),
      // Two Shape B batches in the database at once, so that the clients' transfers queue and go in
      // batches (group commit, db/ledger-batch.ts), and the kills land in the middle of some.
      LEDGER_BATCH_IN_FLIGHT_MAX: '2',
    });
    const apiUrl = `http://127.0.0.1:${apiPort}`;
    const api = new Service(
      'api',
      'api/main.ts',
      env,
      async () => (await fetch(`${apiUrl}/readyz`, { signal: AbortSignal.timeout(2_000) })).status === 200,
    );
    const worker = new Service('worker', 'workers/main.ts', env, async () => true);
    services.push(api, worker);
    await Promise.all([api.start(), worker.start(180_000)]);
    const startupMs = Date.now() - startedAt;
    log(`api and worker ready in ${startupMs} ms`);

    // ---- the load, and the chaos beside it
    const loadEnd = Date.now() + options.durationMs;
    let lastRestartAt = Date.now();
    const chaos = (async () => {
      const rng = mulberry32(options.seed ^ 0x5eed_cafe);
      let nextKill = Date.now() + int(rng, options.killEveryMs[0], options.killEveryMs[1]);
      while (true) {
        const wait = nextKill - Date.now();
        if (wait > 0) await sleep(Math.min(wait, loadEnd - Date.now()));
        if (Date.now() >= loadEnd) return;
        const roll = rng();
        const targets = roll < 0.4 ? [api] : roll < 0.7 ? [worker] : [api, worker];
        kills.events++;
        for (const target of targets) kills[target.name]++;
        log(`kill ${targets.map((target) => target.name).join('+')} at +${Date.now() - startedAt} ms`);
        await Promise.all(targets.map((target) => target.kill()));
        await Promise.all(targets.map((target) => target.start()));
        lastRestartAt = Date.now();
        log(`restarted at +${lastRestartAt - startedAt} ms`);
        nextKill = Math.max(Date.now(), nextKill + int(rng, options.killEveryMs[0], options.killEveryMs[1]));
      }
    })();

    const client = new BankClient(() => apiUrl, tenant.apiKey, counters);
    const runClient = async (index: number) => {
      const rng = mulberry32((options.seed * 1_000 + index + 1) >>> 0);
      let n = 0;
      const shapeB = (): ShapeBBody => {
        const source = pick(rng, tenant.usdAccounts);
        let destination = pick(rng, tenant.usdAccounts);
        const roll = rng();
        if (roll < 0.03)
          destination = source; // SAME_ACCOUNT
        else while (destination === source) destination = pick(rng, tenant.usdAccounts);
        if (roll >= 0.03 && roll < 0.05)
          return { amount: int(rng, 1, 1_000), currency: 'USD', source: tenant.usdcWalletId, destination };
        // Mostly small; some larger than any balance could be.
        const amount = rng() < 0.85 ? int(rng, 1, 60_000) : int(rng, 500_000, 3_000_000);
        return { amount, currency: 'USD', source, destination };
      };
      const shapeA = (): ShapeABody => {
        let cents = int(rng, 0, 99);
        if (cents >= 13 && cents <= 15) cents += 3; // .13/.14/.15 are the sandbox's magic, chosen below
        const magic = rng();
        if (magic < 0.15)
          cents = 13; // the bank refuses at once: failed, the hold voided
        else if (magic < 0.35) cents = 15; // slow: settled or failed later by a simulation, under the kills
        return {
          source: {
            currency: 'USDC',
            rail: 'stablecoin',
            amount: `${int(rng, 1, 60)}.${String(cents).padStart(2, '0')}`,
          },
          destination: { currency: 'USD', rail: 'ach', account: tenant.achAccountId },
        };
      };
      while (Date.now() < loadEnd) {
        const shape = rng() < 0.2 ? 'A' : 'B';
        const key = `bank-${options.seed}-c${index}-${++n}`;
        const primary = shape === 'A' ? shapeA() : shapeB();
        const record: KeyRecord = { key, shape, primary, attempts: [] };
        keys.set(key, record);
        const other = (): TransferBody => {
          // A different body under the same key (a client bug the API must refuse).
          if (shape === 'A') {
            const body = shapeA();
            return body.source.amount === (primary as ShapeABody).source.amount
              ? { ...body, source: { ...body.source, amount: '99.99' } }
              : body;
          }
          const body = shapeB();
          return { ...body, amount: body.amount === (primary as ShapeBBody).amount ? body.amount + 1 : body.amount };
        };
        const roll = rng();
        const attempt = async (
          body: TransferBody,
          kind: Attempt['kind'],
          inProgressIsAnswer: boolean,
          budgetMs = LOAD_RETRY_BUDGET_MS,
        ) => {
          const entry: Attempt = { body, kind, answer: undefined };
          record.attempts.push(entry);
          entry.answer = await client.send(key, body, { budgetMs, inProgressIsAnswer });
          return entry.answer;
        };
        if (roll < 0.08) {
          // Two copies at once: one executes, the other waits (409) and then gets the same answer.
          duplicates.concurrentSameBody++;
          await Promise.all([attempt(primary, 'primary', false), attempt(primary, 'concurrent-duplicate', false)]);
        } else if (roll < 0.13) {
          // The same key with a different body at the same time: exactly one body may win; the other
          // retries through 409s like any client until it gets its definite 422.
          duplicates.concurrentMismatched++;
          await Promise.all([attempt(primary, 'primary', false), attempt(other(), 'concurrent-mismatch', false)]);
        } else {
          const first = await attempt(primary, 'primary', false);
          if (first && rng() < 0.15) {
            duplicates.sameBody++;
            await attempt(primary, 'replay', false);
          }
          if (first && rng() < 0.1) {
            duplicates.mismatched++;
            await attempt(other(), 'mismatch', false);
          }
        }
        // Shape A: drive the payout's later life through the sandbox simulation endpoints, under the kills.
        // (The body that won the key: the primary, or a concurrent mismatch that got there first.)
        const won = record.attempts.find((entry) => entry.answer?.status === 201);
        const created = won?.answer;
        if (shape === 'A' && won && typeof created?.body?.id === 'string') {
          const slow = (won.body as ShapeABody).source.amount.endsWith('.15');
          const refused = (won.body as ShapeABody).source.amount.endsWith('.13');
          const action: Simulation | undefined = slow
            ? rng() < 0.5
              ? 'settle'
              : 'fail'
            : !refused && rng() < 0.25
              ? 'return'
              : undefined;
          if (action) {
            record.simulation = { action, delivered: false };
            record.simulation.delivered = await client.simulate(key, created.body.id, action, LOAD_RETRY_BUDGET_MS);
          }
        }
      }
    };
    await Promise.all(Array.from({ length: options.clients }, (_, index) => runClient(index)));
    await chaos;
    log(`load done at +${Date.now() - startedAt} ms: ${counters.requests} requests, ${kills.events} kill events`);
    for (const service of services) {
      if (!service.running) {
        await service.start();
        lastRestartAt = Date.now();
      }
    }

    // ---- every key gets a definite answer: retry the unanswered ones (after their lease expires)
    const unanswered = [...keys.values()].flatMap((record) =>
      record.attempts.filter((entry) => !entry.answer).map((entry) => ({ record, entry })),
    );
    counters.unansweredDuringLoad = unanswered.length;
    await Promise.all(
      unanswered.map(async ({ record, entry }) => {
        entry.answer = await client.send(record.key, entry.body, {
          budgetMs: RESOLVE_RETRY_BUDGET_MS,
          // A 409 may be about this very request's own dead attempt: keep retrying until decided.
          inProgressIsAnswer: false,
        });
      }),
    );
    const unresolved = unanswered.filter(({ entry }) => !entry.answer).map(({ record }) => record.key);
    // A slow payout whose every answer the kills swallowed during the load got no simulation there
    // (its client never learned its ID): it would wait for the rail's hourly poll. It gets one now.
    const lateRng = mulberry32((options.seed ^ 0x51a1_a7e5) >>> 0);
    for (const record of keys.values()) {
      const won = record.attempts.find((entry) => entry.answer?.status === 201);
      if (record.shape !== 'A' || record.simulation || !won) continue;
      if ((won.body as ShapeABody).source.amount.endsWith('.15')) {
        record.simulation = { action: lateRng() < 0.5 ? 'settle' : 'fail', delivered: false };
      }
    }
    // Simulations the kills swallowed, and those decided just now, are sent now that everything runs.
    await Promise.all(
      [...keys.values()].map(async (record) => {
        const id = record.attempts.find((entry) => entry.answer?.status === 201)?.answer?.body?.id;
        if (record.simulation && !record.simulation.delivered && typeof id === 'string')
          record.simulation.delivered = await client.simulate(
            record.key,
            id,
            record.simulation.action,
            RESOLVE_RETRY_BUDGET_MS,
          );
      }),
    );
    const undelivered = [...keys.values()].filter((record) => record.simulation && !record.simulation.delivered);
    for (const record of undelivered)
      violations.push(`${record.key}: the sandbox ${record.simulation!.action} was never taken by the API`);
    if (unresolved.length > 0)
      violations.push(`no definite answer after retrying for ${RESOLVE_RETRY_BUDGET_MS} ms: ${unresolved.join(', ')}`);

    // ---- every settlement workflow terminal within 60 s of the last restart
    const sql = ownerSql;
    const companyId = tenant.companyId;
    const pendingA = async () =>
      sql<{ id: string; status: string }[]>`
        select id, status from transfers where company_id = ${companyId} and rail = 'ach' and status not in ('settled', 'failed', 'returned')`;
    let stuck = await pendingA();
    while (stuck.length > 0 && Date.now() < lastRestartAt + SETTLEMENT_DEADLINE_MS) {
      await sleep(250);
      stuck = await pendingA();
    }
    const observedAllTerminalMs = stuck.length === 0 ? Math.max(0, Date.now() - lastRestartAt) : null;
    // When the last payout actually became terminal (its status history), relative to the last restart.
    const [lastTerminal] = await sql<{ at: Date | null }[]>`
      select max(h.occurred_at) as at from transfer_status_history h join transfers t on t.id = h.transfer_id
      where t.company_id = ${companyId} and t.rail = 'ach' and h.status in ('settled', 'failed', 'returned')`;
    const lastRestartToLastTerminalMs =
      stuck.length === 0 && lastTerminal?.at ? Math.max(0, lastTerminal.at.getTime() - lastRestartAt) : null;
    if (stuck.length > 0) {
      violations.push(
        `settlement workflows not terminal ${SETTLEMENT_DEADLINE_MS} ms after the last restart: ${stuck.map((row) => `${row.id} (${row.status})`).join(', ')}`,
      );
    }

    // ---- the invariants, read from the database
    const conservation = await sql<
      {
        company_id: string;
        environment: string;
        currency: string;
        posted: bigint;
        pending_debits: bigint;
        pending_credits: bigint;
      }[]
    >`
      select company_id, environment, currency, sum(posted)::bigint as posted,
             sum(pending_debits)::bigint as pending_debits, sum(pending_credits)::bigint as pending_credits
      from ledger_accounts group by company_id, environment, currency order by 1, 2, 3`;
    for (const row of conservation) {
      const where = `${row.company_id}/${row.environment}/${row.currency}`;
      if (row.posted !== 0n) violations.push(`money not conserved in ${where}: sum of posted is ${row.posted}`);
      if (row.pending_debits !== row.pending_credits) {
        violations.push(
          `holds unbalanced in ${where}: pending debits ${row.pending_debits} ≠ pending credits ${row.pending_credits}`,
        );
      }
    }
    const belowFloor = await sql<
      { id: string; posted: bigint; pending_debits: bigint; overdraft_limit: bigint | null }[]
    >`
      select id, posted, pending_debits, overdraft_limit from ledger_accounts
      where type <> 'system' and (overdraft_limit is null or posted - pending_debits < -overdraft_limit)`;
    for (const row of belowFloor) {
      violations.push(
        `account ${row.id} below its floor: posted ${row.posted}, pending debits ${row.pending_debits}, limit ${row.overdraft_limit}`,
      );
    }
    const perKey = await sql<{ company_id: string; environment: string; idempotency_key: string; n: bigint }[]>`
      select company_id, environment, idempotency_key, count(*)::bigint as n from transfers
      group by 1, 2, 3 having count(*) > 1`;
    for (const row of perKey)
      violations.push(`${row.n} transfers under one key ${row.company_id}/${row.environment}/${row.idempotency_key}`);
    const unbalanced = await sql<{ transfer_id: string; currency: string; kind: string; total: bigint }[]>`
      select transfer_id, currency, kind, sum(amount)::bigint as total from ledger_entries
      group by 1, 2, 3 having sum(amount) <> 0`;
    for (const row of unbalanced)
      violations.push(`transfer ${row.transfer_id} entries (${row.currency}, ${row.kind}) sum to ${row.total}`);
    const drift = await sql<
      {
        id: string;
        posted: bigint;
        pending_debits: bigint;
        pending_credits: bigint;
        e_posted: bigint;
        e_debits: bigint;
        e_credits: bigint;
      }[]
    >`
      select a.id, a.posted, a.pending_debits, a.pending_credits,
             coalesce(sum(e.amount) filter (where e.kind = 'posted'), 0)::bigint as e_posted,
             coalesce(sum(-e.amount) filter (where e.kind = 'hold' and e.amount < 0), 0)::bigint
               + coalesce(sum(e.amount) filter (where e.kind = 'hold_release' and e.amount < 0), 0)::bigint as e_debits,
             coalesce(sum(e.amount) filter (where e.kind = 'hold' and e.amount > 0), 0)::bigint
               - coalesce(sum(e.amount) filter (where e.kind = 'hold_release' and e.amount > 0), 0)::bigint as e_credits
      from ledger_accounts a left join ledger_entries e on e.account_id = a.id
      group by a.id
      having a.posted <> coalesce(sum(e.amount) filter (where e.kind = 'posted'), 0)
          or a.pending_debits <> coalesce(sum(-e.amount) filter (where e.kind = 'hold' and e.amount < 0), 0)
                                 + coalesce(sum(e.amount) filter (where e.kind = 'hold_release' and e.amount < 0), 0)
          or a.pending_credits <> coalesce(sum(e.amount) filter (where e.kind = 'hold' and e.amount > 0), 0)
                                  - coalesce(sum(e.amount) filter (where e.kind = 'hold_release' and e.amount > 0), 0)`;
    for (const row of drift) {
      violations.push(
        `account ${row.id} balances differ from its entries: stored (${row.posted}, ${row.pending_debits}, ${row.pending_credits}), ` +
          `from entries (${row.e_posted}, ${row.e_debits}, ${row.e_credits})`,
      );
    }
    const ledgerEntryCounts = await sql<{ id: string; n: bigint }[]>`
      select t.id, count(e.id)::bigint as n from transfers t left join ledger_entries e on e.transfer_id = t.id
      where t.rail = 'ledger' and t.company_id = ${companyId} group by t.id having count(e.id) <> 2`;
    for (const row of ledgerEntryCounts) violations.push(`ledger transfer ${row.id} has ${row.n} entries instead of 2`);
    // Each hold is resolved as its transfer's status says: failed → voided, settled/returned → posted.
    const holdMismatch = await sql<{ id: string; status: string; hold: string }[]>`
      select t.id, t.status, h.status as hold from transfers t join ledger_holds h on h.transfer_id = t.id
      where t.company_id = ${companyId}
        and not ((t.status in ('pending', 'processing') and h.status = 'pending')
              or (t.status = 'failed' and h.status = 'voided')
              or (t.status in ('settled', 'returned') and h.status = 'posted'))`;
    for (const row of holdMismatch) violations.push(`payout ${row.id} is ${row.status} but its hold is ${row.hold}`);
    // Each customer account against a model built from the transfers alone (not from the entries):
    // posted = ledger transfers in − out − settled payouts; pending debits = payouts still in flight.
    const modelDrift = await sql<
      { id: string; posted: bigint; pending_debits: bigint; expected_posted: bigint; expected_pending: bigint }[]
    >`
      select a.id, a.posted, a.pending_debits, m.expected_posted, m.expected_pending
      from ledger_accounts a
      cross join lateral (
        select coalesce(sum(t.amount) filter (where t.rail = 'ledger' and t.status = 'settled' and t.destination_account_id = a.id), 0)::bigint
             - coalesce(sum(t.amount) filter (where t.rail = 'ledger' and t.status = 'settled' and t.source_account_id = a.id), 0)::bigint
             - coalesce(sum(t.amount) filter (where t.rail = 'ach' and t.status = 'settled' and t.source_account_id = a.id), 0)::bigint
               as expected_posted,
               coalesce(sum(t.amount) filter (where t.rail = 'ach' and t.status in ('pending', 'processing') and t.source_account_id = a.id), 0)::bigint
               as expected_pending
        from transfers t where t.company_id = a.company_id and t.environment = a.environment
      ) m
      where a.company_id = ${companyId} and a.type <> 'system'
        and (a.posted <> m.expected_posted or a.pending_debits <> m.expected_pending)`;
    for (const row of modelDrift) {
      violations.push(
        `account ${row.id}: posted ${row.posted}, pending debits ${row.pending_debits}; the transfers say ${row.expected_posted}, ${row.expected_pending}`,
      );
    }
    const [wallet] = await sql<
      { posted: bigint }[]
    >`select posted from ledger_accounts where id = ${tenant.usdcWalletId}`;
    const [settledA] = await sql<{ total: bigint }[]>`
      select coalesce(sum(amount), 0)::bigint as total from transfers
      where company_id = ${companyId} and rail = 'ach' and status = 'settled'`;
    if (wallet!.posted !== USDC_WALLET_START_MINOR - settledA!.total)
      violations.push(`USDC wallet posted ${wallet!.posted}, expected ${USDC_WALLET_START_MINOR - settledA!.total}`);

    // Every answer against the database: one transfer per key, every 201 durable, replays identical.
    const rows = await sql<
      {
        id: string;
        idempotency_key: string;
        rail: string;
        status: string;
        amount: bigint;
        currency: string;
        source_account_id: string;
        destination_account_id: string | null;
        created_at: Date;
      }[]
    >`
      select id, idempotency_key, rail, status, amount, currency, source_account_id, destination_account_id, created_at
      from transfers where company_id = ${companyId} and environment = 'sandbox'`;
    const byKey = new Map(rows.map((row) => [row.idempotency_key, row]));
    const ours = rows.filter((row) => row.idempotency_key.startsWith(`bank-${options.seed}-`));
    for (const row of ours) {
      if (!keys.has(row.idempotency_key))
        violations.push(`transfer ${row.id} under key ${row.idempotency_key} that no client sent`);
    }
    const fingerprint = (body: TransferBody) => JSON.stringify(body);
    /** The status each payout's 201 carried (settled at once, or still pending/processing). */
    const aAnswered: Record<string, number> = {};
    for (const record of keys.values()) {
      const answered = record.attempts.filter((entry): entry is Attempt & { answer: Answer } => !!entry.answer);
      const winners = new Map<string, Answer[]>();
      for (const entry of answered) {
        if (
          entry.kind === 'mismatch' &&
          !(entry.answer.status === 422 && entry.answer.code === 'IDEMPOTENCY_KEY_REUSED')
        ) {
          violations.push(
            `${record.key}: a different body after the first answer got ${entry.answer.status} ${entry.answer.code ?? ''}, not 422 IDEMPOTENCY_KEY_REUSED`,
          );
        }
        if (isReuseAnswer(entry.answer)) continue;
        const list = winners.get(fingerprint(entry.body)) ?? [];
        list.push(entry.answer);
        winners.set(fingerprint(entry.body), list);
      }
      if (winners.size > 1) {
        violations.push(`${record.key}: ${winners.size} different bodies executed under one key`);
        continue;
      }
      const row = byKey.get(record.key);
      const [winner] = [...winners.entries()];
      if (!winner) {
        // Nobody won: every answer says the key was reused or busy, which needs some other request to have won.
        if (answered.length > 0)
          violations.push(`${record.key}: only "reused"/"in progress" answers, no request executed`);
        continue;
      }
      const [winnerFingerprint, answers] = winner;
      const first = answers[0]!;
      for (const later of answers.slice(1)) {
        const sameId = later.body?.id === first.body?.id;
        if (later.status !== first.status || !sameId || later.code !== first.code) {
          violations.push(
            `${record.key}: same key and body answered ${first.status} ${idOf(first)} then ${later.status} ${idOf(later)}`,
          );
        } else if (later.replayed && !isDeepStrictEqual(later.body, first.body)) {
          violations.push(`${record.key}: a replay's body differs from the first answer's`);
        }
      }
      const body = JSON.parse(winnerFingerprint) as TransferBody;
      if (first.status !== 201) {
        if (row)
          violations.push(
            `${record.key}: answered ${first.status} ${first.code ?? ''} but transfer ${row.id} exists under the key`,
          );
        continue;
      }
      if (!row) {
        violations.push(`${record.key}: answered 201 (${String(first.body?.id)}) but no transfer exists under the key`);
        continue;
      }
      const answer = first.body ?? {};
      if (answer.id !== row.id)
        violations.push(`${record.key}: 201 says ${String(answer.id)}, the database has ${row.id}`);
      if (record.shape === 'B') {
        const b = body as ShapeBBody;
        if (
          row.rail !== 'ledger' ||
          row.amount !== BigInt(b.amount) ||
          row.source_account_id !== b.source ||
          row.destination_account_id !== b.destination
        ) {
          violations.push(`${record.key}: ledger transfer ${row.id} in the database does not match the request`);
        }
        if (answer.amount !== Number(row.amount) || answer.status !== row.status || row.status !== 'settled') {
          violations.push(
            `${record.key}: 201 says ${String(answer.amount)} ${String(answer.status)}, the database ${row.amount} ${row.status}`,
          );
        }
      } else {
        const a = body as ShapeABody;
        const source = answer.source as { amount?: string } | undefined;
        if (row.rail !== 'ach' || source?.amount === undefined || Number(source.amount) !== Number(a.source.amount)) {
          violations.push(
            `${record.key}: payout ${row.id} in the database or response does not match the request ${a.source.amount}`,
          );
        }
        const [whole = '0', fraction = ''] = a.source.amount.split('.');
        const minor = BigInt(whole) * 1_000_000n + BigInt(fraction.padEnd(6, '0'));
        if (row.amount !== minor)
          violations.push(`${record.key}: payout ${row.id} amount ${row.amount}, requested ${minor}`);
        const said = String(answer.status);
        aAnswered[said] = (aAnswered[said] ?? 0) + 1;
        const saidIndex = STATUS_ORDER.indexOf(said);
        const isIndex = STATUS_ORDER.indexOf(row.status);
        const consistent =
          said === row.status ||
          (saidIndex >= 0 && isIndex > saidIndex) ||
          (['pending', 'processing'].includes(said) && row.status === 'failed');
        if (!consistent)
          violations.push(`${record.key}: 201 says ${said}, the database has ${row.status}, which cannot follow it`);
      }
    }
    // Each payout ends where its amount and its simulation say, and its workflow agrees with the database.
    const connection = await Connection.connect({ address: dev.address });
    const workflows = { running: 0, completed: 0, other: 0 };
    try {
      const client = new Client({ connection, namespace: 'default' });
      const payouts = await sql<{ id: string; idempotency_key: string; status: string; workflow_id: string | null }[]>`
        select id, idempotency_key, status, workflow_id from transfers where company_id = ${companyId} and rail = 'ach'`;
      for (const payout of payouts) {
        const record = keys.get(payout.idempotency_key);
        if (record?.shape === 'A') {
          const winner = record.attempts.find((entry) => entry.answer?.status === 201);
          const amount = ((winner?.body ?? record.primary) as ShapeABody).source.amount;
          const expected = !winner
            ? undefined
            : amount.endsWith('.13')
              ? 'failed'
              : record.simulation
                ? record.simulation.delivered
                  ? SIMULATED[record.simulation.action]
                  : undefined // reported above as undelivered
                : amount.endsWith('.15')
                  ? undefined
                  : 'settled';
          if (expected && payout.status !== expected) {
            // Say what the run saw: the signals it received, in order with its other events.
            const history = payout.workflow_id
              ? await client.workflow
                  .getHandle(payout.workflow_id)
                  .fetchHistory()
                  .catch(() => undefined)
              : undefined;
            const events = (history?.events ?? [])
              .map((event) =>
                event.workflowExecutionSignaledEventAttributes
                  ? `signal:${event.workflowExecutionSignaledEventAttributes.signalName}`
                  : event.markerRecordedEventAttributes
                    ? 'marker'
                    : event.workflowTaskFailedEventAttributes
                      ? 'task-failed'
                      : event.workflowTaskCompletedEventAttributes
                        ? 'task-done'
                        : '',
              )
              .filter(Boolean);
            violations.push(
              `${record.key}: payout ${payout.id} of ${amount} is ${payout.status}, expected ${expected} (run: ${events.join(' ')})`,
            );
          }
        }
        if (!payout.workflow_id) {
          violations.push(`payout ${payout.id} has no settlement workflow`);
          continue;
        }
        const handle = client.workflow.getHandle(payout.workflow_id);
        const description = await handle.describe().catch(() => undefined);
        const name = description?.status.name;
        if (name === 'RUNNING') workflows.running++;
        else if (name === 'COMPLETED') workflows.completed++;
        else {
          workflows.other++;
          violations.push(`payout ${payout.id}: settlement workflow ${payout.workflow_id} is ${name ?? 'missing'}`);
          continue;
        }
        // A settled payout's run watches the return window; a failed or returned one has finished.
        if ((name === 'RUNNING') !== (payout.status === 'settled'))
          violations.push(`payout ${payout.id} is ${payout.status} but its workflow is ${name}`);
        const snapshot: { status: string } = await (
          name === 'COMPLETED' ? (handle.result() as Promise<TransferSnapshot>) : handle.query(transferSnapshotQuery)
        ).catch((error: unknown) => ({ status: `unreadable: ${String(error)}` }));
        if (snapshot.status !== payout.status)
          violations.push(`payout ${payout.id}: the workflow says ${snapshot.status}, the database ${payout.status}`);
      }
    } finally {
      await connection.close();
    }

    const aByStatus: Record<string, number> = {};
    for (const row of ours) if (row.rail === 'ach') aByStatus[row.status] = (aByStatus[row.status] ?? 0) + 1;
    for (const [key, row] of byKey) {
      if (row.rail === 'ach' && !TERMINAL_A.has(row.status))
        violations.push(`payout ${row.id} (${key}) still ${row.status}`);
    }

    report = {
      seed: options.seed,
      durationMs: options.durationMs,
      clients: options.clients,
      killEveryMs: options.killEveryMs,
      elapsedMs: 0,
      startupMs,
      kills,
      requests: counters.requests,
      retries: counters.retries,
      networkErrors: counters.networkErrors,
      status5xx: counters.status5xx,
      inProgress409: counters.in409,
      replays: counters.replays,
      byStatus: counters.byStatus,
      byCode: counters.byCode,
      created201: counters.created201,
      replayAfterNetworkError: counters.replayAfterNetworkError,
      committedBeforeLostAnswer: ours.filter((row) => {
        const lostAt = counters.firstNetworkErrorAt.get(row.idempotency_key);
        return lostAt !== undefined && row.created_at.getTime() < lostAt;
      }).length,
      simulations: {
        asked: [...keys.values()].filter((record) => record.simulation).length,
        undelivered: undelivered.length,
      },
      workflows,
      keys: {
        total: keys.size,
        A: [...keys.values()].filter((record) => record.shape === 'A').length,
        B: [...keys.values()].filter((record) => record.shape === 'B').length,
        unansweredDuringLoad: counters.unansweredDuringLoad,
        unresolved: unresolved.length,
      },
      duplicates,
      transfers: {
        total: ours.length,
        A: ours.filter((row) => row.rail === 'ach').length,
        B: ours.filter((row) => row.rail === 'ledger').length,
        aByStatus,
        aStatusIn201: aAnswered,
      },
      settlement: { lastRestartToLastTerminalMs, observedAllTerminalMs, pendingAtDeadline: stuck.map((row) => row.id) },
      conservation: conservation.map((row) => ({
        companyId: row.company_id,
        environment: row.environment,
        currency: row.currency,
        posted: row.posted.toString(),
        pendingDebits: row.pending_debits.toString(),
        pendingCredits: row.pending_credits.toString(),
      })),
      leftoverProcesses: [],
      violations,
    };
  } finally {
    // Tear down everything started here, whatever happened above.
    for (const process_ of descendants(process.pid)) if (!baseline.has(process_.pid)) tracked.add(process_.pid);
    await Promise.allSettled(services.map((service) => service.kill()));
    await ownerSql?.end({ timeout: 5 }).catch(() => undefined);
    await temporal?.stop().catch(() => undefined);
    await database?.stop().catch(() => undefined);
    for (const service of services) for (const pid of service.tracked) tracked.add(pid);
  }
  if (!report) throw new Error('bank test: no report');
  // Nothing may be left behind: wait briefly for PostgreSQL's and Temporal's processes to go.
  const leftover = () => {
    const under = descendants(process.pid).filter((process_) => !baseline.has(process_.pid));
    const orphans = [...tracked].filter((pid) => processAlive(pid) && !under.some((process_) => process_.pid === pid));
    return [
      ...under.map((process_) => `${process_.pid} ${process_.command}`),
      ...orphans.map((pid) => `${pid} (orphaned)`),
    ];
  };
  let left = leftover();
  for (let waited = 0; left.length > 0 && waited < 15_000; waited += 200) {
    await sleep(200);
    left = leftover();
  }
  report.leftoverProcesses = left;
  if (left.length > 0) report.violations.push(`processes left behind: ${report.leftoverProcesses.join(', ')}`);
  report.elapsedMs = Date.now() - startedAt;
  if (report.violations.length > 0) throw new BankTestError(report);
  return report;
}
