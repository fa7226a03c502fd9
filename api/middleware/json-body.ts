import type { Context, Middleware } from 'koa';
import { problems } from '../problem.ts';

const METHODS_WITH_BODY = new Set(['POST', 'PUT', 'PATCH']);

/**
 * Whether the request says its body is JSON: application/json or any `+json` type
 * (application/merge-patch+json, …). requireJsonBody admits exactly these and the body parser
 * parses exactly these, so no body is admitted and then silently read as `{}`.
 */
export function isJsonRequest(ctx: Context): boolean {
  return Boolean(ctx.is('application/json', '+json'));
}

/** A write that carries a body must say it is JSON; anything else is a 415, not a silent `{}`. */
export function requireJsonBody(): Middleware {
  return async (ctx, next) => {
    // An empty body (Content-Length: 0, as clients send on a bare POST) needs no type.
    const hasBody = (ctx.request.length ?? 0) > 0 || ctx.get('Transfer-Encoding') !== '';
    if (METHODS_WITH_BODY.has(ctx.method) && hasBody && !isJsonRequest(ctx)) {
      throw problems.unsupportedMediaType();
    }
    await next();
  };
}
