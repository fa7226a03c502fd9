// `npm run db:migrate`: applies pending migrations to DATABASE_URL and exits.
import { loadConfig } from '../platform/config.ts';
import { createLogger } from '../platform/logger.ts';
import { createSql, databaseOptionsFromConfig } from './client.ts';
import { migrate } from './migrate.ts';

const config = loadConfig();
const logger = createLogger({ level: config.LOG_LEVEL, name: 'migrate' });
if (!config.DATABASE_URL) {
  logger.fatal('DATABASE_URL is required');
  process.exit(1);
}
const sql = createSql(databaseOptionsFromConfig(config, config.DATABASE_URL, 'payments-migrate'));
try {
  await migrate(sql, { onApplied: (name) => logger.info({ migration: name }, 'migration applied') });
  logger.info('database is up to date');
} finally {
  await sql.end({ timeout: 5 });
}
