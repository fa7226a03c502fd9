// `npm run db:migrate`: applies pending migrations to DATABASE_URL (the owner) and exits. With
// DATABASE_APP_PASSWORD it also lets payments_app log in with that password, for a deployment whose
// API and worker connect as payments_app itself (DATABASE_APP_URL) and never see the owner's login.
import { loadConfig } from '../platform/config.ts';
import { createLogger } from '../platform/logger.ts';
import { createSql, databaseOptionsFromConfig, enableAppLogin } from './client.ts';
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
  if (config.DATABASE_APP_PASSWORD) {
    await enableAppLogin(sql, config.DATABASE_URL, config.DATABASE_APP_PASSWORD);
    logger.info('payments_app may log in with DATABASE_APP_PASSWORD');
  }
} finally {
  await sql.end({ timeout: 5 });
}
