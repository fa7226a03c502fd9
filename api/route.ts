import type Router from '@koa/router';
import type { Context } from 'koa';
import { z } from 'zod';
import { problems, type ValidationIssue } from './problem.ts';
import type { Permission } from './auth/permissions.ts';
import type { Authenticator } from './auth/authenticate.ts';

export type HttpMethod = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';

/** Who may call a route: anyone, a signed-in console operator with a permission, or an API key. */
export type RouteAuth = { kind: 'public' } | { kind: 'operator'; permission: Permission } | { kind: 'api_key' };

/** The object a route's path parameter names, so the tenancy matrix test can make own and foreign ones. */
export interface RouteResource {
  param: string;
  type: string;
}

const WRITE_METHODS = new Set<HttpMethod>(['POST', 'PUT', 'PATCH', 'DELETE']);

/** The idempotency layer as the route layer uses it (api/middleware/idempotency.ts). */
export interface IdempotencyRunner {
  run(
    ctx: Context,
    scope: { companyId: string; environment: 'sandbox' | 'live' | 'admin' },
    options: { required: boolean; deferred?: boolean },
    execute: () => Promise<void>,
  ): Promise<void>;
}
type Schema = z.ZodType | undefined;
type Infer<S extends Schema> = S extends z.ZodType ? z.output<S> : undefined;

export interface RouteInput<P extends Schema, Q extends Schema, B extends Schema> {
  params: Infer<P>;
  query: Infer<Q>;
  body: Infer<B>;
}

/**
 * One operation: where it lives, what it accepts (zod schemas, parsed once here at the edge) and
 * the handler that receives typed input. The same definition feeds the router and the OpenAPI doc.
 */
export interface RouteDefinition<P extends Schema = Schema, Q extends Schema = Schema, B extends Schema = Schema> {
  method: HttpMethod;
  path: string;
  operationId: string;
  summary: string;
  tags: string[];
  auth: RouteAuth;
  resource?: RouteResource;
  /**
   * Writes are idempotent by default; a route that must never replay (sign-in) opts out. 'deferred':
   * the handler claims the key itself through `ctx.state.deferredIdempotency`, to fold the claim
   * into its own statement (api/middleware/idempotency.ts).
   */
  idempotent?: boolean | 'deferred';
  params?: P;
  query?: Q;
  body?: B;
  /** A valid request body: shown in the docs and used by the route-matrix test. */
  example?: unknown;
  /** Success status and a short description, for the docs. */
  responses: Record<number, string>;
  handler(ctx: Context, input: RouteInput<P, Q, B>): Promise<void> | void;
}

export function defineRoute<P extends Schema = undefined, Q extends Schema = undefined, B extends Schema = undefined>(
  definition: RouteDefinition<P, Q, B>,
): RouteDefinition {
  // The typed handler is only ever called with input parsed by the same schemas (see mountRoutes).
  return definition;
}

type Issue = z.core.$ZodIssue;

/**
 * Field-level issues. A union that matches no branch is reported through the branch it came
 * closest to (fewest issues), so a body of the wrong shape still gets field paths, not "Invalid input".
 */
function flatten(issues: readonly Issue[], prefix: PropertyKey[]): { path: PropertyKey[]; message: string }[] {
  return issues.flatMap((issue) => {
    if (issue.code === 'invalid_union' && issue.errors.length > 0) {
      const closest = [...issue.errors].sort((a, b) => a.length - b.length)[0]!;
      return flatten(closest, [...prefix, ...issue.path]);
    }
    return [{ path: [...prefix, ...issue.path], message: issue.message }];
  });
}

function issuesOf(error: z.ZodError, location: 'params' | 'query' | 'body'): ValidationIssue[] {
  return flatten(error.issues, []).map((issue) => ({
    path: [location, ...issue.path.map(String)].join('.'),
    message: issue.message,
  }));
}

async function parsePart(
  schema: Schema,
  value: unknown,
  location: 'params' | 'query' | 'body',
  issues: ValidationIssue[],
) {
  if (!schema) return undefined;
  const result = await schema.safeParseAsync(value);
  if (result.success) return result.data;
  issues.push(...issuesOf(result.error, location));
  return undefined;
}

const NUL = '\u0000';
const TEXT_SCAN_DEPTH_MAX = 64;
/**
 * A UTF-16 surrogate without its pair (JSON allows "\ud800"): it is not a Unicode character, RFC 8785
 * canonical JSON refuses it (the idempotency fingerprint and the transfer signature would throw: a
 * 500), and PostgreSQL would store U+FFFD instead. With the `u` flag \p{Cs} matches only unpaired ones.
 */
const LONE_SURROGATE = /\p{Cs}/u;

/**
 * Strings PostgreSQL and canonical JSON cannot take, anywhere in the input: U+0000 (a text column
 * refuses it) and an unpaired surrogate (RFC 8785 refuses it). Such a value is refused here as a
 * 400 naming its field, before it reaches a statement or the request fingerprint (a 500) or an
 * activity's arguments (retried in vain).
 */
function unstorableTextIssues(value: unknown, path: string, issues: ValidationIssue[], depth = 0): void {
  if (typeof value === 'string') {
    if (value.includes(NUL)) issues.push({ path, message: 'must not contain the NUL character (U+0000)' });
    if (LONE_SURROGATE.test(value))
      issues.push({ path, message: 'must not contain an unpaired surrogate (\\uD800-\\uDFFF)' });
    return;
  }
  if (typeof value !== 'object' || value === null || depth >= TEXT_SCAN_DEPTH_MAX) return;
  for (const [name, child] of Object.entries(value)) {
    if (name.includes(NUL)) issues.push({ path, message: 'field names must not contain the NUL character (U+0000)' });
    if (LONE_SURROGATE.test(name)) issues.push({ path, message: 'field names must not contain an unpaired surrogate' });
    unstorableTextIssues(child, `${path}.${name}`, issues, depth + 1);
  }
}

/**
 * Query parameters given more than once (`?limit=1&limit=2`): Koa hands them over as an array,
 * which a scalar schema reports as a confusing type error (`expected number, received NaN`). No
 * route's query schema declares an array, so any repeated parameter is refused, naming it; a
 * route that comes to take a list must exempt that key here.
 */
function repeatedQueryIssues(query: Record<string, unknown>, issues: ValidationIssue[]): void {
  for (const [name, value] of Object.entries(query)) {
    if (Array.isArray(value)) {
      issues.push({ path: `query.${name}`, message: `given ${value.length} times; give it once` });
    }
  }
}

/**
 * Query parameters a route does not take (`?limt=5`, `?status=setled` on a route without a status
 * filter): silently ignoring one would answer a different question than the caller asked, so an
 * authenticated route refuses it, naming what the route does take. Public routes (health probes,
 * docs, the JWKS) keep ignoring them, for probes and cache busters.
 */
function unknownQueryIssues(known: QueryParameters, query: Record<string, unknown>, issues: ValidationIssue[]): void {
  if (known === 'any') return;
  for (const name of Object.keys(query)) {
    if (!known.names.has(name))
      issues.push({ path: `query.${name}`, message: `unknown query parameter; ${known.takes}` });
  }
}

type QueryParameters = 'any' | { names: ReadonlySet<string>; takes: string };

/** What unknownQueryIssues checks a route's query against, worked out once when it is mounted. */
function queryParametersOf(route: RouteDefinition): QueryParameters {
  if (route.auth.kind === 'public') return 'any';
  const names = route.query instanceof z.ZodObject ? Object.keys(route.query.shape) : [];
  const takes = names.length === 0 ? 'this route takes no query parameters' : `this route takes ${names.join(', ')}`;
  return { names: new Set(names), takes };
}

export interface RouteLayer {
  authenticate: Authenticator;
  idempotency?: IdempotencyRunner;
}

/**
 * Registers each route with the same pipeline: authenticate and authorize (401/403), validate
 * params, query and body once (400), then run the handler, through the idempotency layer for writes.
 */
export function mountRoutes(router: Router, routes: readonly RouteDefinition[], layer: RouteLayer): void {
  for (const route of routes) {
    const queryParameters = queryParametersOf(route);
    router.register(
      route.path,
      [route.method],
      async (ctx: Context) => {
        ctx.state.auth = await layer.authenticate(ctx, route.auth);
        const issues: ValidationIssue[] = [];
        const rawBody = (ctx.request as { body?: unknown }).body;
        unstorableTextIssues(ctx.params ?? {}, 'params', issues);
        unstorableTextIssues(ctx.query, 'query', issues);
        repeatedQueryIssues(ctx.query, issues);
        unknownQueryIssues(queryParameters, ctx.query, issues);
        unstorableTextIssues(rawBody, 'body', issues);
        if (issues.length > 0) throw problems.validation(issues);
        const params = await parsePart(route.params, ctx.params ?? {}, 'params', issues);
        const query = await parsePart(route.query, ctx.query, 'query', issues);
        const body = await parsePart(route.body, rawBody ?? {}, 'body', issues);
        if (issues.length > 0) throw problems.validation(issues);
        const execute = async () => route.handler(ctx, { params, query, body });
        const principal = ctx.state.auth;
        if (layer.idempotency && principal && WRITE_METHODS.has(route.method) && route.idempotent !== false) {
          const environment = principal.kind === 'api_key' ? principal.environment : 'admin';
          const options = { required: principal.kind === 'api_key', deferred: route.idempotent === 'deferred' };
          await layer.idempotency.run(ctx, { companyId: principal.companyId, environment }, options, execute);
        } else {
          await execute();
        }
      },
      { name: route.operationId },
    );
  }
}

/** Koa-router path (`/a/:id`) to OpenAPI path (`/a/{id}`). */
export function openApiPath(path: string): string {
  return path.replace(/:([A-Za-z0-9_]+)/g, '{$1}');
}

function jsonSchema(schema: z.ZodType): Record<string, unknown> {
  return z.toJSONSchema(schema, { io: 'input', unrepresentable: 'any' });
}

function parameters(schema: Schema, location: 'path' | 'query') {
  if (!schema) return [];
  const object = jsonSchema(schema) as { properties?: Record<string, unknown>; required?: string[] };
  return Object.entries(object.properties ?? {}).map(([name, property]) => ({
    name,
    in: location,
    required: location === 'path' || (object.required ?? []).includes(name),
    schema: property,
  }));
}

export function openApiDocument(routes: readonly RouteDefinition[], info: { title: string; version: string }) {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const route of routes) {
    const operations = (paths[openApiPath(route.path)] ??= {});
    operations[route.method.toLowerCase()] = {
      operationId: route.operationId,
      summary: route.summary,
      tags: route.tags,
      ...(route.auth.kind === 'public'
        ? { security: [] }
        : { security: [{ [route.auth.kind === 'operator' ? 'consoleSession' : 'apiKey']: [] }] }),
      ...(route.auth.kind === 'operator' ? { 'x-permission': route.auth.permission } : {}),
      parameters: [...parameters(route.params, 'path'), ...parameters(route.query, 'query')],
      ...(route.body
        ? {
            requestBody: {
              required: true,
              content: {
                'application/json': {
                  schema: jsonSchema(route.body),
                  ...(route.example === undefined ? {} : { example: route.example }),
                },
              },
            },
          }
        : {}),
      responses: Object.fromEntries(
        Object.entries(route.responses).map(([status, description]) => [status, { description }]),
      ),
    };
  }
  return {
    openapi: '3.1.0',
    info,
    paths,
    components: {
      securitySchemes: {
        consoleSession: { type: 'http', scheme: 'bearer', description: 'Token from POST /admin/auth/login.' },
        apiKey: { type: 'http', scheme: 'bearer', description: 'sk_sandbox_… or sk_live_… API key.' },
      },
    },
  };
}
