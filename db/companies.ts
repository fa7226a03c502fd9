import type { Sql, TransactionSql } from './client.ts';

export type VerificationStatus = 'unverified' | 'pending' | 'verified' | 'rejected';

export interface Company {
  id: string;
  name: string;
  origin: string;
  backend: string;
  countryCode: string;
  maintance: boolean;
  isBlock: boolean;
  isActive: boolean;
  isMasterCompany: boolean;
  custom: Record<string, unknown>;
  apis: Record<string, unknown>;
  email: Record<string, unknown>;
  sms: Record<string, unknown>;
  verificationStatus: VerificationStatus;
  verifiedAt: Date | null;
  createdAt: Date;
  updatedAt: Date;
}

interface CompanyRow {
  id: string;
  name: string;
  origin: string;
  backend: string;
  country_code: string;
  maintance: boolean;
  is_block: boolean;
  is_active: boolean;
  is_master_company: boolean;
  custom: Record<string, unknown>;
  apis: Record<string, unknown>;
  email: Record<string, unknown>;
  sms: Record<string, unknown>;
  verification_status: VerificationStatus;
  verified_at: Date | null;
  created_at: Date;
  updated_at: Date;
}

function toCompany(row: CompanyRow): Company {
  return {
    id: row.id,
    name: row.name,
    origin: row.origin,
    backend: row.backend,
    countryCode: row.country_code,
    maintance: row.maintance,
    isBlock: row.is_block,
    isActive: row.is_active,
    isMasterCompany: row.is_master_company,
    custom: row.custom,
    apis: row.apis,
    email: row.email,
    sms: row.sms,
    verificationStatus: row.verification_status,
    verifiedAt: row.verified_at,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}

export interface NewCompany {
  id: string;
  name: string;
  isMasterCompany?: boolean;
  origin?: string;
  countryCode?: string;
}

export async function insertCompany(tx: TransactionSql | Sql, company: NewCompany): Promise<Company> {
  const [row] = await tx<CompanyRow[]>`
    insert into companies (id, name, is_master_company, origin, country_code)
    values (${company.id}, ${company.name}, ${company.isMasterCompany ?? false}, ${company.origin ?? ''},
            ${company.countryCode ?? ''})
    returning *`;
  return toCompany(row!);
}

export async function findCompany(tx: TransactionSql | Sql, id: string): Promise<Company | undefined> {
  const [row] = await tx<CompanyRow[]>`select * from companies where id = ${id}`;
  return row ? toCompany(row) : undefined;
}

export async function findMasterCompany(tx: TransactionSql | Sql): Promise<Company | undefined> {
  const [row] = await tx<CompanyRow[]>`select * from companies where is_master_company`;
  return row ? toCompany(row) : undefined;
}

/**
 * Marks a company verified. Changes only a company not verified yet and returns undefined otherwise,
 * so of repeated or concurrent verifications exactly one changes the row (and is audited).
 */
export async function markCompanyVerified(
  tx: TransactionSql | Sql,
  id: string,
  at: Date,
): Promise<Company | undefined> {
  const [row] = await tx<CompanyRow[]>`
    update companies
    set verification_status = 'verified', verified_at = ${at}, updated_at = ${at}
    where id = ${id} and verification_status <> 'verified'
    returning *`;
  return row ? toCompany(row) : undefined;
}
