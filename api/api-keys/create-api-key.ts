import { z } from 'zod';
import type { Sql } from '../../db/client.ts';
import { createApiKey } from '../../services/api-keys.ts';
import { actorContext, operatorOf } from '../auth/authenticate.ts';
import { respondWithSecretOnce } from '../middleware/idempotency.ts';
import { defineRoute } from '../route.ts';
import { apiKeyResource } from './api-key-resource.ts';

export const ZCreateApiKeyRequest = z.strictObject({
  name: z.string().trim().min(1).max(100),
  environment: z.enum(['sandbox', 'live']),
});

export function postApiKey(deps: { sql: Sql }) {
  return defineRoute({
    method: 'POST',
    path: '/admin/payments/api-keys',
    operationId: 'createApiKey',
    summary:
      'Create a payment API key. The secret is in this response only: a replay of the request (same ' +
      'Idempotency-Key, same body) answers 201 with the same key and `secret: null`, and the secret is never stored.',
    tags: ['api-keys'],
    auth: { kind: 'operator', permission: 'api_keys.write' },
    body: ZCreateApiKeyRequest,
    example: { name: 'Checkout server', environment: 'sandbox' },
    responses: {
      201: 'The key with its secret; on a replay (Idempotent-Replayed: true), the key with `secret: null`.',
      403: 'Live keys need a verified company (VERIFICATION_REQUIRED).',
    },
    async handler(ctx, { body }) {
      const principal = operatorOf(ctx);
      const { apiKey, secret } = await createApiKey(
        deps.sql,
        {
          companyId: principal.companyId,
          environment: body.environment,
          name: body.name,
          createdBy: principal.operatorId,
        },
        actorContext(ctx),
      );
      ctx.status = 201;
      // Keys are stored only as hashes: the idempotency store keeps, and a replay shows, no secret.
      respondWithSecretOnce(ctx, apiKeyResource(apiKey), secret);
    },
  });
}
