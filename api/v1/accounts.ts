import { z } from 'zod';
import type { Sql } from '../../db/client.ts';
import { findLedgerAccount, listLedgerAccounts } from '../../db/ledger.ts';
import { withTenant } from '../../db/tenant.ts';
import { notFound } from '../../workflows/shared/errors.ts';
import { apiKeyPrincipalOf } from '../auth/authenticate.ts';
import { decodeCursor, toPage, ZPageQuery } from '../pagination.ts';
import { defineRoute } from '../route.ts';
import { accountResource } from './resources.ts';

export function getAccounts(deps: { sql: Sql }) {
  return defineRoute({
    method: 'GET',
    path: '/v1/accounts',
    operationId: 'listAccounts',
    summary: 'The caller’s wallets and accounts in the key’s environment, with balances, newest first.',
    tags: ['accounts'],
    auth: { kind: 'api_key' },
    query: ZPageQuery,
    responses: { 200: '{ data, has_more, next_cursor }' },
    async handler(ctx, { query }) {
      const { companyId, environment } = apiKeyPrincipalOf(ctx);
      const after = decodeCursor(query.cursor, ['wal', 'acct']);
      const rows = await withTenant(deps.sql, companyId, (tx) =>
        listLedgerAccounts(tx, { companyId, environment }, { limit: query.limit + 1, ...(after ? { after } : {}) }),
      );
      ctx.body = toPage(rows, query.limit, accountResource);
    },
  });
}

export function getAccount(deps: { sql: Sql }) {
  return defineRoute({
    method: 'GET',
    path: '/v1/accounts/:id',
    operationId: 'getAccount',
    summary: 'One wallet or account with its balances.',
    tags: ['accounts'],
    auth: { kind: 'api_key' },
    resource: { param: 'id', type: 'ledger_account' },
    params: z.object({ id: z.string().max(100) }),
    responses: { 200: 'The account.', 404: 'No such account in this company and environment.' },
    async handler(ctx, { params }) {
      const { companyId, environment } = apiKeyPrincipalOf(ctx);
      const account = await withTenant(deps.sql, companyId, (tx) => findLedgerAccount(tx, { companyId, environment }, params.id));
      if (!account || account.type === 'system') throw notFound('account');
      ctx.body = accountResource(account);
    },
  });
}
