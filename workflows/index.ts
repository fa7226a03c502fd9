// Workflow bundle entry: every workflow type the worker serves is exported here.
export { dataRetentionWorkflow } from './data-retention.ts';
export { idempotencyPurgeWorkflow } from './idempotency-purge.ts';
export { transferSettlementWorkflow } from './transfer-settlement.ts';
export { outboxRelayWorkflow } from './outbox-relay.ts';
export { webhookDeliveryWorkflow, webhookResendWorkflow } from './webhook-delivery.ts';
