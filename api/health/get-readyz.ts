import { defineRoute } from '../route.ts';
import type { AppDeps } from '../deps.ts';

export function getReadyz(deps: Pick<AppDeps, 'readiness'>) {
  return defineRoute({
    method: 'GET',
    path: '/readyz',
    operationId: 'getReadyz',
    summary: 'Readiness: PostgreSQL and Temporal both answer.',
    tags: ['operations'],
    auth: { kind: 'public' },
    responses: { 200: 'Every dependency answers.', 503: 'At least one dependency does not answer.' },
    async handler(ctx) {
      const names = Object.keys(deps.readiness);
      const results = await Promise.all(names.map((name) => deps.readiness[name]!().catch(() => false)));
      const checks = Object.fromEntries(names.map((name, index) => [name, results[index] ? 'ok' : 'unavailable']));
      const ready = results.every(Boolean);
      ctx.status = ready ? 200 : 503;
      ctx.body = { status: ready ? 'ready' : 'not_ready', checks };
    },
  });
}
