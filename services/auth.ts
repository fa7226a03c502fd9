import type { Sql } from '../db/client.ts';
import { appendAuditEvent } from '../db/audit.ts';
import { findLoginCandidate, recordFailedLogin, recordSuccessfulLogin, type OperatorRole } from '../db/operators.ts';
import { findSessionPrincipal, insertSession, revokeSession } from '../db/sessions.ts';
import { withTenant } from '../db/tenant.ts';
import { newId } from '../platform/ids.ts';
import { DomainError } from '../workflows/shared/errors.ts';
import type { ActorContext } from './audit-context.ts';
import { generateSessionToken, sessionTokenHash, verifyPassword } from './credentials.ts';

export interface LoginPolicy {
  sessionTtlMs: number;
  /** From this many consecutive failures on, each further failure blocks sign-in for a doubling delay. */
  throttleAfterFailures: number;
  throttleBaseMs: number;
  /** At this many consecutive failures the account locks for lockMs. */
  lockAfterFailures: number;
  lockMs: number;
}

export const DEFAULT_LOGIN_POLICY: LoginPolicy = {
  sessionTtlMs: 12 * 60 * 60 * 1000,
  throttleAfterFailures: 5,
  throttleBaseMs: 1000,
  lockAfterFailures: 10,
  lockMs: 60 * 60 * 1000,
};

/** When sign-in is blocked after `failures` consecutive failures at `now` (null: not blocked). */
export function lockoutUntil(policy: LoginPolicy, failures: number, now: Date): Date | null {
  if (failures >= policy.lockAfterFailures) return new Date(now.getTime() + policy.lockMs);
  if (failures >= policy.throttleAfterFailures) {
    return new Date(now.getTime() + policy.throttleBaseMs * 2 ** (failures - policy.throttleAfterFailures));
  }
  return null;
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

  if (candidate?.lockedUntil && candidate.lockedUntil > now) {
    const retryAfterSeconds = Math.ceil((candidate.lockedUntil.getTime() - now.getTime()) / 1000);
    const locked = candidate.failedLogins >= policy.lockAfterFailures;
    await withTenant(sql, candidate.companyId, (tx) =>
      appendAuditEvent(
        tx,
        audit(candidate.companyId, candidate.operatorId, 'auth.login_failed', {
          reason: locked ? 'locked' : 'throttled',
        }),
      ),
    );
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
  if (!candidate) throw invalidCredentials();
  if (!passwordOk) {
    await withTenant(sql, candidate.companyId, async (tx) => {
      const failures = await recordFailedLogin(tx, candidate.operatorId, (count) => lockoutUntil(policy, count, now));
      await appendAuditEvent(
        tx,
        audit(candidate.companyId, candidate.operatorId, 'auth.login_failed', { reason: 'bad_password', failures }),
      );
      if (failures === policy.lockAfterFailures) {
        await appendAuditEvent(
          tx,
          audit(candidate.companyId, candidate.operatorId, 'auth.account_locked', { failures }),
        );
      }
    });
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
