import { defineQuery, defineSignal, defineUpdate } from '@temporalio/workflow';

// The contract between the API, the settlement workflow and its activities. Names are persisted
// in workflow histories: never rename them.

export type TransferStatus = 'pending' | 'processing' | 'settled' | 'failed' | 'canceled' | 'returned';
export type Environment = 'sandbox' | 'live';

/**
 * The settlement workflow's version that new runs are started with (TransferSettlementInput.version).
 * Runs started without one (before version 4) find their version from their patch markers.
 */
export const SETTLEMENT_VERSION = 4;

/**
 * Every version the workflow code can still run. A version stays in this list for as long as a run
 * started with it may be open (up to the 60-day return window after it settles): removing it, or
 * raising SETTLEMENT_VERSION without adding the new one beside it, would make those runs fail on replay.
 */
export const SETTLEMENT_VERSIONS: readonly SettlementVersion[] = [4];
export type SettlementVersion = 4;

export interface TransferSettlementInput {
  transferId: string;
  companyId: string;
  environment: Environment;
  /**
   * The workflow version this run follows, fixed when it starts (SETTLEMENT_VERSION). A run that
   * carries it records no patch marker: the version travels in its input rather than its history.
   */
  version?: SettlementVersion;
  /** How long to wait for the rail's confirmation before polling it; default 1 hour. */
  confirmationPollMs?: number;
  /** How long a submitted payout may stay unconfirmed before it fails as expired; default 3 days. */
  confirmationTimeoutMs?: number;
  /** After settlement, how often to ask the rail whether the payment was returned; default 1 day. */
  returnPollMs?: number;
  /** How long after settlement a return is still possible; default 60 days. */
  returnWindowMs?: number;
}

export interface TransferSnapshot {
  transferId: string;
  status: TransferStatus;
  railReference: string | null;
  failureReason: string | null;
}

/** Settlement workflow ID: derived from company, environment and Idempotency-Key (DESIGN). */
export function transferWorkflowId(companyId: string, environment: Environment, idempotencyKey: string): string {
  return `transfer:${companyId}:${environment}:${idempotencyKey}`;
}

export const TRANSFER_SETTLEMENT_WORKFLOW = 'transferSettlementWorkflow';

/**
 * The failure type of a submission the rail confirmed (paid out) at once but whose settling
 * transaction failed; its details carry the PayoutSubmission. Not an unknown outcome: the workflow
 * settles it by the ledger step. Persisted in histories: never rename it.
 */
export const RAIL_CONFIRMED_SETTLEMENT_PENDING = 'RailConfirmedSettlementPending';

/**
 * Sent with update-with-start by the API (update ID = the Idempotency-Key): waits up to `waitMs`
 * for the transfer to leave `pending` (and, when it settles quickly, to settle) and returns where it is.
 */
export const awaitTransferOutcomeUpdate = defineUpdate<TransferSnapshot, [{ waitMs: number }]>('awaitTransferOutcome');

/** From the rail (a webhook, or the sandbox simulation endpoints). */
export const railConfirmedSignal = defineSignal<[]>('railConfirmed');
export const railFailedSignal = defineSignal<[{ reason: string }]>('railFailed');
export const railReturnedSignal = defineSignal<[{ reason: string }]>('railReturned');

export const transferSnapshotQuery = defineQuery<TransferSnapshot>('transferSnapshot');
