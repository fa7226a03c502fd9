import { z } from 'zod';
import { problems } from './problem.ts';

export const PAGE_SIZE_DEFAULT = 10;
export const PAGE_SIZE_MAX = 100;
const CURSOR_MAX_LENGTH = 200;

/** `limit` (1–100, default 10) and an opaque `cursor`, as every list takes them. */
export const ZPageQuery = z.object({
  // Digits only: z.coerce.number() would also take "0x10", "1e1", " 5", "2.0" and "+3" (Number()'s
  // spellings), which no client means as a page size.
  limit: z
    .string()
    .regex(/^[0-9]{1,3}$/, `an integer from 1 to ${PAGE_SIZE_MAX}`)
    .transform(Number)
    .pipe(z.number().int().min(1).max(PAGE_SIZE_MAX))
    .default(PAGE_SIZE_DEFAULT)
    // The published contract stays what it was (/openapi.json): an integer 1-100, default 10; the
    // string schema above is how a query string is read, not what a client sends.
    .meta({ type: 'integer', minimum: 1, maximum: PAGE_SIZE_MAX, default: PAGE_SIZE_DEFAULT }),
  cursor: z.string().min(1).max(CURSOR_MAX_LENGTH).optional(),
});
export type TPageQuery = z.infer<typeof ZPageQuery>;

/**
 * Lists are ordered by ID, newest first: IDs are UUIDv7 (time-ordered, unique), so a cursor that is
 * the last ID seen is stable under concurrent inserts, with no timestamp-precision ties to break.
 */
export interface KeysetPosition {
  id: string;
}

// IDs are printable ASCII: anything else in a cursor was not written by encodeCursor.
const ZCursor = z.object({
  i: z
    .string()
    .min(1)
    .max(100)
    .regex(/^[\x21-\x7e]+$/),
});

export function encodeCursor(position: KeysetPosition): string {
  return Buffer.from(JSON.stringify({ i: position.id })).toString('base64url');
}

/**
 * The position a cursor of this list holds. `idPrefixes` are the prefixes of the list's IDs
 * (`['tr']`, `['wal', 'acct']`): a cursor of another list, or a forged one, holds an ID no row of
 * this list can have, and would silently answer an empty or shifted page; it is refused instead.
 */
export function decodeCursor(cursor: string | undefined, idPrefixes: readonly string[]): KeysetPosition | undefined {
  if (cursor === undefined) return undefined;
  const refused = () => problems.validation([{ path: 'query.cursor', message: 'Not a cursor returned by this list.' }]);
  let id: string;
  try {
    id = ZCursor.parse(JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'))).i;
  } catch {
    throw refused();
  }
  const separator = id.indexOf('_');
  if (!idPrefixes.includes(id.slice(0, separator)) || !/^[0-9a-f]{32}$/.test(id.slice(separator + 1))) throw refused();
  return { id };
}

export interface Page<T> {
  data: T[];
  has_more: boolean;
  next_cursor: string | null;
}

/** Builds a page from `limit + 1` rows fetched newest first. */
export function toPage<TRow extends KeysetPosition, TOut>(
  rows: TRow[],
  limit: number,
  map: (row: TRow) => TOut,
): Page<TOut> {
  const hasMore = rows.length > limit;
  const visible = hasMore ? rows.slice(0, limit) : rows;
  const last = visible[visible.length - 1];
  return { data: visible.map(map), has_more: hasMore, next_cursor: hasMore && last ? encodeCursor(last) : null };
}
