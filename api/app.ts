import Koa from 'koa';
import Router from '@koa/router';
import { bodyParser } from '@koa/bodyparser';
import type { AppDeps } from './deps.ts';
import { errorHandler } from './middleware/errors.ts';
import { requestContext } from './middleware/request-context.ts';
import { requireJsonBody } from './middleware/json-body.ts';
import { problems } from './problem.ts';
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

/** The middleware stack (request IDs, logs, limits, problem+json errors, JSON bodies) around routes. */
export function createHttpApp(
  deps: Pick<AppDeps, 'logger' | 'limits'>,
  routes: readonly RouteDefinition[],
  layer: RouteLayer = { authenticate: async () => undefined },
): App {
  const koa = new Koa({ proxy: false });
  koa.silent = true; // errors are logged once, by the error middleware
  const router = new Router();
  mountRoutes(router, routes, layer);

  koa.use(requestContext(deps.logger));
  koa.use(errorHandler({ bodyLimitBytes: deps.limits.bodyLimitBytes }));
  koa.use(requireJsonBody());
  koa.use(
    bodyParser({
      enableTypes: ['json'],
      jsonLimit: deps.limits.bodyLimitBytes,
      jsonStrict: true,
      encoding: 'utf-8',
      onError(error) {
        const status = (error as { status?: number }).status;
        if (status === 413) throw problems.payloadTooLarge(deps.limits.bodyLimitBytes);
        throw problems.malformedJson();
      },
    }),
  );
  koa.use(router.routes());
  koa.use(router.allowedMethods());
  return { koa, routes };
}
