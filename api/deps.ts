import type { Sql } from '../db/client.ts';
import type { LedgerWrite } from '../db/ledger-batch.ts';
import type { Logger } from '../platform/logger.ts';
import type { LoginPolicy } from '../services/auth.ts';
import type { IdempotencyRunner } from './route.ts';
import type { TransferSigner } from './v1/resources.ts';
import type { RailTransferDeps } from '../services/rail-transfers.ts';
import type { WebhookEndpointPolicy } from '../services/webhook-endpoints.ts';

/** Everything the HTTP app needs, injected: createApp reads no environment and opens no socket. */
export interface AppDeps {
  logger: Logger;
  /** Application pool: connects as `payments_app`, so row-level security applies to every query. */
  sql: Sql;
  /** Named dependency checks for /readyz; each resolves true when the dependency answers. */
  readiness: Record<string, () => Promise<boolean>>;
  limits: {
    bodyLimitBytes: number;
  };
  /**
   * Whether a proxy in front sets X-Forwarded-For (TRUST_PROXY): then the client's address (sign-in
   * counts, audit, sessions) is the last address it appended; otherwise the socket's peer.
   */
  trustProxy?: boolean;
  loginPolicy: LoginPolicy;
  idempotency: IdempotencyRunner;
  /** Writes Shape B transfers, batching those that arrive while the database is busy. */
  ledger: LedgerWrite;
  /** Signs every transfer object the API returns; also serves the public keys. */
  signer: TransferSigner & { jwks(): Promise<{ keys: unknown[] }> };
  /** External rails: the Temporal client that starts settlement workflows, FX rates, wait limits. */
  rails: Omit<RailTransferDeps, 'sql'>;
  /** Webhook endpoint registration: SSRF policy (ALLOW_PRIVATE_WEBHOOK_URLS) and limits. */
  webhooks: WebhookEndpointPolicy;
}

declare module 'koa' {
  interface DefaultState {
    requestId: string;
    logger: Logger;
  }
}
