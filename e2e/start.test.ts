// End to end: `npm start`'s entry point with embedded PostgreSQL, the Temporal dev server, the
// worker and the API, on free ports and a private DATA_DIR. Proves /readyz answers 200, a Ctrl-C
// leaves no process behind, and a second start keeps the data of the first.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, describe, it } from 'node:test';
import postgres from 'postgres';
import { Client, Connection } from '@temporalio/client';
import { DATA_RETENTION_WORKFLOW_ID } from '../workflows/shared/data-retention.ts';
import { waitFor } from '../test-support/wait.ts';
import { freePort } from '../test-support/ports.ts';
import { descendants, processAlive } from '../platform/processes.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

interface Started {
  child: ChildProcess;
  ready: { apiUrl: string; temporalUiUrl: string; temporalAddress: string };
  output: () => string;
}

async function start(env: NodeJS.ProcessEnv): Promise<Started> {
  // Detached: its own process group, so the test can send Ctrl-C to the group like a terminal does.
  const child = spawn(process.execPath, ['--import', import.meta.resolve('tsx'), join(root, 'bin/start.ts')], {
    cwd: root,
    env,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  let output = '';
  child.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const ready = await new Promise<Started['ready']>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`not ready in 180 s:\n${output}`)), 180_000);
    child.on('message', (message: { type?: string } & Started['ready']) => {
      if (message.type === 'ready') {
        clearTimeout(timer);
        resolve(message);
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`start exited with ${code}:\n${output}`));
    });
  });
  return { child, ready, output: () => output };
}

async function ctrlC(started: Started): Promise<number | null> {
  const pid = started.child.pid!;
  const tree = descendants(pid).map((child) => child.pid);
  assert.ok(tree.length >= 4, `expected postgres, temporal, worker and api under start, got ${tree.length}`);
  const exited = new Promise<number | null>((resolve) => started.child.once('exit', (code) => resolve(code)));
  process.kill(-pid, 'SIGINT');
  const code = await exited;
  await waitFor('every child process to exit', async () => tree.every((child) => !processAlive(child)), 30_000).catch(
    () => {
      throw new Error(`left behind: ${tree.filter(processAlive).join(', ')}\n${started.output()}`);
    },
  );
  return code;
}

describe('npm start (end to end)', { timeout: 600_000 }, () => {
  let dataDir: string;
  after(async () => {
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  });

  it('starts everything, answers /readyz, stops cleanly on Ctrl-C, and keeps data across starts', async () => {
    dataDir = await mkdtemp(join(tmpdir(), 'payments-e2e-'));
    await chmod(dataDir, 0o755);
    const [port, pgPort, temporalPort, uiPort] = await Promise.all([freePort(), freePort(), freePort(), freePort()]);
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      NODE_ENV: 'development',
      LOG_LEVEL: 'warn',
      DATA_DIR: dataDir,
      PORT: String(port),
      EMBEDDED_POSTGRES_PORT: String(pgPort),
      TEMPORAL_PORT: String(temporalPort),
      TEMPORAL_UI_PORT: String(uiPort),
    };
    delete env.DATABASE_URL;
    delete env.TEMPORAL_ADDRESS;

    // First start.
    const first = await start(env);
    assert.equal(first.ready.apiUrl, `http://127.0.0.1:${port}`);
    const ready = await fetch(`${first.ready.apiUrl}/readyz`);
    assert.equal(ready.status, 200);
    assert.deepEqual(await ready.json(), { status: 'ready', checks: { postgres: 'ok', temporal: 'ok' } });
    assert.equal((await fetch(`${first.ready.apiUrl}/docs`)).status, 200);
    assert.equal((await fetch(first.ready.temporalUiUrl)).status, 200);
    assert.match(first.output(), /Temporal UI\s+http:\/\/127\.0\.0\.1:\d+/);

    const connection = await Connection.connect({ address: first.ready.temporalAddress });
    const client = new Client({ connection });
    const retention = await waitFor('the data-retention workflow', () =>
      client.workflow.getHandle(DATA_RETENTION_WORKFLOW_ID).describe(),
    );
    assert.equal(retention.status.name, 'RUNNING');
    await connection.close();

    const password = (await readFile(join(dataDir, 'postgres', 'password'), 'utf8')).trim();
    const databaseUrl = `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${pgPort}/payments`;
    const sql = postgres(databaseUrl, { max: 1, onnotice: () => undefined });
    await sql`insert into outbox (workflow_type, workflow_id, task_queue) values ('marker', 'e2e-marker', 'payments-core')`;
    // The API and the worker log in as payments_app itself, so none of their sessions can switch
    // back to the owner.
    const sessions = await sql<{ usename: string; application_name: string }[]>`
      select distinct usename, application_name from pg_stat_activity
      where application_name in ('payments-api', 'payments-worker') order by application_name`;
    assert.deepEqual(
      sessions.map((session) => [session.application_name, session.usename]),
      [
        ['payments-api', 'payments_app'],
        ['payments-worker', 'payments_app'],
      ],
    );
    const appPassword = (await readFile(join(dataDir, 'postgres', 'app-password'), 'utf8')).trim();
    const app = postgres(`postgres://payments_app:${appPassword}@127.0.0.1:${pgPort}/payments`, {
      max: 1,
      onnotice: () => undefined,
    });
    await assert.rejects(app`set role postgres`, { code: '42501' });
    await app.end();
    await sql.end();

    assert.equal(await ctrlC(first), 0);

    // Second start on the same DATA_DIR: same database rows, same Temporal history.
    const second = await start(env);
    assert.equal((await fetch(`${second.ready.apiUrl}/readyz`)).status, 200);
    const again = postgres(databaseUrl, { max: 1, onnotice: () => undefined });
    const rows = await again`select workflow_id from outbox where workflow_id = 'e2e-marker'`;
    await again.end();
    assert.equal(rows.length, 1);
    const connection2 = await Connection.connect({ address: second.ready.temporalAddress });
    const described = await new Client({ connection: connection2 }).workflow
      .getHandle(DATA_RETENTION_WORKFLOW_ID)
      .describe();
    assert.equal(described.runId, retention.runId, 'the workflow started by the first run is still the one running');
    await connection2.close();

    assert.equal(await ctrlC(second), 0);
  });
});
