import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import shift from 'postgres-shift';
import type { Sql } from './client.ts';

export const MIGRATIONS_DIR = join(dirname(fileURLToPath(import.meta.url)), 'migrations');

// Any 64-bit constant works; it only has to be the same for every migrator of this schema.
const MIGRATION_LOCK_KEY = 7_233_001n;

/**
 * Applies the forward-only numbered migrations in db/migrations with postgres-shift.
 * A session advisory lock serialises concurrent migrators (API, worker, CI) so each migration
 * runs exactly once; postgres-shift itself runs the pending ones in a single transaction.
 */
export async function migrate(sql: Sql, options: { onApplied?: (name: string) => void } = {}): Promise<void> {
  const lock = await sql.reserve();
  try {
    await lock`select pg_advisory_lock(${MIGRATION_LOCK_KEY.toString()}::bigint)`;
    await shift({
      sql,
      path: MIGRATIONS_DIR,
      after: ({ migration_id, name }: { migration_id: number; name: string }) =>
        options.onApplied?.(`${String(migration_id).padStart(5, '0')} ${name}`),
    });
  } finally {
    await lock`select pg_advisory_unlock(${MIGRATION_LOCK_KEY.toString()}::bigint)`.catch(() => undefined);
    lock.release();
  }
}
