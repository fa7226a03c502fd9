import type { Sql, TransactionSql } from '../db/client.ts';
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

function accountNotFound(field: 'source' | 'destination', id: string) {
  return new DomainError('not_found', 'ACCOUNT_NOT_FOUND', `No ${field} account ${id} in this environment.`, { field });
}

/**
 * Shape B: moves money between two of the caller's ledger accounts and settles it in the same
 * transaction. The database refuses an overdraft or an unbalanced entry whatever this code does;
 * this code turns those refusals (and bad references) into clear, stable errors. `inTransaction`
 * runs in the same transaction after the transfer is written (the idempotency record goes there).
 */
export async function createLedgerTransfer(
  sql: Sql,
  scope: { companyId: string; environment: Environment },
  request: LedgerTransferRequest,
  idempotencyKey: string,
  inTransaction: (tx: TransactionSql, transfer: LedgerTransfer) => Promise<void> = async () => undefined,
): Promise<LedgerTransfer> {
  const info = currencyInfo(request.currency);
  if (!info) throw new DomainError('invalid', 'UNSUPPORTED_CURRENCY', `Currency ${request.currency} is not supported.`);
  if (request.amount <= 0n || request.amount > AMOUNT_MAX_MINOR) {
    throw new DomainError('invalid', 'AMOUNT_OUT_OF_RANGE', `amount must be between 1 and ${AMOUNT_MAX_MINOR} minor units.`);
  }
  if (request.source === request.destination) {
    throw new DomainError('unprocessable', 'SAME_ACCOUNT', 'source and destination must be different accounts.');
  }
  for (let attempt = 1; ; attempt++) {
    try {
      return await withTenant(sql, scope.companyId, async (tx) => {
        const [source, destination] = await Promise.all([
          findLedgerAccount(tx, scope, request.source),
          findLedgerAccount(tx, scope, request.destination),
        ]);
        if (!source || source.type === 'system') throw accountNotFound('source', request.source);
        if (!destination || destination.type === 'system') throw accountNotFound('destination', request.destination);
        if (source.currency !== request.currency || destination.currency !== request.currency) {
          throw new DomainError(
            'unprocessable',
            'CURRENCY_MISMATCH',
            `The transfer is in ${request.currency}; the source holds ${source.currency} and the destination ${destination.currency}.`,
          );
        }
        const transfer = await postLedgerTransfer(tx, {
          id: newId('tr'),
          ...scope,
          idempotencyKey,
          amount: request.amount,
          currency: request.currency,
          sourceAccountId: source.id,
          destinationAccountId: destination.id,
        });
        await inTransaction(tx, transfer);
        return transfer;
      });
    } catch (error) {
      const pg = error as { code?: string; constraint_name?: string };
      if (pg.code === POSTGRES_CHECK_VIOLATION && pg.constraint_name === 'ledger_accounts_no_overdraft') {
        throw new DomainError('unprocessable', 'INSUFFICIENT_FUNDS', 'The source account does not have enough available balance.');
      }
      if (pg.constraint_name === 'transfers_idempotency_unique') {
        throw new DomainError('conflict', 'IDEMPOTENCY_KEY_USED', 'A transfer with this Idempotency-Key already exists.');
      }
      if (pg.code && RETRYABLE.has(pg.code) && attempt < ATTEMPTS_MAX) continue;
      throw error;
    }
  }
}
