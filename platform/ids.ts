import { randomFillSync } from 'node:crypto';

// Events (evt_), webhook deliveries (whd_) and attempts (wha_) get their IDs in SQL (migration 00005).
export type IdPrefix = 'co' | 'op' | 'ses' | 'key' | 'wal' | 'acct' | 'sys' | 'tr' | 'hold' | 'ba' | 'we';

// UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, version 7, a 12-bit counter (rand_a, method 1:
// started at a random value below 2048 each millisecond and incremented within it, so IDs made by
// one process are strictly increasing), the variant, and 62 random bits. Randomness comes from a
// pooled buffer refilled 512 IDs at a time: the `uuid` package asks WebCrypto for 16 bytes on every
// call, which cost about 35 µs per transfer on the hot path.
const RANDOM_BYTES_PER_ID = 10; // 2 for the counter's start, 8 for rand_b
const pool = Buffer.alloc(RANDOM_BYTES_PER_ID * 512);
let poolOffset = pool.length;
let lastMs = -1;
let counter = 0;
const bytes = Buffer.alloc(16);

function randomSlice(): number {
  if (poolOffset + RANDOM_BYTES_PER_ID > pool.length) {
    randomFillSync(pool);
    poolOffset = 0;
  }
  const offset = poolOffset;
  poolOffset += RANDOM_BYTES_PER_ID;
  return offset;
}

/** A UUIDv7 as 32 lowercase hex digits, strictly increasing within this process. */
export function uuidv7Hex(now: number = Date.now()): string {
  const offset = randomSlice();
  if (now > lastMs) {
    lastMs = now;
    counter = pool.readUInt16BE(offset) & 0x7ff;
  } else if (++counter > 0xfff) {
    // 4,096 IDs in one millisecond (or a clock that went back): borrow the next millisecond.
    lastMs += 1;
    counter = 0;
  }
  bytes.writeUIntBE(lastMs, 0, 6);
  bytes[6] = 0x70 | (counter >> 8);
  bytes[7] = counter & 0xff;
  pool.copy(bytes, 8, offset + 2, offset + RANDOM_BYTES_PER_ID);
  bytes[8] = 0x80 | (bytes[8]! & 0x3f);
  return bytes.toString('hex');
}

/** A prefixed, time-ordered identifier (`co_0190f3…`): UUIDv7 without dashes. */
export function newId(prefix: IdPrefix): string {
  return `${prefix}_${uuidv7Hex()}`;
}

export function isId(prefix: IdPrefix, value: string): boolean {
  return new RegExp(`^${prefix}_[0-9a-f]{32}$`).test(value);
}
