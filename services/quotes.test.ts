import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { DomainError } from '../workflows/shared/errors.ts';
import { AMOUNT_MAX_MINOR } from '../workflows/shared/money.ts';
import { PEGGED_RATES, quotePayout, type FxRateSource } from './quotes.ts';

describe('payout quotes', () => {
  it('takes a 0.5 % fee in the source currency, rounded up, and pays the rest out rounded down', async () => {
    // 100.000000 USDC: fee 0.500000, out 99.50 USD
    assert.deepEqual(await quotePayout(PEGGED_RATES, 'USDC', 100_000_000n, 'USD'), { feeMinor: 500_000n, outMinor: 9950n, rate: '1' });
    // 1.000001 USDC: fee 0.005000005 → 0.005001 (up); net 0.995 → 0.99 USD (down)
    assert.deepEqual(await quotePayout(PEGGED_RATES, 'USDC', 1_000_001n, 'USD'), { feeMinor: 5001n, outMinor: 99n, rate: '1' });
  });

  it('applies non-par rates exactly and refuses what it cannot price', async () => {
    const rates: FxRateSource = { rate: async () => '0.9987' };
    assert.deepEqual(await quotePayout(rates, 'USDC', 10_000_000n, 'USD'), { feeMinor: 50_000n, outMinor: 993n, rate: '0.9987' });
    await assert.rejects(quotePayout(PEGGED_RATES, 'USDC', 1_000_000n, 'EUR'), (error) => error instanceof DomainError && error.code === 'UNSUPPORTED_CONVERSION');
    await assert.rejects(quotePayout(PEGGED_RATES, 'USDC', 1n, 'USD'), (error) => error instanceof DomainError && error.code === 'AMOUNT_TOO_SMALL');
  });

  it('never pays out more than the amount net of the fee, and never loses a minor unit to the customer beyond one (property)', async () => {
    await fc.assert(
      fc.asyncProperty(fc.bigInt({ min: 20_000n, max: AMOUNT_MAX_MINOR }), async (sourceMinor) => {
        const { feeMinor, outMinor } = await quotePayout(PEGGED_RATES, 'USDC', sourceMinor, 'USD');
        assert.ok(feeMinor >= 0n && feeMinor < sourceMinor);
        // At par, 1 USD cent = 10^4 USDC minor units.
        const netInCents = (sourceMinor - feeMinor) / 10_000n;
        assert.equal(outMinor, netInCents);
        assert.ok(feeMinor * 10_000n >= sourceMinor * 50n, 'fee at least 0.5 %');
        assert.ok((feeMinor - 1n) * 10_000n < sourceMinor * 50n, 'fee rounded up by less than one unit');
      }),
      { numRuns: 1000, seed: 42 },
    );
  });
});
