import assert from 'node:assert/strict';
import type { IdempotencyKeyId, StoredResponse } from '../../db/idempotency.ts';

// The responses this process stored under a completed Idempotency-Key, kept in memory for a few
// minutes so that a client's retry is answered without signing a new object or reading the key's row.
//
// Exact, not approximate: a completed key is never changed (only a running row is completed, taken
// over or released), and its row stays until its retention (24 h at least) ends and the purge
// deletes it. An entry lives `ttlMs` from when its response was stored (minutes) and never past the
// key's own retention, so it answers exactly what the row would. Only responses whose row is known to
// be committed are put here (by the idempotency middleware), and nothing read back from another
// process's row, whose retention this process does not know.
//
// Bounded by bytes (bodies, headers, keys and a fixed overhead per entry): the least recently used
// entries go first. Entries are per company, environment and key, looked up only after the request
// was authenticated for that company and environment.

export interface ReplayCacheOptions {
  /** How long an entry is kept after its response was stored; 0 turns the cache off. */
  ttlMs: number;
  /** The most the entries may take, counted as their bytes plus ENTRY_OVERHEAD_BYTES each. */
  maxBytes: number;
}

export interface CachedAnswer {
  /** The request fingerprint the key was completed for (method, URL and canonical body). */
  requestHash: Buffer;
  response: StoredResponse;
}

interface Entry extends CachedAnswer {
  expiresAt: number;
  bytes: number;
}

/** Map slot, object headers, the fingerprint and header objects: a conservative estimate. */
const ENTRY_OVERHEAD_BYTES = 400;

export class ReplayCache {
  readonly #options: ReplayCacheOptions;
  readonly #now: () => number;
  /** Insertion order is recency order: the first entry is the least recently used. */
  readonly #entries = new Map<string, Entry>();
  #bytes = 0;

  constructor(options: ReplayCacheOptions, now: () => number = Date.now) {
    assert(Number.isInteger(options.ttlMs) && options.ttlMs >= 0, 'replay cache ttlMs must be an integer ≥ 0');
    assert(Number.isInteger(options.maxBytes) && options.maxBytes >= 0, 'replay cache maxBytes must be an integer ≥ 0');
    this.#options = options;
    this.#now = now;
  }

  get size(): number {
    return this.#entries.size;
  }

  get bytes(): number {
    return this.#bytes;
  }

  /** The stored answer for the key, or undefined (never stored here, evicted or expired). */
  get(id: IdempotencyKeyId): CachedAnswer | undefined {
    const name = entryName(id);
    const entry = this.#entries.get(name);
    if (entry === undefined) return undefined;
    this.#entries.delete(name);
    if (entry.expiresAt <= this.#now()) {
      this.#bytes -= entry.bytes;
      return undefined;
    }
    this.#entries.set(name, entry);
    return entry;
  }

  /**
   * Keeps the response a committed, completed key holds. `retentionMs`: how long the key's row is
   * kept from now (its expiry); the entry never outlives it.
   */
  set(id: IdempotencyKeyId, requestHash: Buffer, response: StoredResponse, retentionMs: number): void {
    const lifetimeMs = Math.min(this.#options.ttlMs, retentionMs);
    if (lifetimeMs <= 0) return;
    const name = entryName(id);
    let bytes = name.length * 2 + requestHash.length + response.body.length + ENTRY_OVERHEAD_BYTES;
    for (const [header, value] of Object.entries(response.headers)) bytes += (header.length + value.length) * 2;
    if (bytes > this.#options.maxBytes) return;
    this.#remove(name);
    this.#entries.set(name, { requestHash, response, expiresAt: this.#now() + lifetimeMs, bytes });
    this.#bytes += bytes;
    for (const [oldest, entry] of this.#entries) {
      if (this.#bytes <= this.#options.maxBytes) break;
      this.#entries.delete(oldest);
      this.#bytes -= entry.bytes;
    }
  }

  /** Forgets every entry (a key's row deleted by hand, before its retention ended). */
  clear(): void {
    this.#entries.clear();
    this.#bytes = 0;
  }

  #remove(name: string): void {
    const entry = this.#entries.get(name);
    if (entry === undefined) return;
    this.#entries.delete(name);
    this.#bytes -= entry.bytes;
  }
}

function entryName(id: IdempotencyKeyId): string {
  return `${id.companyId}\u0000${id.environment}\u0000${id.key}`;
}
