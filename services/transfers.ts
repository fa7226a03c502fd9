import type { Sql } from '../db/client.ts';
import type { ClaimOutcome, IdempotencyClaim } from '../db/idempotency.ts';
import { LedgerQueueFullError, type LedgerWrite } from '../db/ledger-batch.ts';
import { findLedgerAccount, postLedgerTransfer, type Environment, type LedgerTransfer } from '../db/ledger.ts';
import { withTenant } from '../db/tenant.ts';
import { newId } from '../platform/ids.ts';
import { DomainError } from '../workflows/shared/errors.ts';
import { AMOUNT_MAX_MINOR, currencyInfo } from '../workflows/shared/money.ts';

export interface LedgerTransferRequest {
  amount: bigint;
  currency: string;
  source: string;
  destination: string;
}

const POSTGRES_CHECK_VIOLATION = '23514';
const RETRYABLE = new Set(['40001', '40P01']); // serialization failure, deadlock
const ATTEMPTS_MAX = 3;
/** SQLSTATEs raised by post_ledger_transfer_idempotent (migration 00006). */
const HOT_PATH_ACCOUNT_NOT_FOUND = 'PT404';
const HOT_PATH_CURRENCY_MISMATCH = 'PT422';

function accountNotFound(field: 'source' | 'destination', id: string) {
  return new DomainError('not_found', 'ACCOUNT_NOT_FOUND', `No ${field} account ${id} in this environment.`, { field });
}

function currencyMismatch(currency: string, source: string, destination: string) {
  return new DomainError(
    'unprocessable',
    'CURRENCY_MISMATCH',
    `The transfer is in ${currency}; the source holds ${source} and the destination ${destination}.`,
  );
}

/** The checks that need no database: currency known, amount in range, two different accounts. */
function checkRequest(request: LedgerTransferRequest): void {
  const info = currencyInfo(request.currency);
  if (!info) throw new DomainError('invalid', 'UNSUPPORTED_CURRENCY', `Currency ${request.currency} is not supported.`);
  if (request.amount <= 0n || request.amount > AMOUNT_MAX_MINOR) {
    throw new DomainError(
      'invalid',
      'AMOUNT_OUT_OF_RANGE',
      `amount must be between 1 and ${AMOUNT_MAX_MINOR} minor units.`,
    );
  }
  if (request.source === request.destination) {
    throw new DomainError('unprocessable', 'SAME_ACCOUNT', 'source and destination must be different accounts.');
  }
}

/** The database's refusals of a transfer, as stable errors; undefined for anything else. */
function refusalOf(error: unknown, request: LedgerTransferRequest): DomainError | undefined {
  if (error instanceof LedgerQueueFullError) {
    // 429 says "later", not "no": the key is not stored, and the same request may be sent again.
    return new DomainError(
      'throttled',
      'LEDGER_BUSY',
      error.full === 'company'
        ? 'Too many of your transfers are waiting to be written. Send this one again in a second.'
        : 'Too many transfers are waiting to be written. Send this one again in a second.',
      { retryAfterSeconds: 1 },
    );
  }
  const pg = error as { code?: string; constraint_name?: string; detail?: string };
  if (pg.code === POSTGRES_CHECK_VIOLATION && pg.constraint_name === 'ledger_accounts_no_overdraft') {
    return new DomainError(
      'unprocessable',
      'INSUFFICIENT_FUNDS',
      'The source account does not have enough available balance.',
    );
  }
  if (pg.constraint_name === 'transfers_idempotency_unique') {
    return new DomainError('conflict', 'IDEMPOTENCY_KEY_USED', 'A transfer with this Idempotency-Key already exists.');
  }
  if (pg.code === HOT_PATH_ACCOUNT_NOT_FOUND) {
    return pg.detail === 'destination'
      ? accountNotFound('destination', request.destination)
      : accountNotFound('source', request.source);
  }
  if (pg.code === HOT_PATH_CURRENCY_MISMATCH) {
    const held = JSON.parse(pg.detail ?? '{}') as { source?: string; destination?: string };
    return currencyMismatch(request.currency, held.source ?? '?', held.destination ?? '?');
  }
  return undefined;
}

/**
 * Runs one write of a transfer, again (up to ATTEMPTS_MAX in all) after a serialization failure or
 * a deadlock; the database's refusals come out as stable errors.
 */
async function withRetries<T>(request: LedgerTransferRequest, write: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await write();
    } catch (error) {
      const refusal = refusalOf(error, request);
      if (refusal) throw refusal;
      const code = (error as { code?: string }).code;
      if (code && RETRYABLE.has(code) && attempt < ATTEMPTS_MAX) continue;
      throw error;
    }
  }
}

/**
 * Shape B in a tenant transaction of its own: moves money between two of the caller's ledger
 * accounts and settles it in that transaction. The database refuses an overdraft or an unbalanced
 * entry whatever this code does; this code turns those refusals (and bad references) into clear,
 * stable errors. The API uses `prepareLedgerTransfer`; tests and benchmarks use this to make transfers.
 */
export async function createLedgerTransfer(
  sql: Sql,
  scope: { companyId: string; environment: Environment },
  request: LedgerTransferRequest,
  idempotencyKey: string,
): Promise<LedgerTransfer> {
  checkRequest(request);
  return withRetries(request, () =>
    withTenant(sql, scope.companyId, async (tx) => {
      const [source, destination] = await Promise.all([
        findLedgerAccount(tx, scope, request.source),
        findLedgerAccount(tx, scope, request.destination),
      ]);
      if (!source || source.type === 'system') throw accountNotFound('source', request.source);
      if (!destination || destination.type === 'system') throw accountNotFound('destination', request.destination);
      if (source.currency !== request.currency || destination.currency !== request.currency) {
        throw currencyMismatch(request.currency, source.currency, destination.currency);
      }
      return postLedgerTransfer(tx, {
        id: newId('tr'),
        ...scope,
        idempotencyKey,
        amount: request.amount,
        currency: request.currency,
        sourceAccountId: source.id,
        destinationAccountId: destination.id,
      });
    }),
  );
}

/**
 * The hot path of Shape B, in two halves around the caller's signing: `prepareLedgerTransfer`
 * checks the request and fixes the transfer (a new ID, created now on this process's clock, settled),
 * so that its response can be built and signed BEFORE anything is written; `write(claim)` then
 * claims the Idempotency-Key, checks both accounts and settles the transfer in ONE statement and one
 * commit (db/ledger.ts `postLedgerTransferClaimingKey`, or batched with others by db/ledger-batch.ts),
 * storing the claim's response with the key.
 * The same refusals as `createLedgerTransfer`, with the same codes.
 */
export function prepareLedgerTransfer(
  writeLedger: LedgerWrite,
  scope: { companyId: string; environment: Environment },
  request: LedgerTransferRequest,
  idempotencyKey: string,
): { transfer: LedgerTransfer; write: (claim: IdempotencyClaim) => Promise<ClaimOutcome> } {
  checkRequest(request);
  const createdAt = new Date();
  const transfer: LedgerTransfer = {
    id: newId('tr'),
    ...scope,
    idempotencyKey,
    rail: 'ledger',
    status: 'settled',
    amount: request.amount,
    currency: request.currency,
    sourceAccountId: request.source,
    destinationAccountId: request.destination,
    payout: null,
    failureReason: null,
    workflowId: null,
    version: 1,
    createdAt,
    updatedAt: createdAt,
  };
  return {
    transfer,
    write: (claim) =>
      withRetries(request, () =>
        writeLedger(claim, {
          id: transfer.id,
          amount: transfer.amount,
          currency: transfer.currency,
          sourceAccountId: request.source,
          destinationAccountId: request.destination,
          createdAt,
        }),
      ),
  };
}
