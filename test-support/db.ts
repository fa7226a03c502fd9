import { randomBytes } from 'node:crypto';
import postgres from 'postgres';
import { APP_ROLE, createSql, type Sql } from '../db/client.ts';
import { testEnv } from './env.ts';

export interface TestDatabase {
  url: string;
  sql: Sql;
  drop(): Promise<void>;
}

function admin() {
  return postgres(testEnv().TEST_PG_ADMIN_URL, { max: 1, onnotice: () => undefined });
}

function urlFor(name: string): string {
  const url = new URL(testEnv().TEST_PG_ADMIN_URL);
  url.pathname = `/${name}`;
  return url.toString();
}

/**
 * A private database for one test file: a clone of the migrated template (fast), or an empty one
 * when `empty` is set (for migration tests). Dropped by `drop()`.
 */
export async function createTestDatabase(options: { empty?: boolean; poolMax?: number } = {}): Promise<TestDatabase> {
  const name = `test_${randomBytes(6).toString('hex')}`;
  const adminSql = admin();
  try {
    if (options.empty) await adminSql.unsafe(`create database ${name}`);
    else await adminSql.unsafe(`create database ${name} template ${testEnv().TEST_PG_TEMPLATE}`);
  } finally {
    await adminSql.end({ timeout: 5 });
  }
  const url = urlFor(name);
  const sql = createSql({
    url,
    poolMax: options.poolMax ?? 5,
    connectTimeoutS: 10,
    idleTimeoutS: 5,
    statementTimeoutMs: 10_000,
    applicationName: 'payments-test',
  });
  return {
    url,
    sql,
    async drop() {
      await sql.end({ timeout: 5 });
      const cleanup = admin();
      try {
        await cleanup.unsafe(`drop database if exists ${name} with (force)`);
      } finally {
        await cleanup.end({ timeout: 5 });
      }
    },
  };
}

/** A pool on a test database that connects as `payments_app`, as the API and worker do: RLS applies. */
export function createAppRoleSql(
  url: string,
  options: { applicationName: string; poolMax?: number; statementTimeoutMs?: number },
): Sql {
  return createSql({
    url,
    poolMax: options.poolMax ?? 5,
    connectTimeoutS: 10,
    idleTimeoutS: 5,
    statementTimeoutMs: options.statementTimeoutMs ?? 10_000,
    applicationName: options.applicationName,
    role: APP_ROLE,
  });
}
