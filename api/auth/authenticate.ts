import type { Context } from 'koa';
import type { Sql } from '../../db/client.ts';
import { apiKeyCache } from '../../services/api-keys.ts';
import { authenticateSession } from '../../services/auth.ts';
import { DomainError } from '../../workflows/shared/errors.ts';
import type { RouteAuth } from '../route.ts';
import { allows } from './permissions.ts';
import type { Principal } from './principal.ts';

// The auth scheme is case-insensitive (RFC 9110 §11.1): `bearer` and `BEARER` are `Bearer`. The `i`
// flag leaves the credential's class as it is: without `u`, case folding never maps a character
// outside printable ASCII into it, and the class already holds both cases of every letter.
const BEARER = /^Bearer ([\x21-\x7e]{1,512})$/i;

function bearerToken(ctx: Context): string {
  // Node keeps the first of repeated Authorization headers and drops the rest; a proxy in front may
  // use another one. Two credentials are ambiguous: refused, as two Idempotency-Keys are.
  if ((ctx.req.headersDistinct.authorization?.length ?? 0) > 1) {
    throw new DomainError(
      'unauthenticated',
      'UNAUTHENTICATED',
      'Send one `Authorization: Bearer <credential>` header, not several.',
    );
  }
  const match = BEARER.exec(ctx.get('Authorization'));
  if (!match) {
    throw new DomainError('unauthenticated', 'UNAUTHENTICATED', 'Send `Authorization: Bearer <credential>`.');
  }
  return match[1]!;
}

export type Authenticator = (ctx: Context, auth: RouteAuth) => Promise<Principal | undefined>;

/** Resolves who is calling and checks the route's permission. Public routes resolve to nobody. */
export function createAuthenticator(sql: Sql): Authenticator {
  return async (ctx, auth) => {
    switch (auth.kind) {
      case 'public':
        return undefined;
      case 'api_key':
        // Cached for a few seconds (services/api-keys.ts, API_KEY_CACHE_TTL_MS).
        return { kind: 'api_key', ...(await apiKeyCache.authenticate(sql, bearerToken(ctx))) };
      case 'operator': {
        const principal = await authenticateSession(sql, bearerToken(ctx));
        if (!allows(principal.role, auth.permission)) {
          throw new DomainError('forbidden', 'FORBIDDEN', `The role ${principal.role} may not ${auth.permission}.`);
        }
        return { kind: 'operator', ...principal };
      }
    }
  };
}

/** The signed-in operator of an operator route (the route layer guarantees there is one). */
export function operatorOf(ctx: Context): Extract<Principal, { kind: 'operator' }> {
  const principal = ctx.state.auth;
  if (principal?.kind !== 'operator') throw new Error('operator route reached without an operator principal');
  return principal;
}

export function apiKeyPrincipalOf(ctx: Context): Extract<Principal, { kind: 'api_key' }> {
  const principal = ctx.state.auth;
  if (principal?.kind !== 'api_key') throw new Error('api_key route reached without an api_key principal');
  return principal;
}

/** Who did it and from where, for the audit trail. */
export function actorContext(ctx: Context) {
  const principal = ctx.state.auth;
  const actor =
    principal?.kind === 'operator'
      ? { type: 'operator' as const, id: principal.operatorId }
      : principal?.kind === 'api_key'
        ? { type: 'api_key' as const, id: principal.keyId }
        : { type: 'anonymous' as const };
  return { actor, ip: ctx.ip, requestId: ctx.state.requestId };
}
