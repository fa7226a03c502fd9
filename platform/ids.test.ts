import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isId, newId, uuidv7Hex } from './ids.ts';

const UUID_V7 = /^[0-9a-f]{12}7[0-9a-f]{3}[89ab][0-9a-f]{15}$/;

describe('newId (UUIDv7)', () => {
  it('is a prefixed RFC 9562 version 7 UUID carrying the creation millisecond', () => {
    const before = Date.now();
    const id = newId('tr');
    const after = Date.now();
    assert.ok(isId('tr', id), id);
    const hex = id.slice(3);
    assert.match(hex, UUID_V7);
    const ms = Number.parseInt(hex.slice(0, 12), 16);
    assert.ok(ms >= before && ms <= after, `${ms} within [${before}, ${after}]`);
  });

  it('is strictly increasing within a process, across and within milliseconds, and unique', () => {
    const ids = Array.from({ length: 20_000 }, () => uuidv7Hex());
    for (let i = 1; i < ids.length; i++) assert.ok(ids[i - 1]! < ids[i]!, `${ids[i - 1]} < ${ids[i]}`);
    assert.equal(new Set(ids).size, ids.length);
    for (const id of ids) assert.match(id, UUID_V7);
  });

  it('stays increasing when 4,096 IDs share a millisecond or the clock goes back', () => {
    const now = Date.now() + 60_000;
    const ids = Array.from({ length: 10_000 }, () => uuidv7Hex(now));
    ids.push(uuidv7Hex(now - 5_000)); // the clock stepped back
    for (let i = 1; i < ids.length; i++) assert.ok(ids[i - 1]! < ids[i]!, `${i}: ${ids[i - 1]} < ${ids[i]}`);
    const lastMs = Number.parseInt(ids.at(-1)!.slice(0, 12), 16);
    assert.ok(lastMs > now && lastMs <= now + 3, 'borrowed at most a few milliseconds');
  });

  it('spends its random bits: two processes in the same millisecond do not collide in practice', () => {
    const randB = new Set(Array.from({ length: 5_000 }, () => uuidv7Hex().slice(17)));
    assert.equal(randB.size, 5_000);
  });
});
