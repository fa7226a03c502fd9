import type { Sql, TransactionSql } from '../db/client.ts';
import { appendAuditEvent } from '../db/audit.ts';
import {
  countActiveApiKeys,
  findApiKeyByLookup,
  insertApiKey,
  lockApiKeysOf,
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

/** Active (unrevoked) keys a company may hold per environment; revoke one to create another. */
export const API_KEYS_MAX_PER_ENVIRONMENT = 20;

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
  await lockApiKeysOf(tx, input.companyId, input.environment);
  if ((await countActiveApiKeys(tx, input.companyId, input.environment)) >= API_KEYS_MAX_PER_ENVIRONMENT) {
    throw new DomainError(
      'unprocessable',
      'API_KEY_LIMIT',
      `At most ${API_KEYS_MAX_PER_ENVIRONMENT} active ${input.environment} API keys per company; revoke one first.`,
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
  const revoked = await withTenant(sql, input.companyId, async (tx) => {
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
  apiKeyCache.forget(input.id); // after the commit: a look-up from now on sees the revocation
  return revoked;
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

// A short-lived in-process cache of successful API-key authentications (the /v1 hot path would
// otherwise spend a database round trip per request on the same key). Keyed by the SHA-256 of the
// whole secret, so an entry can only ever be reached with the exact secret that the database
// accepted. Entries live `ttlMs` (API_KEY_CACHE_TTL_MS, 5 s) from the look-up that filled them, not
// sliding: a revoked key, a blocked company or a withdrawn verification takes effect in every process
// within that time, and at once in the process that revoked the key (bar a look-up already under
// way). Failures are never cached, and a miss always asks the database. At most `maxEntries`
// (oldest dropped first); concurrent misses for one key share one look-up.
export const API_KEY_CACHE_TTL_MS = 5_000;
export const API_KEY_CACHE_MAX_ENTRIES = 10_000;

interface CachedPrincipal {
  principal: Promise<ApiKeyPrincipal>;
  /** Known once the look-up succeeded; used to forget a revoked key. */
  keyId?: string;
  expiresAtMs: number;
}

export interface ApiKeyCache {
  authenticate(sql: Sql, secret: string): Promise<ApiKeyPrincipal>;
  /** Drops every entry of a key (after its revocation committed). */
  forget(keyId: string): void;
}

export function createApiKeyCache(options: { ttlMs: number; maxEntries: number }): ApiKeyCache {
  const entries = new Map<string, CachedPrincipal>();
  return {
    authenticate(sql, secret) {
      const hash = sha256(secret).toString('base64');
      const now = performance.now();
      const cached = entries.get(hash);
      if (cached && cached.expiresAtMs > now) return cached.principal;
      if (cached) entries.delete(hash);
      const entry: CachedPrincipal = { principal: authenticateApiKey(sql, secret), expiresAtMs: now + options.ttlMs };
      entry.principal.then(
        (principal) => {
          entry.keyId = principal.keyId;
        },
        () => {
          if (entries.get(hash) === entry) entries.delete(hash);
        },
      );
      if (entries.size >= options.maxEntries) entries.delete(entries.keys().next().value!);
      entries.set(hash, entry);
      return entry.principal;
    },
    forget(keyId) {
      for (const [hash, entry] of entries) if (entry.keyId === keyId) entries.delete(hash);
    },
  };
}

/** The process's cache, used by `/v1` authentication (api/auth/authenticate.ts) and by `revokeApiKey`. */
export const apiKeyCache = createApiKeyCache({ ttlMs: API_KEY_CACHE_TTL_MS, maxEntries: API_KEY_CACHE_MAX_ENTRIES });
