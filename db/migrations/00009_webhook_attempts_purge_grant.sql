-- The data-retention sweep (db/retention.ts, policy `webhook_attempts.finished`) deletes webhook
-- attempts finished more than 30 days ago, as the worker's role, payments_app, which was granted
-- select, insert and update on webhook_attempts but not delete: every sweep failed with
-- "permission denied" and retried. The tests ran the sweep as the owner and did not see it.
grant delete on webhook_attempts to payments_app;
