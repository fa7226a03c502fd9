import type { Sql, TransactionSql } from './client.ts';
import { claimOutcomeOf, type ClaimOutcome, type ClaimOutcomeRow, type IdempotencyClaim } from './idempotency.ts';

export type Environment = 'sandbox' | 'live';
export type LedgerAccountType = 'wallet' | 'account' | 'system';

export interface LedgerAccount {
  id: string;
  companyId: string;
  environment: Environment;
  type: LedgerAccountType;
  currency: string;
  name: string;
  posted: bigint;
  pendingDebits: bigint;
  pendingCredits: bigint;
  overdraftLimit: bigint | null;
  createdAt: Date;
}

interface LedgerAccountRow {
  id: string;
  company_id: string;
  environment: Environment;
  type: LedgerAccountType;
  currency: string;
  name: string;
  posted: bigint;
  pending_debits: bigint;
  pending_credits: bigint;
  overdraft_limit: bigint | null;
  created_at: Date;
}

function toAccount(row: LedgerAccountRow): LedgerAccount {
  return {
    id: row.id,
    companyId: row.company_id,
    environment: row.environment,
    type: row.type,
    currency: row.currency,
    name: row.name,
    posted: row.posted,
    pendingDebits: row.pending_debits,
    pendingCredits: row.pending_credits,
    overdraftLimit: row.overdraft_limit,
    createdAt: row.created_at,
  };
}

/** available = posted − outgoing holds; pending = incoming − outgoing holds; posted = settled. */
export function balancesOf(account: Pick<LedgerAccount, 'posted' | 'pendingDebits' | 'pendingCredits'>) {
  return {
    available: account.posted - account.pendingDebits,
    pending: account.pendingCredits - account.pendingDebits,
    posted: account.posted,
  };
}

const ACCOUNT_COLUMNS =
  'id, company_id, environment, type, currency, name, posted, pending_debits, pending_credits, overdraft_limit, created_at';

export async function openLedgerAccount(
  tx: TransactionSql,
  account: {
    id: string;
    companyId: string;
    environment: Environment;
    type: LedgerAccountType;
    currency: string;
    name: string;
    /** 0n: no overdraft (default); null: unbounded (system accounts only). */
    overdraftLimit?: bigint | null;
    /** What a system account is for (required for type system). */
    systemPurpose?: 'sandbox_funding' | 'rail_clearing' | 'fees' | 'fx' | 'ach_payouts';
  },
): Promise<LedgerAccount> {
  const [row] = await tx<LedgerAccountRow[]>`
    insert into ledger_accounts (id, company_id, environment, type, currency, name, overdraft_limit, system_purpose)
    values (${account.id}, ${account.companyId}, ${account.environment}, ${account.type}, ${account.currency},
            ${account.name}, ${account.overdraftLimit === undefined ? '0' : account.overdraftLimit === null ? null : account.overdraftLimit.toString()},
            ${account.systemPurpose ?? null})
    returning ${tx.unsafe(ACCOUNT_COLUMNS)}`;
  return toAccount(row!);
}

export async function findLedgerAccount(
  tx: TransactionSql | Sql,
  scope: { companyId: string; environment: Environment },
  id: string,
): Promise<LedgerAccount | undefined> {
  const [row] = await tx<LedgerAccountRow[]>`
    select ${tx.unsafe(ACCOUNT_COLUMNS)} from ledger_accounts
    where id = ${id} and company_id = ${scope.companyId} and environment = ${scope.environment}`;
  return row ? toAccount(row) : undefined;
}

/**
 * The caller's wallets and accounts (system accounts are the platform's side and never listed),
 * newest first. Wallets (`wal_…`) and accounts (`acct_…`) carry different prefixes, so the order is
 * the UUIDv7 after the prefix (the ID breaks a tie), not the ID: by the ID every wallet would come
 * before every account whatever their age. Served by ledger_accounts_listing_idx (migration 00015).
 */
export async function listLedgerAccounts(
  tx: TransactionSql,
  scope: { companyId: string; environment: Environment },
  page: { limit: number; after?: { id: string } },
): Promise<LedgerAccount[]> {
  const rows = await tx<LedgerAccountRow[]>`
    select ${tx.unsafe(ACCOUNT_COLUMNS)} from ledger_accounts
    where company_id = ${scope.companyId} and environment = ${scope.environment} and type <> 'system'
      ${page.after ? tx`and (split_part(id, '_', 2), id) < (split_part(${page.after.id}, '_', 2), ${page.after.id})` : tx``}
    order by split_part(id, '_', 2) desc, id desc limit ${page.limit}`;
  return rows.map(toAccount);
}

export type TransferStatus = 'pending' | 'processing' | 'settled' | 'failed' | 'canceled' | 'returned';

export interface LedgerTransfer {
  id: string;
  companyId: string;
  environment: Environment;
  idempotencyKey: string;
  rail: 'ledger' | 'ach';
  status: TransferStatus;
  amount: bigint;
  currency: string;
  sourceAccountId: string;
  /** Ledger rail: the destination account. */
  destinationAccountId: string | null;
  /** External rails (Shape A): the bank account and the payout quote. */
  payout: {
    externalAccountId: string;
    outAmount: bigint;
    outCurrency: string;
    feeAmount: bigint;
    fxRate: string;
  } | null;
  failureReason: string | null;
  /** External rails: the settlement workflow's ID. */
  workflowId: string | null;
  version: number;
  createdAt: Date;
  updatedAt: Date;
}

interface TransferRow {
  id: string;
  company_id: string;
  environment: Environment;
  idempotency_key: string;
  rail: 'ledger' | 'ach';
  status: TransferStatus;
  amount: bigint;
  currency: string;
  source_account_id: string;
  destination_account_id: string | null;
  destination_external_account_id: string | null;
  out_amount: bigint | null;
  out_currency: string | null;
  fee_amount: bigint | null;
  fx_rate: string | null;
  failure_reason: string | null;
  workflow_id: string | null;
  version: number;
  created_at: Date;
  updated_at: Date;
}

function toTransfer(row: TransferRow): LedgerTransfer {
  return {
    id: row.id,
    companyId: row.company_id,
    environment: row.environment,
    idempotencyKey: row.idempotency_key,
    rail: row.rail,
    status: row.status,
    amount: row.amount,
    currency: row.currency,
    sourceAccountId: row.source_account_id,
    destinationAccountId: row.destination_account_id,
    payout:
      row.destination_external_account_id &&
      row.out_amount !== null &&
      row.out_currency &&
      row.fee_amount !== null &&
      row.fx_rate
        ? {
            externalAccountId: row.destination_external_account_id,
            outAmount: row.out_amount,
            outCurrency: row.out_currency,
            feeAmount: row.fee_amount,
            fxRate: row.fx_rate,
          }
        : null,
    failureReason: row.failure_reason,
    workflowId: row.workflow_id,
    version: row.version,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}

/**
 * A transfer from its event snapshot (transfer_snapshot() in migration 00005: the row's own column
 * names, with bigints as strings and timestamps as ISO text), through the same mapping as a row.
 */
export function transferFromSnapshot(snapshot: Record<string, unknown>): LedgerTransfer {
  const big = (value: unknown) => (value === null || value === undefined ? null : BigInt(value as string));
  return toTransfer({
    ...(snapshot as unknown as TransferRow),
    amount: BigInt(snapshot.amount as string),
    out_amount: big(snapshot.out_amount),
    fee_amount: big(snapshot.fee_amount),
    created_at: new Date(snapshot.created_at as string),
    updated_at: new Date(snapshot.updated_at as string),
  });
}

const TRANSFER_COLUMNS =
  'id, company_id, environment, idempotency_key, rail, status, amount, currency, source_account_id, destination_account_id, ' +
  'destination_external_account_id, out_amount, out_currency, fee_amount, fx_rate::text as fx_rate, failure_reason, workflow_id, version, created_at, updated_at';

/**
 * A ledger-rail transfer, settled at once: the transfer row, its two posted entries (balances move
 * by trigger; the overdraft check and the double-entry check are the database's), and its status
 * history, in ONE statement. The caller's transaction decides the rest (idempotency, outbox).
 */
export async function postLedgerTransfer(
  tx: TransactionSql,
  transfer: {
    id: string;
    companyId: string;
    environment: Environment;
    idempotencyKey: string;
    amount: bigint;
    currency: string;
    sourceAccountId: string;
    destinationAccountId: string;
  },
): Promise<LedgerTransfer> {
  const [row] = await tx<TransferRow[]>`
    with transfer as (
      insert into transfers (id, company_id, environment, idempotency_key, rail, status, amount, currency,
                             source_account_id, destination_account_id)
      values (${transfer.id}, ${transfer.companyId}, ${transfer.environment}, ${transfer.idempotencyKey}, 'ledger',
              'settled', ${transfer.amount.toString()}, ${transfer.currency}, ${transfer.sourceAccountId},
              ${transfer.destinationAccountId})
      returning ${tx.unsafe(TRANSFER_COLUMNS)}
    ), entries as (
      insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind)
      select t.company_id, t.environment, t.id, e.account_id, t.currency, e.amount, 'posted'
      from transfer t
      cross join lateral (values (t.source_account_id, -t.amount), (t.destination_account_id, t.amount)) as e(account_id, amount)
      -- Accounts are locked (by the balance trigger) in ID order, so opposite transfers never deadlock.
      order by e.account_id
    ), history as (
      insert into transfer_status_history (transfer_id, company_id, status)
      select id, company_id, status from transfer
    )
    select * from transfer`;
  return toTransfer(row!);
}

/** A Shape B transfer as the hot path writes it; `createdAt` is in the signed response. */
export interface HotPathTransfer {
  id: string;
  amount: bigint;
  currency: string;
  sourceAccountId: string;
  destinationAccountId: string;
  createdAt: Date;
}

/**
 * The Shape B hot path in ONE statement and one commit (migration 00006): claims the Idempotency-Key
 * with the response to store, checks both accounts, and writes the settled transfer exactly as
 * `postLedgerTransfer` does, under row-level security for the claim's company. Refusals raise:
 * SQLSTATE PT404 (an account is missing, a system account or another company's; `detail` names
 * the field), PT422 (currency mismatch; `detail` is JSON with both currencies), PT500 (this
 * process's clock is more than 5 minutes off the database's), 23514 on ledger_accounts_no_overdraft.
 * `createdAt` is the API's clock: it is part of the signed response stored with the key.
 */
export async function postLedgerTransferClaimingKey(
  sql: Sql,
  claim: IdempotencyClaim,
  transfer: HotPathTransfer,
): Promise<ClaimOutcome> {
  const [row] = await sql<ClaimOutcomeRow[]>`
    select * from post_ledger_transfer_idempotent(
      ${claim.companyId}, ${claim.environment}, ${claim.key}, ${claim.requestMethod}, ${claim.requestPath},
      ${claim.requestHash}, ${claim.ttlMs}::double precision, ${claim.response.status}::integer,
      ${sql.json(claim.response.headers)}, ${claim.response.body}, ${transfer.id}, ${transfer.amount.toString()}::bigint,
      ${transfer.currency}, ${transfer.sourceAccountId}, ${transfer.destinationAccountId}, ${transfer.createdAt})`;
  return claimOutcomeOf(row!);
}

export async function findTransfer(
  tx: TransactionSql | Sql,
  scope: { companyId: string; environment: Environment },
  id: string,
): Promise<LedgerTransfer | undefined> {
  const [row] = await tx<TransferRow[]>`
    select ${tx.unsafe(TRANSFER_COLUMNS)} from transfers
    where id = ${id} and company_id = ${scope.companyId} and environment = ${scope.environment}`;
  return row ? toTransfer(row) : undefined;
}

export interface TransferFilters {
  status?: TransferStatus;
  rail?: string;
  createdGte?: Date;
  createdLt?: Date;
}

export async function listTransfers(
  tx: TransactionSql,
  scope: { companyId: string; environment: Environment },
  page: { limit: number; after?: { id: string } },
  filters: TransferFilters = {},
): Promise<LedgerTransfer[]> {
  const rows = await tx<TransferRow[]>`
    select ${tx.unsafe(TRANSFER_COLUMNS)} from transfers
    where company_id = ${scope.companyId} and environment = ${scope.environment}
      ${page.after ? tx`and id < ${page.after.id}` : tx``}
      ${filters.status ? tx`and status = ${filters.status}` : tx``}
      ${filters.rail ? tx`and rail = ${filters.rail}` : tx``}
      ${filters.createdGte ? tx`and created_at >= ${filters.createdGte}` : tx``}
      ${filters.createdLt ? tx`and created_at < ${filters.createdLt}` : tx``}
    order by id desc limit ${page.limit}`;
  return rows.map(toTransfer);
}

export interface StatusChange {
  status: TransferStatus;
  reason: string | null;
  occurredAt: Date;
}

export async function transferHistory(tx: TransactionSql | Sql, transferId: string): Promise<StatusChange[]> {
  const rows = await tx<{ status: TransferStatus; reason: string | null; occurred_at: Date }[]>`
    select status, reason, occurred_at from transfer_status_history where transfer_id = ${transferId} order by id`;
  return rows.map((row) => ({ status: row.status, reason: row.reason, occurredAt: row.occurred_at }));
}
