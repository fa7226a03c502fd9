import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { AMOUNT_MAX_MINOR, CURRENCIES, formatMinor, parseDecimalAmount } from './money.ts';

describe('money', () => {
  it('parses decimal strings to minor units exactly, per currency scale', () => {
    assert.deepEqual(parseDecimalAmount('10.50', 'USD'), { ok: true, minor: 1050n });
    assert.deepEqual(parseDecimalAmount('10.5', 'USD'), { ok: true, minor: 1050n });
    assert.deepEqual(parseDecimalAmount('0.000001', 'USDC'), { ok: true, minor: 1n });
    assert.deepEqual(parseDecimalAmount('1000', 'JPY'), { ok: true, minor: 1000n });
    assert.deepEqual(parseDecimalAmount('0.1', 'JPY'), { ok: false, error: 'scale' });
    assert.deepEqual(parseDecimalAmount('1.001', 'USD'), { ok: false, error: 'scale' });
    for (const bad of ['', '-1', '+1', '1e3', ' 1', '01', '1.', '.5', '1,00', 'NaN', '0x10', '1.0.0']) {
      assert.deepEqual(parseDecimalAmount(bad, 'USD'), { ok: false, error: 'format' }, bad);
    }
    assert.deepEqual(parseDecimalAmount('0.00', 'USD'), { ok: false, error: 'zero' });
    assert.deepEqual(parseDecimalAmount('10000000000000.01', 'USD'), { ok: false, error: 'too_large' });
    // Long but well formed: too large or too precise, not malformed.
    assert.deepEqual(parseDecimalAmount('1'.repeat(40), 'USDC'), { ok: false, error: 'too_large' });
    assert.deepEqual(parseDecimalAmount('1'.repeat(22), 'USD'), { ok: false, error: 'too_large' });
    assert.deepEqual(parseDecimalAmount(`1.${'0'.repeat(19)}`, 'USDC'), { ok: false, error: 'scale' });
    assert.deepEqual(parseDecimalAmount('1', 'XYZ'), { ok: false, error: 'currency' });
    assert.deepEqual(parseDecimalAmount('1', 'constructor'), { ok: false, error: 'currency' });
  });

  it('formats with exactly the currency scale', () => {
    assert.equal(formatMinor(1050n, 'USD'), '10.50');
    assert.equal(formatMinor(5n, 'USD'), '0.05');
    assert.equal(formatMinor(-5n, 'USD'), '-0.05');
    assert.equal(formatMinor(1n, 'USDC'), '0.000001');
    assert.equal(formatMinor(1000n, 'JPY'), '1000');
    assert.equal(formatMinor(0n, 'EUR'), '0.00');
  });

  it('round-trips every amount in every currency (property)', () => {
    fc.assert(
      fc.property(
        fc.constantFrom(...Object.keys(CURRENCIES)),
        fc.bigInt({ min: 1n, max: AMOUNT_MAX_MINOR }),
        (currency, minor) => {
          const text = formatMinor(minor, currency);
          assert.deepEqual(parseDecimalAmount(text, currency), { ok: true, minor });
        },
      ),
      { numRuns: 2000 },
    );
  });
});
