import { Decimal } from 'decimal.js';
import { DomainError } from '../workflows/shared/errors.ts';
import { currencyInfo } from '../workflows/shared/money.ts';

// One Decimal configuration for every money calculation: 40 significant digits, and each rounding
// below names its own direction (fees up, payouts down: never in the customer's disfavour by more
// than one minor unit, never in the platform's by any).
const D = Decimal.clone({ precision: 40, rounding: Decimal.ROUND_HALF_EVEN, toExpNeg: -40, toExpPos: 40 });

/** FX rates come from outside the machine; this interface is what a real provider fills. */
export interface FxRateSource {
  /** How many units of `to` one unit of `from` buys, as a decimal string. */
  rate(from: string, to: string): Promise<string>;
}

/** Stablecoins pegged to the dollar at par: the sandbox's rates, and a stand-in until a provider is wired. */
export const PEGGED_RATES: FxRateSource = {
  async rate(from, to) {
    const pegged: Record<string, string> = { USDC: 'USD', USDT: 'USD', PYUSD: 'USD', EURC: 'EUR' };
    if (pegged[from] === to) return '1';
    throw new DomainError('unprocessable', 'UNSUPPORTED_CONVERSION', `No rate from ${from} to ${to}.`);
  },
};

export const PAYOUT_FEE_BPS = 50n; // 0.50 %

export interface Quote {
  feeMinor: bigint;
  outMinor: bigint;
  rate: string;
}

/**
 * Fee and payout for converting `sourceMinor` of `from` into `to`: the fee is taken in the source
 * currency (rounded up to a minor unit), the rest converted at `rate` and rounded down.
 */
export async function quotePayout(rates: FxRateSource, from: string, sourceMinor: bigint, to: string): Promise<Quote> {
  const source = currencyInfo(from);
  const target = currencyInfo(to);
  if (!source || !target) throw new DomainError('invalid', 'UNSUPPORTED_CURRENCY', `Unsupported currency ${!source ? from : to}.`);
  const rate = new D(await rates.rate(from, to));
  const feeMinor = BigInt(new D(sourceMinor.toString()).mul(PAYOUT_FEE_BPS.toString()).div(10_000).toDecimalPlaces(0, Decimal.ROUND_UP).toFixed(0));
  const netMajor = new D((sourceMinor - feeMinor).toString()).div(new D(10).pow(source.scale));
  const outMinor = BigInt(netMajor.mul(rate).mul(new D(10).pow(target.scale)).toDecimalPlaces(0, Decimal.ROUND_DOWN).toFixed(0));
  if (outMinor <= 0n) throw new DomainError('unprocessable', 'AMOUNT_TOO_SMALL', 'The amount does not cover the fee.');
  return { feeMinor, outMinor, rate: rate.toFixed() };
}
