import type { Sql, TransactionSql } from './client.ts';
import type { ApiKeyEnvironment } from '../services/credentials.ts';

export interface ApiKey {
  id: string;
  companyId: string;
  environment: ApiKeyEnvironment;
  name: string;
  lookup: string;
  last4: string;
  createdBy: string | null;
  createdAt: Date;
  revokedAt: Date | null;
  lastUsedAt: Date | null;
}

interface ApiKeyRow {
  id: string;
  company_id: string;
  environment: ApiKeyEnvironment;
  name: string;
  lookup: string;
  last4: string;
  created_by: string | null;
  created_at: Date;
  revoked_at: Date | null;
  last_used_at: Date | null;
}

function toApiKey(row: ApiKeyRow): ApiKey {
  return {
    id: row.id,
    companyId: row.company_id,
    environment: row.environment,
    name: row.name,
    lookup: row.lookup,
    last4: row.last4,
    createdBy: row.created_by,
    createdAt: row.created_at,
    revokedAt: row.revoked_at,
    lastUsedAt: row.last_used_at,
  };
}

const COLUMNS = 'id, company_id, environment, name, lookup, last4, created_by, created_at, revoked_at, last_used_at';

export async function insertApiKey(
  tx: TransactionSql,
  key: {
    id: string;
    companyId: string;
    environment: ApiKeyEnvironment;
    name: string;
    lookup: string;
    secretHash: Buffer;
    last4: string;
    createdBy: string | null;
  },
): Promise<ApiKey> {
  const [row] = await tx<ApiKeyRow[]>`
    insert into api_keys (id, company_id, environment, name, lookup, secret_hash, last4, created_by)
    values (${key.id}, ${key.companyId}, ${key.environment}, ${key.name}, ${key.lookup}, ${key.secretHash},
            ${key.last4}, ${key.createdBy})
    returning ${tx.unsafe(COLUMNS)}`;
  return toApiKey(row!);
}

/** Serialises key creation per company and environment, so a count checked inside stays true. */
export async function lockApiKeysOf(
  tx: TransactionSql,
  companyId: string,
  environment: ApiKeyEnvironment,
): Promise<void> {
  await tx`select pg_advisory_xact_lock(hashtextextended(${`api_keys:${companyId}:${environment}`}, 0))`;
}

export async function countActiveApiKeys(
  tx: TransactionSql,
  companyId: string,
  environment: ApiKeyEnvironment,
): Promise<number> {
  const [row] = await tx<{ count: number }[]>`
    select count(*)::int as count from api_keys
    where company_id = ${companyId} and environment = ${environment} and revoked_at is null`;
  return row!.count;
}

export async function findApiKey(tx: TransactionSql, companyId: string, id: string): Promise<ApiKey | undefined> {
  const [row] = await tx<ApiKeyRow[]>`
    select ${tx.unsafe(COLUMNS)} from api_keys where company_id = ${companyId} and id = ${id}`;
  return row ? toApiKey(row) : undefined;
}

/** Newest first by UUIDv7 ID, keyset-paginated, so concurrent inserts never shift a page. */
export async function listApiKeys(
  tx: TransactionSql,
  companyId: string,
  page: { limit: number; after?: { id: string } },
): Promise<ApiKey[]> {
  const rows = await tx<ApiKeyRow[]>`
    select ${tx.unsafe(COLUMNS)} from api_keys
    where company_id = ${companyId} ${page.after ? tx`and id < ${page.after.id}` : tx``}
    order by id desc limit ${page.limit}`;
  return rows.map(toApiKey);
}

export async function revokeApiKey(
  tx: TransactionSql,
  companyId: string,
  id: string,
  by: string | null,
  at: Date,
): Promise<ApiKey | undefined> {
  const [row] = await tx<ApiKeyRow[]>`
    update api_keys set revoked_at = coalesce(revoked_at, ${at}), revoked_by = coalesce(revoked_by, ${by})
    where company_id = ${companyId} and id = ${id}
    returning ${tx.unsafe(COLUMNS)}`;
  return row ? toApiKey(row) : undefined;
}

export interface ApiKeyPrincipalRow {
  keyId: string;
  companyId: string;
  environment: ApiKeyEnvironment;
  secretHash: Buffer;
  companyBlocked: boolean;
  companyActive: boolean;
  verificationStatus: string;
}

/** Cross-company lookup of a live key by its visible part, through the narrow database function. */
export async function findApiKeyByLookup(sql: Sql, lookup: string): Promise<ApiKeyPrincipalRow | undefined> {
  const [row] = await sql<
    {
      key_id: string;
      company_id: string;
      environment: ApiKeyEnvironment;
      secret_hash: Buffer;
      company_blocked: boolean;
      company_active: boolean;
      verification_status: string;
    }[]
  >`select * from auth_api_key(${lookup})`;
  if (!row) return undefined;
  return {
    keyId: row.key_id,
    companyId: row.company_id,
    environment: row.environment,
    secretHash: row.secret_hash,
    companyBlocked: row.company_blocked,
    companyActive: row.company_active,
    verificationStatus: row.verification_status,
  };
}
