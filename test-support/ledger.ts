import type { TransactionSql } from '../db/client.ts';
import { openLedgerAccount, type Environment } from '../db/ledger.ts';
import type { SystemPurpose } from '../db/rails.ts';

/** Opens a platform-side account (type system, unbounded), the way the services do. */
export async function openSystemAccount(
  tx: TransactionSql,
  account: { id: string; companyId: string; environment: Environment; currency: string; name: string; purpose?: SystemPurpose },
): Promise<void> {
  const { purpose, ...fields } = account;
  await openLedgerAccount(tx, { ...fields, type: 'system', overdraftLimit: null, systemPurpose: purpose ?? 'sandbox_funding' });
}
