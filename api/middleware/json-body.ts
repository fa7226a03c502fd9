import type { Middleware } from 'koa';
import { problems } from '../problem.ts';

const METHODS_WITH_BODY = new Set(['POST', 'PUT', 'PATCH']);

/** A write that carries a body must say it is JSON; anything else is a 415, not a silent `{}`. */
export function requireJsonBody(): Middleware {
  return async (ctx, next) => {
    // An empty body (Content-Length: 0, as clients send on a bare POST) needs no type.
    const hasBody = (ctx.request.length ?? 0) > 0 || ctx.get('Transfer-Encoding') !== '';
    if (METHODS_WITH_BODY.has(ctx.method) && hasBody && !ctx.is('application/json', '+json')) {
      throw problems.unsupportedMediaType();
    }
    await next();
  };
}
