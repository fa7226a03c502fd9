// Money in the domain kernel: integer minor units as bigint, decimal strings at the edges. No JS
// number ever holds an amount. (Decimal arithmetic for FX and fees uses decimal.js in the activities
// and services, configured once with explicit rounding; parsing and formatting need none.)

export interface CurrencyInfo {
  code: string;
  scale: number;
  kind: 'fiat' | 'stablecoin';
}

/** Must equal the `currencies` table (a test checks it). */
export const CURRENCIES: Readonly<Record<string, CurrencyInfo>> = Object.freeze({
  USD: { code: 'USD', scale: 2, kind: 'fiat' },
  EUR: { code: 'EUR', scale: 2, kind: 'fiat' },
  GBP: { code: 'GBP', scale: 2, kind: 'fiat' },
  MXN: { code: 'MXN', scale: 2, kind: 'fiat' },
  BRL: { code: 'BRL', scale: 2, kind: 'fiat' },
  COP: { code: 'COP', scale: 2, kind: 'fiat' },
  JPY: { code: 'JPY', scale: 0, kind: 'fiat' },
  USDC: { code: 'USDC', scale: 6, kind: 'stablecoin' },
  USDT: { code: 'USDT', scale: 6, kind: 'stablecoin' },
  EURC: { code: 'EURC', scale: 6, kind: 'stablecoin' },
  PYUSD: { code: 'PYUSD', scale: 6, kind: 'stablecoin' },
});

/** Largest amount one transfer may move, in minor units (10^15: a billion USDC, 10 trillion USD). */
export const AMOUNT_MAX_MINOR = 10n ** 15n;

export function currencyInfo(code: string): CurrencyInfo | undefined {
  return Object.prototype.hasOwnProperty.call(CURRENCIES, code) ? CURRENCIES[code] : undefined;
}

export type AmountError = 'format' | 'scale' | 'zero' | 'too_large' | 'currency';

/**
 * "10.50" in USD → 1050n. Accepts plain non-negative decimals only: no sign, exponent, spaces,
 * leading zeros beyond one, or more fraction digits than the currency has.
 */
export function parseDecimalAmount(
  value: string,
  currency: string,
): { ok: true; minor: bigint } | { ok: false; error: AmountError } {
  const info = currencyInfo(currency);
  if (!info) return { ok: false, error: 'currency' };
  // The shape first, then each limit on its own: a long but well-formed amount is too large or too
  // precise, not malformed. The callers bound the string's length (the API: 40 characters).
  const match = /^(0|[1-9]\d*)(?:\.(\d+))?$/.exec(value);
  if (!match) return { ok: false, error: 'format' };
  const [, whole, fraction = ''] = match;
  if (fraction.length > info.scale) return { ok: false, error: 'scale' };
  if (whole!.length > 21) return { ok: false, error: 'too_large' };
  const minor = BigInt(whole!) * 10n ** BigInt(info.scale) + BigInt(fraction.padEnd(info.scale, '0') || '0');
  if (minor === 0n) return { ok: false, error: 'zero' };
  if (minor > AMOUNT_MAX_MINOR) return { ok: false, error: 'too_large' };
  return { ok: true, minor };
}

/** 1050n in USD → "10.50"; negative amounts keep their sign. Always exactly `scale` decimals. */
export function formatMinor(minor: bigint, currency: string): string {
  const info = currencyInfo(currency);
  if (!info) throw new Error(`unknown currency ${currency}`);
  const negative = minor < 0n;
  const digits = (negative ? -minor : minor).toString().padStart(info.scale + 1, '0');
  const whole = digits.slice(0, digits.length - info.scale);
  const fraction = digits.slice(digits.length - info.scale);
  return `${negative ? '-' : ''}${whole}${info.scale > 0 ? `.${fraction}` : ''}`;
}
