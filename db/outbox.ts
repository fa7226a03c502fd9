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

/**
 * Records several entries in one statement (the webhook dispatcher's batch of deliveries); an ID
 * already recorded is a no-op, as in insertOutboxEntry.
 */
export async function insertOutboxEntries(tx: TransactionSql | Sql, entries: readonly NewOutboxEntry[]): Promise<void> {
  if (entries.length === 0) return;
  await tx`
    insert into outbox (company_id, workflow_type, workflow_id, task_queue, payload)
    select company_id, workflow_type, workflow_id, task_queue, payload::jsonb
    from unnest(${entries.map((entry) => entry.companyId)}::text[], ${entries.map((entry) => entry.workflowType)}::text[],
                ${entries.map((entry) => entry.workflowId)}::text[], ${entries.map((entry) => entry.taskQueue)}::text[],
                ${entries.map((entry) => JSON.stringify(entry.payload))}::text[])
      as t(company_id, workflow_type, workflow_id, task_queue, payload)
    on conflict (workflow_id) do nothing`;
}

export async function findOutboxEntry(sql: Sql | TransactionSql, workflowId: string): Promise<OutboxEntry | undefined> {
  const [row] = await sql<OutboxRow[]>`
    select id, company_id, workflow_type, workflow_id, task_queue, payload, created_at, dispatched_at, attempts
    from outbox where workflow_id = ${workflowId}`;
  return row ? toEntry(row) : undefined;
}

export async function markOutboxDispatched(sql: Sql | TransactionSql, workflowId: string, at: Date): Promise<void> {
  await markOutboxEntriesDispatched(sql, [workflowId], at);
}

/** Marks entries handed to Temporal at `at` (never before their creation: the clocks may differ). */
export async function markOutboxEntriesDispatched(
  sql: Sql | TransactionSql,
  workflowIds: readonly string[],
  at: Date,
): Promise<void> {
  if (workflowIds.length === 0) return;
  await sql`
    update outbox set dispatched_at = greatest(created_at, ${at}), attempts = attempts + 1
    where workflow_id = any (${workflowIds}::text[]) and dispatched_at is null`;
}

/**
 * Entries created before `olderThan` and still not handed to Temporal (the API normally does it at
 * once), least tried first, then oldest: entries whose start keeps failing cannot hold a batch's
 * every slot and starve newer ones. `workflowType` narrows them to one kind of workflow.
 */
export async function findStrandedOutboxEntries(
  tx: TransactionSql,
  options: { olderThan: Date; limit: number; workflowType?: string },
): Promise<OutboxEntry[]> {
  const rows = await tx<OutboxRow[]>`
    select id, company_id, workflow_type, workflow_id, task_queue, payload, created_at, dispatched_at, attempts
    from outbox where dispatched_at is null and created_at < ${options.olderThan}
      ${options.workflowType === undefined ? tx`` : tx`and workflow_type = ${options.workflowType}`}
    order by attempts, created_at limit ${options.limit}`;
  return rows.map(toEntry);
}

export async function recordOutboxFailure(tx: TransactionSql, workflowId: string, error: string): Promise<void> {
  await recordOutboxFailures(tx, [{ workflowId, error }]);
}

/** Counts a failed start on each entry and keeps its error (one statement for the whole batch). */
export async function recordOutboxFailures(
  tx: TransactionSql,
  failures: readonly { workflowId: string; error: string }[],
): Promise<void> {
  if (failures.length === 0) return;
  await tx`
    update outbox set attempts = attempts + 1, last_error = t.error
    from unnest(${failures.map((failure) => failure.workflowId)}::text[], ${failures.map((failure) => failure.error.slice(0, 2000))}::text[])
      as t(workflow_id, error)
    where outbox.workflow_id = t.workflow_id and outbox.dispatched_at is null`;
}
