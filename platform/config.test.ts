import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ConfigError, IDEMPOTENCY_LEASE_MARGIN_MS, ledgerBatchInFlight, loadConfig } from './config.ts';

describe('configuration', () => {
  it('takes the defaults, whose idempotency lease outlasts the Shape A outcome wait', () => {
    const config = loadConfig({});
    assert.equal(config.IDEMPOTENCY_LEASE_MS, 60_000);
    assert.ok(config.IDEMPOTENCY_LEASE_MS >= config.TRANSFER_OUTCOME_WAIT_MS + IDEMPOTENCY_LEASE_MARGIN_MS);
  });

  it('refuses an idempotency lease shorter than the outcome wait plus its margin, at start', () => {
    const leaseMin = 10_000 + IDEMPOTENCY_LEASE_MARGIN_MS;
    assert.equal(
      loadConfig({ TRANSFER_OUTCOME_WAIT_MS: '10000', IDEMPOTENCY_LEASE_MS: String(leaseMin) }).IDEMPOTENCY_LEASE_MS,
      leaseMin,
    );
    assert.throws(
      () => loadConfig({ TRANSFER_OUTCOME_WAIT_MS: '10000', IDEMPOTENCY_LEASE_MS: String(leaseMin - 1) }),
      (error: unknown) =>
        error instanceof ConfigError &&
        error.message.includes('IDEMPOTENCY_LEASE_MS: must be at least TRANSFER_OUTCOME_WAIT_MS') &&
        error.message.includes(`(${leaseMin})`),
    );
    // The bank test's children run with a 10 s lease and the default 3 s wait.
    assert.equal(loadConfig({ IDEMPOTENCY_LEASE_MS: '10000' }).IDEMPOTENCY_LEASE_MS, 10_000);
  });

  it('leaves two of the pool connections to other work, refuses a ledger batch setting that would not, and a company queue above the whole', () => {
    assert.equal(ledgerBatchInFlight(loadConfig({})), 8);
    assert.equal(ledgerBatchInFlight(loadConfig({ DATABASE_POOL_MAX: '5' })), 3);
    assert.equal(ledgerBatchInFlight(loadConfig({ DATABASE_POOL_MAX: '1' })), 1);
    assert.equal(ledgerBatchInFlight(loadConfig({ DATABASE_POOL_MAX: '40' })), 8);
    assert.equal(ledgerBatchInFlight(loadConfig({ DATABASE_POOL_MAX: '40', LEDGER_BATCH_IN_FLIGHT_MAX: '16' })), 16);
    assert.throws(
      () => loadConfig({ DATABASE_POOL_MAX: '10', LEDGER_BATCH_IN_FLIGHT_MAX: '10' }),
      (error: unknown) =>
        error instanceof ConfigError &&
        error.message.includes('LEDGER_BATCH_IN_FLIGHT_MAX: must be less than DATABASE_POOL_MAX (10)'),
    );
    const queue = loadConfig({});
    assert.deepEqual([queue.LEDGER_QUEUE_MAX, queue.LEDGER_QUEUE_MAX_PER_COMPANY], [4096, 1024]);
    assert.throws(
      () => loadConfig({ LEDGER_QUEUE_MAX: '100', LEDGER_QUEUE_MAX_PER_COMPANY: '101' }),
      (error: unknown) =>
        error instanceof ConfigError &&
        error.message.includes('LEDGER_QUEUE_MAX_PER_COMPANY: may not exceed LEDGER_QUEUE_MAX (100)'),
    );
  });
});
