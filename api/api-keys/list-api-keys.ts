import type { Sql } from '../../db/client.ts';
import { listApiKeys } from '../../db/api-keys.ts';
import { withTenant } from '../../db/tenant.ts';
import { operatorOf } from '../auth/authenticate.ts';
import { decodeCursor, toPage, ZPageQuery } from '../pagination.ts';
import { defineRoute } from '../route.ts';
import { apiKeyResource } from './api-key-resource.ts';

export function getApiKeys(deps: { sql: Sql }) {
  return defineRoute({
    method: 'GET',
    path: '/admin/payments/api-keys',
    operationId: 'listApiKeys',
    summary: 'List the company’s payment API keys, newest first (never a secret).',
    tags: ['api-keys'],
    auth: { kind: 'operator', permission: 'api_keys.read' },
    query: ZPageQuery,
    responses: { 200: '{ data, has_more, next_cursor }' },
    async handler(ctx, { query }) {
      const { companyId } = operatorOf(ctx);
      const after = decodeCursor(query.cursor, ['key']);
      const rows = await withTenant(deps.sql, companyId, (tx) =>
        listApiKeys(tx, companyId, { limit: query.limit + 1, ...(after ? { after } : {}) }),
      );
      ctx.body = toPage(rows, query.limit, apiKeyResource);
    },
  });
}
