import type { DomainError, DomainErrorKind } from '../workflows/shared/errors.ts';
import { HttpProblem } from './problem.ts';

const STATUS: Record<DomainErrorKind, { status: number; title: string }> = {
  invalid: { status: 400, title: 'Invalid request' },
  unauthenticated: { status: 401, title: 'Unauthenticated' },
  forbidden: { status: 403, title: 'Forbidden' },
  not_found: { status: 404, title: 'Not found' },
  conflict: { status: 409, title: 'Conflict' },
  unprocessable: { status: 422, title: 'Unprocessable request' },
  locked: { status: 423, title: 'Locked' },
  throttled: { status: 429, title: 'Too many requests' },
};

/** A business-rule failure as the problem the caller sees: status from its kind, its stable code. */
export function problemFromDomainError(error: DomainError): HttpProblem {
  const { status, title } = STATUS[error.kind];
  const headers: Record<string, string> = {};
  if (error.details.retryAfterSeconds !== undefined) headers['Retry-After'] = String(error.details.retryAfterSeconds);
  if (error.kind === 'unauthenticated') headers['WWW-Authenticate'] = 'Bearer';
  return new HttpProblem({ status, code: error.code, title, detail: error.message, headers });
}
