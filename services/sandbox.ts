import type { Sql, TransactionSql } from '../db/client.ts';
import { withTenant } from '../db/tenant.ts';
import { openLedgerAccount, postLedgerTransfer } from '../db/ledger.ts';
import { findSystemAccount, insertExternalAccount } from '../db/rails.ts';
import { newId } from '../platform/ids.ts';
import { parseDecimalAmount } from '../workflows/shared/money.ts';

/** What every company gets in the sandbox at once: spendable test money. */
export const SANDBOX_PRELOAD = [
  { type: 'wallet', currency: 'USDC', name: 'USDC wallet', balance: '10000.00' },
  { type: 'wallet', currency: 'USD', name: 'USD wallet', balance: '10000.00' },
  { type: 'account', currency: 'USD', name: 'USD account', balance: '0' },
] as const;

export interface SandboxLedger {
  usdcWalletId: string;
  usdWalletId: string;
  usdAccountId: string;
  /** A test bank account to pay out to over ACH (Shape A's destination.account). */
  achAccountId: string;
}

/** The sandbox bank account: a test routing number, nothing real behind it. */
export const SANDBOX_ACH = { routingNumber: '110000000', accountLast4: '6789', label: 'Sandbox checking' } as const;

/**
 * Opens the sandbox wallets and account of a new company and funds them from a platform-side
 * funding account per currency (unbounded, type system), with real double-entry transfers, so
 * sandbox money obeys every ledger rule live money does. Runs inside the provisioning transaction.
 */
export async function provisionSandboxLedger(tx: TransactionSql, companyId: string): Promise<SandboxLedger> {
  const scope = { companyId, environment: 'sandbox' as const };
  const funding = new Map<string, string>();
  const ids: string[] = [];
  for (const preload of SANDBOX_PRELOAD) {
    const prefix = preload.type === 'wallet' ? 'wal' : 'acct';
    const account = await openLedgerAccount(tx, {
      id: newId(prefix),
      ...scope,
      type: preload.type,
      currency: preload.currency,
      name: preload.name,
    });
    ids.push(account.id);
    const amount = parseDecimalAmount(preload.balance, preload.currency);
    if (!amount.ok) continue; // a zero preload opens the account empty
    let source = funding.get(preload.currency);
    if (!source) {
      source = (
        await openLedgerAccount(tx, {
          id: newId('sys'),
          ...scope,
          type: 'system',
          currency: preload.currency,
          name: `Sandbox funding ${preload.currency}`,
          overdraftLimit: null,
          systemPurpose: 'sandbox_funding',
        })
      ).id;
      funding.set(preload.currency, source);
    }
    await postLedgerTransfer(tx, {
      id: newId('tr'),
      ...scope,
      idempotencyKey: `sandbox-preload:${account.id}`,
      amount: amount.minor,
      currency: preload.currency,
      sourceAccountId: source,
      destinationAccountId: account.id,
    });
  }
  const achAccountId = newId('ba');
  await insertExternalAccount(tx, { id: achAccountId, ...scope, rail: 'ach', currency: 'USD', ...SANDBOX_ACH });
  return { usdcWalletId: ids[0]!, usdWalletId: ids[1]!, usdAccountId: ids[2]!, achAccountId };
}

/** What the CLI reports (DESIGN 13): the sandbox USD wallet and account (a Shape B pair) and the ACH bank account. */
export async function findSandboxPair(
  sql: Sql,
  companyId: string,
): Promise<{ walletId: string; accountId: string; currency: 'USD'; achAccount: string } | undefined> {
  const rows = await withTenant(
    sql,
    companyId,
    (tx) => tx<{ id: string; type: string }[]>`
    select distinct on (type) id, type from ledger_accounts
    where company_id = ${companyId} and environment = 'sandbox' and currency = 'USD' and type in ('wallet', 'account')
    order by type, id`,
  );
  const [bank] = await withTenant(
    sql,
    companyId,
    (tx) => tx<{ id: string }[]>`
    select id from external_accounts
    where company_id = ${companyId} and environment = 'sandbox' and rail = 'ach' order by id limit 1`,
  );
  const walletId = rows.find((row) => row.type === 'wallet')?.id;
  const accountId = rows.find((row) => row.type === 'account')?.id;
  return walletId && accountId && bank ? { walletId, accountId, currency: 'USD', achAccount: bank.id } : undefined;
}

/**
 * Opens `count` extra sandbox accounts in `currency` and funds each with `amountMinor` from the
 * company's sandbox funding account, by real ledger transfers (test and benchmark worlds).
 */
export async function openFundedSandboxAccounts(
  sql: Sql,
  companyId: string,
  options: { count: number; amountMinor: bigint; currency: string; namePrefix: string },
): Promise<string[]> {
  const scope = { companyId, environment: 'sandbox' as const };
  return withTenant(sql, companyId, async (tx) => {
    const funding = await findSystemAccount(tx, scope, { purpose: 'sandbox_funding', currency: options.currency });
    if (!funding) throw new Error(`no sandbox funding account for ${options.currency}`);
    const ids: string[] = [];
    for (let index = 0; index < options.count; index++) {
      const account = await openLedgerAccount(tx, {
        id: newId('acct'),
        ...scope,
        type: 'account',
        currency: options.currency,
        name: `${options.namePrefix} ${index}`,
      });
      await postLedgerTransfer(tx, {
        id: newId('tr'),
        ...scope,
        idempotencyKey: `sandbox-funding:${account.id}`,
        amount: options.amountMinor,
        currency: options.currency,
        sourceAccountId: funding,
        destinationAccountId: account.id,
      });
      ids.push(account.id);
    }
    return ids;
  });
}
