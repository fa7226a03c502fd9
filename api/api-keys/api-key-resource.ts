import type { ApiKey } from '../../db/api-keys.ts';

/** The API key record as the API shows it: never the secret, only its last four characters. */
export function apiKeyResource(key: ApiKey) {
  return {
    _id: key.id,
    name: key.name,
    environment: key.environment,
    prefix: `sk_${key.environment}_${key.lookup}`,
    last4: key.last4,
    status: key.revokedAt ? 'revoked' : 'active',
    createdAt: key.createdAt.toISOString(),
    createdBy: key.createdBy,
    revokedAt: key.revokedAt?.toISOString() ?? null,
    lastUsedAt: key.lastUsedAt?.toISOString() ?? null,
  };
}
