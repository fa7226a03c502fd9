import Koa from 'koa';
import Router from '@koa/router';
import { bodyParser } from '@koa/bodyparser';
import type { AppDeps } from './deps.ts';
import { errorHandler } from './middleware/errors.ts';
import { requestContext } from './middleware/request-context.ts';
import { requireJsonBody } from './middleware/json-body.ts';
import { problems } from './problem.ts';
import { mountRoutes, type RouteDefinition } from './route.ts';
import { getHealthz } from './health/get-healthz.ts';
import { getReadyz } from './health/get-readyz.ts';
import { docsRoutes } from './docs/docs-routes.ts';

export interface App {
  koa: Koa;
  routes: readonly RouteDefinition[];
}

/** Every route of the service, in one list: the router, the docs and the route tests read it. */
export function buildRoutes(deps: AppDeps): RouteDefinition[] {
  const routes: RouteDefinition[] = [getHealthz, getReadyz(deps)];
  routes.push(...docsRoutes(() => routes));
  return routes;
}

/** The HTTP application: no listen, no environment reads; everything comes in through deps. */
export function createApp(deps: AppDeps): App {
  return createHttpApp(deps, buildRoutes(deps));
}

/** The middleware stack (request IDs, logs, limits, problem+json errors, JSON bodies) around routes. */
export function createHttpApp(deps: Pick<AppDeps, 'logger' | 'limits'>, routes: readonly RouteDefinition[]): App {
  const koa = new Koa({ proxy: false });
  koa.silent = true; // errors are logged once, by the error middleware
  const router = new Router();
  mountRoutes(router, routes);

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
