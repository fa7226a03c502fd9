-- The retention sweep (db/retention.ts, `webhook_attempts.finished`) deletes finished attempts
-- oldest first: `where finished_at is not null and finished_at < $1 order by finished_at limit $2`.
-- Without an index on finished_at every sweep reads the whole table. Partial, like
-- outbox_dispatched_idx: in-flight attempts (finished_at null) are never purged, so they stay out of
-- it, and an attempt enters it once, when it is closed.
--
-- Not CONCURRENTLY: postgres-shift runs migrations in a transaction, and the build blocks writes to
-- webhook_attempts while it runs. Where the table is already large, build it by hand first with
-- `create index concurrently webhook_attempts_finished_idx …` (same definition); this then does nothing.
create index if not exists webhook_attempts_finished_idx on webhook_attempts (finished_at) where finished_at is not null;
