import type { Sql } from '../../db/client.ts';
import { findCompany, type Company } from '../../db/companies.ts';
import { withTenant } from '../../db/tenant.ts';
import { notFound } from '../../workflows/shared/errors.ts';
import { operatorOf } from '../auth/authenticate.ts';
import { defineRoute } from '../route.ts';

/** SPEC 2.1, field for field. */
export function companyResource(company: Company) {
  return {
    _id: company.id,
    name: company.name,
    origin: company.origin,
    backend: company.backend,
    countryCode: company.countryCode,
    maintance: company.maintance,
    is_block: company.isBlock,
    isActive: company.isActive,
    isMasterCompany: company.isMasterCompany,
    custom: company.custom,
    apis: company.apis,
    email: company.email,
    sms: company.sms,
  };
}

export function getCompanyConfig(deps: { sql: Sql }) {
  return defineRoute({
    method: 'GET',
    path: '/admin/company/config',
    operationId: 'getCompanyConfig',
    summary: 'The configuration of the requester’s company.',
    tags: ['company'],
    auth: { kind: 'operator', permission: 'company.read' },
    responses: { 200: '{ success, company }' },
    async handler(ctx) {
      const { companyId } = operatorOf(ctx);
      const company = await withTenant(deps.sql, companyId, (tx) => findCompany(tx, companyId));
      if (!company) throw notFound('company');
      ctx.body = { success: true, company: companyResource(company) };
    },
  });
}
