import { balancesOf, type LedgerAccount, type LedgerTransfer, type StatusChange } from '../../db/ledger.ts';
import { formatMinor } from '../../workflows/shared/money.ts';

/** DESIGN 14: `{ id, type, currency, balances: { available, pending, posted } }`, decimal strings. */
export function accountResource(account: LedgerAccount) {
  const balances = balancesOf(account);
  return {
    id: account.id,
    type: account.type,
    currency: account.currency,
    name: account.name,
    balances: {
      available: formatMinor(balances.available, account.currency),
      pending: formatMinor(balances.pending, account.currency),
      posted: formatMinor(balances.posted, account.currency),
    },
    created_at: account.createdAt.toISOString(),
  };
}

function historyResource(history: StatusChange[] | undefined) {
  return history
    ? { status_history: history.map((change) => ({ status: change.status, at: change.occurredAt.toISOString(), reason: change.reason })) }
    : {};
}

/**
 * A transfer as the API shows it. Ledger rail: Response B of SPEC 4.2 (integer minor units) plus the
 * two accounts. External rails: Response A (`out` in decimal strings) plus what was sent and the fee.
 * Neither shows `version` or `updatedAt` (a new payout is answered without them: services/rail-transfers.ts).
 */
/** `1.000000000000000000` (numeric(38, 18) as text) → `1`; `0.920000` → `0.92`: the rate the quote gave. */
function withoutTrailingZeros(decimal: string): string {
  return decimal.includes('.') ? decimal.replace(/\.?0+$/, '') : decimal;
}

export function transferResource(transfer: Omit<LedgerTransfer, 'version' | 'updatedAt'>, history?: StatusChange[]) {
  if (transfer.rail === 'ach' && transfer.payout) {
    const { payout } = transfer;
    return {
      id: transfer.id,
      status: transfer.status,
      out: { amount: formatMinor(payout.outAmount, payout.outCurrency), currency: payout.outCurrency },
      source: { currency: transfer.currency, rail: 'stablecoin', amount: formatMinor(transfer.amount, transfer.currency) },
      destination: { currency: payout.outCurrency, rail: 'ach', account: payout.externalAccountId },
      fee: { amount: formatMinor(payout.feeAmount, transfer.currency), currency: transfer.currency },
      rate: withoutTrailingZeros(payout.fxRate),
      rail: transfer.rail,
      failure_reason: transfer.failureReason,
      created_at: transfer.createdAt.toISOString(),
      ...historyResource(history),
    };
  }
  return {
    id: transfer.id,
    status: transfer.status,
    amount: Number(transfer.amount), // ≤ 10^15 minor units: exact as a JSON number
    currency: transfer.currency,
    rail: transfer.rail,
    source: transfer.sourceAccountId,
    destination: transfer.destinationAccountId,
    created_at: transfer.createdAt.toISOString(),
    ...historyResource(history),
  };
}

export interface TransferSigner {
  sign(object: Record<string, unknown>): Promise<string>;
  /** Loads the signing key, so that sign() does not wait for the database. */
  warm(): Promise<void>;
}

/** Every transfer object leaves signed (DESIGN 7): a detached JWS over the object without `signature`. */
export async function signed<T extends Record<string, unknown>>(signer: TransferSigner, object: T): Promise<T & { signature: string }> {
  return { ...object, signature: await signer.sign(object) };
}
