import { createHash } from 'node:crypto';
import { WithStartWorkflowOperation, type Client } from '@temporalio/client';
import { WorkflowIdConflictPolicy } from '@temporalio/common';
import type { Sql, TransactionSql } from '../db/client.ts';
import type { Environment, LedgerTransfer } from '../db/ledger.ts';
import { insertOutboxEntry, markOutboxDispatched } from '../db/outbox.ts';
import { createRailTransfer, findPayoutContext, systemAccount, type RailTransfer } from '../db/rails.ts';
import { withTenant } from '../db/tenant.ts';
import type { Logger } from '../platform/logger.ts';
import { newId } from '../platform/ids.ts';
import { DomainError } from '../workflows/shared/errors.ts';
import { parseDecimalAmount, type AmountError } from '../workflows/shared/money.ts';
import { SEARCH_ATTRIBUTES } from '../workflows/shared/search-attributes.ts';
import { TASK_QUEUES } from '../workflows/shared/task-queues.ts';
import {
  awaitTransferOutcomeUpdate,
  SETTLEMENT_VERSION,
  TRANSFER_SETTLEMENT_WORKFLOW,
  transferWorkflowId,
  type TransferSettlementInput,
  type TransferSnapshot,
} from '../workflows/shared/transfer-settlement.ts';
import { quotePayout, type FxRateSource } from './quotes.ts';

export interface RailTransferRequest {
  source: { currency: string; rail: 'stablecoin'; amount: string };
  destination: { currency: string; rail: 'ach'; account: string };
}

export interface RailTransferDeps {
  sql: Sql;
  temporal: Client;
  fxRates: FxRateSource;
  logger: Logger;
  /** How long the request waits for the settlement workflow's first outcome (sandbox: settled). */
  outcomeWaitMs: number;
}

const AMOUNT_ERRORS: Record<AmountError, string> = {
  format: 'source.amount is a plain decimal string such as "100.50"',
  scale: 'source.amount has more decimal places than its currency allows',
  zero: 'source.amount must be greater than zero',
  too_large: 'source.amount exceeds the per-transfer limit',
  currency: 'source.currency is not supported',
};

/**
 * A payout as the API answers it: the row as this request wrote (or found) it, at the status the
 * settlement workflow reported. Without `version` and `updatedAt`, which only the row itself knows
 * once the workflow has moved it.
 */
export type PayoutTransfer = Omit<LedgerTransfer, 'version' | 'updatedAt'>;

function payoutTransferOf(transfer: RailTransfer, outcome: TransferSnapshot | undefined): PayoutTransfer {
  return {
    id: transfer.id,
    companyId: transfer.companyId,
    environment: transfer.environment,
    idempotencyKey: transfer.idempotencyKey,
    rail: 'ach',
    status: outcome ? outcome.status : transfer.status,
    amount: transfer.amount,
    currency: transfer.currency,
    sourceAccountId: transfer.sourceAccountId,
    destinationAccountId: null,
    payout: {
      externalAccountId: transfer.destinationExternalAccountId,
      outAmount: transfer.outAmount,
      outCurrency: transfer.outCurrency,
      feeAmount: transfer.feeAmount,
      fxRate: transfer.fxRate,
    },
    failureReason: outcome ? outcome.failureReason : transfer.failureReason,
    workflowId: transfer.workflowId,
    createdAt: transfer.createdAt,
  };
}

/** The workflow's own ID, hashed where a key could be long: IDs stay short and printable. */
export function settlementWorkflowId(companyId: string, environment: Environment, idempotencyKey: string): string {
  const safe = /^[A-Za-z0-9._:-]{1,100}$/.test(idempotencyKey)
    ? idempotencyKey
    : `sha256-${createHash('sha256').update(idempotencyKey).digest('hex')}`;
  return transferWorkflowId(companyId, environment, safe);
}

/** What the route's idempotency layer does inside the payout's transactions (createPayoutTransfer). */
export interface PayoutIdempotencySteps {
  /** Claims the Idempotency-Key: the hold transaction's first statement. */
  claim?: (tx: TransactionSql) => Promise<void>;
  /** Stores the answer under the key, in the transaction that marks the outbox row dispatched. */
  record?: (tx: TransactionSql, transfer: PayoutTransfer) => Promise<void>;
}

/**
 * Shape A: a stablecoin payout over ACH. The transfer, its hold on the wallet and an outbox row are
 * written in one transaction (insufficient funds is known before anything leaves); then the
 * settlement workflow is started with update-with-start under an ID derived from the key, so a retry
 * joins the same run, and its answer says where the payout stands. If Temporal cannot be reached the
 * transfer stays `pending` and the outbox relay starts the same workflow later: the 201 is durable
 * either way.
 *
 * The route's idempotency steps ride in these transactions (`steps`): `claim` is the first statement
 * of the hold's transaction (the key is claimed with the hold, not in a transaction of its own), and
 * `record` runs, with the answer, in the transaction that marks the outbox row dispatched (the
 * response is stored under the key there).
 */
export async function createPayoutTransfer(
  deps: RailTransferDeps,
  scope: { companyId: string; environment: Environment },
  request: RailTransferRequest,
  idempotencyKey: string,
  steps: PayoutIdempotencySteps = {},
): Promise<PayoutTransfer> {
  const { claim, record } = steps;
  const amount = parseDecimalAmount(request.source.amount, request.source.currency);
  if (!amount.ok) {
    const code = amount.error === 'currency' ? 'UNSUPPORTED_CURRENCY' : 'INVALID_AMOUNT';
    throw new DomainError('invalid', code, AMOUNT_ERRORS[amount.error]);
  }
  const workflowId = settlementWorkflowId(scope.companyId, scope.environment, idempotencyKey);
  const input: TransferSettlementInput = {
    transferId: '',
    companyId: scope.companyId,
    environment: scope.environment,
    version: SETTLEMENT_VERSION,
  };
  // FX rates come from outside the machine and the quote needs nothing the transaction reads: it is
  // taken before the transaction, which then never waits on a rate provider. A refused quote is
  // reported where it always was, after the destination and wallet checks.
  const quoted = await quotePayout(
    deps.fxRates,
    request.source.currency,
    amount.minor,
    request.destination.currency,
  ).then(
    (quote) => ({ ok: true as const, quote }),
    (error: unknown) => ({ ok: false as const, error }),
  );

  const transfer = await withTenant(deps.sql, scope.companyId, async (tx) => {
    // The reads go out behind the claim without waiting for its answer (postgres.js pipelines them
    // on the transaction's connection); a claim refused (the key exists) aborts the transaction
    // before anything is written.
    const claimed = claim?.(tx);
    const [, context] = await Promise.all([
      claimed,
      findPayoutContext(tx, scope, {
        idempotencyKey,
        externalAccountId: request.destination.account,
        currency: request.source.currency,
      }),
    ]);
    // A retry after a crash: the transfer and its hold exist already.
    if (context.existing) return context.existing;
    const { bank, wallet } = context;
    if (!bank) {
      throw new DomainError(
        'not_found',
        'ACCOUNT_NOT_FOUND',
        `No destination account ${request.destination.account} in this environment.`,
        {
          field: 'destination',
        },
      );
    }
    if (bank.currency !== request.destination.currency) {
      throw new DomainError(
        'unprocessable',
        'CURRENCY_MISMATCH',
        `The bank account is in ${bank.currency}, not ${request.destination.currency}.`,
      );
    }
    if (!wallet) {
      throw new DomainError(
        'unprocessable',
        'NO_FUNDING_WALLET',
        `This company has no ${request.source.currency} wallet in this environment.`,
      );
    }
    if (!quoted.ok) throw quoted.error;
    const { quote } = quoted;
    const clearing =
      context.clearing ??
      (await systemAccount(tx, scope, request.source.currency, 'rail_clearing', () => newId('sys')));
    const id = newId('tr');
    // The outbox row first: the hold below locks the company's wallet and clearing account, and the
    // commit follows it directly (an overdraft aborts the whole transaction, outbox row included).
    // Not awaited before the transfer's statement: both go out in one write.
    const outboxed = insertOutboxEntry(tx, {
      companyId: scope.companyId,
      workflowType: TRANSFER_SETTLEMENT_WORKFLOW,
      workflowId,
      taskQueue: TASK_QUEUES.core,
      payload: { ...input, transferId: id },
    });
    try {
      const [, created] = await Promise.all([
        outboxed,
        createRailTransfer(tx, {
          id,
          holdId: newId('hold'),
          ...scope,
          idempotencyKey,
          workflowId,
          amount: amount.minor,
          currency: request.source.currency,
          sourceAccountId: wallet,
          clearingAccountId: clearing,
          destinationExternalAccountId: bank.id,
          outAmount: quote.outMinor,
          outCurrency: request.destination.currency,
          feeAmount: quote.feeMinor,
          fxRate: quote.rate,
        }),
      ]);
      return created;
    } catch (error) {
      if ((error as { constraint_name?: string }).constraint_name === 'ledger_accounts_no_overdraft') {
        throw new DomainError(
          'unprocessable',
          'INSUFFICIENT_FUNDS',
          `The ${request.source.currency} wallet does not have enough available balance.`,
        );
      }
      throw error;
    }
  });

  let outcome: TransferSnapshot | undefined;
  try {
    outcome = await startSettlement(
      deps.temporal,
      workflowId,
      { ...input, transferId: transfer.id },
      idempotencyKey,
      deps.outcomeWaitMs,
    );
  } catch (error) {
    deps.logger.warn({ err: error, workflowId }, 'settlement workflow not started now; the outbox relay will start it');
  }
  // Without an outcome (not started now) the answer is the transfer as committed (or found) above:
  // `pending` for a new one, and the outbox row stays for the relay.
  const answer = payoutTransferOf(transfer, outcome);
  if (outcome === undefined && record === undefined) return answer;
  const dispatchedAt = new Date();
  const finish = withTenant(deps.sql, scope.companyId, async (tx) => {
    const marked = outcome === undefined ? undefined : markOutboxDispatched(tx, workflowId, dispatchedAt);
    // The response is stored without waiting for the mark's answer: one transaction for both.
    const recorded = record?.(tx, answer);
    await Promise.all([marked, recorded]);
  });
  if (record !== undefined) await finish;
  else {
    // Nothing to record: a lost mark only means that the relay starts (joins) the run again later.
    await finish.catch((error: unknown) => {
      deps.logger.warn({ err: error, workflowId }, 'outbox row not marked dispatched; the relay will join the run');
    });
  }
  return answer;
}

/** Starts (or joins) the settlement workflow and returns its first outcome (awaitTransferOutcome). */
async function startSettlement(
  temporal: Client,
  workflowId: string,
  input: TransferSettlementInput,
  updateId: string,
  waitMs: number,
): Promise<TransferSnapshot> {
  // Bounded: when Temporal is unreachable the request answers `pending` promptly instead of waiting
  // out the client's retries; the outbox relay starts the workflow later.
  const deadline = Date.now() + waitMs + START_MARGIN_MS;
  return temporal.connection.withDeadline(deadline, () =>
    temporal.workflow.executeUpdateWithStart(awaitTransferOutcomeUpdate, {
      args: [{ waitMs }],
      updateId,
      startWorkflowOperation: new WithStartWorkflowOperation(TRANSFER_SETTLEMENT_WORKFLOW, {
        workflowId,
        taskQueue: TASK_QUEUES.core,
        args: [input],
        workflowIdConflictPolicy: WorkflowIdConflictPolicy.USE_EXISTING,
        typedSearchAttributes: [
          { key: SEARCH_ATTRIBUTES.companyId, value: input.companyId },
          { key: SEARCH_ATTRIBUTES.objectId, value: input.transferId },
          { key: SEARCH_ATTRIBUTES.objectStatus, value: 'pending' },
          { key: SEARCH_ATTRIBUTES.environment, value: input.environment },
        ],
      }),
    }),
  );
}

const START_MARGIN_MS = 2_000;
