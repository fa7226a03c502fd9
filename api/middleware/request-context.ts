import { randomUUID } from 'node:crypto';
import type { Middleware } from 'koa';
import type { Logger } from '../../platform/logger.ts';

const REQUEST_ID_PATTERN = /^[A-Za-z0-9._:-]{8,128}$/;

/**
 * Gives every request an ID (the caller's X-Request-Id when it is well formed, else a new UUID),
 * echoes it back, and writes one structured log line per request when it completes.
 *
 * `ctx.state.logger` (a pino child carrying the request ID) is made on first use: most requests
 * never log anything but their closing line, and that one is skipped, child and all, when its level
 * is disabled.
 */
export function requestContext(logger: Logger): Middleware {
  return async (ctx, next) => {
    const incoming = ctx.get('X-Request-Id');
    const requestId = REQUEST_ID_PATTERN.test(incoming) ? incoming : `req_${randomUUID()}`;
    ctx.state.requestId = requestId;
    let child: Logger | undefined;
    Object.defineProperty(ctx.state, 'logger', {
      configurable: true,
      enumerable: true,
      get: () => (child ??= logger.child({ request_id: requestId })),
    });
    ctx.set('X-Request-Id', requestId);
    const startedAt = process.hrtime.bigint();
    try {
      await next();
    } finally {
      const level = ctx.status >= 500 ? 'error' : 'info';
      if (logger.isLevelEnabled(level)) {
        const durationMs = Number(process.hrtime.bigint() - startedAt) / 1e6;
        ctx.state.logger[level](
          { method: ctx.method, path: ctx.path, status: ctx.status, duration_ms: Math.round(durationMs * 100) / 100 },
          'request',
        );
      }
    }
  };
}
