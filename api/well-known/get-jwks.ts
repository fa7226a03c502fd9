import { defineRoute } from '../route.ts';

/** Clients and proxies may reuse the key set this long; a signature with an unknown kid means fetch again. */
export const JWKS_MAX_AGE_S = 300;

/** The public keys that verify transfer signatures (DESIGN contract 7); never a private member. */
export function getJwks(deps: { signer: { jwks(): Promise<{ keys: unknown[] }> } }) {
  return defineRoute({
    method: 'GET',
    path: '/.well-known/jwks.json',
    operationId: 'getJwks',
    summary: 'The public keys (JWKS) that verify the detached JWS signature of every transfer object.',
    tags: ['signing'],
    auth: { kind: 'public' },
    responses: { 200: 'The key set: the active key first, then retired keys that still verify old signatures.' },
    async handler(ctx) {
      const jwks = await deps.signer.jwks();
      ctx.set('Cache-Control', `public, max-age=${JWKS_MAX_AGE_S}`);
      ctx.body = { keys: jwks.keys };
    },
  });
}
