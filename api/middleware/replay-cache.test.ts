import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { IdempotencyKeyId, StoredResponse } from '../../db/idempotency.ts';
import { ReplayCache } from './replay-cache.ts';

const id = (key: string, companyId = 'co_a', environment: IdempotencyKeyId['environment'] = 'sandbox') => ({
  companyId,
  environment,
  key,
});
const hash = (label: string) => Buffer.alloc(32, label);
const response = (bodyBytes: number): StoredResponse => ({
  status: 201,
  headers: { 'content-type': 'application/json; charset=utf-8' },
  body: Buffer.alloc(bodyBytes, 'x'),
});
const DAY_MS = 86_400_000;

describe('ReplayCache', () => {
  it('answers per company, environment and key until the entry expires', () => {
    let now = 1_000;
    const cache = new ReplayCache({ ttlMs: 60_000, maxBytes: 1024 * 1024 }, () => now);
    const stored = response(100);
    cache.set(id('k'), hash('a'), stored, DAY_MS);
    assert.equal(cache.get(id('k'))?.response, stored);
    assert.ok(cache.get(id('k'))?.requestHash.equals(hash('a')));
    assert.equal(cache.get(id('k', 'co_b')), undefined);
    assert.equal(cache.get(id('k', 'co_a', 'live')), undefined);
    now += 59_999;
    assert.ok(cache.get(id('k')));
    now += 1;
    assert.equal(cache.get(id('k')), undefined);
    assert.equal(cache.size, 0);
    assert.equal(cache.bytes, 0);
  });

  it("never outlives the key's own retention", () => {
    let now = 0;
    const cache = new ReplayCache({ ttlMs: 60_000, maxBytes: 1024 * 1024 }, () => now);
    cache.set(id('short'), hash('a'), response(10), 5_000);
    now = 5_000;
    assert.equal(cache.get(id('short')), undefined);
    cache.set(id('gone'), hash('a'), response(10), 0);
    assert.equal(cache.size, 0);
  });

  it('evicts the least recently used entries to stay within its bytes, and skips an entry too big for it', () => {
    const cache = new ReplayCache({ ttlMs: 60_000, maxBytes: 3 * 1_000 });
    for (const key of ['a', 'b', 'c', 'd']) cache.set(id(key), hash(key), response(400), DAY_MS);
    assert.ok(cache.bytes <= 3_000);
    assert.equal(cache.size, 3);
    assert.equal(cache.get(id('a')), undefined, 'the oldest went first');
    assert.ok(cache.get(id('b')), 'read now, so no longer the least recently used');
    cache.set(id('e'), hash('e'), response(400), DAY_MS);
    assert.ok(cache.get(id('b')));
    assert.equal(cache.get(id('c')), undefined);

    cache.set(id('huge'), hash('h'), response(5_000), DAY_MS);
    assert.equal(cache.get(id('huge')), undefined);
    assert.equal(cache.size, 3);

    // The same key again replaces its entry and its bytes.
    const before = cache.bytes;
    cache.set(id('e'), hash('e'), response(400), DAY_MS);
    assert.equal(cache.bytes, before);
    cache.clear();
    assert.equal(cache.size, 0);
    assert.equal(cache.bytes, 0);
  });

  it('keeps nothing when turned off', () => {
    const cache = new ReplayCache({ ttlMs: 0, maxBytes: 0 });
    cache.set(id('k'), hash('a'), response(10), DAY_MS);
    assert.equal(cache.get(id('k')), undefined);
    assert.throws(() => new ReplayCache({ ttlMs: -1, maxBytes: 0 }), /ttlMs/);
  });
});
