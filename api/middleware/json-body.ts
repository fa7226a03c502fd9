import type { Middleware } from 'koa';
import { problems } from '../problem.ts';

const METHODS_WITH_BODY = new Set(['POST', 'PUT', 'PATCH']);

/** A write that carries a body must say it is JSON; anything else is a 415, not a silent `{}`. */
export function requireJsonBody(): Middleware {
  return async (ctx, next) => {
    // ctx.is answers null when there is no body at all, false when the body is of another type.
    if (METHODS_WITH_BODY.has(ctx.method) && ctx.is('application/json', '+json') === false) {
      throw problems.unsupportedMediaType();
    }
    await next();
  };
}
