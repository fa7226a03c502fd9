// The settlement workflow ID of a payout, from its Idempotency-Key: one ID per key, never one for two.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, it } from 'node:test';
import { settlementWorkflowId } from './rail-transfers.ts';

const COMPANY = 'co_00000000000000000000000000000000';
const idOf = (key: string) => settlementWorkflowId(COMPANY, 'sandbox', key);
const sha256 = (text: string) => createHash('sha256').update(text).digest('hex');
const keyPart = (key: string) => idOf(key).slice(`transfer:${COMPANY}:sandbox:`.length);

describe('settlementWorkflowId', () => {
  it('uses a short printable key as it is', () => {
    assert.equal(idOf('order-42.a:b_C'), `transfer:${COMPANY}:sandbox:order-42.a:b_C`);
    assert.equal(keyPart('x'.repeat(100)), 'x'.repeat(100));
  });

  it('hashes a key with other characters, or a long one', () => {
    assert.equal(keyPart('order 42/a'), `sha256-${sha256('order 42/a')}`);
    assert.equal(keyPart('x'.repeat(101)), `sha256-${sha256('x'.repeat(101))}`);
  });

  it('hashes a key spelled like the hash of another: the two keys get two IDs', () => {
    const hashed = 'order 42/a';
    const literal = `sha256-${sha256(hashed)}`;
    assert.equal(keyPart(literal), `sha256-${sha256(literal)}`);
    assert.notEqual(idOf(literal), idOf(hashed));
    // Any key starting with the prefix, even one that is not a digest.
    assert.equal(keyPart('sha256-'), `sha256-${sha256('sha256-')}`);
    assert.equal(keyPart('sha256-abc'), `sha256-${sha256('sha256-abc')}`);
  });

  it('is one-to-one over keys (raw keys never carry the prefix, hashed ones always do)', () => {
    const keys = [
      'a',
      'sha256-a',
      'order 42/a',
      `sha256-${sha256('order 42/a')}`,
      `sha256-${sha256('a')}`,
      'SHA256-a',
      'sha256a',
    ];
    const ids = keys.map(idOf);
    assert.equal(new Set(ids).size, keys.length);
    for (const key of keys) {
      const part = keyPart(key);
      if (part === key) assert.ok(!key.startsWith('sha256-'), key);
      else assert.match(part, /^sha256-[0-9a-f]{64}$/, key);
    }
  });
});
