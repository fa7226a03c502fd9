import type { TransactionSql } from './client.ts';

/**
 * What the data-retention workflow may delete. Each policy names one table and the rows that have
 * outlived their purpose; nothing else is ever deleted by the sweeper. Business records (ledger
 * entries, transfers, audit events) never appear here: they are kept for good.
 */
export interface RetentionPolicy {
  name: string;
  /** Deletes at most `limit` expired rows and returns how many it deleted. */
  purge(tx: TransactionSql, options: { olderThan: Date; limit: number }): Promise<number>;
  keepForMs: number;
}

const DAY_MS = 24 * 60 * 60 * 1000;

export const RETENTION_POLICIES: readonly RetentionPolicy[] = [
  {
    name: 'outbox.dispatched',
    keepForMs: 7 * DAY_MS,
    async purge(tx, { olderThan, limit }) {
      const rows = await tx`
        delete from outbox
        where id in (
          select id from outbox
          where dispatched_at is not null and dispatched_at < ${olderThan}
          order by dispatched_at
          limit ${limit}
        )
        returning id`;
      return rows.length;
    },
  },
  {
    // Webhook attempts are a debugging log, not a business record (the delivery row and the event
    // stay): 30 days, as long as a receiver could reasonably ask what was sent. Found through
    // webhook_attempts_finished_idx (migration 00007), partial on the same `finished_at is not null`.
    name: 'webhook_attempts.finished',
    keepForMs: 30 * DAY_MS,
    async purge(tx, { olderThan, limit }) {
      const rows = await tx`
        delete from webhook_attempts
        where id in (
          select id from webhook_attempts
          where finished_at is not null and finished_at < ${olderThan}
          order by finished_at
          limit ${limit}
        )
        returning id`;
      return rows.length;
    },
  },
  {
    // Sign-in counters per email (migration 00013): a day after an email's last attempt, and once any
    // lock has run out, its count goes (a success already deletes it). Without this, sign-ins on
    // made-up emails would grow the table for good.
    name: 'login_attempts.stale',
    keepForMs: DAY_MS,
    async purge(tx, { olderThan, limit }) {
      const rows = await tx`
        delete from login_attempts
        where email_hash in (
          select email_hash from login_attempts
          where updated_at < ${olderThan} and (locked_until is null or locked_until < ${olderThan})
          order by updated_at
          limit ${limit}
        )
        returning email_hash`;
      return rows.length;
    },
  },
];
