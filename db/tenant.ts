import type { Sql, TransactionSql } from './client.ts';

/**
 * Runs `fn` in a transaction scoped to one company: row-level security shows and accepts only that
 * company's rows, whatever the queries inside say. Every tenant read and write goes through here.
 */
export async function withTenant<T>(sql: Sql, companyId: string, fn: (tx: TransactionSql) => Promise<T>): Promise<T> {
  return sql.begin(async (tx) => {
    await tx`select set_config('app.company_id', ${companyId}, true)`;
    return fn(tx);
  }) as Promise<T>;
}

/** A transaction that sees across companies: for platform jobs and the CLI, never for a request. */
export async function withSystemScope<T>(sql: Sql, fn: (tx: TransactionSql) => Promise<T>): Promise<T> {
  return sql.begin(async (tx) => {
    await tx`select set_config('app.scope', 'system', true)`;
    return fn(tx);
  }) as Promise<T>;
}
