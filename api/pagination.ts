import { z } from 'zod';
import { problems } from './problem.ts';

export const PAGE_SIZE_DEFAULT = 10;
export const PAGE_SIZE_MAX = 100;
const CURSOR_MAX_LENGTH = 200;

/** `limit` (1–100, default 10) and an opaque `cursor`, as every list takes them. */
export const ZPageQuery = z.object({
  limit: z.coerce.number().int().min(1).max(PAGE_SIZE_MAX).default(PAGE_SIZE_DEFAULT),
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

export function decodeCursor(cursor: string | undefined): KeysetPosition | undefined {
  if (cursor === undefined) return undefined;
  try {
    const parsed = ZCursor.parse(JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')));
    return { id: parsed.i };
  } catch {
    throw problems.validation([{ path: 'query.cursor', message: 'Not a cursor returned by this list.' }]);
  }
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
