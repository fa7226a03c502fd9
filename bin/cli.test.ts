// The CLI as a user runs it: a child process with its own environment, against a private test
// database (DATABASE_URL) or, in the last suite, the embedded PostgreSQL of a private DATA_DIR.
import assert from 'node:assert/strict';
import { execFileSync, fork, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readFile, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { findLoginCandidate } from '../db/operators.ts';
import { withSystemScope } from '../db/tenant.ts';
import { authenticateApiKey, revokeApiKey } from '../services/api-keys.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { parseApiKey, verifyPassword } from '../services/credentials.ts';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { freePort } from '../test-support/ports.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const CLI_TIMEOUT_MS = 120_000;
const COMPANY_ID = /^co_[0-9a-f]{32}$/;
const SANDBOX_KEY = /^sk_sandbox_[0-9A-Za-z]{44}$/;
/** Variables the CLI reads that the test runner's own environment must not leak into a run. */
const CLEARED = [
  'DATABASE_URL',
  'DATA_DIR',
  'PORT',
  'PUBLIC_BASE_URL',
  'TEMPORAL_ADDRESS',
  'TEMPORAL_UI_PORT',
  'EMBEDDED_POSTGRES_PORT',
];

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
  /** stdout parsed as JSON (fails the test with both streams when it is not). */
  json: () => Record<string, any>;
}

function environment(overrides: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const name of CLEARED) delete env[name];
  return { ...env, ...overrides };
}

async function cli(args: string[], overrides: Record<string, string>): Promise<Run> {
  const child = spawn(process.execPath, ['--import', import.meta.resolve('tsx'), join(root, 'bin/cli.ts'), ...args], {
    cwd: root,
    env: environment(overrides),
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: CLI_TIMEOUT_MS,
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const code = await new Promise<number | null>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (exitCode) => resolve(exitCode));
  });
  assert.doesNotMatch(stderr, /open handles kept the process alive/);
  return {
    code,
    stdout,
    stderr,
    json: () => {
      try {
        return JSON.parse(stdout) as Record<string, any>;
      } catch {
        throw new Error(`stdout is not JSON (exit ${code}):\n${stdout}\nstderr:\n${stderr}`);
      }
    },
  };
}

function assertSucceeded(run: Run): void {
  assert.equal(run.code, 0, `exit ${run.code}\nstdout:\n${run.stdout}\nstderr:\n${run.stderr}`);
}

/** The printed credentials work: the password signs in to the company, the key authenticates for it. */
interface PrintedCredentials {
  companyId: string;
  email: string;
  password: string;
  sandboxApiKey?: string;
}

async function assertCredentialsWork(database: TestDatabase, printed: PrintedCredentials): Promise<void> {
  const candidate = await findLoginCandidate(database.sql, printed.email);
  assert.equal(candidate?.companyId, printed.companyId);
  assert.equal(candidate.role, 'owner');
  assert.ok(await verifyPassword(candidate.passwordHash, printed.password), `the password of ${printed.email} works`);
  if (printed.sandboxApiKey !== undefined) {
    const principal = await authenticateApiKey(database.sql, printed.sandboxApiKey);
    assert.equal(principal.companyId, printed.companyId);
    assert.equal(principal.environment, 'sandbox');
  }
}

async function count(database: TestDatabase, table: 'companies' | 'operators' | 'api_keys'): Promise<number> {
  return withSystemScope(database.sql, async (tx) => {
    const [row] = await tx<{ count: number }[]>`select count(*)::int as count from ${tx(table)}`;
    return row!.count;
  });
}

/** DESIGN 13's sandbox: a wallet and an account in one currency (Shape B) and an ACH bank account (Shape A). */
function assertSandboxPair(sandbox: unknown): void {
  const pair = sandbox as { walletId: string; accountId: string; currency: string; achAccount: string };
  assert.match(pair.achAccount, /^ba_[0-9a-f]{32}$/);
  assert.match(pair.walletId, /^wal_[0-9a-f]{32}$/);
  assert.match(pair.accountId, /^acct_[0-9a-f]{32}$/);
  assert.equal(pair.currency, 'USD');
}

describe('cli against DATABASE_URL', { timeout: 300_000 }, () => {
  let database: TestDatabase;
  let dataDir: string;
  let otherDataDir: string;
  let env: Record<string, string>;
  let first: any;

  before(async () => {
    database = await createTestDatabase();
    dataDir = await mkdtemp(join(tmpdir(), 'payments-cli-'));
    otherDataDir = await mkdtemp(join(tmpdir(), 'payments-cli-other-'));
    env = { DATABASE_URL: database.url, DATA_DIR: dataDir, PORT: '4321', TEMPORAL_UI_PORT: '9876', LOG_LEVEL: 'warn' };
  });
  after(async () => {
    await database?.drop();
    await rm(dataDir, { recursive: true, force: true });
    await rm(otherDataDir, { recursive: true, force: true });
  });

  it('bootstrap prints the documented shape and keeps the credentials in DATA_DIR/bootstrap.json (0600)', async () => {
    const run = await cli(['bootstrap', '--json'], env);
    assertSucceeded(run);
    first = run.json();
    assert.deepEqual(Object.keys(first).sort(), ['apiBaseUrl', 'master', 'temporalUiUrl', 'tenant']);
    assert.equal(first.apiBaseUrl, 'http://127.0.0.1:4321');
    assert.equal(first.temporalUiUrl, 'http://127.0.0.1:9876');
    assert.deepEqual(Object.keys(first.master).sort(), ['companyId', 'email', 'password']);
    assert.deepEqual(Object.keys(first.tenant).sort(), ['companyId', 'email', 'password', 'sandbox', 'sandboxApiKey']);
    assertSandboxPair(first.tenant.sandbox);
    assert.match(first.master.companyId, COMPANY_ID);
    assert.match(first.tenant.companyId, COMPANY_ID);
    assert.notEqual(first.master.companyId, first.tenant.companyId);
    assert.equal(first.master.email, 'admin@platform.example');
    assert.equal(first.tenant.email, 'owner@demo-company.example');
    assert.ok(first.master.password.length >= 12 && first.tenant.password.length >= 12);
    assert.match(first.tenant.sandboxApiKey, SANDBOX_KEY);

    const companies = await withSystemScope(
      database.sql,
      (tx) =>
        tx<{ id: string; name: string; is_master_company: boolean }[]>`
        select id, name, is_master_company from companies order by is_master_company desc`,
    );
    assert.deepEqual(
      companies.map((row) => ({ ...row })),
      [
        { id: first.master.companyId, name: 'Platform', is_master_company: true },
        { id: first.tenant.companyId, name: 'Demo Company', is_master_company: false },
      ],
    );
    await assertCredentialsWork(database, first.master);
    await assertCredentialsWork(database, first.tenant);
    const file = join(dataDir, 'bootstrap.json');
    assert.equal((await stat(file)).mode & 0o777, 0o600);
    assert.deepEqual(await readdir(dataDir), ['bootstrap.json'], 'no temporary file is left behind');
  });

  it('a second bootstrap prints the same JSON and creates nothing', async () => {
    const run = await cli(['bootstrap', '--json'], env);
    assertSucceeded(run);
    assert.equal(JSON.stringify(run.json()), JSON.stringify(first));
    assert.equal(await count(database, 'companies'), 2);
    assert.equal(await count(database, 'operators'), 2);
    assert.equal(await count(database, 'api_keys'), 2); // provisionTenant gives the master a sandbox key too
  });

  it('reports PUBLIC_BASE_URL and no Temporal UI when Temporal is external', async () => {
    const run = await cli(['bootstrap', '--json'], {
      ...env,
      PUBLIC_BASE_URL: 'https://payments.example.com',
      TEMPORAL_ADDRESS: 'temporal.internal:7233',
    });
    assertSucceeded(run);
    assert.deepEqual(run.json(), { ...first, apiBaseUrl: 'https://payments.example.com', temporalUiUrl: null });
  });

  it('bootstrap with another DATA_DIR against the same database fails clearly and creates nothing', async () => {
    const run = await cli(['bootstrap', '--json'], { ...env, DATA_DIR: otherDataDir });
    assert.equal(run.code, 1);
    assert.equal(run.json().error.code, 'BOOTSTRAP_MISMATCH');
    assert.match(run.stderr, /master company .* another DATA_DIR/);
    assert.equal(run.stderr.trim().split('\n').length, 1, 'one line on stderr');
    assert.deepEqual(await readdir(otherDataDir), []);
    assert.equal(await count(database, 'companies'), 2);
    assert.equal(await count(database, 'operators'), 2);
  });

  it('bootstrap replaces a saved sandbox key that was revoked, and prints the new one from then on', async () => {
    const companyId: string = first.tenant.companyId;
    const lookup = parseApiKey(first.tenant.sandboxApiKey)!.lookup;
    const [key] = await withSystemScope(
      database.sql,
      (tx) => tx<{ id: string }[]>`select id from api_keys where lookup = ${lookup}`,
    );
    await revokeApiKey(database.sql, { companyId, id: key!.id, revokedBy: null }, SYSTEM_ACTOR);
    const run = await cli(['bootstrap', '--json'], { ...env, LOG_LEVEL: 'info' }); // info: notes on stderr
    assertSucceeded(run);
    const renewed = run.json();
    assert.notEqual(renewed.tenant.sandboxApiKey, first.tenant.sandboxApiKey);
    assert.match(renewed.tenant.sandboxApiKey, SANDBOX_KEY);
    assert.deepEqual(renewed, { ...first, tenant: { ...first.tenant, sandboxApiKey: renewed.tenant.sandboxApiKey } });
    await assertCredentialsWork(database, renewed.tenant);
    assert.match(run.stderr, /no longer works/);
    const again = await cli(['bootstrap', '--json'], env);
    assertSucceeded(again);
    assert.equal(JSON.stringify(again.json()), JSON.stringify(renewed), 'kept in bootstrap.json');
    assert.equal(await count(database, 'api_keys'), 3);
  });

  it('company create prints the tenant alone; the same --email again fails with EMAIL_TAKEN', async () => {
    const run = await cli(
      ['company', 'create', '--name', 'Acme Test', '--email', 'Founder@Acme-Test.example', '--json'],
      env,
    );
    assertSucceeded(run);
    const tenant = run.json() as PrintedCredentials;
    assert.deepEqual(Object.keys(tenant).sort(), ['companyId', 'email', 'password', 'sandbox', 'sandboxApiKey']);
    assertSandboxPair((tenant as { sandbox?: unknown }).sandbox);
    assert.match(tenant.companyId, COMPANY_ID);
    assert.equal(tenant.email, 'founder@acme-test.example');
    assert.ok(tenant.password.length >= 12);
    assert.match(tenant.sandboxApiKey!, SANDBOX_KEY);
    await assertCredentialsWork(database, tenant);

    const again = await cli(
      ['company', 'create', '--name', 'Acme Again', '--email', 'founder@acme-test.example', '--json'],
      env,
    );
    assert.equal(again.code, 1);
    assert.equal(again.json().error.code, 'EMAIL_TAKEN');
    assert.equal(again.stderr.trim().split('\n').length, 1, 'one line on stderr');
    assert.match(again.stderr, /EMAIL_TAKEN/);
    assert.equal(await count(database, 'companies'), 3, 'the failed create left nothing behind');

    const plain = await cli(['company', 'create', '--name', 'Acme Again', '--email', 'founder@acme-test.example'], env);
    assert.equal(plain.code, 1);
    assert.equal(plain.stdout, '', 'without --json the error goes to stderr only');
  });

  it('company create derives the owner email from the name and adds a suffix when it is taken', async () => {
    const first = await cli(['company', 'create', '--name', 'Zeta Bank, Ltd.', '--json'], env);
    assertSucceeded(first);
    assert.equal(first.json().email, 'owner@zeta-bank-ltd.example');
    const second = await cli(['company', 'create', '--name', 'Zeta Bank, Ltd.', '--json'], env);
    assertSucceeded(second);
    assert.match(second.json().email, /^owner-[0-9a-f]{6}@zeta-bank-ltd\.example$/);
    assert.notEqual(second.json().companyId, first.json().companyId);
  });

  it('company verify marks the company verified, idempotently; an unknown id fails', async () => {
    const companyId: string = first.tenant.companyId;
    const run = await cli(['company', 'verify', '--id', companyId, '--json'], env);
    assertSucceeded(run);
    const verified = run.json();
    assert.equal(verified.companyId, companyId);
    assert.equal(verified.verificationStatus, 'verified');
    assert.ok(!Number.isNaN(Date.parse(verified.verifiedAt)));
    const [row] = await withSystemScope(
      database.sql,
      (tx) =>
        tx<{ verification_status: string; verified_at: Date }[]>`
        select verification_status, verified_at from companies where id = ${companyId}`,
    );
    assert.equal(row!.verification_status, 'verified');
    assert.equal(row!.verified_at.toISOString(), verified.verifiedAt);

    const again = await cli(['company', 'verify', '--id', companyId, '--json'], env);
    assertSucceeded(again);
    assert.deepEqual(again.json(), verified);

    const unknown = await cli(['company', 'verify', '--id', `co_${'0'.repeat(32)}`, '--json'], env);
    assert.equal(unknown.code, 1);
    assert.equal(unknown.json().error.code, 'NOT_FOUND');
    assert.match(unknown.stderr, /No company with id co_0{32}/);
  });

  it('prints usage for --help (exit 0) and for an unknown command (exit 2)', async () => {
    const help = await cli(['--help'], env);
    assert.equal(help.code, 0);
    assert.match(help.stdout, /^Usage: npm run cli -- <command>/);

    const unknown = await cli(['frobnicate'], env);
    assert.equal(unknown.code, 2);
    assert.match(unknown.stderr, /unknown command "frobnicate"/);
    assert.match(unknown.stderr, /Usage: npm run cli/);

    const missing = await cli(['company', 'create', '--json'], env);
    assert.equal(missing.code, 2);
    assert.equal(missing.json().error.code, 'USAGE');
    assert.equal((await cli(['bootstrap', '--name', 'x'], env)).code, 2);
    assert.equal((await cli(['company', 'verify', '--id', 'nope'], env)).code, 2);
  });
});

describe('cli bootstrap after an interrupted run', { timeout: 300_000 }, () => {
  let database: TestDatabase;
  let dataDir: string;
  let env: Record<string, string>;
  before(async () => {
    database = await createTestDatabase();
    dataDir = await mkdtemp(join(tmpdir(), 'payments-cli-recover-'));
    env = { DATABASE_URL: database.url, DATA_DIR: dataDir, LOG_LEVEL: 'warn' };
  });
  after(async () => {
    await database?.drop();
    await rm(dataDir, { recursive: true, force: true });
  });

  it('adopts rows whose credentials the file holds but never recorded, and refuses ones it cannot prove', async () => {
    const created = await cli(['bootstrap', '--json'], env);
    assertSucceeded(created);
    const printed = created.json();
    const file = join(dataDir, 'bootstrap.json');
    const recorded = JSON.parse(await readFile(file, 'utf8'));

    // As if the process had stopped after each commit but before writing the ids down.
    const pending = {
      ...recorded,
      master: { email: recorded.master.email, password: recorded.master.password },
      tenant: { email: recorded.tenant.email, password: recorded.tenant.password },
    };
    await writeFile(
      file,
      JSON.stringify({ ...pending, master: { ...pending.master, password: 'not-the-password-1' } }),
    );
    const unproven = await cli(['bootstrap', '--json'], env);
    assert.equal(unproven.code, 1);
    assert.equal(unproven.json().error.code, 'BOOTSTRAP_MISMATCH');

    await writeFile(file, JSON.stringify(pending));
    const recovered = await cli(['bootstrap', '--json'], env);
    assertSucceeded(recovered);
    const again = recovered.json();
    assert.deepEqual(again.master, printed.master);
    assert.deepEqual({ ...again.tenant, sandboxApiKey: '' }, { ...printed.tenant, sandboxApiKey: '' });
    assert.notEqual(again.tenant.sandboxApiKey, printed.tenant.sandboxApiKey, 'the lost key secret is replaced');
    await assertCredentialsWork(database, again.tenant);
    assert.equal(await count(database, 'companies'), 2);
    assert.equal(await count(database, 'operators'), 2);

    const settled = await cli(['bootstrap', '--json'], env);
    assertSucceeded(settled);
    assert.deepEqual(settled.json(), again);
  });
});

/** Every process whose command line names the data folder (the postmaster: `postgres -D <pgdata>`). */
function processesFor(folder: string): string[] {
  return execFileSync('ps', ['-e', '-o', 'pid=,args='], { encoding: 'utf8' })
    .split('\n')
    .filter((line) => line.includes(folder));
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('cli with the embedded PostgreSQL of DATA_DIR', { timeout: 300_000 }, () => {
  let dataDir: string;
  let env: Record<string, string>;
  let first: any;

  before(async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'payments-cli-embedded-'));
    await chmod(dataDir, 0o755); // embedded PostgreSQL runs as the postgres user when we are root
    env = { DATA_DIR: dataDir, EMBEDDED_POSTGRES_PORT: String(await freePort()), LOG_LEVEL: 'info' };
  });
  after(async () => {
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  });

  it('starts PostgreSQL for the command, bootstraps, and stops it again', async () => {
    const run = await cli(['bootstrap', '--json'], env);
    assertSucceeded(run);
    first = run.json();
    assert.match(first.tenant.sandboxApiKey, SANDBOX_KEY);
    assert.match(run.stderr, /starting the embedded PostgreSQL/);
    assert.match(run.stderr, /stopped the embedded PostgreSQL/);
    const pgdata = join(dataDir, 'postgres', 'pgdata');
    assert.deepEqual(processesFor(pgdata), [], 'no postgres process is left running for the data folder');
    assert.equal(existsSync(join(pgdata, 'postmaster.pid')), false);

    // A failure keeps its exit code (embedded-postgres's exit hook would otherwise exit with 0).
    const unknown = await cli(['company', 'verify', '--id', `co_${'0'.repeat(32)}`, '--json'], env);
    assert.equal(unknown.code, 1);
    assert.equal(unknown.json().error.code, 'NOT_FOUND');
    assert.deepEqual(processesFor(pgdata), []);
  });

  it('uses the PostgreSQL that `npm start` runs, and leaves it running', async () => {
    // The same supervisor `npm start` uses, over IPC.
    const supervisor = fork(join(root, 'bin/embedded-postgres-main.ts'), [], {
      cwd: root,
      env: environment({ ...env, LOG_LEVEL: 'warn' }),
      execArgv: ['--import', import.meta.resolve('tsx')],
      stdio: ['ignore', 'ignore', 'inherit', 'ipc'],
    });
    const exited = new Promise<number | null>((resolve) => supervisor.once('exit', (code) => resolve(code)));
    try {
      await new Promise<void>((resolve, reject) => {
        supervisor.on('message', (message: { type?: string }) => {
          if (message.type === 'ready') resolve();
        });
        void exited.then((code) => reject(new Error(`the PostgreSQL supervisor exited with ${code}`)));
      });
      const pidFile = join(dataDir, 'postgres', 'pgdata', 'postmaster.pid');
      const postmaster = Number.parseInt((await readFile(pidFile, 'utf8')).split('\n')[0]!, 10);

      const run = await cli(['bootstrap', '--json'], env);
      assertSucceeded(run);
      assert.deepEqual(run.json(), first);
      assert.match(run.stderr, /using the running embedded PostgreSQL/);
      assert.doesNotMatch(run.stderr, /starting the embedded PostgreSQL/);
      assert.ok(alive(postmaster), 'the running postmaster was left alone');
      assert.equal(Number.parseInt((await readFile(pidFile, 'utf8')).split('\n')[0]!, 10), postmaster);
    } finally {
      if (supervisor.connected) supervisor.send({ type: 'stop' });
      await exited;
    }
  });
});
