// RFC 9457 problem details. Every error the API returns has this shape.

export interface ValidationIssue {
  path: string;
  message: string;
}

export interface ProblemBody {
  type: string;
  title: string;
  status: number;
  detail?: string;
  code: string;
  request_id?: string;
  errors?: ValidationIssue[];
  [extension: string]: unknown;
}

export const PROBLEM_CONTENT_TYPE = 'application/problem+json';
const PROBLEM_TYPE_BASE = 'https://docs.payments.example/problems/';

/** A failure that is safe to show the caller: status, a stable code, a human title and detail. */
export class HttpProblem extends Error {
  override readonly name = 'HttpProblem';
  readonly status: number;
  readonly code: string;
  readonly title: string;
  readonly detail: string | undefined;
  readonly errors: ValidationIssue[] | undefined;
  readonly headers: Record<string, string>;
  readonly extensions: Record<string, unknown>;

  constructor(options: {
    status: number;
    code: string;
    title: string;
    detail?: string;
    errors?: ValidationIssue[];
    headers?: Record<string, string>;
    extensions?: Record<string, unknown>;
  }) {
    super(options.detail ?? options.title);
    this.status = options.status;
    this.code = options.code;
    this.title = options.title;
    this.detail = options.detail;
    this.errors = options.errors;
    this.headers = options.headers ?? {};
    this.extensions = options.extensions ?? {};
  }

  toBody(requestId: string | undefined): ProblemBody {
    return {
      ...this.extensions,
      type: PROBLEM_TYPE_BASE + this.code.toLowerCase().replaceAll('_', '-'),
      title: this.title,
      status: this.status,
      ...(this.detail === undefined ? {} : { detail: this.detail }),
      code: this.code,
      ...(requestId === undefined ? {} : { request_id: requestId }),
      ...(this.errors === undefined ? {} : { errors: this.errors }),
    };
  }
}

export const problems = {
  validation: (errors: ValidationIssue[], detail = 'The request has invalid fields.') =>
    new HttpProblem({ status: 400, code: 'VALIDATION_FAILED', title: 'Invalid request', detail, errors }),
  malformedJson: (detail = 'The request body is not valid JSON.') =>
    new HttpProblem({ status: 400, code: 'MALFORMED_JSON', title: 'Malformed JSON', detail }),
  notFound: (detail = 'No such resource.') =>
    new HttpProblem({ status: 404, code: 'NOT_FOUND', title: 'Not found', detail }),
  routeNotFound: (method: string, path: string) =>
    new HttpProblem({
      status: 404,
      code: 'ROUTE_NOT_FOUND',
      title: 'Not found',
      detail: `No route for ${method} ${path}.`,
    }),
  methodNotAllowed: (method: string, allow: string) =>
    new HttpProblem({
      status: 405,
      code: 'METHOD_NOT_ALLOWED',
      title: 'Method not allowed',
      detail: `${method} is not allowed here; allowed: ${allow}.`,
      headers: { Allow: allow },
    }),
  payloadTooLarge: (limitBytes: number) =>
    new HttpProblem({
      status: 413,
      code: 'PAYLOAD_TOO_LARGE',
      title: 'Payload too large',
      detail: `The request body exceeds ${limitBytes} bytes.`,
    }),
  unsupportedMediaType: () =>
    new HttpProblem({
      status: 415,
      code: 'UNSUPPORTED_MEDIA_TYPE',
      title: 'Unsupported media type',
      detail: 'Send the request body as application/json.',
    }),
  internal: () =>
    new HttpProblem({
      status: 500,
      code: 'INTERNAL_ERROR',
      title: 'Internal server error',
      detail: 'Something went wrong on our side. Quote the request_id if you contact support.',
    }),
  unavailable: (detail: string, retryAfterSeconds?: number) =>
    new HttpProblem({
      status: 503,
      code: 'SERVICE_UNAVAILABLE',
      title: 'Service unavailable',
      detail,
      ...(retryAfterSeconds === undefined ? {} : { headers: { 'Retry-After': String(retryAfterSeconds) } }),
    }),
  idempotencyKeyRequired: () =>
    new HttpProblem({
      status: 400,
      code: 'IDEMPOTENCY_KEY_REQUIRED',
      title: 'Idempotency key required',
      detail: 'Send an Idempotency-Key header (1 to 255 printable ASCII characters) with every write.',
    }),
  idempotencyKeyInvalid: () =>
    new HttpProblem({
      status: 400,
      code: 'IDEMPOTENCY_KEY_INVALID',
      title: 'Invalid idempotency key',
      detail: 'The Idempotency-Key header must be 1 to 255 printable ASCII characters.',
    }),
  idempotencyKeyReused: () =>
    new HttpProblem({
      status: 422,
      code: 'IDEMPOTENCY_KEY_REUSED',
      title: 'Idempotency key reused',
      detail: 'This Idempotency-Key was already used for a different request (method, path or body). Use a new key.',
    }),
  idempotencyRequestInProgress: (retryAfterSeconds = 1) =>
    new HttpProblem({
      status: 409,
      code: 'IDEMPOTENCY_REQUEST_IN_PROGRESS',
      title: 'Request in progress',
      detail: 'A request with this Idempotency-Key is still being processed. Retry after a moment to get its response.',
      headers: { 'Retry-After': String(retryAfterSeconds) },
    }),
};
