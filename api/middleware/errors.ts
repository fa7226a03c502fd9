import type { Context, Middleware } from 'koa';
import { DomainError } from '../../workflows/shared/errors.ts';
import { problemFromDomainError } from '../domain-errors.ts';
import { HttpProblem, PROBLEM_CONTENT_TYPE, problems } from '../problem.ts';

interface HttpLikeError {
  status?: number;
  statusCode?: number;
  expose?: boolean;
  type?: string;
  message?: string;
}

/** Maps errors raised by Koa's own stack (body parsing, limits) to problems; anything else is a 500. */
function toProblem(error: unknown, ctx: Context, bodyLimitBytes: number): HttpProblem {
  if (error instanceof HttpProblem) return error;
  if (error instanceof DomainError) return problemFromDomainError(error);
  const httpError = (typeof error === 'object' && error !== null ? error : {}) as HttpLikeError;
  const status = httpError.status ?? httpError.statusCode;
  if (httpError.type === 'entity.too.large' || status === 413) return problems.payloadTooLarge(bodyLimitBytes);
  if (httpError.type === 'entity.parse.failed' || (status === 400 && error instanceof SyntaxError)) {
    return problems.malformedJson();
  }
  if (status === 415) return problems.unsupportedMediaType();
  if (status !== undefined && status >= 400 && status < 500 && httpError.expose) {
    return new HttpProblem({ status, code: 'BAD_REQUEST', title: 'Bad request', detail: httpError.message ?? 'Bad request.' });
  }
  void ctx;
  return problems.internal();
}

function send(ctx: Context, problem: HttpProblem): void {
  ctx.status = problem.status;
  for (const [name, value] of Object.entries(problem.headers)) ctx.set(name, value);
  ctx.type = PROBLEM_CONTENT_TYPE;
  ctx.body = problem.toBody(ctx.state.requestId);
}

/**
 * The one error boundary: every failure leaves as RFC 9457 problem+json. Unknown errors are logged
 * with their stack and answered with a bare 500 that carries no internals. Unmatched routes become
 * 404 and known paths with the wrong method 405 with Allow.
 */
export function errorHandler(options: { bodyLimitBytes: number }): Middleware {
  return async (ctx, next) => {
    try {
      await next();
      if (ctx.body === undefined || ctx.body === null) {
        if (ctx.status === 404) send(ctx, problems.routeNotFound(ctx.method, ctx.path));
        else if (ctx.status === 405) send(ctx, problems.methodNotAllowed(ctx.method, ctx.response.get('Allow')));
      }
    } catch (error) {
      const problem = toProblem(error, ctx, options.bodyLimitBytes);
      if (problem.status >= 500) ctx.state.logger?.error({ err: error }, 'unhandled error');
      send(ctx, problem);
    }
  };
}

/** Renders a problem exactly as the error middleware does, for middleware that must capture it. */
export function sendProblem(ctx: Context, problem: HttpProblem): void {
  send(ctx, problem);
}

/**
 * The problem for an error whose meaning is known (an HttpProblem as it is, a DomainError by its
 * kind), or undefined for any other error, which the error middleware answers with a bare 500.
 */
export function knownProblem(error: unknown): HttpProblem | undefined {
  if (error instanceof HttpProblem) return error;
  if (error instanceof DomainError) return problemFromDomainError(error);
  return undefined;
}
