import type { Sql, TransactionSql } from './client.ts';
import type { OperatorRole } from './operators.ts';

export interface SessionPrincipal {
  sessionId: string;
  operatorId: string;
  companyId: string;
  role: OperatorRole;
  expiresAt: Date;
  operatorBlocked: boolean;
  companyBlocked: boolean;
  companyActive: boolean;
  isMasterCompany: boolean;
}

export async function insertSession(
  tx: TransactionSql,
  session: {
    id: string;
    companyId: string;
    operatorId: string;
    tokenHash: Buffer;
    expiresAt: Date;
    ip?: string;
    userAgent?: string;
  },
): Promise<void> {
  await tx`
    insert into admin_sessions (id, company_id, operator_id, token_hash, expires_at, ip, user_agent)
    values (${session.id}, ${session.companyId}, ${session.operatorId}, ${session.tokenHash}, ${session.expiresAt},
            ${session.ip ?? null}, ${session.userAgent?.slice(0, 500) ?? null})`;
}

/** Cross-company lookup of a live session by its token hash, through the narrow database function. */
export async function findSessionPrincipal(sql: Sql, tokenHash: Buffer): Promise<SessionPrincipal | undefined> {
  const [row] = await sql<
    {
      session_id: string;
      operator_id: string;
      company_id: string;
      role: OperatorRole;
      expires_at: Date;
      operator_blocked: boolean;
      company_blocked: boolean;
      company_active: boolean;
      is_master_company: boolean;
    }[]
  >`select * from auth_session(${tokenHash})`;
  if (!row) return undefined;
  return {
    sessionId: row.session_id,
    operatorId: row.operator_id,
    companyId: row.company_id,
    role: row.role,
    expiresAt: row.expires_at,
    operatorBlocked: row.operator_blocked,
    companyBlocked: row.company_blocked,
    companyActive: row.company_active,
    isMasterCompany: row.is_master_company,
  };
}

export async function revokeSession(tx: TransactionSql, sessionId: string, at: Date): Promise<boolean> {
  const rows =
    await tx`update admin_sessions set revoked_at = ${at} where id = ${sessionId} and revoked_at is null returning id`;
  return rows.length > 0;
}
