import type { Client } from '@temporalio/client';
import type { Sql } from '../db/client.ts';
import { createOutboxRelayActivities } from './outbox-relay.ts';
import { RETENTION_POLICIES } from '../db/retention.ts';
import { createDataRetentionActivities } from './data-retention.ts';
import { createIdempotencyActivities } from './idempotency.ts';
import type { PayoutRails } from './rails/types.ts';
import { createTransferActivities, defaultPayoutRails } from './transfers.ts';
import { createWebhookActivities, type WebhookDeliveryLimits } from './webhooks/deliver.ts';
import { createWebhookSender, type WebhookSender } from './webhooks/http.ts';
import { createTransferSigner } from '../services/signing.ts';
import type { TransferSigner } from '../api/v1/resources.ts';

export interface ActivityDeps {
  sql: Sql;
  /** Payout rails per environment; default: the simulated sandbox ACH rail and no live rail. */
  rails?: PayoutRails;
  /** The Temporal client the outbox relay starts stranded flows with (given lazily by the worker). */
  temporal?: () => Client;
  /** Webhook delivery: the HTTP sender (default: SSRF-filtering, private targets refused), the signer of transfer objects, limits. */
  webhooks?: { sender?: WebhookSender; signer?: TransferSigner; limits?: Partial<WebhookDeliveryLimits> };
}

/** Every activity the worker registers, built from injected dependencies. */
export function createActivities(deps: ActivityDeps) {
  return {
    ...createDataRetentionActivities({ sql: deps.sql, policies: RETENTION_POLICIES }),
    ...createIdempotencyActivities({ sql: deps.sql }),
    ...createTransferActivities({ sql: deps.sql, rails: deps.rails ?? defaultPayoutRails() }),
    ...createWebhookActivities({
      sql: deps.sql,
      sender: deps.webhooks?.sender ?? createWebhookSender({ allowPrivate: false }),
      signer: deps.webhooks?.signer ?? createTransferSigner({ sql: deps.sql }),
      ...(deps.webhooks?.limits ? { limits: deps.webhooks.limits } : {}),
    }),
    ...createOutboxRelayActivities({
      sql: deps.sql,
      temporal:
        deps.temporal ??
        (() => {
          throw new Error('the outbox relay needs a Temporal client (ActivityDeps.temporal)');
        }),
    }),
  };
}

export type Activities = ReturnType<typeof createActivities>;
