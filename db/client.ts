import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import postgres from 'postgres';

export type Sql = postgres.Sql;
export type TransactionSql = postgres.TransactionSql;

export interface DatabaseOptions {
  url: string;
  poolMax: number;
  connectTimeoutS: number;
  idleTimeoutS: number;
  statementTimeoutMs: number;
  applicationName: string;
  /**
   * Role every connection switches to at start-up. Application pools use `payments_app`, which is
   * subject to row-level security; migrations and the CLI connect as the owner (no role).
   */
  role?: string;
}

export const APP_ROLE = 'payments_app';

/**
 * Queries postgres.js may send ahead on a busy connection; above that, queries wait in one FIFO
 * queue for the next free connection. postgres.js's own default (100) queues queries behind
 * whichever connection is busy, so one slow commit holds up a whole pipeline (at concurrency 32 it
 * doubled the benchmark's p99). At 1, every transaction whose BEGIN is pipelined behind a busy
 * connection needs patches/postgres+3.4.9.patch (postgres.js reserved the connection only while its
 * pipeline had room: an open transaction left on the pool; db/client.test.ts).
 */
const DEFAULT_MAX_PIPELINE = 1;

/** What patches/postgres+3.4.9.patch writes into postgres.js's connection.js. */
const POSTGRES_PATCH_MARKER = 'porsager/postgres#1189';

let postgresPatchChecked = false;

/**
 * Throws unless the postgres.js that `import 'postgres'` loads carries our patch: an install with
 * --ignore-scripts (or a new postgres.js version) skips patch-package, and without the patch a
 * saturated pool loses acknowledged writes (db/client.test.ts). `connectionJs` is for the test.
 */
export function assertPostgresPatched(
  connectionJs = fileURLToPath(new URL('./connection.js', import.meta.resolve('postgres'))),
): void {
  if (readFileSync(connectionJs, 'utf8').includes(POSTGRES_PATCH_MARKER)) return;
  throw new Error(
    `postgres.js at ${connectionJs} is not patched (patches/postgres+3.4.9.patch): run \`npm install\`, ` +
      'whose postinstall applies it with patch-package',
  );
}

/** A postgres.js pool with every limit spelled out rather than left to defaults. */
export function createSql(options: DatabaseOptions): Sql {
  if (!postgresPatchChecked) {
    assertPostgresPatched();
    postgresPatchChecked = true;
  }
  return postgres(options.url, {
    max: options.poolMax,
    // postgres.js reads max_pipeline but its types omit it.
    ...({ max_pipeline: DEFAULT_MAX_PIPELINE } as object),
    connect_timeout: options.connectTimeoutS,
    idle_timeout: options.idleTimeoutS,
    max_lifetime: 60 * 30,
    prepare: true,
    onnotice: () => undefined,
    connection: {
      ...(options.role ? { role: options.role } : {}),
      application_name: options.applicationName,
      statement_timeout: options.statementTimeoutMs,
      idle_in_transaction_session_timeout: options.statementTimeoutMs * 3,
      lock_timeout: options.statementTimeoutMs,
    },
    types: {
      // bigint columns come back as JS bigint: money never passes through a float.
      bigint: postgres.BigInt,
    },
  });
}

export function databaseOptionsFromConfig(
  config: {
    DATABASE_POOL_MAX: number;
    DATABASE_CONNECT_TIMEOUT_S: number;
    DATABASE_IDLE_TIMEOUT_S: number;
    DATABASE_STATEMENT_TIMEOUT_MS: number;
  },
  url: string,
  applicationName: string,
  role?: string,
): DatabaseOptions {
  return {
    url,
    ...(role ? { role } : {}),
    poolMax: config.DATABASE_POOL_MAX,
    connectTimeoutS: config.DATABASE_CONNECT_TIMEOUT_S,
    idleTimeoutS: config.DATABASE_IDLE_TIMEOUT_S,
    statementTimeoutMs: config.DATABASE_STATEMENT_TIMEOUT_MS,
    applicationName,
  };
}

/**
 * The pool options of a service that runs as payments_app (the API, the worker): DATABASE_APP_URL, a
 * login of the role itself, when there is one; else DATABASE_URL with a switch to the role at
 * connection start.
 */
export function appDatabaseOptions(
  config: Parameters<typeof databaseOptionsFromConfig>[0] & {
    DATABASE_URL?: string | undefined;
    DATABASE_APP_URL?: string | undefined;
  },
  applicationName: string,
): DatabaseOptions {
  if (config.DATABASE_APP_URL) return databaseOptionsFromConfig(config, config.DATABASE_APP_URL, applicationName);
  if (config.DATABASE_URL) return databaseOptionsFromConfig(config, config.DATABASE_URL, applicationName, APP_ROLE);
  throw new Error(
    'DATABASE_APP_URL or DATABASE_URL is required (`npm start` runs an embedded PostgreSQL and sets both)',
  );
}

/**
 * Lets payments_app log in with `password` (run as the owner; idempotent), and returns
 * `ownerUrl` with that login: what the API and the worker connect with when the service runs the database.
 */
export async function enableAppLogin(sql: Sql, ownerUrl: string, password: string): Promise<string> {
  const [statement] = await sql<{ statement: string }[]>`
    select format('alter role %I with login password %L', ${APP_ROLE}::text, ${password}::text) as statement`;
  await sql.unsafe(statement!.statement);
  const url = new URL(ownerUrl);
  url.username = APP_ROLE;
  url.password = encodeURIComponent(password);
  return url.toString();
}

/** True when a trivial query answers within the pool's timeouts. */
export async function pingDatabase(sql: Sql): Promise<boolean> {
  try {
    const [row] = await sql<{ ok: number }[]>`select 1 as ok`;
    return row?.ok === 1;
  } catch {
    return false;
  }
}
