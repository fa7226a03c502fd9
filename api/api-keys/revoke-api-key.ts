import { z } from 'zod';
import type { Sql } from '../../db/client.ts';
import { revokeApiKey } from '../../services/api-keys.ts';
import { actorContext, operatorOf } from '../auth/authenticate.ts';
import { defineRoute } from '../route.ts';
import { apiKeyResource } from './api-key-resource.ts';

export function deleteApiKey(deps: { sql: Sql }) {
  return defineRoute({
    method: 'DELETE',
    path: '/admin/payments/api-keys/:id',
    operationId: 'revokeApiKey',
    summary: 'Revoke a payment API key: it stops authenticating at once. Revoking twice is harmless.',
    tags: ['api-keys'],
    auth: { kind: 'operator', permission: 'api_keys.write' },
    resource: { param: 'id', type: 'api_key' },
    params: z.object({ id: z.string().max(100) }),
    responses: { 200: 'The revoked key.', 404: 'No such key in this company.' },
    async handler(ctx, { params }) {
      const principal = operatorOf(ctx);
      const revoked = await revokeApiKey(
        deps.sql,
        { companyId: principal.companyId, id: params.id, revokedBy: principal.operatorId },
        actorContext(ctx),
      );
      ctx.body = apiKeyResource(revoked);
    },
  });
}
