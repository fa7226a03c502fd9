import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';
import type { Context } from 'koa';
import type { Sql, TransactionSql } from '../../db/client.ts';
import {
  completeIdempotencyKey,
  findIdempotencyKey,
  insertCompletedIdempotencyKey,
  insertRunningIdempotencyKey,
  releaseIdempotencyKey,
  takeOverExpiredIdempotencyKey,
  type ClaimOutcome,
  type IdempotencyClaim,
  type IdempotencyKeyId,
  type IdempotencyKeyState,
  type IdempotencyMethod,
  type IdempotencyRecord,
  type StoredResponse,
} from '../../db/idempotency.ts';
import { withTenant } from '../../db/tenant.ts';
import { problems, type HttpProblem } from '../problem.ts';
import { knownProblem, sendProblem } from './errors.ts';
import { ReplayCache, type ReplayCacheOptions } from './replay-cache.ts';

// Idempotency for every write (DESIGN contract 5). The route layer calls `run` after authentication
// and validation; `run` either executes the operation once and stores its response under the key,
// or answers from what is stored:
//
//   no key               → 400 IDEMPOTENCY_KEY_REQUIRED when required, else execute without one
//   malformed key        → 400 IDEMPOTENCY_KEY_INVALID
//   new key              → execute, store the response, send it
//   same key, same request, completed       → the stored response again, `Idempotent-Replayed: true`
//   same key, different method, path or body → 422 IDEMPOTENCY_KEY_REUSED
//   same key, first request still running   → 409 IDEMPOTENCY_REQUEST_IN_PROGRESS, `Retry-After: 1`
//   same key, running but its lease expired (the process died mid-request) → taken over and executed
//
// An HttpProblem or DomainError below 500 (except 429 and 409 IDEMPOTENCY_REQUEST_IN_PROGRESS, which
// say "later", not "no") is the operation's decided answer and is stored like any response. Any other
// failure deletes the running row, so that a retry executes, and is rethrown to the error middleware.
//
// A request's lease must outlast its longest possible run (set it above the server's request
// timeout): once it expires, a retry takes the key over and executes the operation again. A request
// that finds, when it records its response, that it lost its lease stores nothing (the key is
// another request's now, or gone) and is answered 409 IDEMPOTENCY_REQUEST_IN_PROGRESS: its retry
// gets the other request's answer, or executes again when the key was released.
//
// What is stored is what was sent, byte for byte, unless the handler sets
// `ctx.state.idempotentReplayBody` (see DefaultState below): then the first request is answered
// with ctx.body and the store keeps, and a replay answers with, that body instead (a secret shown
// once is not kept in idempotency_keys nor shown again).
//
// Routes declared `idempotent: 'deferred'` (POST /v1/transfers) claim the key themselves, through
// `ctx.state.deferredIdempotency`: either the classic flow above, or the single-statement flow in
// which the new key is inserted already completed, with its response, by the write's own statement
// (no running row, one round trip, one commit). Its answers are the same as above, except that a
// request racing another with the same key waits for that one's statement instead of a 409, and is
// then answered with the stored response.

export interface IdempotencyScope {
  companyId: string;
  environment: 'sandbox' | 'live' | 'admin';
}

export interface IdempotencyOptions {
  /** How long a key is kept (and replayed) after its first use; at least 24 h (the table enforces it). */
  ttlMs: number;
  /** How long a running request holds its key before another request may take it over. */
  leaseMs: number;
  /**
   * Responses this process stored, kept in memory to answer retries (see replay-cache.ts);
   * absent or `ttlMs: 0`: every replay reads the key's row.
   */
  replayCache?: ReplayCacheOptions;
}

/** A response for `recordResponse`: a JSON body (or none), serialized once and stored as bytes. */
export interface IdempotentResponse {
  status: number;
  /** A JSON-serializable body; leave it out for an empty body. */
  body?: unknown;
  /** Location header, e.g. the URL of a created resource. */
  location?: string;
}

/**
 * `ctx.state.idempotency`, set by `run` for the duration of `execute` when the request carries a key
 * (undefined for a keyless request on a surface where the key is optional).
 *
 * For the single-transaction hot path (a ledger transfer): the handler calls
 * `recordResponse(tx, response)` inside ITS OWN `withTenant` transaction for `scope.companyId`, so
 * the response is stored and the key completed atomically with the business change; if that
 * transaction rolls back, so does the completion. `run` then sends exactly the recorded response
 * (whatever the handler put in ctx.body) and does not store it again. It may be called once; it
 * throws an internal error, which must abort the transaction (let it propagate), when this request
 * no longer holds the key (its lease expired and another request took it over, and may have
 * released it): nothing is then stored, and the caller is answered 409 IDEMPOTENCY_REQUEST_IN_PROGRESS.
 */
export interface IdempotencyContext {
  key: string;
  scope: IdempotencyScope;
  recordResponse(tx: TransactionSql, response: IdempotentResponse): Promise<void>;
}

/**
 * A write whose key claim is folded into its own statement (the Shape B hot path): the response is
 * known before the statement runs (the handler chose the IDs and signed it), and `execute` sends
 * the claim (key, request fingerprint, retention, response) with the write, in one statement and
 * one commit. `execute` is called again (same response) when it answers 'retry', or when the key
 * was held by a request that died; it must write nothing unless it answers 'created'.
 */
export interface InStatementWrite {
  response: IdempotentResponse;
  execute(claim: IdempotencyClaim): Promise<ClaimOutcome>;
}

/**
 * `ctx.state.deferredIdempotency`, set by `run` for routes that claim their key themselves
 * (`deferred: true`). The handler calls exactly one of:
 *   - `claimThenRun(run)`: the classic flow (claim as running, run, store the response), as for any write;
 *   - `claimInTransaction(run)`: the classic flow, but `run` claims the key itself with `claim(tx)`
 *     as the first statement of its own first transaction (a `withTenant` transaction for the key's
 *     company), which saves the claim its own transaction. A key that exists makes `claim` throw,
 *     which must abort that transaction; `run` is then called again once the classic flow has
 *     taken the key (a dead request's), with a `claim` that does nothing. `recordResponse` works as
 *     in the classic flow;
 *   - `inStatement(prepare)`: `prepare` validates and builds the response and the write (a thrown
 *     DomainError or problem below 500 is the decided answer, stored under the key like any
 *     other); the new key is then claimed by the write's own statement, with the response: one
 *     round trip and one commit for a new request, one round trip and no write for a replay.
 * Semantics are the classic ones: same key and request → the stored response replayed; another
 * request → 422; a classic request still running → 409. A concurrent request with the same key
 * waits for the first one's statement (milliseconds) and then gets its answer replayed.
 */
export interface DeferredIdempotency {
  key: string;
  scope: IdempotencyScope;
  claimThenRun(run: () => Promise<void>): Promise<void>;
  claimInTransaction(run: (claim: ClaimInTransaction) => Promise<void>): Promise<void>;
  inStatement(prepare: () => Promise<InStatementWrite>): Promise<void>;
}

/** Claims the key as running in the caller's transaction; throws when the key exists already. */
export type ClaimInTransaction = (tx: TransactionSql) => Promise<void>;

/** The key exists already: thrown by a ClaimInTransaction, caught by the middleware. */
class KeyTaken extends Error {
  constructor() {
    super('the Idempotency-Key exists already');
  }
}

/**
 * This request no longer holds its key: thrown by recordResponse when completing the key under this
 * request's lease fails (the lease expired and another request took the key over, and may have
 * released it since). Never the key's answer: runHolding stores nothing and answers 409.
 */
class LeaseLost extends Error {
  constructor() {
    super('the Idempotency-Key lease was lost before the response was recorded');
  }
}

declare module 'koa' {
  interface DefaultState {
    idempotency?: IdempotencyContext;
    deferredIdempotency?: DeferredIdempotency;
    /**
     * Set by a handler whose response body must not be kept as sent (a secret shown once): the
     * body, a JSON value, that the idempotency store keeps instead of ctx.body, and that a replay
     * of the request (same key, same request) answers with, same status and headers. The first
     * request is answered with ctx.body. Applies to a successful response the middleware captures
     * from ctx (the classic flow, claimThenRun, claimInTransaction without recordResponse); not to
     * a refusal, nor to responses a handler records itself (recordResponse, inStatement).
     */
    idempotentReplayBody?: unknown;
  }
}

export interface Idempotency {
  /**
   * Runs a write under its key. `deferred`: the handler claims the key itself through
   * `ctx.state.deferredIdempotency` (see DeferredIdempotency) instead of before it runs.
   */
  run(
    ctx: Context,
    scope: IdempotencyScope,
    options: { required: boolean; deferred?: boolean },
    execute: () => Promise<void>,
  ): Promise<void>;
  /**
   * Forgets the responses kept in memory. Only needed when a key's row is deleted before its
   * retention ended (by hand, or by a test standing in for the purge).
   */
  clearReplayCache(): void;
}

export const IDEMPOTENCY_KEY_HEADER = 'Idempotency-Key';
export const IDEMPOTENT_REPLAYED_HEADER = 'Idempotent-Replayed';
const IDEMPOTENCY_KEY_PATTERN = /^[\x20-\x7e]{1,255}$/;
const TTL_MS_MIN = 24 * 60 * 60 * 1000;
const REQUEST_PATH_LENGTH_MAX = 2000;
/** Rounds of insert / read / take over before giving up with a 409 (a row vanishing in between). */
const ACQUIRE_ATTEMPTS_MAX = 3;
const RETRY_AFTER_SECONDS = 1;
const JSON_CONTENT_TYPE = 'application/json; charset=utf-8';
/** Statuses that carry no body (Koa strips it). */
const EMPTY_BODY_STATUSES = new Set([204, 205, 304]);
const WRITE_METHODS = new Set<string>(['POST', 'PUT', 'PATCH', 'DELETE']);

/**
 * Answers with `resource` and a secret shown this once (an API key, a webhook signing secret): not
 * cached on the way, and kept by the idempotency store, so shown by a replay, with `secret: null`.
 */
export function respondWithSecretOnce(ctx: Context, resource: Record<string, unknown>, secret: string): void {
  ctx.set('Cache-Control', 'no-store');
  ctx.body = { ...resource, secret };
  ctx.state.idempotentReplayBody = { ...resource, secret: null };
}

/**
 * SHA-256 over the method, the path with its query string, and the RFC 8785 canonical JSON of the
 * parsed body: the same request however its JSON was spaced or its keys ordered.
 */
export function requestFingerprint(method: string, url: string, body: unknown): Buffer {
  const canonical = canonicalize(body === undefined ? null : body) ?? 'null';
  return createHash('sha256').update(method).update('\0').update(url).update('\0').update(canonical).digest();
}

/** The key from the header: undefined when absent, a 400 problem when malformed. */
function readKey(ctx: Context): string | undefined {
  const name = IDEMPOTENCY_KEY_HEADER.toLowerCase();
  const value = ctx.request.headers[name];
  if (value === undefined) return undefined;
  // Node joins repeated headers with ", ": two keys would otherwise pass as one key "a, b".
  if ((ctx.req.headersDistinct[name]?.length ?? 0) > 1) throw problems.idempotencyKeyInvalid();
  if (typeof value !== 'string' || !IDEMPOTENCY_KEY_PATTERN.test(value)) throw problems.idempotencyKeyInvalid();
  return value;
}

/** A body as the bytes Koa sends for it: a Buffer as is, a string as UTF-8, anything else as JSON. */
function bodyBytes(body: unknown, status: number): Buffer {
  if (body === undefined || body === null || EMPTY_BODY_STATUSES.has(status)) return Buffer.alloc(0);
  if (Buffer.isBuffer(body)) return body;
  if (typeof body === 'string') return Buffer.from(body, 'utf8');
  assert(typeof (body as { pipe?: unknown }).pipe !== 'function', 'an idempotent write cannot answer with a stream');
  return Buffer.from(JSON.stringify(body));
}

/** Status, Content-Type, Location and body bytes of the response the handler produced. */
function captureResponse(ctx: Context, extraHeaders: Record<string, string> = {}): StoredResponse {
  const bytes = bodyBytes(ctx.body, ctx.status);
  const headers: Record<string, string> = {};
  const contentType = ctx.response.get('Content-Type');
  if (bytes.length > 0 && contentType) headers['content-type'] = contentType;
  const location = ctx.response.get('Location');
  if (location) headers.location = location;
  for (const [name, value] of Object.entries(extraHeaders)) headers[name.toLowerCase()] = value;
  return { status: ctx.status, headers, body: bytes };
}

/** `sent` with the body a replay shows instead (ctx.state.idempotentReplayBody): what the store keeps. */
function withReplayBody(sent: StoredResponse, replayBody: unknown): StoredResponse {
  const body = bodyBytes(replayBody, sent.status);
  const { 'content-type': contentType, ...headers } = sent.headers;
  if (body.length > 0) headers['content-type'] = contentType ?? JSON_CONTENT_TYPE;
  return { status: sent.status, headers, body };
}

/** Writes a stored response to ctx; the first response and every replay go through here alike. */
function writeResponse(ctx: Context, response: StoredResponse): void {
  ctx.status = response.status;
  ctx.body = EMPTY_BODY_STATUSES.has(response.status) ? null : response.body;
  ctx.remove('Content-Type');
  ctx.remove('Location');
  for (const [name, value] of Object.entries(response.headers)) ctx.set(name, value);
}

function fromIdempotentResponse(response: IdempotentResponse): StoredResponse {
  const hasBody = response.body !== undefined && !EMPTY_BODY_STATUSES.has(response.status);
  const headers: Record<string, string> = hasBody ? { 'content-type': JSON_CONTENT_TYPE } : {};
  if (response.location !== undefined) headers.location = response.location;
  return {
    status: response.status,
    headers,
    body: hasBody ? Buffer.from(JSON.stringify(response.body)) : Buffer.alloc(0),
  };
}

/** Problems that say "later", not "no": never a key's answer. */
const RETRY_LATER_CODES = new Set([problems.idempotencyRequestInProgress().code]);

/** The decided answer an error stands for, or undefined when the outcome is unknown (release the key). */
function decidedProblem(error: unknown): HttpProblem | undefined {
  const problem = knownProblem(error);
  const later = problem !== undefined && (problem.status === 429 || RETRY_LATER_CODES.has(problem.code));
  return problem && problem.status < 500 && !later ? problem : undefined;
}

interface RequestFingerprint {
  method: IdempotencyMethod;
  path: string;
  hash: Buffer;
}

type Acquired = { kind: 'acquired'; lease: Date } | { kind: 'replay'; response: StoredResponse };

/**
 * What a key that was already taken means for this request, the same in both flows: 422 for another
 * request, the stored response to replay, 409 while a request holds a live lease. A running row
 * whose lease expired belongs to a request that died before it wrote anything: its lease comes
 * back, for the caller to take the row over (classic flow) or release it and try again (in-statement).
 */
function answerFor(
  existing: IdempotencyKeyState,
  sameRequest: boolean,
): { kind: 'replay'; response: StoredResponse } | { kind: 'expired'; lease: Date } {
  if (!sameRequest) throw problems.idempotencyKeyReused();
  if (existing.status === 'completed') return { kind: 'replay', response: existing.response };
  if (!existing.leaseExpired) throw problems.idempotencyRequestInProgress(RETRY_AFTER_SECONDS);
  return { kind: 'expired', lease: existing.lockedUntil };
}

function writeReplay(ctx: Context, response: StoredResponse): void {
  writeResponse(ctx, response);
  ctx.set(IDEMPOTENT_REPLAYED_HEADER, 'true');
}

export function createIdempotency(deps: { sql: Sql; options: IdempotencyOptions }): Idempotency {
  const { sql, options } = deps;
  assert(Number.isInteger(options.ttlMs) && options.ttlMs >= TTL_MS_MIN, 'idempotency ttlMs must be at least 24 h');
  assert(Number.isInteger(options.leaseMs) && options.leaseMs >= 1000, 'idempotency leaseMs must be at least 1 s');
  const replayCache = new ReplayCache(options.replayCache ?? { ttlMs: 0, maxBytes: 0 });
  /**
   * `response` is now the committed answer of a completed key (its row was inserted or completed
   * by a statement that returned): it is kept for retries, as long as the row is at most.
   */
  const remember = (id: IdempotencyKeyId, request: RequestFingerprint, response: StoredResponse) =>
    replayCache.set(id, request.hash, response, options.ttlMs);

  /** The key as a running row for `request`, with the configured lease and retention. */
  const runningKey = (id: IdempotencyKeyId, request: RequestFingerprint) => ({
    ...id,
    requestMethod: request.method,
    requestPath: request.path,
    requestHash: request.hash,
    leaseMs: options.leaseMs,
    ttlMs: options.ttlMs,
  });

  /** The key completed with `response`, for `request` (inserted so by the single-statement flows). */
  const completedKey = (
    id: IdempotencyKeyId,
    request: RequestFingerprint,
    response: StoredResponse,
  ): IdempotencyClaim => ({
    ...id,
    requestMethod: request.method,
    requestPath: request.path,
    requestHash: request.hash,
    ttlMs: options.ttlMs,
    response,
  });

  /** One transaction: insert the key as running, or find out why not (and take over a dead lease). */
  async function acquire(id: IdempotencyKeyId, request: RequestFingerprint): Promise<Acquired> {
    return withTenant(sql, id.companyId, async (tx) => {
      for (let attempt = 0; attempt < ACQUIRE_ATTEMPTS_MAX; attempt++) {
        const lease = await insertRunningIdempotencyKey(tx, runningKey(id, request));
        if (lease) return { kind: 'acquired', lease };
        const existing = await findIdempotencyKey(tx, id);
        if (!existing) continue; // released between the two statements: try the insert again
        const answer = answerFor(existing, existing.requestHash.equals(request.hash));
        if (answer.kind === 'replay') return answer;
        const takenOver = await takeOverExpiredIdempotencyKey(tx, {
          ...id,
          requestHash: request.hash,
          leaseMs: options.leaseMs,
        });
        if (takenOver) return { kind: 'acquired', lease: takenOver };
        break; // another request took it over first
      }
      throw problems.idempotencyRequestInProgress(RETRY_AFTER_SECONDS);
    });
  }

  /**
   * Completes the key with the response, then sends the very bytes that were stored, or `sent`
   * when given (the first answer to a request whose replays show another body).
   */
  async function store(
    ctx: Context,
    id: IdempotencyKeyId,
    request: RequestFingerprint,
    lease: Date,
    response: StoredResponse,
    sent: StoredResponse = response,
  ): Promise<void> {
    try {
      const completed = await withTenant(sql, id.companyId, (tx) =>
        completeIdempotencyKey(tx, { ...id, lease, response }),
      );
      if (completed) remember(id, request, response);
      else ctx.state.logger.warn({ key: id.key }, 'idempotency: lease lost before the response was stored');
    } catch (error) {
      // The operation has happened: answer with its result rather than a 500 that invites a retry.
      ctx.state.logger.error(
        { err: error },
        'idempotency: could not store the response; a retry after the lease may execute again',
      );
    }
    writeResponse(ctx, sent);
  }

  /** The classic flow: claim the key as running, execute, store the response (or a decided problem). */
  async function runClaimed(
    ctx: Context,
    id: IdempotencyKeyId,
    request: RequestFingerprint,
    execute: () => Promise<void>,
  ) {
    const acquired = await acquire(id, request);
    if (acquired.kind === 'replay') {
      writeReplay(ctx, acquired.response);
      return;
    }
    const { lease } = acquired;
    await runHolding(ctx, id, request, () => lease, execute, false);
  }

  /**
   * The classic flow with the claim in the handler's first transaction (see
   * DeferredIdempotency.claimInTransaction). A key that exists already aborts that transaction
   * (KeyTaken) and is answered by the classic flow: replayed, refused, or taken over and run again,
   * then without a claim of its own.
   */
  async function runClaimedInTransaction(
    ctx: Context,
    id: IdempotencyKeyId,
    request: RequestFingerprint,
    run: (claim: ClaimInTransaction) => Promise<void>,
  ) {
    let lease: Date | undefined;
    const claim: ClaimInTransaction = async (tx) => {
      assert(lease === undefined, 'a key is claimed once');
      const claimed = await insertRunningIdempotencyKey(tx, runningKey(id, request));
      if (!claimed) throw new KeyTaken();
      lease = claimed;
    };
    try {
      await runHolding(
        ctx,
        id,
        request,
        () => lease,
        () => run(claim),
        true,
      );
    } catch (error) {
      if (!(error instanceof KeyTaken)) throw error;
      await runClaimed(ctx, id, request, () => run(async () => undefined));
    }
  }

  /**
   * Runs `execute` under the key's lease and stores its answer. `leaseOf` gives the lease: known
   * before `execute` in the classic flow, set by the claim inside it when `claimInside`
   * (claimInTransaction); then the claim may also have rolled back with the handler's transaction,
   * and a decided refusal is inserted as a completed key instead. A lease found lost by
   * recordResponse is never stored, whatever the handler makes of it: the caller gets 409.
   */
  async function runHolding(
    ctx: Context,
    id: IdempotencyKeyId,
    request: RequestFingerprint,
    leaseOf: () => Date | undefined,
    execute: () => Promise<void>,
    claimInside: boolean,
  ) {
    let recorded: StoredResponse | undefined;
    let leaseLost = false;
    /** Another request holds the key now (or released it): nothing of ours may be stored under it. */
    const lostLease = () => {
      ctx.state.logger.warn({ key: id.key }, 'idempotency: lease lost before the response was recorded; answering 409');
      return problems.idempotencyRequestInProgress(RETRY_AFTER_SECONDS);
    };
    ctx.state.idempotency = {
      key: id.key,
      scope: { companyId: id.companyId, environment: id.environment },
      async recordResponse(tx, response) {
        assert(recorded === undefined, 'recordResponse may be called once per request');
        const lease = leaseOf();
        assert(lease !== undefined, 'recordResponse needs the key claimed first');
        const stored = fromIdempotentResponse(response);
        if (!(await completeIdempotencyKey(tx, { ...id, lease, response: stored }))) {
          leaseLost = true;
          throw new LeaseLost();
        }
        recorded = stored;
      },
    };

    try {
      await execute();
    } catch (error) {
      if (error instanceof KeyTaken) throw error;
      // Not a decided answer, nor ours to release: the key belongs to another request, or is gone.
      if (leaseLost || error instanceof LeaseLost) throw lostLease();
      const problem = decidedProblem(error);
      const lease = leaseOf();
      if (!problem) {
        if (lease !== undefined) {
          await withTenant(sql, id.companyId, (tx) => releaseIdempotencyKey(tx, { ...id, lease })).catch(
            (releaseError: unknown) => {
              ctx.state.logger.error(
                { err: releaseError },
                'idempotency: could not release the key; it frees when its lease expires',
              );
            },
          );
        }
        throw error;
      }
      // Rendered as the error middleware would, then stored like any other response.
      sendProblem(ctx, problem);
      const refusal = captureResponse(ctx, problem.headers);
      if (!claimInside) {
        assert(lease !== undefined, 'the classic flow holds its lease from the start');
        await store(ctx, id, request, lease, refusal);
        return;
      }
      const existing = await storeRefusal(ctx, id, request, lease, refusal);
      if (existing) {
        // Another request holds the key: its answer, or 409 while it runs.
        const answer = answerFor(existing, existing.requestHash.equals(request.hash));
        if (answer.kind !== 'replay') throw problems.idempotencyRequestInProgress(RETRY_AFTER_SECONDS);
        writeReplay(ctx, answer.response);
      }
      return;
    } finally {
      ctx.state.idempotency = undefined;
    }

    if (leaseLost) throw lostLease(); // the handler swallowed LeaseLost: still nothing to store
    if (recorded) {
      writeResponse(ctx, recorded);
      return;
    }
    const lease = leaseOf();
    assert(lease !== undefined, 'a handler run with claimInTransaction must claim its key before it succeeds');
    const sent = captureResponse(ctx);
    const { idempotentReplayBody: replayBody } = ctx.state;
    await store(ctx, id, request, lease, replayBody === undefined ? sent : withReplayBody(sent, replayBody), sent);
  }

  /**
   * Stores a decided refusal as the key's answer, for the flows whose claim may not have committed
   * (claimInTransaction, single statement): completes the running row under `lease` when there is
   * one, else inserts the key completed, and sends the refusal. When another request holds the key
   * by then, nothing is stored or sent, and that request's row comes back for the caller to answer from.
   */
  async function storeRefusal(
    ctx: Context,
    id: IdempotencyKeyId,
    request: RequestFingerprint,
    lease: Date | undefined,
    refusal: StoredResponse,
  ): Promise<IdempotencyRecord | undefined> {
    const existing = await withTenant(sql, id.companyId, async (tx) => {
      if (lease !== undefined && (await completeIdempotencyKey(tx, { ...id, lease, response: refusal })))
        return undefined;
      return (await insertCompletedIdempotencyKey(tx, completedKey(id, request, refusal)))
        ? undefined
        : findIdempotencyKey(tx, id);
    });
    if (!existing) {
      remember(id, request, refusal);
      writeResponse(ctx, refusal);
    }
    return existing;
  }

  /**
   * The single-statement flow (see InStatementWrite). A decided refusal (from `prepare` or from the
   * statement) is stored as the key's answer in a transaction of its own, unless another request
   * with the key got there first, in which case that request's answer is given. A running row whose
   * lease expired (its request died before it wrote anything) is released, and the write tried again.
   */
  async function runInStatement(
    ctx: Context,
    id: IdempotencyKeyId,
    request: RequestFingerprint,
    prepare: () => Promise<InStatementWrite>,
  ) {
    let write: InStatementWrite | undefined;
    for (let attempt = 0; attempt < ACQUIRE_ATTEMPTS_MAX; attempt++) {
      let outcome: ClaimOutcome;
      let stored: StoredResponse | undefined;
      try {
        write ??= await prepare();
        stored = fromIdempotentResponse(write.response);
        outcome = await write.execute(completedKey(id, request, stored));
      } catch (error) {
        const problem = decidedProblem(error);
        if (!problem) throw error;
        sendProblem(ctx, problem);
        const refusal = captureResponse(ctx, problem.headers);
        const existing = await storeRefusal(ctx, id, request, undefined, refusal);
        if (!existing) return;
        outcome = {
          kind: 'existing',
          existing: { ...existing, sameRequest: existing.requestHash.equals(request.hash) },
        };
      }
      if (outcome.kind === 'created') {
        remember(id, request, stored!);
        writeResponse(ctx, stored!);
        return;
      }
      if (outcome.kind === 'retry') continue;
      const answer = answerFor(outcome.existing, outcome.existing.sameRequest);
      if (answer.kind === 'replay') {
        writeReplay(ctx, answer.response);
        return;
      }
      await withTenant(sql, id.companyId, (tx) => releaseIdempotencyKey(tx, { ...id, lease: answer.lease }));
    }
    throw problems.idempotencyRequestInProgress(RETRY_AFTER_SECONDS);
  }

  return {
    clearReplayCache: () => replayCache.clear(),
    async run(ctx, scope, runOptions, execute) {
      const key = readKey(ctx);
      if (key === undefined) {
        if (runOptions.required) throw problems.idempotencyKeyRequired();
        await execute();
        return;
      }
      const method = ctx.method.toUpperCase();
      assert(WRITE_METHODS.has(method), `idempotency applies to writes, not ${method}`);
      const id: IdempotencyKeyId = { companyId: scope.companyId, environment: scope.environment, key };
      const request: RequestFingerprint = {
        method: method as IdempotencyMethod,
        path: ctx.path.slice(0, REQUEST_PATH_LENGTH_MAX),
        hash: requestFingerprint(method, ctx.originalUrl, (ctx.request as { body?: unknown }).body),
      };
      // A retry of a request this process answered: the same answers as from the key's row.
      const cached = replayCache.get(id);
      if (cached !== undefined) {
        if (!cached.requestHash.equals(request.hash)) throw problems.idempotencyKeyReused();
        writeReplay(ctx, cached.response);
        return;
      }
      if (!runOptions.deferred) {
        await runClaimed(ctx, id, request, execute);
        return;
      }

      let chosen = false;
      const choose = () => {
        assert(!chosen, 'a deferred idempotent handler chooses one flow, once');
        chosen = true;
      };
      ctx.state.deferredIdempotency = {
        key,
        scope,
        claimThenRun(run) {
          choose();
          return runClaimed(ctx, id, request, run);
        },
        claimInTransaction(run) {
          choose();
          return runClaimedInTransaction(ctx, id, request, run);
        },
        inStatement(prepare) {
          choose();
          return runInStatement(ctx, id, request, prepare);
        },
      };
      try {
        await execute();
      } finally {
        ctx.state.deferredIdempotency = undefined;
      }
      assert(
        chosen,
        'a deferred idempotent handler must claim its key (claimThenRun, claimInTransaction or inStatement)',
      );
    },
  };
}
