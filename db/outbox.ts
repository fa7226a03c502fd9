import type { Sql, TransactionSql } from './client.ts';

export interface OutboxEntry {
  id: bigint;
  companyId: string | null;
  workflowType: string;
  workflowId: string;
  taskQueue: string;
  payload: unknown;
  createdAt: Date;
  dispatchedAt: Date | null;
  attempts: number;
}

interface OutboxRow {
  id: bigint;
  company_id: string | null;
  workflow_type: string;
  workflow_id: string;
  task_queue: string;
  payload: unknown;
  created_at: Date;
  dispatched_at: Date | null;
  attempts: number;
}

function toEntry(row: OutboxRow): OutboxEntry {
  return {
    id: row.id,
    companyId: row.company_id,
    workflowType: row.workflow_type,
    workflowId: row.workflow_id,
    taskQueue: row.task_queue,
    payload: row.payload,
    createdAt: row.created_at,
    dispatchedAt: row.dispatched_at,
    attempts: row.attempts,
  };
}

export interface NewOutboxEntry {
  companyId: string | null;
  workflowType: string;
  workflowId: string;
  taskQueue: string;
  payload: unknown;
}

/** Records, inside the caller's transaction, a workflow that must run; a duplicate ID is a no-op. */
export async function insertOutboxEntry(tx: TransactionSql | Sql, entry: NewOutboxEntry): Promise<void> {
  await tx`
    insert into outbox (company_id, workflow_type, workflow_id, task_queue, payload)
    values (${entry.companyId}, ${entry.workflowType}, ${entry.workflowId}, ${entry.taskQueue},
            ${tx.json(entry.payload as Parameters<typeof tx.json>[0])})
    on conflict (workflow_id) do nothing`;
}

export async function findOutboxEntry(sql: Sql | TransactionSql, workflowId: string): Promise<OutboxEntry | undefined> {
  const [row] = await sql<OutboxRow[]>`
    select id, company_id, workflow_type, workflow_id, task_queue, payload, created_at, dispatched_at, attempts
    from outbox where workflow_id = ${workflowId}`;
  return row ? toEntry(row) : undefined;
}

export async function markOutboxDispatched(sql: Sql | TransactionSql, workflowId: string, at: Date): Promise<void> {
  await sql`
    update outbox set dispatched_at = greatest(created_at, ${at}), attempts = attempts + 1
    where workflow_id = ${workflowId} and dispatched_at is null`;
}

/** Entries not handed to Temporal for `olderThanMs` (the API normally does it at once), oldest first. */
export async function findStrandedOutboxEntries(
  tx: TransactionSql,
  options: { olderThan: Date; limit: number },
): Promise<OutboxEntry[]> {
  const rows = await tx<OutboxRow[]>`
    select id, company_id, workflow_type, workflow_id, task_queue, payload, created_at, dispatched_at, attempts
    from outbox where dispatched_at is null and created_at < ${options.olderThan}
    order by created_at limit ${options.limit}`;
  return rows.map(toEntry);
}

export async function recordOutboxFailure(tx: TransactionSql, workflowId: string, error: string): Promise<void> {
  await tx`
    update outbox set attempts = attempts + 1, last_error = ${error.slice(0, 2000)}
    where workflow_id = ${workflowId} and dispatched_at is null`;
}
