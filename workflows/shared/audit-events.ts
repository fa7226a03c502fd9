import { z } from 'zod';

/**
 * The closed list of security audit event names. It mirrors the rows seeded into
 * `audit_event_types` by migration 00002 exactly (a test compares the two), and every name is
 * persisted in the hash-chained audit trail: add names through a migration and here together,
 * never rename or remove one.
 */
export const AUDIT_EVENTS = [
  'auth.login_succeeded',
  'auth.login_failed',
  'auth.account_locked',
  'auth.logout',
  'company.created',
  'company.verified',
  'company.config_changed',
  'company.module_visibility_changed',
  'operator.created',
  'operator.updated',
  'user.blocked',
  'user.unblocked',
  'api_key.created',
  'api_key.revoked',
  'kyc.decision_recorded',
  'kyc.alert_assigned',
  'workspace.ownership_transferred',
  'security.ip_blocked',
  'security.ip_reputation_rechecked',
] as const;

export type AuditEventName = (typeof AUDIT_EVENTS)[number];

export const ZAuditEventName = z.enum(AUDIT_EVENTS);

/** Who caused an audit event; mirrors the `audit_events.actor_type` check constraint. */
export const AUDIT_ACTOR_TYPES = ['operator', 'api_key', 'system', 'anonymous'] as const;

export type AuditActorType = (typeof AUDIT_ACTOR_TYPES)[number];

export const ZAuditActorType = z.enum(AUDIT_ACTOR_TYPES);
