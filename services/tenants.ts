import type { Sql } from '../db/client.ts';
import type { Company } from '../db/companies.ts';
import type { Operator } from '../db/operators.ts';
import { withTenant } from '../db/tenant.ts';
import { newId } from '../platform/ids.ts';
import type { ActorContext } from './audit-context.ts';
import { createApiKeyInTx } from './api-keys.ts';
import { createCompanyInTx } from './companies.ts';
import { generatePassword } from './credentials.ts';
import { createOperatorInTx, hashOperatorPassword } from './operators.ts';
import { provisionSandboxLedger, type SandboxLedger } from './sandbox.ts';

/** The name of the sandbox key every company gets at once (and bootstrap issues again when it must). */
export const DEFAULT_SANDBOX_KEY_NAME = 'Default sandbox key';

export interface ProvisionedTenant {
  company: Company;
  owner: Operator;
  /** Generated when none was given; shown once. */
  ownerPassword: string;
  /** Shown once. */
  sandboxApiKey: string;
  /** The preloaded sandbox wallets and account. */
  sandbox: SandboxLedger;
}

/**
 * A new tenant ready to use, in one transaction: the company, its owner operator, a sandbox API key
 * and preloaded sandbox balances. Either all of it exists afterwards or none of it.
 */
export async function provisionTenant(
  sql: Sql,
  input: { name: string; ownerEmail: string; ownerPassword?: string; isMasterCompany?: boolean },
  context: ActorContext,
): Promise<ProvisionedTenant> {
  const ownerPassword = input.ownerPassword ?? generatePassword();
  const passwordHash = await hashOperatorPassword(ownerPassword);
  const companyId = newId('co');
  return withTenant(sql, companyId, async (tx) => {
    const company = await createCompanyInTx(
      tx,
      companyId,
      { name: input.name, isMasterCompany: input.isMasterCompany ?? false },
      context,
    );
    const owner = await createOperatorInTx(
      tx,
      { companyId, email: input.ownerEmail, password: ownerPassword, role: 'owner' },
      passwordHash,
      context,
    );
    const { secret } = await createApiKeyInTx(
      tx,
      { companyId, environment: 'sandbox', name: DEFAULT_SANDBOX_KEY_NAME, createdBy: owner.id },
      context,
    );
    const sandbox = await provisionSandboxLedger(tx, companyId);
    return { company, owner, ownerPassword, sandboxApiKey: secret, sandbox };
  });
}
