// Business-rule failures, independent of transport: the API maps `kind` to an HTTP status, and a
// workflow turns the same error into a non-retryable ApplicationFailure whose type is `code`.

export type DomainErrorKind =
  'invalid' | 'unauthenticated' | 'forbidden' | 'not_found' | 'conflict' | 'unprocessable' | 'locked' | 'throttled';

export class DomainError extends Error {
  override readonly name = 'DomainError';

  constructor(
    readonly kind: DomainErrorKind,
    /** Stable UPPER_SNAKE code, part of the public contract. */
    readonly code: string,
    message: string,
    readonly details: { retryAfterSeconds?: number; [key: string]: unknown } = {},
  ) {
    super(message);
  }
}

export const notFound = (what: string) => new DomainError('not_found', 'NOT_FOUND', `No such ${what}.`);
