import { randomUUID } from 'node:crypto';
import type { Middleware } from 'koa';
import type { Logger } from '../../platform/logger.ts';

const REQUEST_ID_PATTERN = /^[A-Za-z0-9._:-]{8,128}$/;

/**
 * Gives every request an ID (the caller's X-Request-Id when it is well formed, else a new UUID),
 * echoes it back, and writes one structured log line per request when it completes.
 */
export function requestContext(logger: Logger): Middleware {
  return async (ctx, next) => {
    const incoming = ctx.get('X-Request-Id');
    const requestId = REQUEST_ID_PATTERN.test(incoming) ? incoming : `req_${randomUUID()}`;
    ctx.state.requestId = requestId;
    ctx.state.logger = logger.child({ request_id: requestId });
    ctx.set('X-Request-Id', requestId);
    const startedAt = process.hrtime.bigint();
    try {
      await next();
    } finally {
      const durationMs = Number(process.hrtime.bigint() - startedAt) / 1e6;
      const level = ctx.status >= 500 ? 'error' : 'info';
      ctx.state.logger[level](
        { method: ctx.method, path: ctx.path, status: ctx.status, duration_ms: Math.round(durationMs * 100) / 100 },
        'request',
      );
    }
  };
}
