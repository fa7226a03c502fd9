import { v7 as uuidv7 } from 'uuid';

export type IdPrefix = 'co' | 'op' | 'ses' | 'key' | 'wal' | 'acct' | 'sys' | 'tr' | 'hold' | 'ba' | 'we' | 'evt' | 'whd' | 'wha';

/** A prefixed, time-ordered identifier (`co_0190f3…`): UUIDv7 without dashes. */
export function newId(prefix: IdPrefix): string {
  return `${prefix}_${uuidv7().replaceAll('-', '')}`;
}

export function isId(prefix: IdPrefix, value: string): boolean {
  return new RegExp(`^${prefix}_[0-9a-f]{32}$`).test(value);
}
