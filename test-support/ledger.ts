import { createHash } from 'node:crypto';
import type { TransactionSql } from '../db/client.ts';
import type { IdempotencyClaim } from '../db/idempotency.ts';
import { openLedgerAccount, type Environment, type HotPathTransfer } from '../db/ledger.ts';
import { newId } from '../platform/ids.ts';
import type { ProvisionedTenant } from '../services/tenants.ts';
import type { SystemPurpose } from '../db/rails.ts';

/** Opens a platform-side account (type system, unbounded), the way the services do. */
export async function openSystemAccount(
  tx: TransactionSql,
  account: {
    id: string;
    companyId: string;
    environment: Environment;
    currency: string;
    name: string;
    purpose?: SystemPurpose;
  },
): Promise<void> {
  const { purpose, ...fields } = account;
  await openLedgerAccount(tx, {
    ...fields,
    type: 'system',
    overdraftLimit: null,
    systemPurpose: purpose ?? 'sandbox_funding',
  });
}

/**
 * A Shape B key claim as the API sends it with the hot-path statement: `body` is both the request
 * fingerprinted and the response stored, so distinct bodies make distinct requests.
 */
export function hotPathClaim(companyId: string, key: string, body: string): IdempotencyClaim {
  return {
    companyId,
    environment: 'sandbox',
    key,
    requestMethod: 'POST',
    requestPath: '/v1/transfers',
    requestHash: createHash('sha256').update(body).digest(),
    ttlMs: 24 * 60 * 60 * 1000,
    response: {
      status: 201,
      headers: { 'content-type': 'application/json; charset=utf-8', location: '/v1/transfers/x' },
      body: Buffer.from(body),
    },
  };
}

/** A USD Shape B transfer of `owner`'s sandbox, from its USD wallet to its USD account unless overridden. */
export function usdHotPathTransfer(
  owner: ProvisionedTenant,
  amount: bigint,
  overrides: Partial<HotPathTransfer> = {},
): HotPathTransfer {
  return {
    id: newId('tr'),
    amount,
    currency: 'USD',
    sourceAccountId: owner.sandbox.usdWalletId,
    destinationAccountId: owner.sandbox.usdAccountId,
    createdAt: new Date(),
    ...overrides,
  };
}
