import type { Sql } from '../../db/client.ts';
import { findOperator } from '../../db/operators.ts';
import { withTenant } from '../../db/tenant.ts';
import { operatorOf } from '../auth/authenticate.ts';
import { defineRoute } from '../route.ts';

export function getMe(deps: { sql: Sql }) {
  return defineRoute({
    method: 'GET',
    path: '/admin/auth/me',
    operationId: 'getMe',
    summary: 'The signed-in operator, its role and company.',
    tags: ['auth'],
    auth: { kind: 'operator', permission: 'session.self' },
    responses: { 200: 'The operator.' },
    async handler(ctx) {
      const principal = operatorOf(ctx);
      const operator = await withTenant(deps.sql, principal.companyId, (tx) => findOperator(tx, principal.operatorId));
      ctx.body = {
        _id: principal.operatorId,
        companyId: principal.companyId,
        email: operator?.email,
        firstName: operator?.firstName,
        lastName: operator?.lastName,
        role: principal.role,
        isMasterCompany: principal.isMasterCompany,
        sessionExpiresAt: principal.expiresAt.toISOString(),
      };
    },
  });
}
