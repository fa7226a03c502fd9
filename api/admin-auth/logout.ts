import type { Sql } from '../../db/client.ts';
import { logout } from '../../services/auth.ts';
import { actorContext, operatorOf } from '../auth/authenticate.ts';
import { defineRoute } from '../route.ts';

export function postLogout(deps: { sql: Sql }) {
  return defineRoute({
    method: 'POST',
    path: '/admin/auth/logout',
    operationId: 'logout',
    summary: 'End the current session: its token stops working at once.',
    tags: ['auth'],
    auth: { kind: 'operator', permission: 'session.self' },
    idempotent: false,
    responses: { 200: '{ success: true }' },
    async handler(ctx) {
      await logout(deps.sql, operatorOf(ctx), actorContext(ctx));
      ctx.body = { success: true };
    },
  });
}
