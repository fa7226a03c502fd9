import { z } from 'zod';
import type { Sql } from '../../db/client.ts';
import { withTenant } from '../../db/tenant.ts';
import { findEvent, listEvents } from '../../db/webhooks.ts';
import { renderEvent } from '../../services/events.ts';
import { notFound } from '../../workflows/shared/errors.ts';
import { EVENT_TYPES } from '../../workflows/shared/webhooks.ts';
import { apiKeyPrincipalOf } from '../auth/authenticate.ts';
import { decodeCursor, toPage, ZPageQuery } from '../pagination.ts';
import { defineRoute, type RouteDefinition } from '../route.ts';
import type { TransferSigner } from './resources.ts';

export function eventRoutes(deps: { sql: Sql; signer: TransferSigner }): RouteDefinition[] {
  return [
    defineRoute({
      method: 'GET',
      path: '/v1/events',
      operationId: 'listEvents',
      summary:
        'Every state change of the key’s environment, newest first: the backstop for missed webhooks. ' +
        'Filters: type, object (an object ID).',
      tags: ['events'],
      auth: { kind: 'api_key' },
      query: ZPageQuery.extend({ type: z.enum(EVENT_TYPES).optional(), object: z.string().max(100).optional() }),
      responses: { 200: '{ data, has_more, next_cursor }' },
      async handler(ctx, { query }) {
        const { companyId, environment } = apiKeyPrincipalOf(ctx);
        const after = decodeCursor(query.cursor, ['evt']);
        const rows = await withTenant(deps.sql, companyId, (tx) =>
          listEvents(
            tx,
            { companyId, environment },
            { limit: query.limit + 1, ...(after ? { after } : {}) },
            { ...(query.type ? { type: query.type } : {}), ...(query.object ? { objectId: query.object } : {}) },
          ),
        );
        const page = toPage(rows, query.limit, (event) => event);
        ctx.body = { ...page, data: await Promise.all(page.data.map((event) => renderEvent(event, deps.signer))) };
      },
    }),
    defineRoute({
      method: 'GET',
      path: '/v1/events/:id',
      operationId: 'getEvent',
      summary: 'One event, with the object as it was at that version.',
      tags: ['events'],
      auth: { kind: 'api_key' },
      resource: { param: 'id', type: 'event' },
      params: z.object({ id: z.string().max(100) }),
      responses: { 200: 'The event.', 404: 'No such event in this company and environment.' },
      async handler(ctx, { params }) {
        const { companyId, environment } = apiKeyPrincipalOf(ctx);
        const event = await withTenant(deps.sql, companyId, (tx) => findEvent(tx, { companyId, environment }, params.id));
        if (!event) throw notFound('event');
        ctx.body = await renderEvent(event, deps.signer);
      },
    }),
  ];
}
