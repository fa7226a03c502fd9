import type { TransactionSql } from './client.ts';
import type { Environment, TransferStatus } from './ledger.ts';

export type SystemPurpose = 'sandbox_funding' | 'rail_clearing' | 'fees' | 'fx' | 'ach_payouts';

interface Scope {
  companyId: string;
  environment: Environment;
}

/** Which system account: its purpose and currency. */
export interface SystemAccountRef {
  purpose: SystemPurpose;
  currency: string;
}

const refKey = (ref: SystemAccountRef) => `${ref.purpose} ${ref.currency}`;

/** The IDs of those of the company's system accounts that exist, by `refKey`. One query. */
async function findSystemAccounts(
  tx: TransactionSql,
  scope: Scope,
  refs: SystemAccountRef[],
): Promise<Map<string, string>> {
  const rows = await tx<{ id: string; system_purpose: SystemPurpose; currency: string }[]>`
    select a.id, a.system_purpose, a.currency from ledger_accounts a
    join unnest(${refs.map((ref) => ref.purpose)}::text[], ${refs.map((ref) => ref.currency)}::text[]) as wanted(purpose, currency)
      on a.system_purpose = wanted.purpose and a.currency = wanted.currency
    where a.company_id = ${scope.companyId} and a.environment = ${scope.environment} and a.type = 'system'`;
  return new Map(rows.map((row) => [refKey({ purpose: row.system_purpose, currency: row.currency }), row.id]));
}

/** The company's system account for a purpose and currency, if it has been opened. */
export async function findSystemAccount(
  tx: TransactionSql,
  scope: Scope,
  ref: SystemAccountRef,
): Promise<string | undefined> {
  return (await findSystemAccounts(tx, scope, [ref])).get(refKey(ref));
}

/**
 * The company's platform-side accounts for these purposes and currencies, in the order asked,
 * each opened on first use: one query when they all exist (the usual case), and for those that do
 * not, one insert and, should another transaction have opened one meanwhile, one re-read.
 */
async function systemAccounts(
  tx: TransactionSql,
  scope: Scope,
  refs: SystemAccountRef[],
  newId: () => string,
): Promise<string[]> {
  // Read first: the rows exist after the first use, and a plain read never waits, where
  // INSERT ... ON CONFLICT waits for every transaction that has just updated the (hot) row.
  const ids = await findSystemAccounts(tx, scope, refs);
  // Each missing account once, in one order, so that concurrent first uses lock the keys alike.
  const missing = [...new Map(refs.filter((ref) => !ids.has(refKey(ref))).map((ref) => [refKey(ref), ref])).entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([, ref]) => ref);
  if (missing.length > 0) {
    const created = await tx<{ id: string; system_purpose: SystemPurpose; currency: string }[]>`
      insert into ledger_accounts (id, company_id, environment, type, currency, name, overdraft_limit, system_purpose)
      select n.id, ${scope.companyId}, ${scope.environment}, 'system', n.currency, n.name, null, n.purpose
      from unnest(
        ${missing.map(() => newId())}::text[],
        ${missing.map((ref) => ref.currency)}::text[],
        ${missing.map((ref) => `${ref.purpose} ${ref.currency}`)}::text[],
        ${missing.map((ref) => ref.purpose)}::text[]
      ) as n(id, currency, name, purpose)
      on conflict (company_id, environment, currency, system_purpose) where type = 'system' do nothing
      returning id, system_purpose, currency`;
    for (const row of created) ids.set(refKey({ purpose: row.system_purpose, currency: row.currency }), row.id);
    const raced = missing.filter((ref) => !ids.has(refKey(ref)));
    if (raced.length > 0) for (const [key, id] of await findSystemAccounts(tx, scope, raced)) ids.set(key, id);
  }
  return refs.map((ref) => ids.get(refKey(ref))!);
}

/** The company's platform-side account for a purpose and currency, opened on first use. */
export async function systemAccount(
  tx: TransactionSql,
  scope: Scope,
  currency: string,
  purpose: SystemPurpose,
  newId: () => string,
): Promise<string> {
  const [id] = await systemAccounts(tx, scope, [{ purpose, currency }], newId);
  return id!;
}

export interface ExternalAccount {
  id: string;
  companyId: string;
  environment: Environment;
  rail: 'ach';
  currency: string;
  label: string;
  routingNumber: string;
  accountLast4: string;
}

export async function insertExternalAccount(tx: TransactionSql, account: ExternalAccount): Promise<void> {
  await tx`
    insert into external_accounts (id, company_id, environment, rail, currency, label, routing_number, account_last4)
    values (${account.id}, ${account.companyId}, ${account.environment}, ${account.rail}, ${account.currency},
            ${account.label}, ${account.routingNumber}, ${account.accountLast4})`;
}

interface ExternalAccountRow {
  id: string;
  company_id: string;
  environment: Environment;
  rail: 'ach';
  currency: string;
  label: string;
  routing_number: string;
  account_last4: string;
}

const EXTERNAL_ACCOUNT_COLUMNS = 'id, company_id, environment, rail, currency, label, routing_number, account_last4';

function toExternalAccount(row: ExternalAccountRow): ExternalAccount {
  return {
    id: row.id,
    companyId: row.company_id,
    environment: row.environment,
    rail: row.rail,
    currency: row.currency,
    label: row.label,
    routingNumber: row.routing_number,
    accountLast4: row.account_last4,
  };
}

export interface RailTransfer {
  id: string;
  companyId: string;
  environment: Environment;
  idempotencyKey: string;
  status: TransferStatus;
  version: number;
  amount: bigint;
  currency: string;
  sourceAccountId: string;
  destinationExternalAccountId: string;
  outAmount: bigint;
  outCurrency: string;
  feeAmount: bigint;
  fxRate: string;
  railReference: string | null;
  failureReason: string | null;
  workflowId: string;
  createdAt: Date;
  updatedAt: Date;
}

interface RailTransferRow {
  id: string;
  company_id: string;
  environment: Environment;
  idempotency_key: string;
  status: TransferStatus;
  version: number;
  amount: bigint;
  currency: string;
  source_account_id: string;
  destination_external_account_id: string;
  out_amount: bigint;
  out_currency: string;
  fee_amount: bigint;
  fx_rate: string;
  rail_reference: string | null;
  failure_reason: string | null;
  workflow_id: string;
  created_at: Date;
  updated_at: Date;
}

function toRailTransfer(row: RailTransferRow): RailTransfer {
  return {
    id: row.id,
    companyId: row.company_id,
    environment: row.environment,
    idempotencyKey: row.idempotency_key,
    status: row.status,
    version: row.version,
    amount: row.amount,
    currency: row.currency,
    sourceAccountId: row.source_account_id,
    destinationExternalAccountId: row.destination_external_account_id,
    outAmount: row.out_amount,
    outCurrency: row.out_currency,
    feeAmount: row.fee_amount,
    fxRate: row.fx_rate,
    railReference: row.rail_reference,
    failureReason: row.failure_reason,
    workflowId: row.workflow_id,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}

const RAIL_COLUMNS =
  'id, company_id, environment, idempotency_key, status, version, amount, currency, source_account_id, destination_external_account_id, out_amount, out_currency, fee_amount, fx_rate::text as fx_rate, rail_reference, failure_reason, workflow_id, created_at, updated_at';

export async function findRailTransfer(
  tx: TransactionSql,
  scope: Scope,
  id: string,
): Promise<RailTransfer | undefined> {
  const [row] = await tx<RailTransferRow[]>`
    select ${tx.unsafe(RAIL_COLUMNS)} from transfers
    where id = ${id} and company_id = ${scope.companyId} and environment = ${scope.environment} and rail = 'ach'`;
  return row ? toRailTransfer(row) : undefined;
}

/** A rail transfer and the bank account it pays out to, in one statement (a submission needs both). */
export async function findRailTransferWithAccount(
  tx: TransactionSql,
  scope: Scope,
  id: string,
): Promise<{ transfer: RailTransfer; account: ExternalAccount | undefined } | undefined> {
  const [row] = await tx<(RailTransferRow & { account: ExternalAccountRow | null })[]>`
    select t.*, (select to_jsonb(a) from (
             select ${tx.unsafe(EXTERNAL_ACCOUNT_COLUMNS)} from external_accounts
             where id = t.destination_external_account_id and company_id = t.company_id and environment = t.environment
           ) a) as account
    from (select ${tx.unsafe(RAIL_COLUMNS)} from transfers
          where id = ${id} and company_id = ${scope.companyId} and environment = ${scope.environment} and rail = 'ach') t`;
  if (!row) return undefined;
  return { transfer: toRailTransfer(row), account: row.account ? toExternalAccount(row.account) : undefined };
}

/** What creating a payout reads, found in one statement (see findPayoutContext). */
export interface PayoutContext {
  /** The transfer already created under this Idempotency-Key (a retry after a crash). */
  existing: RailTransfer | undefined;
  bank: ExternalAccount | undefined;
  /** The funding wallet: the company's oldest wallet in the source currency. */
  wallet: string | undefined;
  /** The rail clearing account in the source currency, when it has been opened (systemAccount opens it). */
  clearing: string | undefined;
}

/**
 * The four reads before a payout's hold in one statement (one round trip): the transfer already
 * created under the key, the bank account, the funding wallet and the `rail_clearing` account.
 */
export async function findPayoutContext(
  tx: TransactionSql,
  scope: Scope,
  wanted: { idempotencyKey: string; externalAccountId: string; currency: string },
): Promise<PayoutContext> {
  const [row] = await tx<
    (Partial<RailTransferRow> & { bank: ExternalAccountRow | null; wallet: string | null; clearing: string | null })[]
  >`
    select t.*,
      (select to_jsonb(a) from (
         select ${tx.unsafe(EXTERNAL_ACCOUNT_COLUMNS)} from external_accounts
         where id = ${wanted.externalAccountId} and company_id = ${scope.companyId} and environment = ${scope.environment}
       ) a) as bank,
      (select id from ledger_accounts
       where company_id = ${scope.companyId} and environment = ${scope.environment} and currency = ${wanted.currency}
         and type = 'wallet'
       order by id limit 1) as wallet,
      (select id from ledger_accounts
       where company_id = ${scope.companyId} and environment = ${scope.environment} and currency = ${wanted.currency}
         and type = 'system' and system_purpose = 'rail_clearing') as clearing
    from (select 1) as one
    left join (
      select ${tx.unsafe(RAIL_COLUMNS)} from transfers
      where company_id = ${scope.companyId} and environment = ${scope.environment}
        and idempotency_key = ${wanted.idempotencyKey} and rail = 'ach'
    ) t on true`;
  return {
    existing: row!.id ? toRailTransfer(row as RailTransferRow) : undefined,
    bank: row!.bank ? toExternalAccount(row!.bank) : undefined,
    wallet: row!.wallet ?? undefined,
    clearing: row!.clearing ?? undefined,
  };
}

interface EntryLine {
  accountId: string;
  currency: string;
  amount: bigint;
  kind: 'posted' | 'hold' | 'hold_release';
  holdId?: string;
}

/**
 * All of a step's entries in ONE statement, in account-ID order: the balance trigger locks each
 * account as its row is inserted, so concurrent steps lock in the same order (no deadlock), and the
 * hot platform accounts (fees, FX, clearing, payouts) are held for one statement rather than one
 * round trip per entry. The sort is stable, so lines for one account keep the order given: a
 * settlement lists the hold's release before the wallet's posted debit, because the overdraft check
 * runs on every row and a fully held wallet could not take the debit first.
 */
async function insertEntries(tx: TransactionSql, scope: Scope, transferId: string, lines: EntryLine[]): Promise<void> {
  const sorted = [...lines].sort((a, b) => (a.accountId < b.accountId ? -1 : a.accountId > b.accountId ? 1 : 0));
  await tx`
    insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind, hold_id)
    select ${scope.companyId}, ${scope.environment}, ${transferId}, l.account_id, l.currency, l.amount, l.kind, l.hold_id
    from unnest(
      ${sorted.map((line) => line.accountId)}::text[],
      ${sorted.map((line) => line.currency)}::text[],
      ${sorted.map((line) => line.amount.toString())}::bigint[],
      ${sorted.map((line) => line.kind)}::text[],
      ${sorted.map((line) => line.holdId ?? null)}::text[]
    ) with ordinality as l(account_id, currency, amount, kind, hold_id, n)
    order by l.n`;
}

export interface NewRailTransfer extends Scope {
  id: string;
  holdId: string;
  idempotencyKey: string;
  workflowId: string;
  amount: bigint;
  currency: string;
  sourceAccountId: string;
  clearingAccountId: string;
  destinationExternalAccountId: string;
  outAmount: bigint;
  outCurrency: string;
  feeAmount: bigint;
  fxRate: string;
}

/**
 * Creates a rail transfer as `pending` and reserves its money: a hold of the full source amount on
 * the wallet against the rail clearing account. An overdraw is refused by the database here. The
 * hold's entries are its last statement: callers commit right after it.
 */
export async function createRailTransfer(tx: TransactionSql, transfer: NewRailTransfer): Promise<RailTransfer> {
  // The transfer, its hold and its first status in one statement (the foreign keys are checked at
  // its end, when the transfer row exists); the entries follow in a second.
  const [row] = await tx<RailTransferRow[]>`
    with created as (
      insert into transfers (id, company_id, environment, idempotency_key, rail, status, amount, currency, source_account_id,
                             destination_external_account_id, source_rail, out_amount, out_currency, fee_amount, fx_rate, workflow_id)
      values (${transfer.id}, ${transfer.companyId}, ${transfer.environment}, ${transfer.idempotencyKey}, 'ach', 'pending',
              ${transfer.amount.toString()}, ${transfer.currency}, ${transfer.sourceAccountId}, ${transfer.destinationExternalAccountId},
              'stablecoin', ${transfer.outAmount.toString()}, ${transfer.outCurrency}, ${transfer.feeAmount.toString()},
              ${transfer.fxRate}, ${transfer.workflowId})
      returning ${tx.unsafe(RAIL_COLUMNS)}
    ), hold as (
      insert into ledger_holds (id, company_id, transfer_id) select ${transfer.holdId}, company_id, id from created
    ), history as (
      insert into transfer_status_history (transfer_id, company_id, status, reason) select id, company_id, 'pending', null from created
    )
    select * from created`;
  // Last: the entries lock the wallet and the clearing account (every payout of the company takes
  // them), so nothing else waits between them and the caller's commit.
  await insertEntries(
    tx,
    transfer,
    transfer.id,
    holdPair(transfer, { id: transfer.holdId, clearingAccountId: transfer.clearingAccountId }, 'hold'),
  );
  return toRailTransfer(row!);
}

/**
 * Moves the status forward under the database's transition guard. Returns the transfer as it now
 * is, or undefined when it was not in `from` at `transfer.version` (nothing changed).
 */
async function advance(
  tx: TransactionSql,
  transfer: RailTransfer,
  from: TransferStatus[],
  to: TransferStatus,
  fields: { railReference?: string; failureReason?: string } = {},
): Promise<RailTransfer | undefined> {
  // The status history row is written only when the guarded update matched (one statement).
  const [row] = await tx<RailTransferRow[]>`
    with moved as (
      update transfers
      set status = ${to}, version = version + 1, updated_at = now(),
          rail_reference = coalesce(${fields.railReference ?? null}, rail_reference),
          failure_reason = coalesce(${fields.failureReason ?? null}, failure_reason)
      where id = ${transfer.id} and status = any(${from}) and version = ${transfer.version}
      returning ${tx.unsafe(RAIL_COLUMNS)}
    ), history as (
      insert into transfer_status_history (transfer_id, company_id, status, reason)
      select id, company_id, ${to}, ${fields.failureReason ?? null} from moved
    )
    select * from moved`;
  return row ? toRailTransfer(row) : undefined;
}

/**
 * A hold's pair of entries, wallet debited and clearing account credited: as `hold` they reserve the
 * amount; as `hold_release` they undo that reservation, and the database requires each release to
 * mirror a hold entry exactly (same hold, account and amount).
 */
function holdPair(
  transfer: { sourceAccountId: string; currency: string; amount: bigint },
  hold: { id: string; clearingAccountId: string },
  kind: 'hold' | 'hold_release',
): EntryLine[] {
  return [
    {
      accountId: transfer.sourceAccountId,
      currency: transfer.currency,
      amount: -transfer.amount,
      kind,
      holdId: hold.id,
    },
    { accountId: hold.clearingAccountId, currency: transfer.currency, amount: transfer.amount, kind, holdId: hold.id },
  ];
}

/**
 * Resolves the transfer's hold (posted or voided) and returns it with the clearing account its
 * hold entry credited, in one statement.
 */
async function resolveHold(
  tx: TransactionSql,
  transferId: string,
  status: 'posted' | 'voided',
): Promise<{ id: string; clearingAccountId: string }> {
  const [row] = await tx<{ id: string; clearing_account_id: string }[]>`
    update ledger_holds h set status = ${status}, resolved_at = now()
    where h.transfer_id = ${transferId} and h.status = 'pending'
    returning h.id, (select e.account_id from ledger_entries e
                     where e.hold_id = h.id and e.kind = 'hold' and e.amount > 0) as clearing_account_id`;
  // The caller moved the transfer out of its pending state first (at its version), so its hold is
  // pending: anything else is a broken invariant, said plainly rather than as a TypeError.
  if (!row) throw new Error(`transfer ${transferId} has no pending hold to mark ${status}`);
  return { id: row.id, clearingAccountId: row.clearing_account_id };
}

// Each step below returns the transfer after it, or undefined when it was not in the step's `from`
// status at `transfer.version` (then nothing was written).

/** Submitted to the rail: `pending` → `processing`. Idempotent. */
export async function markRailTransferProcessing(
  tx: TransactionSql,
  transfer: RailTransfer,
  railReference: string,
): Promise<RailTransfer | undefined> {
  return advance(tx, transfer, ['pending'], 'processing', { railReference });
}

/** The platform accounts a settlement posts through (and its return reverses), in one round trip. */
async function settlementAccounts(tx: TransactionSql, transfer: RailTransfer, newSystemId: () => string) {
  const [fees, fxIn, fxOut, payouts] = await systemAccounts(
    tx,
    transfer,
    [
      { purpose: 'fees', currency: transfer.currency },
      { purpose: 'fx', currency: transfer.currency },
      { purpose: 'fx', currency: transfer.outCurrency },
      { purpose: 'ach_payouts', currency: transfer.outCurrency },
    ],
    newSystemId,
  );
  return { fees: fees!, fxIn: fxIn!, fxOut: fxOut!, payouts: payouts! };
}

/**
 * The rail paid out: the hold is released and posted. USDC leaves the wallet into fees and FX; in
 * USD the FX account pays the ACH payouts account. Each currency balances. Idempotent.
 */
export async function settleRailTransfer(
  tx: TransactionSql,
  transfer: RailTransfer,
  newSystemId: () => string,
): Promise<RailTransfer | undefined> {
  const settled = await advance(tx, transfer, ['processing'], 'settled');
  if (!settled) return undefined;
  const hold = await resolveHold(tx, transfer.id, 'posted');
  const { fees, fxIn, fxOut, payouts } = await settlementAccounts(tx, transfer, newSystemId);
  const lines: EntryLine[] = [
    ...holdPair(transfer, hold, 'hold_release'),
    { accountId: transfer.sourceAccountId, currency: transfer.currency, amount: -transfer.amount, kind: 'posted' },
    { accountId: fxIn, currency: transfer.currency, amount: transfer.amount - transfer.feeAmount, kind: 'posted' },
    { accountId: fxOut, currency: transfer.outCurrency, amount: -transfer.outAmount, kind: 'posted' },
    { accountId: payouts, currency: transfer.outCurrency, amount: transfer.outAmount, kind: 'posted' },
  ];
  if (transfer.feeAmount > 0n)
    lines.push({ accountId: fees, currency: transfer.currency, amount: transfer.feeAmount, kind: 'posted' });
  await insertEntries(tx, transfer, transfer.id, lines);
  return settled;
}

/** The rail refused or never confirmed: the hold is voided, the money is available again. Idempotent. */
export async function failRailTransfer(
  tx: TransactionSql,
  transfer: RailTransfer,
  reason: string,
): Promise<RailTransfer | undefined> {
  const failed = await advance(tx, transfer, ['pending', 'processing'], 'failed', { failureReason: reason });
  if (!failed) return undefined;
  const hold = await resolveHold(tx, transfer.id, 'voided');
  await insertEntries(tx, transfer, transfer.id, holdPair(transfer, hold, 'hold_release'));
  return failed;
}

/**
 * The bank returned a settled payout: every posted entry of the settlement is reversed, the fee
 * included, so the wallet gets its full amount back. Idempotent.
 */
export async function returnRailTransfer(
  tx: TransactionSql,
  transfer: RailTransfer,
  reason: string,
  newSystemId: () => string,
): Promise<RailTransfer | undefined> {
  const returned = await advance(tx, transfer, ['settled'], 'returned', { failureReason: reason });
  if (!returned) return undefined;
  const { fees, fxIn, fxOut, payouts } = await settlementAccounts(tx, transfer, newSystemId);
  const lines: EntryLine[] = [
    { accountId: transfer.sourceAccountId, currency: transfer.currency, amount: transfer.amount, kind: 'posted' },
    { accountId: fxIn, currency: transfer.currency, amount: -(transfer.amount - transfer.feeAmount), kind: 'posted' },
    { accountId: fxOut, currency: transfer.outCurrency, amount: transfer.outAmount, kind: 'posted' },
    { accountId: payouts, currency: transfer.outCurrency, amount: -transfer.outAmount, kind: 'posted' },
  ];
  if (transfer.feeAmount > 0n)
    lines.push({ accountId: fees, currency: transfer.currency, amount: -transfer.feeAmount, kind: 'posted' });
  await insertEntries(tx, transfer, transfer.id, lines);
  return returned;
}
