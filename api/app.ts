import Koa from 'koa';
import Router from '@koa/router';
import { bodyParser } from '@koa/bodyparser';
import type { AppDeps } from './deps.ts';
import { errorHandler } from './middleware/errors.ts';
import { requestContext } from './middleware/request-context.ts';
import { isJsonRequest, requireJsonBody } from './middleware/json-body.ts';
import { HttpProblem, problems } from './problem.ts';
import { mountRoutes, type RouteDefinition, type RouteLayer } from './route.ts';
import { createAuthenticator } from './auth/authenticate.ts';
import { getHealthz } from './health/get-healthz.ts';
import { getReadyz } from './health/get-readyz.ts';
import { docsRoutes } from './docs/docs-routes.ts';
import { postLogin } from './admin-auth/login.ts';
import { postLogout } from './admin-auth/logout.ts';
import { getMe } from './admin-auth/me.ts';
import { postApiKey } from './api-keys/create-api-key.ts';
import { getApiKeys } from './api-keys/list-api-keys.ts';
import { deleteApiKey } from './api-keys/revoke-api-key.ts';
import { getCompanyConfig } from './company/get-company-config.ts';
import { getAccount, getAccounts } from './v1/accounts.ts';
import { getTransfer, getTransfers, postTransfer } from './v1/transfers.ts';
import { getJwks } from './well-known/get-jwks.ts';
import { sandboxRoutes } from './v1/sandbox.ts';
import { webhookEndpointRoutes } from './v1/webhook-endpoints.ts';
import { eventRoutes } from './v1/events.ts';

export interface App {
  koa: Koa;
  routes: readonly RouteDefinition[];
}

/** Every route of the service, in one list: the router, the docs and the route tests read it. */
export function buildRoutes(deps: AppDeps): RouteDefinition[] {
  const routes: RouteDefinition[] = [
    getHealthz,
    getReadyz(deps),
    postLogin(deps),
    postLogout(deps),
    getMe(deps),
    getCompanyConfig(deps),
    postApiKey(deps),
    getApiKeys(deps),
    deleteApiKey(deps),
    getJwks(deps),
    getAccounts(deps),
    getAccount(deps),
    postTransfer(deps),
    getTransfers(deps),
    getTransfer(deps),
    ...sandboxRoutes(deps),
    ...webhookEndpointRoutes(deps),
    ...eventRoutes(deps),
  ];
  routes.push(...docsRoutes(() => routes));
  return routes;
}

/** The HTTP application: no listen, no environment reads; everything comes in through deps. */
export function createApp(deps: AppDeps): App {
  return createHttpApp(deps, buildRoutes(deps), {
    authenticate: createAuthenticator(deps.sql),
    idempotency: deps.idempotency,
  });
}

/** What @hapi/bourne (under co-body) throws for valid JSON holding a `__proto__` key, at any depth. */
const PROTOTYPE_POISONING = 'Object contains forbidden prototype property';

function isPrototypePoisoning(error: unknown): boolean {
  return error instanceof SyntaxError && error.message === PROTOTYPE_POISONING;
}

/** A method the router does not implement at all (TRACE, …), as problem+json like every other error. */
function notImplemented(method: string, allow: string): HttpProblem {
  return new HttpProblem({
    status: 501,
    code: 'NOT_IMPLEMENTED',
    title: 'Not implemented',
    detail: `This API does not implement the ${method} method.`,
    ...(allow === '' ? {} : { headers: { Allow: allow } }),
  });
}

/** The middleware stack (request IDs, logs, limits, problem+json errors, JSON bodies) around routes. */
export function createHttpApp(
  deps: Pick<AppDeps, 'logger' | 'limits' | 'trustProxy'>,
  routes: readonly RouteDefinition[],
  layer: RouteLayer = { authenticate: async () => undefined },
): App {
  // Behind one trusted proxy, the address it appended last; never one the client wrote itself.
  const koa = new Koa({ proxy: deps.trustProxy ?? false, maxIpsCount: 1 });
  koa.silent = true; // errors are logged once, by the error middleware
  const router = new Router();
  mountRoutes(router, routes, layer);

  koa.use(requestContext(deps.logger));
  koa.use(errorHandler({ bodyLimitBytes: deps.limits.bodyLimitBytes }));
  const requireJson = requireJsonBody();
  const parseBody = bodyParser({
    enableTypes: ['json'],
    // Every type requireJsonBody admits, `+json` ones included: by default only a fixed list of
    // them is parsed and any other (application/merge-patch+json) would reach the route as `{}`.
    detectJSON: isJsonRequest,
    jsonLimit: deps.limits.bodyLimitBytes,
    jsonStrict: true,
    encoding: 'utf-8',
    onError(error) {
      const status = (error as { status?: number }).status;
      if (status === 413) throw problems.payloadTooLarge(deps.limits.bodyLimitBytes);
      // Valid JSON, but refused so the key cannot reach an object's prototype: say so, not "not JSON".
      if (isPrototypePoisoning(error)) {
        throw problems.validation(
          [{ path: 'body', message: 'JSON objects may not contain a "__proto__" key, at any depth' }],
          'The request body contains a "__proto__" key, which is not accepted.',
        );
      }
      throw problems.malformedJson();
    },
  });
  // A body refused (400, 413, 415) for a request no route takes is not the answer: an unknown path
  // or a wrong method is answered 404 / 405 by the router whatever its body. The routes are matched
  // only then, off the hot path.
  koa.use(async (ctx, next) => {
    try {
      await requireJson(ctx, () => parseBody(ctx, async () => undefined));
    } catch (error) {
      if (router.match(ctx.path, ctx.method).route) throw error;
    }
    await next();
  });
  // A method the router does not implement at all (TRACE, …) comes back from allowedMethods() as a
  // bare 501, turned into a problem here; its `throw` option's factories get no context, so they
  // could name neither the method nor Allow. (A bare 405 with Allow the error middleware handles.)
  koa.use(async (ctx, next) => {
    await next();
    if (ctx.status === 501 && (ctx.body === undefined || ctx.body === null)) {
      const allow = ctx.response.get('Allow');
      ctx.remove('Allow');
      throw notImplemented(ctx.method, allow);
    }
  });
  koa.use(router.routes());
  koa.use(router.allowedMethods());
  return { koa, routes };
}
