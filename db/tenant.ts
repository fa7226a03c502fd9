import type { Sql, TransactionSql } from './client.ts';

/**
 * Runs `fn` in a transaction with `scope` set first. The setting is sent without waiting for its
 * answer, so it travels in the same write as `fn`'s first statement, which PostgreSQL runs after it
 * on the same connection: one round trip per transaction fewer. postgres.js sends a query only when
 * it is awaited or executed, hence `execute()` before `fn` runs.
 */
function scoped<T>(
  sql: Sql,
  scope: (tx: TransactionSql) => ReturnType<TransactionSql>,
  fn: (tx: TransactionSql) => Promise<T>,
): Promise<T> {
  return sql.begin((tx) => {
    const setting = scope(tx).execute();
    return Promise.all([setting, fn(tx)]).then(([, result]) => result);
  }) as Promise<T>;
}

/**
 * Runs `fn` in a transaction scoped to one company: row-level security shows and accepts only that
 * company's rows, whatever the queries inside say. Every tenant read and write goes through here.
 */
export async function withTenant<T>(sql: Sql, companyId: string, fn: (tx: TransactionSql) => Promise<T>): Promise<T> {
  return scoped(sql, (tx) => tx`select set_config('app.company_id', ${companyId}, true)`, fn);
}

/** A transaction that sees across companies: for platform jobs and the CLI, never for a request. */
export async function withSystemScope<T>(sql: Sql, fn: (tx: TransactionSql) => Promise<T>): Promise<T> {
  return scoped(sql, (tx) => tx`select set_config('app.scope', 'system', true)`, fn);
}
