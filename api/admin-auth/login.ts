import { z } from 'zod';
import type { Sql } from '../../db/client.ts';
import { login, type LoginPolicy } from '../../services/auth.ts';
import { PASSWORD_MAX_LENGTH } from '../../services/credentials.ts';
import { defineRoute } from '../route.ts';

export const ZLoginRequest = z.strictObject({
  email: z.email().max(254),
  password: z.string().min(1).max(PASSWORD_MAX_LENGTH),
});

export function postLogin(deps: { sql: Sql; loginPolicy: LoginPolicy }) {
  return defineRoute({
    method: 'POST',
    path: '/admin/auth/login',
    operationId: 'login',
    summary: 'Sign in a console operator; returns a bearer token for /admin.',
    tags: ['auth'],
    auth: { kind: 'public' },
    idempotent: false,
    body: ZLoginRequest,
    example: { email: 'owner@example.com', password: 'correct horse battery staple' },
    responses: { 200: '{ token, expiresAt }', 401: 'Wrong email or password', 403: 'Blocked', 423: 'Locked', 429: 'Throttled' },
    async handler(ctx, { body }) {
      const result = await login(
        deps.sql,
        deps.loginPolicy,
        { email: body.email, password: body.password, userAgent: ctx.get('User-Agent') },
        { ip: ctx.ip, requestId: ctx.state.requestId },
      );
      ctx.set('Cache-Control', 'no-store');
      ctx.body = { token: result.token, expiresAt: result.expiresAt.toISOString() };
    },
  });
}
