import { OPERATOR_ROLES, type OperatorRole } from '../../db/operators.ts';

const ALL = OPERATOR_ROLES;

/**
 * The role × operation table, enforced in one place (the route layer checks the route's
 * permission against the caller's role before its handler runs). Operators of the master company
 * hold the same roles; what they add is reach: on routes that name a company in their path they
 * may act on another company (see `crossCompany` on the route).
 */
export const PERMISSIONS = {
  'session.self': ALL,
  'company.read': ALL,
  'api_keys.read': ['owner', 'admin'],
  'api_keys.write': ['owner', 'admin'],
} as const satisfies Record<string, readonly OperatorRole[]>;

export type Permission = keyof typeof PERMISSIONS;

export const PERMISSION_DESCRIPTIONS: Record<Permission, string> = {
  'session.self': 'see and end one’s own session',
  'company.read': 'read the company’s configuration',
  'api_keys.read': 'list payment API keys',
  'api_keys.write': 'create and revoke payment API keys',
};

export function allows(role: OperatorRole, permission: Permission): boolean {
  return (PERMISSIONS[permission] as readonly OperatorRole[]).includes(role);
}

/** The table as Markdown, for the README (a test keeps the two identical). */
export function permissionsMarkdown(): string {
  const header = `| permission | ${OPERATOR_ROLES.join(' | ')} |`;
  const rule = `|---|${OPERATOR_ROLES.map(() => '---').join('|')}|`;
  const rows = (Object.keys(PERMISSIONS) as Permission[]).map(
    (permission) =>
      `| \`${permission}\`: ${PERMISSION_DESCRIPTIONS[permission]} | ${OPERATOR_ROLES.map((role) => (allows(role, permission) ? '✓' : '')).join(' | ')} |`,
  );
  return [header, rule, ...rows].join('\n');
}
