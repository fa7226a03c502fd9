import type { Sql, TransactionSql } from './client.ts';

export const OPERATOR_ROLES = ['owner', 'admin', 'compliance', 'support_manager', 'support_agent', 'viewer'] as const;
export type OperatorRole = (typeof OPERATOR_ROLES)[number];

export interface Operator {
  id: string;
  companyId: string;
  email: string;
  firstName: string;
  lastName: string;
  role: OperatorRole;
  isBlocked: boolean;
  failedLogins: number;
  lockedUntil: Date | null;
  lastLoginAt: Date | null;
  createdAt: Date;
}

interface OperatorRow {
  id: string;
  company_id: string;
  email: string;
  first_name: string;
  last_name: string;
  role: OperatorRole;
  is_blocked: boolean;
  failed_logins: number;
  locked_until: Date | null;
  last_login_at: Date | null;
  created_at: Date;
}

function toOperator(row: OperatorRow): Operator {
  return {
    id: row.id,
    companyId: row.company_id,
    email: row.email,
    firstName: row.first_name,
    lastName: row.last_name,
    role: row.role,
    isBlocked: row.is_blocked,
    failedLogins: row.failed_logins,
    lockedUntil: row.locked_until,
    lastLoginAt: row.last_login_at,
    createdAt: row.created_at,
  };
}

const COLUMNS =
  'id, company_id, email, first_name, last_name, role, is_blocked, failed_logins, locked_until, last_login_at, created_at';

export interface NewOperator {
  id: string;
  companyId: string;
  email: string;
  firstName?: string;
  lastName?: string;
  role: OperatorRole;
  passwordHash: string;
}

export async function insertOperator(tx: TransactionSql | Sql, operator: NewOperator): Promise<Operator> {
  const [row] = await tx<OperatorRow[]>`
    insert into operators (id, company_id, email, first_name, last_name, role, password_hash)
    values (${operator.id}, ${operator.companyId}, ${operator.email.toLowerCase()}, ${operator.firstName ?? ''},
            ${operator.lastName ?? ''}, ${operator.role}, ${operator.passwordHash})
    returning ${tx.unsafe(COLUMNS)}`;
  return toOperator(row!);
}

export async function findOperator(tx: TransactionSql | Sql, id: string): Promise<Operator | undefined> {
  const [row] = await tx<OperatorRow[]>`select ${tx.unsafe(COLUMNS)} from operators where id = ${id}`;
  return row ? toOperator(row) : undefined;
}

export async function findOperatorByEmail(tx: TransactionSql | Sql, email: string): Promise<Operator | undefined> {
  const [row] = await tx<
    OperatorRow[]
  >`select ${tx.unsafe(COLUMNS)} from operators where email = ${email.toLowerCase()}`;
  return row ? toOperator(row) : undefined;
}

export interface LoginCandidate {
  operatorId: string;
  companyId: string;
  passwordHash: string;
  role: OperatorRole;
  isBlocked: boolean;
  failedLogins: number;
  lockedUntil: Date | null;
  companyBlocked: boolean;
  companyActive: boolean;
}

/** Cross-company lookup for sign-in, through the narrow database function made for it. */
export async function findLoginCandidate(sql: Sql, email: string): Promise<LoginCandidate | undefined> {
  const [row] = await sql<
    {
      operator_id: string;
      company_id: string;
      password_hash: string;
      role: OperatorRole;
      is_blocked: boolean;
      failed_logins: number;
      locked_until: Date | null;
      company_blocked: boolean;
      company_active: boolean;
    }[]
  >`select * from auth_operator_for_login(${email})`;
  if (!row) return undefined;
  return {
    operatorId: row.operator_id,
    companyId: row.company_id,
    passwordHash: row.password_hash,
    role: row.role,
    isBlocked: row.is_blocked,
    failedLogins: row.failed_logins,
    lockedUntil: row.locked_until,
    companyBlocked: row.company_blocked,
    companyActive: row.company_active,
  };
}

export async function recordSuccessfulLogin(tx: TransactionSql, operatorId: string, at: Date): Promise<void> {
  await tx`update operators set failed_logins = 0, locked_until = null, last_login_at = ${at} where id = ${operatorId}`;
}

export interface LoginAttemptClaim {
  /** False while sign-in for this email is throttled or locked: the attempt was not counted. */
  claimed: boolean;
  /** Consecutive failures, this attempt included when claimed (a success resets them). */
  failures: number;
  lockedUntil: Date | null;
}

/**
 * Counts a sign-in attempt for `email` (registered or not) as a failure before its password is
 * checked, atomically with the throttle check (migration 00013), so concurrent attempts cannot all
 * pass one check. `resetLoginAttempts` undoes it when the password was right.
 */
export async function claimLoginAttempt(
  sql: Sql,
  email: string,
  policy: { throttleAfterFailures: number; throttleBaseMs: number; lockAfterFailures: number; lockMs: number },
): Promise<LoginAttemptClaim> {
  const [row] = await sql<{ claimed: boolean; failures: number; locked_until: Date | null }[]>`
    select * from auth_claim_login_attempt(${email}, ${policy.throttleAfterFailures}::integer,
      ${policy.throttleBaseMs}::integer, ${policy.lockAfterFailures}::integer, ${policy.lockMs}::integer)`;
  return { claimed: row!.claimed, failures: row!.failures, lockedUntil: row!.locked_until };
}

export interface LoginAttemptPairClaim {
  /** False while either count blocks sign-in: then neither was counted. */
  claimed: boolean;
  /** Which count blocked it. */
  blockedBy: 'client' | 'email' | null;
  /** Consecutive failures of each count, this attempt included when claimed. */
  clientFailures: number;
  emailFailures: number;
  /** When the blocking count's throttle or lock ends. */
  lockedUntil: Date | null;
}

/**
 * Both sign-in counts in one call (migration 00017): the email from this client, and the email from
 * every client. Both are checked before either is counted, under their rows' locks.
 */
export async function claimLoginAttemptPair(
  sql: Sql,
  keys: { client: string; email: string },
  policy: {
    throttleBaseMs: number;
    lockMs: number;
    client: { throttleAfterFailures: number; lockAfterFailures: number };
    email: { throttleAfterFailures: number; lockAfterFailures: number };
  },
): Promise<LoginAttemptPairClaim> {
  const [row] = await sql<
    {
      claimed: boolean;
      blocked_by: 'client' | 'email' | null;
      client_failures: number;
      email_failures: number;
      locked_until: Date | null;
    }[]
  >`
    select * from auth_claim_login_attempt_pair(${keys.client}, ${keys.email}, ${policy.throttleBaseMs}::integer,
      ${policy.lockMs}::integer, ${policy.client.throttleAfterFailures}::integer,
      ${policy.client.lockAfterFailures}::integer, ${policy.email.throttleAfterFailures}::integer,
      ${policy.email.lockAfterFailures}::integer)`;
  return {
    claimed: row!.claimed,
    blockedBy: row!.blocked_by,
    clientFailures: row!.client_failures,
    emailFailures: row!.email_failures,
    lockedUntil: row!.locked_until,
  };
}

export async function resetLoginAttempts(tx: TransactionSql, email: string): Promise<void> {
  await tx`select auth_reset_login_attempts(${email})`;
}
