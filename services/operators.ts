import type { Sql, TransactionSql } from '../db/client.ts';
import { appendAuditEvent } from '../db/audit.ts';
import { insertOperator, type Operator, type OperatorRole } from '../db/operators.ts';
import { withTenant } from '../db/tenant.ts';
import { newId } from '../platform/ids.ts';
import { DomainError } from '../workflows/shared/errors.ts';
import type { ActorContext } from './audit-context.ts';
import { hashPassword, PASSWORD_MAX_LENGTH, PASSWORD_MIN_LENGTH } from './credentials.ts';

export interface NewOperatorInput {
  companyId: string;
  email: string;
  password: string;
  role: OperatorRole;
  firstName?: string;
  lastName?: string;
}

export async function createOperator(sql: Sql, input: NewOperatorInput, context: ActorContext): Promise<Operator> {
  const passwordHash = await hashOperatorPassword(input.password);
  return withTenant(sql, input.companyId, (tx) => createOperatorInTx(tx, input, passwordHash, context));
}

/** Checks the password rules and hashes it (slow: call it before opening a transaction). */
export async function hashOperatorPassword(password: string): Promise<string> {
  if (password.length < PASSWORD_MIN_LENGTH || password.length > PASSWORD_MAX_LENGTH) {
    throw new DomainError(
      'invalid',
      'WEAK_PASSWORD',
      `Passwords have ${PASSWORD_MIN_LENGTH} to ${PASSWORD_MAX_LENGTH} characters.`,
    );
  }
  return hashPassword(password);
}

export async function createOperatorInTx(
  tx: TransactionSql,
  input: NewOperatorInput,
  passwordHash: string,
  context: ActorContext,
): Promise<Operator> {
  const { password, ...fields } = input; // the plaintext never reaches the data layer
  const operator = await insertOperator(tx, { id: newId('op'), ...fields, passwordHash }).catch((error: unknown) => {
    if ((error as { constraint_name?: string }).constraint_name === 'operators_email_unique') {
      throw new DomainError('conflict', 'EMAIL_TAKEN', 'An operator with this email already exists.');
    }
    throw error;
  });
  await appendAuditEvent(tx, {
    companyId: input.companyId,
    event: 'operator.created',
    actor: context.actor,
    object: { type: 'operator', id: operator.id },
    data: { email: operator.email, role: operator.role },
    ip: context.ip,
    requestId: context.requestId,
  });
  return operator;
}
