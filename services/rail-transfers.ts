import { createHash } from 'node:crypto';
import { WithStartWorkflowOperation, type Client } from '@temporalio/client';
import {
  WorkflowExecutionAlreadyStartedError,
  WorkflowIdConflictPolicy,
  WorkflowIdReusePolicy,
} from '@temporalio/common';
import type { Sql, TransactionSql } from '../db/client.ts';
import type { Environment, LedgerTransfer } from '../db/ledger.ts';
import { insertOutboxEntry, markOutboxDispatched } from '../db/outbox.ts';
import { createRailTransfer, findPayoutContext, systemAccount, type RailTransfer } from '../db/rails.ts';
import { withTenant } from '../db/tenant.ts';
import type { Logger } from '../platform/logger.ts';
import { newId } from '../platform/ids.ts';
import { DomainError } from '../workflows/shared/errors.ts';
import { CURRENCIES, currencyInfo, parseDecimalAmount, type AmountError } from '../workflows/shared/money.ts';
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
  // The workflow answered for another transfer (two transfers under one workflow ID): its outcome
  // says nothing about this one, and copying it would answer with a status this transfer never had.
  if (outcome !== undefined && outcome.transferId !== transfer.id) {
    throw new Error(
      `settlement workflow ${transfer.workflowId} answered for transfer ${outcome.transferId}, not ${transfer.id}`,
    );
  }
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

const HASHED_KEY_PREFIX = 'sha256-';

/**
 * The workflow's own ID, hashed where a key could be long: IDs stay short and printable. One key,
 * one ID, and never one ID for two keys: a key is used as it is only when it could not be the hashed
 * form of another (it does not start with `sha256-`); every other key, `sha256-…` ones included, is
 * hashed.
 */
export function settlementWorkflowId(companyId: string, environment: Environment, idempotencyKey: string): string {
  const safe =
    /^[A-Za-z0-9._:-]{1,100}$/.test(idempotencyKey) && !idempotencyKey.startsWith(HASHED_KEY_PREFIX)
      ? idempotencyKey
      : `${HASHED_KEY_PREFIX}${createHash('sha256').update(idempotencyKey).digest('hex')}`;
  return transferWorkflowId(companyId, environment, safe);
}

/**
 * Whether a request is the payout a transfer already made under its key: the same source amount and
 * currency to the same bank account in the same currency, as the transfer stores them.
 */
function samePayout(transfer: RailTransfer, request: RailTransferRequest, amountMinor: bigint): boolean {
  return (
    transfer.amount === amountMinor &&
    transfer.currency === request.source.currency &&
    transfer.destinationExternalAccountId === request.destination.account &&
    transfer.outCurrency === request.destination.currency
  );
}

/** A transfer already holds the Idempotency-Key (as Shape B answers, services/transfers.ts). */
function keyUsed(): DomainError {
  return new DomainError('conflict', 'IDEMPOTENCY_KEY_USED', 'A transfer with this Idempotency-Key already exists.');
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
  if (currencyInfo(request.source.currency)?.kind !== 'stablecoin') {
    const stablecoins = Object.values(CURRENCIES).filter((currency) => currency.kind === 'stablecoin');
    throw new DomainError(
      'invalid',
      'UNSUPPORTED_CURRENCY',
      `source.currency is ${request.source.currency}; the stablecoin rail pays out ${stablecoins.map((currency) => currency.code).join(', ')}.`,
    );
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
    // A retry after a crash: the transfer and its hold exist already. Only for the same payout: once
    // the key's record is gone (purged, or released after an error that came after the hold's
    // commit) the key alone does not say that this is a retry, so the request is compared with
    // what the transfer stores.
    if (context.existing) {
      if (!samePayout(context.existing, request, amount.minor)) throw keyUsed();
      return context.existing;
    }
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
      const constraint = (error as { constraint_name?: string }).constraint_name;
      if (constraint === 'ledger_accounts_no_overdraft') {
        throw new DomainError(
          'unprocessable',
          'INSUFFICIENT_FUNDS',
          `The ${request.source.currency} wallet does not have enough available balance.`,
        );
      }
      // Another kind of transfer (a Shape B ledger transfer) holds the key, and its record is gone.
      if (constraint === 'transfers_idempotency_unique') throw keyUsed();
      throw error;
    }
  });

  // The ID the transfer was created with (a retry finds the one its first request stored).
  const { workflowId: settlementId } = transfer;
  let outcome: TransferSnapshot | undefined;
  // Whether the workflow has been handed to Temporal: its outbox row is then done with.
  let dispatched = false;
  try {
    outcome = await startSettlement(
      deps.temporal,
      settlementId,
      { ...input, transferId: transfer.id },
      idempotencyKey,
      deps.outcomeWaitMs,
    );
    dispatched = true;
  } catch (error) {
    if (error instanceof WorkflowExecutionAlreadyStartedError) {
      // The settlement's run has closed (a retry once the key's record is gone): it is not run
      // again, and the transfer found above is where it left it.
      dispatched = true;
      deps.logger.info({ workflowId: settlementId }, 'settlement workflow already closed; answering from the transfer');
    } else {
      deps.logger.warn(
        { err: error, workflowId: settlementId },
        'settlement workflow not started now; the outbox relay will start it',
      );
    }
  }
  // Without an outcome (not started now, or closed already) the answer is the transfer as committed
  // (or found) above: `pending` for a new one, and the outbox row stays for the relay unless the
  // workflow has been started.
  const answer = payoutTransferOf(transfer, outcome);
  if (!dispatched && record === undefined) return answer;
  const dispatchedAt = new Date();
  const finish = withTenant(deps.sql, scope.companyId, async (tx) => {
    const marked = dispatched ? markOutboxDispatched(tx, settlementId, dispatchedAt) : undefined;
    // The response is stored without waiting for the mark's answer: one transaction for both.
    const recorded = record?.(tx, answer);
    await Promise.all([marked, recorded]);
  });
  if (record !== undefined) await finish;
  else {
    // Nothing to record: a lost mark only means that the relay starts (joins) the run again later.
    await finish.catch((error: unknown) => {
      deps.logger.warn(
        { err: error, workflowId: settlementId },
        'outbox row not marked dispatched; the relay will join the run',
      );
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
        // A running settlement is joined; a closed one is not started again (as startOnce does), the
        // start is refused with WorkflowExecutionAlreadyStartedError.
        workflowIdConflictPolicy: WorkflowIdConflictPolicy.USE_EXISTING,
        workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
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
