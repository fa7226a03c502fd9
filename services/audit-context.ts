/** Who did something and from where, carried into every audit event a service writes. */
export interface ActorContext {
  actor: { type: 'operator' | 'api_key' | 'system' | 'anonymous'; id?: string };
  ip?: string;
  requestId?: string;
}

export const SYSTEM_ACTOR: ActorContext = { actor: { type: 'system' } };
