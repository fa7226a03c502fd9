import type { Sql, TransactionSql } from '../db/client.ts';
import { appendAuditEvent } from '../db/audit.ts';
import { findCompany, insertCompany, markCompanyVerified, type Company } from '../db/companies.ts';
import { withSystemScope, withTenant } from '../db/tenant.ts';
import { newId } from '../platform/ids.ts';
import { DomainError, notFound } from '../workflows/shared/errors.ts';
import type { ActorContext } from './audit-context.ts';

/** Creates a company (tenant). The master company can exist once; the database enforces it too. */
export async function createCompany(sql: Sql, input: NewCompanyInput, context: ActorContext): Promise<Company> {
  return withSystemScope(sql, (tx) => createCompanyInTx(tx, newId('co'), input, context));
}

export interface NewCompanyInput {
  name: string;
  isMasterCompany?: boolean;
  countryCode?: string;
  origin?: string;
}

/** Inside a transaction scoped to `id` (or system scope), so it composes with the tenant's first rows. */
export async function createCompanyInTx(
  tx: TransactionSql,
  id: string,
  input: NewCompanyInput,
  context: ActorContext,
): Promise<Company> {
  const company = await insertCompany(tx, { id, ...input }).catch((error: unknown) => {
    if ((error as { constraint_name?: string }).constraint_name === 'companies_one_master') {
      throw new DomainError('conflict', 'MASTER_COMPANY_EXISTS', 'A master company already exists.');
    }
    throw error;
  });
  await appendAuditEvent(tx, {
    companyId: id,
    event: 'company.created',
    actor: context.actor,
    object: { type: 'company', id },
    data: { name: input.name, isMasterCompany: input.isMasterCompany ?? false },
    ip: context.ip,
    requestId: context.requestId,
  });
  return company;
}

/** Marks a company verified, which allows live API keys. Idempotent. */
export async function verifyCompany(sql: Sql, companyId: string, context: ActorContext): Promise<Company> {
  return withTenant(sql, companyId, async (tx) => {
    const before = await findCompany(tx, companyId);
    if (!before) throw notFound('company');
    // The update decides: of two concurrent verifications only one changes the row and is audited.
    const company = await markCompanyVerified(tx, companyId, new Date());
    if (!company) return (await findCompany(tx, companyId))!;
    await appendAuditEvent(tx, {
      companyId,
      event: 'company.verified',
      actor: context.actor,
      object: { type: 'company', id: companyId },
      data: { previousStatus: before.verificationStatus },
      ip: context.ip,
      requestId: context.requestId,
    });
    return company;
  });
}
