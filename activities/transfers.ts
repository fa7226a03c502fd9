import { ApplicationFailure } from '@temporalio/common';
import type { Sql, TransactionSql } from '../db/client.ts';
import {
  failRailTransfer,
  findRailTransfer,
  findRailTransferWithAccount,
  markRailTransferProcessing,
  returnRailTransfer,
  settleRailTransfer,
  type RailTransfer,
} from '../db/rails.ts';
import { withTenant } from '../db/tenant.ts';
import { newId } from '../platform/ids.ts';
import { formatMinor } from '../workflows/shared/money.ts';
import {
  RAIL_CONFIRMED_SETTLEMENT_PENDING,
  type Environment,
  type TransferSnapshot,
  type TransferStatus,
} from '../workflows/shared/transfer-settlement.ts';
import { createSandboxAchRail } from './rails/sandbox-ach.ts';
import type { PayoutCancellation, PayoutRail, PayoutRails, PayoutStatus, PayoutSubmission } from './rails/types.ts';

// Activity names are persisted in workflow histories: never rename them.

export interface TransferRef {
  transferId: string;
  companyId: string;
  environment: Environment;
}

export type SubmitTransferToRailInput = TransferRef;
export type SubmitTransferToRailResult = PayoutSubmission;

export interface SubmitAndSettleTransferResult {
  /** The rail's first answer, as submitTransferToRail returns it. */
  submission: PayoutSubmission;
  /** When the rail confirmed at once: the transfer after its settlement, in the same transaction. */
  settled?: TransferSnapshot;
}

export interface TransferReasonInput extends TransferRef {
  /** Kept on the transfer and in its status history (at most 500 characters). */
  reason: string;
}

export interface PollRailInput {
  environment: Environment;
  reference: string;
}

/** Stable types of the non-retryable failures these activities raise (business rules). */
const TRANSFER_FAILURE_TYPES = {
  notFound: 'TransferNotFound',
  externalAccountNotFound: 'ExternalAccountNotFound',
  notSubmittable: 'TransferNotSubmittable',
  railNotConfigured: 'RailNotConfigured',
  /** The rail confirmed (paid out) at once but the settling transaction failed: not an unknown outcome. */
  confirmedNotSettled: RAIL_CONFIRMED_SETTLEMENT_PENDING,
} as const;

const REASON_LENGTH_MAX = 500;

export interface TransferActivityDeps {
  sql: Sql;
  rails: PayoutRails;
}

/** The live ACH rail is a bank integration outside this machine: until one is wired, it refuses. */
export function createUnconfiguredLiveRail(): PayoutRail {
  const refuse = (): never => {
    throw ApplicationFailure.nonRetryable('live ACH rail not configured', TRANSFER_FAILURE_TYPES.railNotConfigured);
  };
  return { submit: async () => refuse(), status: async () => refuse(), cancel: async () => refuse() };
}

/** The rails a worker gets unless told otherwise: the simulated sandbox rail, and no live rail. */
export function defaultPayoutRails(): PayoutRails {
  return { sandbox: createSandboxAchRail(), live: createUnconfiguredLiveRail() };
}

function snapshotOf(transfer: RailTransfer): TransferSnapshot {
  return {
    transferId: transfer.id,
    status: transfer.status,
    railReference: transfer.railReference,
    failureReason: transfer.failureReason,
  };
}

function notFound(ref: TransferRef): ApplicationFailure {
  return ApplicationFailure.nonRetryable(
    `No ACH transfer ${ref.transferId} for company ${ref.companyId} in ${ref.environment}.`,
    TRANSFER_FAILURE_TYPES.notFound,
  );
}

function clip(reason: string): string {
  return reason.length <= REASON_LENGTH_MAX ? reason : `${reason.slice(0, REASON_LENGTH_MAX - 1)}…`;
}

export function createTransferActivities(deps: TransferActivityDeps) {
  const scopeOf = (ref: TransferRef) => ({ companyId: ref.companyId, environment: ref.environment });

  /**
   * Runs one status change in a tenant transaction and returns the snapshot after it (the change
   * returns the updated row). Idempotent: when the transfer is already past `from`, nothing changes
   * and the current snapshot is returned. When it is still in `from` but the change did not apply (a
   * concurrent writer bumped the version), a plain error makes Temporal retry with a fresh read.
   */
  async function transition(
    ref: TransferRef,
    from: readonly TransferStatus[],
    change: (tx: TransactionSql, transfer: RailTransfer) => Promise<RailTransfer | undefined>,
    known?: RailTransfer,
  ): Promise<TransferSnapshot> {
    return withTenant(deps.sql, ref.companyId, async (tx) => {
      // `known`: the transfer as read just before (by submit); a stale copy only makes the guarded
      // change miss, and the retry reads afresh.
      const transfer = known ?? (await findRailTransfer(tx, scopeOf(ref), ref.transferId));
      if (!transfer) throw notFound(ref);
      if (!from.includes(transfer.status)) return snapshotOf(transfer);
      const after = await change(tx, transfer);
      if (!after) {
        throw new Error(
          `transfer ${ref.transferId} changed concurrently (was ${transfer.status} v${transfer.version}); retrying`,
        );
      }
      return snapshotOf(after);
    });
  }

  /**
   * Hands the payout to the environment's rail (idempotent on the transfer ID at the rail) and
   * records the submission: `pending` → `processing` with the rail's reference. With
   * `settleIfConfirmed`, a payout the rail confirms at once is also settled, in the transaction that
   * records the submission, and a retry that finds it settled answers as the settling attempt did,
   * without submitting again. Refuses (non-retryable) a transfer that is missing or no longer
   * pending/processing.
   */
  async function submit(input: TransferRef, settleIfConfirmed: boolean): Promise<SubmitAndSettleTransferResult> {
    const scope = scopeOf(input);
    const loaded = await withTenant(deps.sql, input.companyId, (tx) =>
      findRailTransferWithAccount(tx, scope, input.transferId),
    );
    if (!loaded) throw notFound(input);
    const { transfer, account } = loaded;
    if (settleIfConfirmed && transfer.status === 'settled' && transfer.railReference !== null) {
      return { submission: { reference: transfer.railReference, outcome: 'confirmed' }, settled: snapshotOf(transfer) };
    }
    if (!account) {
      throw ApplicationFailure.nonRetryable(
        `Bank account ${transfer.destinationExternalAccountId} of transfer ${transfer.id} not found.`,
        TRANSFER_FAILURE_TYPES.externalAccountNotFound,
      );
    }
    if (transfer.status !== 'pending' && transfer.status !== 'processing') {
      throw ApplicationFailure.nonRetryable(
        `Transfer ${transfer.id} is ${transfer.status}; it is not submitted to the rail.`,
        TRANSFER_FAILURE_TYPES.notSubmittable,
      );
    }
    const answer = await deps.rails[input.environment].submit({
      transferId: transfer.id,
      amount: formatMinor(transfer.outAmount, transfer.outCurrency),
      currency: transfer.outCurrency,
      destination: {
        externalAccountId: account.id,
        routingNumber: account.routingNumber,
        accountLast4: account.accountLast4,
      },
      sourceAmountMinor: transfer.amount,
      sourceCurrency: transfer.currency,
    });
    const submission: PayoutSubmission =
      answer.reason === undefined
        ? { reference: answer.reference, outcome: answer.outcome }
        : { reference: answer.reference, outcome: answer.outcome, reason: clip(answer.reason) };
    if (settleIfConfirmed && answer.outcome === 'confirmed') {
      let settled: TransferSnapshot;
      try {
        settled = await transition(
          input,
          ['pending', 'processing'],
          async (tx, current) => {
            const processing =
              current.status === 'pending' ? await markRailTransferProcessing(tx, current, answer.reference) : current;
            return processing && settleRailTransfer(tx, processing, () => newId('sys'));
          },
          transfer,
        );
      } catch (error) {
        // The rail has paid out: that is known, whatever the settling transaction did. Record the
        // submission on its own (processing, with the reference) and say so with a failure the
        // workflow tells apart from an unknown outcome: it then settles with the ledger's retries,
        // where treating it as unknown would let the confirmation window expire and void the hold of
        // a payout the bank has made. Should this write fail too, the plain error is retried.
        await transition(input, ['pending'], (tx, current) =>
          markRailTransferProcessing(tx, current, answer.reference),
        );
        throw ApplicationFailure.create({
          message: `the rail confirmed ${answer.reference} but settling failed: ${error instanceof Error ? error.message : String(error)}`,
          type: TRANSFER_FAILURE_TYPES.confirmedNotSettled,
          nonRetryable: true,
          details: [submission],
        });
      }
      return { submission, settled };
    }
    await transition(
      input,
      ['pending'],
      (tx, current) => markRailTransferProcessing(tx, current, answer.reference),
      transfer,
    );
    return { submission };
  }

  return {
    /** Submits the payout to its rail and records the submission (see `submit`); version 1 and 2 runs. */
    submitTransferToRail: async (input: SubmitTransferToRailInput): Promise<SubmitTransferToRailResult> =>
      (await submit(input, false)).submission,

    /**
     * Version 3 runs: submitTransferToRail, and settleTransfer in the same transaction when the rail
     * confirms at once (the sandbox's ordinary payout): one local activity and two transactions
     * instead of two and three.
     */
    submitAndSettleTransfer: async (input: TransferRef): Promise<SubmitAndSettleTransferResult> => submit(input, true),

    /** The rail paid out: `processing` → `settled`, the hold posted through fees and FX. */
    settleTransfer: async (input: TransferRef): Promise<TransferSnapshot> =>
      transition(input, ['processing'], (tx, transfer) => settleRailTransfer(tx, transfer, () => newId('sys'))),

    /** The rail refused, or never confirmed: `pending`/`processing` → `failed`, the hold voided. */
    failTransfer: async (input: TransferReasonInput): Promise<TransferSnapshot> =>
      transition(input, ['pending', 'processing'], (tx, transfer) =>
        failRailTransfer(tx, transfer, clip(input.reason)),
      ),

    /** The bank sent a settled payout back: `settled` → `returned`, every posted entry reversed. */
    returnTransfer: async (input: TransferReasonInput): Promise<TransferSnapshot> =>
      transition(input, ['settled'], (tx, transfer) =>
        returnRailTransfer(tx, transfer, clip(input.reason), () => newId('sys')),
      ),

    /**
     * Asks the rail to stop a payout it has not confirmed (the confirmation window ran out), so that
     * its hold is voided only for money that did not leave: `canceled`, `failed` (the rail had
     * refused it) or `confirmed` (too late: it was paid, and must settle). A transfer no longer
     * pending or processing is not asked about again: its status is the answer. Changes nothing here.
     */
    cancelRailPayout: async (input: TransferRef): Promise<PayoutCancellation> => {
      const transfer = await withTenant(deps.sql, input.companyId, (tx) =>
        findRailTransfer(tx, scopeOf(input), input.transferId),
      );
      if (!transfer) throw notFound(input);
      if (transfer.status === 'settled' || transfer.status === 'returned') return { outcome: 'confirmed' };
      if (transfer.status === 'failed') return { outcome: 'failed', reason: transfer.failureReason ?? 'failed' };
      if (transfer.status === 'canceled') return { outcome: 'canceled' };
      const answer = await deps.rails[input.environment].cancel({
        transferId: transfer.id,
        ...(transfer.railReference === null ? {} : { reference: transfer.railReference }),
      });
      return answer.reason === undefined
        ? { outcome: answer.outcome }
        : { outcome: answer.outcome, reason: clip(answer.reason) };
    },

    /** Asks the rail where a submitted payout is. Read-only. */
    pollRail: async (input: PollRailInput): Promise<PayoutStatus> => {
      const status = await deps.rails[input.environment].status(input.reference);
      return status.reason === undefined
        ? { outcome: status.outcome }
        : { outcome: status.outcome, reason: clip(status.reason) };
    },
  };
}

export type TransferActivities = ReturnType<typeof createTransferActivities>;
