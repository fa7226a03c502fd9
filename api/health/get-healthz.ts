import { defineRoute } from '../route.ts';

export const getHealthz = defineRoute({
  method: 'GET',
  path: '/healthz',
  operationId: 'getHealthz',
  summary: 'Liveness: the process is up and serving HTTP.',
  tags: ['operations'],
  auth: { kind: 'public' },
  responses: { 200: 'The process is up.' },
  handler(ctx) {
    ctx.body = { status: 'ok' };
  },
});
