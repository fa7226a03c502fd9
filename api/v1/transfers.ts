import { z } from 'zod';
import type { Sql } from '../../db/client.ts';
import { findTransfer, listTransfers, transferHistory } from '../../db/ledger.ts';
import { withTenant } from '../../db/tenant.ts';
import { prepareLedgerTransfer } from '../../services/transfers.ts';
import type { LedgerWrite } from '../../db/ledger-batch.ts';
import { createPayoutTransfer, type RailTransferDeps } from '../../services/rail-transfers.ts';
import { notFound } from '../../workflows/shared/errors.ts';
import { AMOUNT_MAX_MINOR } from '../../workflows/shared/money.ts';
import { apiKeyPrincipalOf } from '../auth/authenticate.ts';
import { decodeCursor, toPage, ZPageQuery } from '../pagination.ts';
import { defineRoute } from '../route.ts';
import { transferResource, signed, type TransferSigner } from './resources.ts';

const ZAccountReference = z.string().min(1).max(100);

const ZCurrencyCode = z.string().regex(/^[A-Z][A-Z0-9]{2,4}$/, 'an upper-case currency code such as USD or USDC');

/** Shape A of SPEC 4.2, exactly its fields: a stablecoin amount paid out to a bank account. */
export const ZShapeA = z.strictObject({
  source: z.strictObject({
    currency: ZCurrencyCode,
    rail: z.literal('stablecoin'),
    amount: z
      .string()
      .max(40)
      .regex(/^(0|[1-9]\d*)(\.\d+)?$/, 'a decimal string such as "100.50"'),
  }),
  destination: z.strictObject({
    currency: ZCurrencyCode,
    rail: z.literal('ach'),
    account: z.string().min(1).max(100),
  }),
});

/**
 * Shape B of SPEC 4.2, exactly its fields: integer minor units between two ledger accounts. The
 * amount's range is checked first and stops the checks: zod's `.int()` means a safe integer, so
 * after it a huge or hugely negative whole number would also be called "not an integer".
 */
export const ZShapeB = z.strictObject({
  amount: z
    .number({ error: 'amount is an integer number of minor units (e.g. 1050 for 10.50 USD)' })
    .positive({ error: 'amount must be positive', abort: true })
    .max(Number(AMOUNT_MAX_MINOR), { error: `amount may not exceed ${AMOUNT_MAX_MINOR} minor units`, abort: true })
    .int('amount is an integer number of minor units'),
  currency: ZCurrencyCode,
  source: ZAccountReference,
  destination: ZAccountReference,
});

/** A body is one shape or the other; a mix of both matches neither and is a 400 with field paths. */
export const ZCreateTransferRequest = z.union([ZShapeB, ZShapeA]);

export interface TransferRouteDeps {
  sql: Sql;
  /** Writes Shape B transfers: batched with those arriving meanwhile (db/ledger-batch.ts). */
  ledger: LedgerWrite;
  signer: TransferSigner;
  rails: Omit<RailTransferDeps, 'sql'>;
}

export function postTransfer(deps: TransferRouteDeps) {
  return defineRoute({
    method: 'POST',
    path: '/v1/transfers',
    operationId: 'createTransfer',
    summary:
      'Shape B moves money between two of your ledger accounts and settles before the response; Shape A pays a ' +
      'stablecoin amount out to a bank account through a settlement workflow. Requires Idempotency-Key.',
    tags: ['transfers'],
    auth: { kind: 'api_key' },
    // Shape B claims its Idempotency-Key in the transfer's own statement; Shape A the classic way.
    idempotent: 'deferred',
    body: ZCreateTransferRequest,
    example: { amount: 1050, currency: 'USD', source: 'wal_…', destination: 'acct_…' },
    responses: {
      201: 'The settled transfer, signed.',
      404: 'ACCOUNT_NOT_FOUND',
      422: 'INSUFFICIENT_FUNDS, CURRENCY_MISMATCH, SAME_ACCOUNT',
      429: 'LEDGER_BUSY: too many transfers waiting for the ledger; send the same request again after Retry-After',
    },
    async handler(ctx, { body }) {
      const { companyId, environment } = apiKeyPrincipalOf(ctx);
      const idempotency = ctx.state.deferredIdempotency;
      if (!idempotency) throw new Error('POST /v1/transfers runs only behind the idempotency layer');
      if (typeof body.source !== 'string') {
        const shapeA = body as z.infer<typeof ZShapeA>;
        // The key is claimed in the hold's transaction, and the response stored in the one that
        // marks the workflow started: two transactions fewer than the classic flow.
        await idempotency.claimInTransaction(async (claim) => {
          const claimed = ctx.state.idempotency;
          if (!claimed) throw new Error('claimInTransaction runs its handler with the key');
          await createPayoutTransfer(
            { sql: deps.sql, ...deps.rails },
            { companyId, environment },
            shapeA,
            idempotency.key,
            {
              claim,
              async record(tx, transfer) {
                const body = await signed(deps.signer, transferResource(transfer));
                await claimed.recordResponse(tx, { status: 201, body, location: `/v1/transfers/${transfer.id}` });
              },
            },
          );
        });
        return;
      }
      const shapeB = body as z.infer<typeof ZShapeB>;
      // The transfer's ID and creation time are chosen here, so the response is signed before the
      // one statement that claims the key, settles the transfer and stores this very response.
      await idempotency.inStatement(async () => {
        const { transfer, write } = prepareLedgerTransfer(
          deps.ledger,
          { companyId, environment },
          {
            amount: BigInt(shapeB.amount),
            currency: shapeB.currency,
            source: shapeB.source,
            destination: shapeB.destination,
          },
          idempotency.key,
        );
        const response = await signed(deps.signer, transferResource(transfer));
        return { response: { status: 201, body: response, location: `/v1/transfers/${transfer.id}` }, execute: write };
      });
    },
  });
}

/** An ISO 8601 instant PostgreSQL can hold: year 0000 parses in JavaScript but not in timestamptz. */
const ZCreatedBound = z.iso
  .datetime()
  .refine((value) => !value.startsWith('0000'), 'a date-time from year 0001 on, such as 2026-01-31T00:00:00Z');

const ZTransferStatus = z.enum(['pending', 'processing', 'settled', 'failed', 'canceled', 'returned']);

export const ZListTransfersQuery = ZPageQuery.extend({
  status: ZTransferStatus.optional(),
  rail: z.enum(['ledger', 'ach']).optional(),
  'created[gte]': ZCreatedBound.optional(),
  'created[lt]': ZCreatedBound.optional(),
});

export function getTransfers(deps: TransferRouteDeps) {
  return defineRoute({
    method: 'GET',
    path: '/v1/transfers',
    operationId: 'listTransfers',
    summary: 'Transfers in the key’s environment, newest first; filters: status, rail, created[gte], created[lt].',
    tags: ['transfers'],
    auth: { kind: 'api_key' },
    query: ZListTransfersQuery,
    responses: { 200: '{ data, has_more, next_cursor }' },
    async handler(ctx, { query }) {
      const { companyId, environment } = apiKeyPrincipalOf(ctx);
      const after = decodeCursor(query.cursor, ['tr']);
      const rows = await withTenant(deps.sql, companyId, (tx) =>
        listTransfers(
          tx,
          { companyId, environment },
          { limit: query.limit + 1, ...(after ? { after } : {}) },
          {
            ...(query.status ? { status: query.status } : {}),
            ...(query.rail ? { rail: query.rail } : {}),
            ...(query['created[gte]'] ? { createdGte: new Date(query['created[gte]']) } : {}),
            ...(query['created[lt]'] ? { createdLt: new Date(query['created[lt]']) } : {}),
          },
        ),
      );
      const page = toPage(rows, query.limit, (transfer) => transferResource(transfer));
      ctx.body = { ...page, data: await Promise.all(page.data.map((transfer) => signed(deps.signer, transfer))) };
    },
  });
}

export function getTransfer(deps: TransferRouteDeps) {
  return defineRoute({
    method: 'GET',
    path: '/v1/transfers/:id',
    operationId: 'getTransfer',
    summary: 'One transfer with its status history, signed.',
    tags: ['transfers'],
    auth: { kind: 'api_key' },
    resource: { param: 'id', type: 'transfer' },
    params: z.object({ id: z.string().max(100) }),
    responses: { 200: 'The transfer.', 404: 'No such transfer in this company and environment.' },
    async handler(ctx, { params }) {
      const { companyId, environment } = apiKeyPrincipalOf(ctx);
      const found = await withTenant(deps.sql, companyId, async (tx) => {
        const transfer = await findTransfer(tx, { companyId, environment }, params.id);
        return transfer ? { transfer, history: await transferHistory(tx, transfer.id) } : undefined;
      });
      if (!found) throw notFound('transfer');
      ctx.body = await signed(deps.signer, transferResource(found.transfer, found.history));
    },
  });
}
