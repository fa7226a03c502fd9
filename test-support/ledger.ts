import { createHash } from 'node:crypto';
import type { Sql, TransactionSql } from '../db/client.ts';
import type { IdempotencyClaim } from '../db/idempotency.ts';
import { openLedgerAccount, type Environment, type HotPathTransfer } from '../db/ledger.ts';
import { newId } from '../platform/ids.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { provisionTenant, type ProvisionedTenant } from '../services/tenants.ts';
import type { SystemPurpose } from '../db/rails.ts';
import { createAppRoleSql, createTestDatabase, type TestDatabase } from './db.ts';

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

/**
 * A private database with two provisioned tenants and a pool that connects as `payments_app` (row-
 * level security applies), for the hot-path and group-commit tests, with the probes they read back.
 */
export interface HotPathFixture {
  database: TestDatabase;
  /** Owner connection: sees every company. */
  ownerSql: Sql;
  /** As the API writes: `payments_app`, under row-level security. */
  appSql: Sql;
  tenant: ProvisionedTenant;
  other: ProvisionedTenant;
  /** An account's posted balance, in minor units. */
  posted(accountId: string): Promise<bigint>;
  /** How many transfers were written under an Idempotency-Key. */
  transfersUnder(key: string): Promise<number>;
  close(): Promise<void>;
}

export async function startHotPathFixture(label: string, poolMax: number): Promise<HotPathFixture> {
  const database = await createTestDatabase();
  const ownerSql = database.sql;
  const appSql = createAppRoleSql(database.url, { applicationName: `payments-test-${label}`, poolMax });
  const provision = (name: string) =>
    provisionTenant(
      ownerSql,
      { name, ownerEmail: `${label}-${name.toLowerCase()}-${process.pid}@example.com` },
      SYSTEM_ACTOR,
    );
  const tenant = await provision('Tenant');
  const other = await provision('Other');
  return {
    database,
    ownerSql,
    appSql,
    tenant,
    other,
    posted: async (accountId) =>
      (await ownerSql<{ posted: bigint }[]>`select posted from ledger_accounts where id = ${accountId}`)[0]!.posted,
    transfersUnder: async (key) =>
      (await ownerSql<{ n: number }[]>`select count(*)::int as n from transfers where idempotency_key = ${key}`)[0]!.n,
    async close() {
      await appSql.end({ timeout: 5 });
      await database.drop();
    },
  };
}
