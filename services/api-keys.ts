import type { Sql, TransactionSql } from '../db/client.ts';
import { appendAuditEvent } from '../db/audit.ts';
import {
  findApiKeyByLookup,
  insertApiKey,
  revokeApiKey as revokeApiKeyRow,
  findApiKey,
  type ApiKey,
} from '../db/api-keys.ts';
import { findCompany } from '../db/companies.ts';
import { withTenant } from '../db/tenant.ts';
import { newId } from '../platform/ids.ts';
import { DomainError, notFound } from '../workflows/shared/errors.ts';
import type { ActorContext } from './audit-context.ts';
import { generateApiKeySecret, hashesEqual, parseApiKey, sha256, type ApiKeyEnvironment } from './credentials.ts';

export interface CreatedApiKey {
  apiKey: ApiKey;
  /** Shown once, in the creation response; only its hash is stored. */
  secret: string;
}

/** Sandbox keys at once; live keys only for a verified company. */
export interface NewApiKeyInput {
  companyId: string;
  environment: ApiKeyEnvironment;
  name: string;
  createdBy: string | null;
}

export async function createApiKey(sql: Sql, input: NewApiKeyInput, context: ActorContext): Promise<CreatedApiKey> {
  return withTenant(sql, input.companyId, (tx) => createApiKeyInTx(tx, input, context));
}

export async function createApiKeyInTx(
  tx: TransactionSql,
  input: NewApiKeyInput,
  context: ActorContext,
): Promise<CreatedApiKey> {
  const generated = generateApiKeySecret(input.environment);
  const company = await findCompany(tx, input.companyId);
  if (!company) throw notFound('company');
  if (input.environment === 'live' && company.verificationStatus !== 'verified') {
    throw new DomainError(
      'forbidden',
      'VERIFICATION_REQUIRED',
      'Live API keys are issued once the company has completed verification; use a sandbox key until then.',
    );
  }
  const apiKey = await insertApiKey(tx, {
    id: newId('key'),
    companyId: input.companyId,
    environment: input.environment,
    name: input.name,
    lookup: generated.lookup,
    secretHash: generated.secretHash,
    last4: generated.last4,
    createdBy: input.createdBy,
  });
  await appendAuditEvent(tx, {
    companyId: input.companyId,
    event: 'api_key.created',
    actor: context.actor,
    object: { type: 'api_key', id: apiKey.id },
    data: { environment: apiKey.environment, name: apiKey.name, last4: apiKey.last4 },
    ip: context.ip,
    requestId: context.requestId,
  });
  return { apiKey, secret: generated.secret };
}

export async function revokeApiKey(
  sql: Sql,
  input: { companyId: string; id: string; revokedBy: string | null },
  context: ActorContext,
): Promise<ApiKey> {
  return withTenant(sql, input.companyId, async (tx) => {
    const existing = await findApiKey(tx, input.companyId, input.id);
    if (!existing) throw notFound('API key');
    if (existing.revokedAt) return existing;
    const revoked = (await revokeApiKeyRow(tx, input.companyId, input.id, input.revokedBy, new Date()))!;
    await appendAuditEvent(tx, {
      companyId: input.companyId,
      event: 'api_key.revoked',
      actor: context.actor,
      object: { type: 'api_key', id: input.id },
      data: { environment: revoked.environment, last4: revoked.last4 },
      ip: context.ip,
      requestId: context.requestId,
    });
    return revoked;
  });
}

export interface ApiKeyPrincipal {
  keyId: string;
  companyId: string;
  environment: ApiKeyEnvironment;
}

const invalidKey = () =>
  new DomainError('unauthenticated', 'INVALID_API_KEY', 'The API key is missing, malformed, unknown or revoked.');

/** `/v1` authentication: the key decides the company and the environment. */
export async function authenticateApiKey(sql: Sql, secret: string): Promise<ApiKeyPrincipal> {
  const parsed = parseApiKey(secret);
  if (!parsed) throw invalidKey();
  const row = await findApiKeyByLookup(sql, parsed.lookup);
  if (!row || row.environment !== parsed.environment || !hashesEqual(row.secretHash, sha256(secret)))
    throw invalidKey();
  if (row.companyBlocked || !row.companyActive) {
    throw new DomainError('forbidden', 'COMPANY_BLOCKED', 'This company is blocked or inactive.');
  }
  if (row.environment === 'live' && row.verificationStatus !== 'verified') {
    throw new DomainError('forbidden', 'VERIFICATION_REQUIRED', 'Live keys work only for a verified company.');
  }
  return { keyId: row.keyId, companyId: row.companyId, environment: row.environment };
}
