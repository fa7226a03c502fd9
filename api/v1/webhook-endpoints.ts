import { z } from 'zod';
import type { Client } from '@temporalio/client';
import type { Sql } from '../../db/client.ts';
import { withTenant } from '../../db/tenant.ts';
import { findWebhookEndpoint, listAttempts, listWebhookEndpoints, type WebhookAttempt } from '../../db/webhooks.ts';
import type { Logger } from '../../platform/logger.ts';
import { webhookEndpointResource } from '../../services/events.ts';
import {
  changeWebhookEndpoint,
  createWebhookEndpoint,
  deleteWebhookEndpoint,
  resendWebhookEvent,
  ROTATION_OVERLAP_MAX_S,
  rotateWebhookEndpointSecret,
  type WebhookEndpointPolicy,
} from '../../services/webhook-endpoints.ts';
import { notFound } from '../../workflows/shared/errors.ts';
import { EVENT_TYPES } from '../../workflows/shared/webhooks.ts';
import { apiKeyPrincipalOf } from '../auth/authenticate.ts';
import { respondWithSecretOnce } from '../middleware/idempotency.ts';
import { decodeCursor, toPage, ZPageQuery } from '../pagination.ts';
import { defineRoute, type RouteDefinition } from '../route.ts';

export interface WebhookRouteDeps {
  sql: Sql;
  logger: Logger;
  webhooks: WebhookEndpointPolicy;
  rails: { temporal: Client };
}

const ZUrl = z.string().min(1).max(2048);
const ZEvents = z
  .array(z.enum([...EVENT_TYPES, '*'], { error: `an event type (${EVENT_TYPES.join(', ')}) or "*"` }))
  .min(1)
  .max(EVENT_TYPES.length + 1);
const ZDescription = z.string().max(500);
const ZEndpointParams = z.object({ id: z.string().max(100) });

const ZCreateWebhookEndpoint = z.strictObject({
  url: ZUrl,
  events: ZEvents.optional(),
  description: ZDescription.optional(),
});
const ZUpdateWebhookEndpoint = z
  .strictObject({
    url: ZUrl.optional(),
    events: ZEvents.optional(),
    description: ZDescription.optional(),
    enabled: z.boolean().optional(),
  })
  .refine((body) => Object.keys(body).length > 0, {
    message: 'Send at least one of url, events, description, enabled.',
  });
const ZRotateSecret = z.strictObject({
  overlap_seconds: z
    .number()
    .int()
    .min(0)
    .max(ROTATION_OVERLAP_MAX_S)
    .default(24 * 3600),
});
const ZResend = z.strictObject({ event: z.string().min(1).max(100) });

function attemptResource(attempt: WebhookAttempt) {
  return {
    id: attempt.id,
    object: 'webhook_attempt' as const,
    event: attempt.eventId,
    endpoint: attempt.endpointId,
    trigger: attempt.trigger,
    state: attempt.state,
    url: attempt.url,
    status_code: attempt.statusCode,
    latency_ms: attempt.latencyMs,
    error: attempt.error,
    response_body: attempt.responseBody,
    started_at: attempt.startedAt.toISOString(),
    finished_at: attempt.finishedAt?.toISOString() ?? null,
  };
}

const EXAMPLE_URL = 'https://hooks.example.com/payments';

export function webhookEndpointRoutes(deps: WebhookRouteDeps): RouteDefinition[] {
  return [
    defineRoute({
      method: 'POST',
      path: '/v1/webhook_endpoints',
      operationId: 'createWebhookEndpoint',
      summary:
        'Register a URL for events (all types, or those listed). The signing secret (whsec_…) is shown once, here. ' +
        'Loopback, private, link-local and metadata targets are refused.',
      tags: ['webhooks'],
      auth: { kind: 'api_key' },
      body: ZCreateWebhookEndpoint,
      example: { url: EXAMPLE_URL, events: ['transfer.settled', 'transfer.failed'] },
      responses: {
        201: '{ id, url, secret, … }',
        400: 'WEBHOOK_URL_INVALID, WEBHOOK_URL_FORBIDDEN, WEBHOOK_URL_UNRESOLVABLE',
        422: 'WEBHOOK_ENDPOINT_LIMIT',
      },
      async handler(ctx, { body }) {
        const { companyId, environment } = apiKeyPrincipalOf(ctx);
        const endpoint = await createWebhookEndpoint(deps.sql, { companyId, environment }, body, deps.webhooks);
        ctx.status = 201;
        ctx.set('Location', `/v1/webhook_endpoints/${endpoint.id}`);
        respondWithSecretOnce(ctx, webhookEndpointResource(endpoint), endpoint.secret);
      },
    }),
    defineRoute({
      method: 'GET',
      path: '/v1/webhook_endpoints',
      operationId: 'listWebhookEndpoints',
      summary: 'The webhook endpoints of the key’s environment, newest first (secrets are not shown).',
      tags: ['webhooks'],
      auth: { kind: 'api_key' },
      query: ZPageQuery,
      responses: { 200: '{ data, has_more, next_cursor }' },
      async handler(ctx, { query }) {
        const { companyId, environment } = apiKeyPrincipalOf(ctx);
        const after = decodeCursor(query.cursor, ['we']);
        const rows = await withTenant(deps.sql, companyId, (tx) =>
          listWebhookEndpoints(tx, { companyId, environment }, { limit: query.limit + 1, ...(after ? { after } : {}) }),
        );
        ctx.body = toPage(rows, query.limit, webhookEndpointResource);
      },
    }),
    defineRoute({
      method: 'GET',
      path: '/v1/webhook_endpoints/:id',
      operationId: 'getWebhookEndpoint',
      summary: 'One webhook endpoint.',
      tags: ['webhooks'],
      auth: { kind: 'api_key' },
      resource: { param: 'id', type: 'webhook_endpoint' },
      params: ZEndpointParams,
      responses: { 200: 'The endpoint.', 404: 'No such endpoint in this company and environment.' },
      async handler(ctx, { params }) {
        const { companyId, environment } = apiKeyPrincipalOf(ctx);
        const endpoint = await withTenant(deps.sql, companyId, (tx) =>
          findWebhookEndpoint(tx, { companyId, environment }, params.id),
        );
        if (!endpoint) throw notFound('webhook endpoint');
        ctx.body = webhookEndpointResource(endpoint);
      },
    }),
    defineRoute({
      method: 'PATCH',
      path: '/v1/webhook_endpoints/:id',
      operationId: 'updateWebhookEndpoint',
      summary: 'Change the URL, the event types, the description, or enable/disable the endpoint.',
      tags: ['webhooks'],
      auth: { kind: 'api_key' },
      resource: { param: 'id', type: 'webhook_endpoint' },
      params: ZEndpointParams,
      body: ZUpdateWebhookEndpoint,
      example: { enabled: true },
      responses: { 200: 'The endpoint.', 400: 'WEBHOOK_URL_*', 404: 'No such endpoint.' },
      async handler(ctx, { params, body }) {
        const { companyId, environment } = apiKeyPrincipalOf(ctx);
        ctx.body = webhookEndpointResource(
          await changeWebhookEndpoint(deps.sql, { companyId, environment }, params.id, body, deps.webhooks),
        );
      },
    }),
    defineRoute({
      method: 'DELETE',
      path: '/v1/webhook_endpoints/:id',
      operationId: 'deleteWebhookEndpoint',
      summary: 'Delete the endpoint: nothing more is sent to it; deliveries in progress stop.',
      tags: ['webhooks'],
      auth: { kind: 'api_key' },
      resource: { param: 'id', type: 'webhook_endpoint' },
      params: ZEndpointParams,
      responses: { 200: '{ id, object, deleted: true }', 404: 'No such endpoint.' },
      async handler(ctx, { params }) {
        const { companyId, environment } = apiKeyPrincipalOf(ctx);
        const endpoint = await deleteWebhookEndpoint(deps.sql, { companyId, environment }, params.id);
        ctx.body = { id: endpoint.id, object: 'webhook_endpoint', deleted: true };
      },
    }),
    defineRoute({
      method: 'POST',
      path: '/v1/webhook_endpoints/:id/rotate_secret',
      operationId: 'rotateWebhookEndpointSecret',
      summary:
        'A new signing secret, shown once. The previous one keeps signing (a second signature in webhook-signature) ' +
        'for overlap_seconds (default 24 h, at most 7 days; 0 retires it at once).',
      tags: ['webhooks'],
      auth: { kind: 'api_key' },
      resource: { param: 'id', type: 'webhook_endpoint' },
      params: ZEndpointParams,
      body: ZRotateSecret,
      example: { overlap_seconds: 3600 },
      responses: { 200: '{ …endpoint, secret, previous_secret_expires_at }', 404: 'No such endpoint.' },
      async handler(ctx, { params, body }) {
        const { companyId, environment } = apiKeyPrincipalOf(ctx);
        const endpoint = await rotateWebhookEndpointSecret(
          deps.sql,
          { companyId, environment },
          params.id,
          body.overlap_seconds,
        );
        respondWithSecretOnce(ctx, webhookEndpointResource(endpoint), endpoint.secret);
      },
    }),
    defineRoute({
      method: 'GET',
      path: '/v1/webhook_endpoints/:id/attempts',
      operationId: 'listWebhookAttempts',
      summary:
        'Delivery attempts to this endpoint, newest first: status, latency, error and up to 1 KiB of the answer.',
      tags: ['webhooks'],
      auth: { kind: 'api_key' },
      resource: { param: 'id', type: 'webhook_endpoint' },
      params: ZEndpointParams,
      query: ZPageQuery.extend({ event: z.string().max(100).optional() }),
      responses: { 200: '{ data, has_more, next_cursor }', 404: 'No such endpoint.' },
      async handler(ctx, { params, query }) {
        const { companyId, environment } = apiKeyPrincipalOf(ctx);
        const after = decodeCursor(query.cursor, ['wha']);
        const rows = await withTenant(deps.sql, companyId, async (tx) => {
          const endpoint = await findWebhookEndpoint(tx, { companyId, environment }, params.id);
          if (!endpoint) throw notFound('webhook endpoint');
          return listAttempts(
            tx,
            endpoint.id,
            { limit: query.limit + 1, ...(after ? { after } : {}) },
            query.event ? { eventId: query.event } : {},
          );
        });
        ctx.body = toPage(rows, query.limit, attemptResource);
      },
    }),
    defineRoute({
      method: 'POST',
      path: '/v1/webhook_endpoints/:id/resend',
      operationId: 'resendWebhookEvent',
      summary:
        'Send an event to this endpoint again, now, with its original webhook-id (one attempt, outside the schedule). ' +
        'The outcome appears in the endpoint’s attempts.',
      tags: ['webhooks'],
      auth: { kind: 'api_key' },
      resource: { param: 'id', type: 'webhook_endpoint' },
      params: ZEndpointParams,
      body: ZResend,
      example: { event: 'evt_…' },
      responses: {
        202: '{ id, object, event, endpoint, status: "queued" }',
        404: 'No such endpoint or event.',
        409: 'WEBHOOK_ENDPOINT_DISABLED',
      },
      async handler(ctx, { params, body }) {
        const { companyId, environment } = apiKeyPrincipalOf(ctx);
        const idempotency = ctx.state.idempotency;
        if (!idempotency) throw new Error('resend runs only behind the idempotency layer');
        const resend = await resendWebhookEvent(
          { sql: deps.sql, temporal: deps.rails.temporal, logger: deps.logger },
          { companyId, environment },
          {
            endpointId: params.id,
            eventId: body.event,
            idempotencyKey: { ...idempotency.scope, key: idempotency.key },
          },
        );
        ctx.status = 202;
        ctx.body = {
          id: resend.resendId,
          object: 'webhook_resend',
          event: body.event,
          endpoint: params.id,
          status: 'queued',
        };
      },
    }),
  ];
}
