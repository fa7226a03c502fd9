import type { ApiKeyPrincipal } from '../../services/api-keys.ts';
import type { OperatorPrincipal } from '../../services/auth.ts';

export type Principal = ({ kind: 'operator' } & OperatorPrincipal) | ({ kind: 'api_key' } & ApiKeyPrincipal);

declare module 'koa' {
  interface DefaultState {
    auth?: Principal;
  }
}
