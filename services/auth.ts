import { isIPv4, isIPv6 } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Sql } from '../db/client.ts';
import { appendAuditEvent } from '../db/audit.ts';
import {
  claimLoginAttemptPair,
  findLoginCandidate,
  recordSuccessfulLogin,
  resetLoginAttempts,
  type OperatorRole,
} from '../db/operators.ts';
import { findSessionPrincipal, insertSession, revokeSession } from '../db/sessions.ts';
import { withTenant } from '../db/tenant.ts';
import { newId } from '../platform/ids.ts';
import { DomainError } from '../workflows/shared/errors.ts';
import type { ActorContext } from './audit-context.ts';
import { generateSessionToken, sessionTokenHash, verifyPassword } from './credentials.ts';

/**
 * Failures are counted twice: per email and client (the caller's IP address, an IPv6 one by its
 * /64), where the throttle and the lock come soon, and per email from every client together, where
 * they come much later. Someone who knows an operator's email can lock it for the clients they
 * guess from, not for the operator's own; a guesser spread over many addresses still meets the
 * email's own lock.
 */
export interface LoginPolicy {
  sessionTtlMs: number;
  /** From this many consecutive failures from one client on, each further failure blocks that client for a doubling delay. */
  throttleAfterFailures: number;
  throttleBaseMs: number;
  /** At this many consecutive failures from one client, sign-in to the email locks for that client for lockMs. */
  lockAfterFailures: number;
  lockMs: number;
  /** The same two steps for the email from every client together (same base delay and lock time). */
  emailThrottleAfterFailures: number;
  emailLockAfterFailures: number;
}

export const DEFAULT_LOGIN_POLICY: LoginPolicy = {
  sessionTtlMs: 12 * 60 * 60 * 1000,
  throttleAfterFailures: 5,
  throttleBaseMs: 1000,
  lockAfterFailures: 10,
  lockMs: 60 * 60 * 1000,
  emailThrottleAfterFailures: 50,
  emailLockAfterFailures: 100,
};

/**
 * The client a sign-in is counted against: an IPv4 address as is (also when written IPv4-mapped),
 * an IPv6 one by its /64, which one subscriber usually holds whole.
 */
export function loginClient(ip: string | undefined): string {
  if (!ip) return 'unknown';
  let address = ip.trim().toLowerCase();
  // Some proxies write the client's source port too ("203.0.113.7:54321", "[2001:db8::1]:443"):
  // kept, every new connection would be a client of its own.
  const withPort =
    /^\[([^\]]+)\](?::\d+)?$/.exec(address) ?? /^((?:::ffff:)?\d{1,3}(?:\.\d{1,3}){3}):\d+$/.exec(address);
  if (withPort) address = withPort[1]!;
  if (isIPv4(address) || !isIPv6(address)) return address;
  const groups = ipv6Groups(address);
  // IPv4-mapped (::ffff:a.b.c.d, however it is spelled): the IPv4 address itself.
  if (groups.slice(0, 5).every((group) => group === 0) && groups[5] === 0xffff) {
    return [groups[6]! >> 8, groups[6]! & 0xff, groups[7]! >> 8, groups[7]! & 0xff].join('.');
  }
  return `${groups
    .slice(0, 4)
    .map((group) => group.toString(16))
    .join(':')}::/64`;
}

/** The eight 16-bit groups of a valid IPv6 address (a zone dropped, a dotted-quad tail as two groups). */
function ipv6Groups(address: string): number[] {
  const parse = (part: string) =>
    part
      ? part.split(':').flatMap((group) => {
          if (!group.includes('.')) return [parseInt(group, 16)];
          const [a = 0, b = 0, c = 0, d = 0] = group.split('.').map(Number);
          return [(a << 8) | b, (c << 8) | d];
        })
      : [];
  const [head = '', tail] = address.replace(/%.*$/, '').split('::');
  const headGroups = parse(head);
  if (tail === undefined) return headGroups;
  const tailGroups = parse(tail);
  return [...headGroups, ...Array<number>(8 - headGroups.length - tailGroups.length).fill(0), ...tailGroups];
}

/** The two counters' keys (the database hashes each, lower-cased). */
function attemptKeys(email: string, client: string) {
  return { email, client: `${email}\n${client}` };
}

/**
 * The least time a refused sign-in (429/423) takes from its start, and a failed one (401) from the
 * end of its password check. A registered email's failure writes an audit event (a committed
 * transaction) and an unknown email's cannot, so without a floor the answer's timing tells
 * registered emails from unknown ones; refusals skip the password hash, so they can be sampled
 * without limit. Each floor is well above the audit transaction's usual time.
 */
export const REFUSED_ANSWER_MIN_MS = 60;
export const FAILED_ANSWER_AFTER_VERIFY_MIN_MS = 40;

/** Waits until `floorMs` after `since` (a performance.now() reading). */
async function answerNoSoonerThan(since: number, floorMs: number): Promise<void> {
  const left = since + floorMs - performance.now();
  if (left > 0) await sleep(left);
}

const invalidCredentials = () =>
  new DomainError('unauthenticated', 'INVALID_CREDENTIALS', 'The email or password is not correct.');

export interface LoginResult {
  token: string;
  expiresAt: Date;
  operatorId: string;
  companyId: string;
}

export async function login(
  sql: Sql,
  policy: LoginPolicy,
  input: { email: string; password: string; userAgent?: string },
  context: Omit<ActorContext, 'actor'>,
): Promise<LoginResult> {
  const now = new Date();
  const startedAt = performance.now();
  const candidate = await findLoginCandidate(sql, input.email);
  const audit = (
    companyId: string,
    operatorId: string,
    event: 'auth.login_failed' | 'auth.login_succeeded' | 'auth.account_locked',
    data: Record<string, unknown>,
  ) => ({
    companyId,
    event,
    actor: { type: 'anonymous' as const },
    object: { type: 'operator', id: operatorId },
    data,
    ip: context.ip,
    requestId: context.requestId,
  });

  // Counted before the password is checked, for a registered email or not (migration 00013): a
  // burst of concurrent guesses cannot all pass one check, and an unknown email is throttled and
  // locked exactly like a registered one. Both counts in one call (migration 00017): an attempt
  // either of them refuses counts against neither.
  const keys = attemptKeys(input.email, loginClient(context.ip));
  const attempt = await claimLoginAttemptPair(sql, keys, {
    throttleBaseMs: policy.throttleBaseMs,
    lockMs: policy.lockMs,
    client: { throttleAfterFailures: policy.throttleAfterFailures, lockAfterFailures: policy.lockAfterFailures },
    email: {
      throttleAfterFailures: policy.emailThrottleAfterFailures,
      lockAfterFailures: policy.emailLockAfterFailures,
    },
  });
  if (!attempt.claimed) {
    const retryAfterSeconds = Math.max(1, Math.ceil(((attempt.lockedUntil?.getTime() ?? 0) - Date.now()) / 1000));
    const locked =
      attempt.blockedBy === 'email'
        ? attempt.emailFailures >= policy.emailLockAfterFailures
        : attempt.clientFailures >= policy.lockAfterFailures;
    if (candidate) {
      await withTenant(sql, candidate.companyId, (tx) =>
        appendAuditEvent(
          tx,
          audit(candidate.companyId, candidate.operatorId, 'auth.login_failed', {
            reason: locked ? 'locked' : 'throttled',
          }),
        ),
      );
    }
    await answerNoSoonerThan(startedAt, REFUSED_ANSWER_MIN_MS);
    throw locked
      ? new DomainError('locked', 'ACCOUNT_LOCKED', 'Too many failed sign-ins: this account is locked for now.', {
          retryAfterSeconds,
        })
      : new DomainError('throttled', 'LOGIN_THROTTLED', 'Too many failed sign-ins: wait before trying again.', {
          retryAfterSeconds,
        });
  }

  // Verified even when the email is unknown (against a dummy hash), so timing does not tell.
  const passwordOk = await verifyPassword(candidate?.passwordHash, input.password);
  const verifiedAt = performance.now();
  if (!candidate) {
    await answerNoSoonerThan(verifiedAt, FAILED_ANSWER_AFTER_VERIFY_MIN_MS);
    throw invalidCredentials();
  }
  if (!passwordOk) {
    const failures = attempt.clientFailures;
    const emailFailures = attempt.emailFailures;
    await withTenant(sql, candidate.companyId, async (tx) => {
      await appendAuditEvent(
        tx,
        audit(candidate.companyId, candidate.operatorId, 'auth.login_failed', {
          reason: 'bad_password',
          failures,
          email_failures: emailFailures,
        }),
      );
      if (failures === policy.lockAfterFailures) {
        await appendAuditEvent(
          tx,
          audit(candidate.companyId, candidate.operatorId, 'auth.account_locked', { failures, scope: 'client' }),
        );
      }
      if (emailFailures === policy.emailLockAfterFailures) {
        await appendAuditEvent(
          tx,
          audit(candidate.companyId, candidate.operatorId, 'auth.account_locked', {
            failures: emailFailures,
            scope: 'email',
          }),
        );
      }
    });
    await answerNoSoonerThan(verifiedAt, FAILED_ANSWER_AFTER_VERIFY_MIN_MS);
    throw invalidCredentials();
  }
  if (candidate.isBlocked || candidate.companyBlocked || !candidate.companyActive) {
    const reason = candidate.isBlocked ? 'operator_blocked' : 'company_blocked';
    await withTenant(sql, candidate.companyId, (tx) =>
      appendAuditEvent(tx, audit(candidate.companyId, candidate.operatorId, 'auth.login_failed', { reason })),
    );
    throw candidate.isBlocked
      ? new DomainError('forbidden', 'ACCOUNT_BLOCKED', 'This account is blocked.')
      : new DomainError('forbidden', 'COMPANY_BLOCKED', 'This company is blocked or inactive.');
  }

  const { token, tokenHash } = generateSessionToken();
  const expiresAt = new Date(now.getTime() + policy.sessionTtlMs);
  await withTenant(sql, candidate.companyId, async (tx) => {
    await resetLoginAttempts(tx, keys.client);
    await resetLoginAttempts(tx, keys.email);
    await recordSuccessfulLogin(tx, candidate.operatorId, now);
    await insertSession(tx, {
      id: newId('ses'),
      companyId: candidate.companyId,
      operatorId: candidate.operatorId,
      tokenHash,
      expiresAt,
      ip: context.ip,
      userAgent: input.userAgent,
    });
    await appendAuditEvent(tx, audit(candidate.companyId, candidate.operatorId, 'auth.login_succeeded', {}));
  });
  return { token, expiresAt, operatorId: candidate.operatorId, companyId: candidate.companyId };
}

export interface OperatorPrincipal {
  sessionId: string;
  operatorId: string;
  companyId: string;
  role: OperatorRole;
  isMasterCompany: boolean;
  expiresAt: Date;
}

const invalidSession = () =>
  new DomainError(
    'unauthenticated',
    'UNAUTHENTICATED',
    'Sign in first: the bearer token is missing, expired or revoked.',
  );

export async function authenticateSession(sql: Sql, token: string): Promise<OperatorPrincipal> {
  const tokenHash = sessionTokenHash(token);
  if (!tokenHash) throw invalidSession();
  const principal = await findSessionPrincipal(sql, tokenHash);
  if (!principal) throw invalidSession();
  if (principal.operatorBlocked) throw new DomainError('forbidden', 'ACCOUNT_BLOCKED', 'This account is blocked.');
  if (principal.companyBlocked || !principal.companyActive) {
    throw new DomainError('forbidden', 'COMPANY_BLOCKED', 'This company is blocked or inactive.');
  }
  return {
    sessionId: principal.sessionId,
    operatorId: principal.operatorId,
    companyId: principal.companyId,
    role: principal.role,
    isMasterCompany: principal.isMasterCompany,
    expiresAt: principal.expiresAt,
  };
}

export async function logout(sql: Sql, principal: OperatorPrincipal, context: ActorContext): Promise<void> {
  await withTenant(sql, principal.companyId, async (tx) => {
    if (await revokeSession(tx, principal.sessionId, new Date())) {
      await appendAuditEvent(tx, {
        companyId: principal.companyId,
        event: 'auth.logout',
        actor: context.actor,
        object: { type: 'session', id: principal.sessionId },
        data: {},
        ip: context.ip,
        requestId: context.requestId,
      });
    }
  });
}
