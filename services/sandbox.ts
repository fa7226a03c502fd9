import type { Sql, TransactionSql } from '../db/client.ts';
import { withTenant } from '../db/tenant.ts';
import { openLedgerAccount, postLedgerTransfer } from '../db/ledger.ts';
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
}

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
  return { usdcWalletId: ids[0]!, usdWalletId: ids[1]!, usdAccountId: ids[2]! };
}

/** The Shape B pair the CLI reports: the company's first sandbox USD wallet and USD account. */
export async function findSandboxPair(
  sql: Sql,
  companyId: string,
): Promise<{ walletId: string; accountId: string; currency: 'USD' } | undefined> {
  const rows = await withTenant(
    sql,
    companyId,
    (tx) => tx<{ id: string; type: string }[]>`
    select distinct on (type) id, type from ledger_accounts
    where company_id = ${companyId} and environment = 'sandbox' and currency = 'USD' and type in ('wallet', 'account')
    order by type, id`,
  );
  const walletId = rows.find((row) => row.type === 'wallet')?.id;
  const accountId = rows.find((row) => row.type === 'account')?.id;
  return walletId && accountId ? { walletId, accountId, currency: 'USD' } : undefined;
}
