import {
  ActivityFailure,
  allHandlersFinished,
  ApplicationFailure,
  condition,
  log,
  patched,
  sleep,
  TimeoutFailure,
  proxyActivities,
  proxyLocalActivities,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import type { TransferActivities } from '../activities/transfers.ts';
import type { PayoutCancellation, PayoutStatus, PayoutSubmission } from '../activities/rails/types.ts';
import { DAY_MS, HOUR_MS, SECOND_MS } from './shared/durations.ts';
import { SEARCH_ATTRIBUTES } from './shared/search-attributes.ts';
import {
  awaitTransferOutcomeUpdate,
  RAIL_CONFIRMED_SETTLEMENT_PENDING,
  railConfirmedSignal,
  railFailedSignal,
  railReturnedSignal,
  SETTLEMENT_VERSIONS,
  type SettlementVersion,
  transferSnapshotQuery,
  type TransferSettlementInput,
  type TransferSnapshot,
} from './shared/transfer-settlement.ts';

export const CONFIRMATION_POLL_MS_DEFAULT = HOUR_MS;
export const CONFIRMATION_TIMEOUT_MS_DEFAULT = 3 * DAY_MS;
export const RETURN_POLL_MS_DEFAULT = DAY_MS;
export const RETURN_WINDOW_MS_DEFAULT = 60 * DAY_MS;
/** The longest an awaitTransferOutcome update holds the caller (an HTTP request waits on it). */
export const AWAIT_OUTCOME_MAX_MS = 10 * SECOND_MS;
/**
 * Upper bound on rail polls per phase (confirmation, return window). A poll interval too short for
 * its window is stretched to window / POLLS_PER_PHASE_MAX, so the loops stay bounded whatever the input.
 */
export const POLLS_PER_PHASE_MAX = 400;
export const EXPIRED_REASON = 'expired: no confirmation from the rail';
const REASON_LENGTH_MAX = 500;
const TIMING_MS_MAX = 365 * DAY_MS;

// Submitting is idempotent at the rail (keyed by the transfer ID), so an attempt whose answer was lost
// is simply made again. When every attempt fails transiently the rail may still hold the payout: the
// confirmation loop keeps re-submitting until it gets an answer or the payout expires.
const SUBMIT_OPTIONS = {
  startToCloseTimeout: '30 seconds',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute', maximumAttempts: 10 },
} as const;

// Ledger writes: each is one short, idempotent transaction. They must happen eventually: a run that
// gave up would leave the hold pending for good (a refused payout's money locked, a paid-out one never
// debited, a returned one never credited), and nothing could restart it (its ID is never reused and
// its outbox row is done). So they retry until they succeed (unlimited attempts, every 5 minutes at
// most: about 80 history events an hour of outage for a local activity); only a non-retryable
// failure (the transfer does not exist) ends the run. The attempt count is visible to operators.
const LEDGER_OPTIONS = {
  startToCloseTimeout: '30 seconds',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '5 minutes' },
} as const;

/**
 * Version 2 (patch `settlement-local-steps`) runs the submission and the ledger writes as local
 * activities: each is one short idempotent call, so it runs inside the workflow task that asked for
 * it and is recorded as a marker, instead of a round trip through an activity task queue (three
 * history events, a task dispatch and a new workflow task each). The quick path (submit, settle,
 * answer the update, start the return-window timer) is then one workflow task, which is what makes
 * Shape A cost about what a bare one-local-activity workflow costs on the same Temporal server.
 * Every retry beyond the first waits on a durable workflow timer (`localRetryThreshold` near zero),
 * not in the worker's memory, so a backoff survives a worker crash and time-skipping tests skip it.
 * Runs started before version 2 replay with the remote activities they were started with.
 */
const LOCAL_STEPS_PATCH = 'settlement-local-steps';
/**
 * Version 3 (patch `settlement-submit-settles`, which implies version 2): the submission settles a
 * payout the rail confirms at once in the same local activity and transaction
 * (submitAndSettleTransfer), so the quick path is one local activity, one status upsert and two
 * database transactions instead of two, two and three. Its runs record this patch only.
 */
const SUBMIT_SETTLES_PATCH = 'settlement-submit-settles';
/**
 * Cancel before expiring (patch `settlement-cancel-on-expiry`, asked only on that path, so the quick
 * path records nothing): when the confirmation window runs out, the rail is asked to stop the payout
 * before its hold is voided. Before, the hold was voided on the window alone, and a bank that paid
 * late would have sent money whose hold the customer could spend again. The rail's answer decides:
 * canceled or failed, the transfer fails; confirmed (too late), it settles. Runs that expired before
 * this replay as they ran.
 */
const CANCEL_ON_EXPIRY_PATCH = 'settlement-cancel-on-expiry';
const LOCAL_RETRY_THRESHOLD = '1 millisecond';
const remoteSubmit = proxyActivities<TransferActivities>(SUBMIT_OPTIONS);
const remoteLedger = proxyActivities<TransferActivities>(LEDGER_OPTIONS);
const localSubmit = proxyLocalActivities<TransferActivities>({
  ...SUBMIT_OPTIONS,
  localRetryThreshold: LOCAL_RETRY_THRESHOLD,
});
const localLedger = proxyLocalActivities<TransferActivities>({
  ...LEDGER_OPTIONS,
  localRetryThreshold: LOCAL_RETRY_THRESHOLD,
});

// A poll is best effort: a failed one is logged and the next interval polls again.
const { pollRail } = proxyActivities<TransferActivities>({
  startToCloseTimeout: '30 seconds',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '30 seconds', maximumAttempts: 5 },
});

type Verdict = { outcome: 'confirmed' } | { outcome: 'failed'; reason: string };
type Phase =
  'submitting' | 'confirming' | 'canceling' | 'settling' | 'failing' | 'watching_returns' | 'returning' | 'done';

function positiveMs(name: string, value: number | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  if (!Number.isInteger(value) || value < 1 || value > TIMING_MS_MAX) {
    throw ApplicationFailure.nonRetryable(
      `${name} must be an integer between 1 and ${TIMING_MS_MAX} ms.`,
      'InvalidSettlementInput',
    );
  }
  return value;
}

/** Stretches the poll interval so that one window needs at most POLLS_PER_PHASE_MAX polls. */
function pollInterval(pollMs: number, windowMs: number): number {
  return Math.max(pollMs, Math.ceil(windowMs / POLLS_PER_PHASE_MAX));
}

function reasonFrom(payload: { reason?: unknown } | undefined, fallback: string): string {
  const reason = typeof payload?.reason === 'string' ? payload.reason.trim() : '';
  return (reason || fallback).slice(0, REASON_LENGTH_MAX);
}

/**
 * The failure an activity call ended with, unwrapped, or undefined when the error is not an
 * activity's (a bug, a cancellation: those propagate). A remote activity's failure comes wrapped in an
 * ActivityFailure; a local activity's (TypeScript SDK) is thrown as the ApplicationFailure or
 * TimeoutFailure itself.
 */
function activityFailureCause(error: unknown): Error | undefined {
  if (error instanceof ActivityFailure) return error.cause ?? error;
  return error instanceof ApplicationFailure || error instanceof TimeoutFailure ? error : undefined;
}

/** The submission a confirmed-but-not-settled failure carries, or undefined for any other failure. */
function confirmedNotSettled(cause: Error): PayoutSubmission | undefined {
  if (!(cause instanceof ApplicationFailure) || cause.type !== RAIL_CONFIRMED_SETTLEMENT_PENDING) return undefined;
  const [submission] = (cause.details ?? []) as (PayoutSubmission | undefined)[];
  return submission?.outcome === 'confirmed' && typeof submission.reference === 'string' ? submission : undefined;
}

function isRefusal(cause: Error): boolean {
  return cause instanceof ApplicationFailure && cause.nonRetryable === true;
}

/**
 * Settles one external-rail payout (DESIGN contract 4): submit to the rail, then settle, fail or
 * expire on the rail's answer; after settlement, watch the return window and reverse a return.
 *
 * A saga over the hold the API placed when it created the transfer: its undo, failTransfer (which
 * voids the hold), is registered with the submission, the step whose outcome can be ambiguous, and
 * runs whenever the payout does not go through.
 *
 * No continue-as-new: each loop is bounded by POLLS_PER_PHASE_MAX. A poll whose answer comes costs
 * about 11 history events (timer, activity, workflow tasks); a round whose submission outcome stays
 * unknown about 60 (a marker per local-activity attempt, its backoff timers). With the defaults
 * (hourly for 3 days, daily for 60 days) a calm run stays under 1,500 events and a rail outage for
 * the whole confirmation window about 4,300, inside Temporal's history warning threshold (10,240)
 * and far from its limit (51,200). The shortest poll intervals the input allows (window / 400) could
 * pass the warning threshold in an outage (about 24,000); the API never sets them. A database
 * outage adds about 80 events an hour while a ledger write retries (LEDGER_OPTIONS).
 */
export async function transferSettlementWorkflow(input: TransferSettlementInput): Promise<TransferSnapshot> {
  if (!input?.transferId || !input.companyId || (input.environment !== 'sandbox' && input.environment !== 'live')) {
    throw ApplicationFailure.nonRetryable(
      'transferId, companyId and environment are required.',
      'InvalidSettlementInput',
    );
  }
  const version: unknown = input.version;
  if (version !== undefined && !SETTLEMENT_VERSIONS.includes(version as SettlementVersion)) {
    // A version this code does not know comes from a newer API (deployed before this worker) or was
    // recorded before a rollback: a plain Error fails the workflow task, which is retried until a
    // worker that knows the version takes it. Failing the run instead would leave the transfer
    // pending with its hold for good: its workflow ID is never started again.
    throw new Error(
      `version must be one of ${SETTLEMENT_VERSIONS.join(', ')} or absent, not ${JSON.stringify(version)}: ` +
        'waiting for a worker that runs it',
    );
  }
  const ref = { transferId: input.transferId, companyId: input.companyId, environment: input.environment };
  // Version 4: version 3's steps, with the version in the run's input (`version: 4`) instead of a
  // patch. A patch costs every new run a marker event and a TemporalChangeVersion upsert (one more
  // visibility write on the server) for as long as it stays in the code; the input costs nothing.
  // Runs started without a version (an outbox row written before version 4, an older run) decide by
  // their patches, newest first: a run records only the newest, and an older run's history answers each.
  // Every version in the input (4 on) submits and settles in one step; older runs ask their patch.
  const submitSettlesVersion = version !== undefined || patched(SUBMIT_SETTLES_PATCH);
  const localStepsVersion = submitSettlesVersion || patched(LOCAL_STEPS_PATCH);
  const { submitTransferToRail, submitAndSettleTransfer } = localStepsVersion ? localSubmit : remoteSubmit;
  const { settleTransfer, failTransfer, returnTransfer } = localStepsVersion ? localLedger : remoteLedger;
  // Until the rail answers: a payout's hold cannot be released on a guess (LEDGER_OPTIONS' retries).
  const { cancelRailPayout } = localLedger;
  const confirmationTimeoutMs = positiveMs(
    'confirmationTimeoutMs',
    input.confirmationTimeoutMs,
    CONFIRMATION_TIMEOUT_MS_DEFAULT,
  );
  const confirmationPollMs = pollInterval(
    positiveMs('confirmationPollMs', input.confirmationPollMs, CONFIRMATION_POLL_MS_DEFAULT),
    confirmationTimeoutMs,
  );
  const returnWindowMs = positiveMs('returnWindowMs', input.returnWindowMs, RETURN_WINDOW_MS_DEFAULT);
  /** The longest wait between two asks of a rail that gave no usable answer after the window. */
  const retryWaitMaxMs = Math.max(DAY_MS, confirmationPollMs);
  /** The next wait of a loop that may not give up: doubled, to retryWaitMaxMs at most. */
  const longerWait = (waitMs: number) => Math.min(2 * waitMs, retryWaitMaxMs);
  const returnPollMs = pollInterval(
    positiveMs('returnPollMs', input.returnPollMs, RETURN_POLL_MS_DEFAULT),
    returnWindowMs,
  );

  let snapshot: TransferSnapshot = {
    transferId: ref.transferId,
    status: 'pending',
    railReference: null,
    failureReason: null,
  };
  let phase: Phase = 'submitting';
  /** Set once the rail's first answer has been applied (processing, settled or failed). */
  let firstOutcomeApplied = false;
  /** The rail's answer on a payout it accepted as pending: from a signal or a poll. */
  let verdict: Verdict | undefined;
  let returned: { reason: string } | undefined;

  // Version 2 upserts only what differs from the run's current search attributes: a run the API
  // started already carries all four (set by update-with-start), so its first upsert is skipped.
  const publishStatus = () => {
    const wanted = [
      { key: SEARCH_ATTRIBUTES.companyId, value: ref.companyId },
      { key: SEARCH_ATTRIBUTES.objectId, value: ref.transferId },
      { key: SEARCH_ATTRIBUTES.environment, value: ref.environment },
      { key: SEARCH_ATTRIBUTES.objectStatus, value: snapshot.status },
    ];
    const current = workflowInfo().typedSearchAttributes;
    const changed = localStepsVersion ? wanted.filter(({ key, value }) => current.get(key) !== value) : wanted;
    if (changed.length > 0) upsertSearchAttributes(changed);
  };
  const adopt = (next: TransferSnapshot) => {
    const changed = next.status !== snapshot.status;
    snapshot = next;
    if (changed) publishStatus();
  };
  publishStatus();

  setHandler(transferSnapshotQuery, () => snapshot);
  setHandler(
    awaitTransferOutcomeUpdate,
    async ({ waitMs }) => {
      const outcomeKnown = () => firstOutcomeApplied && snapshot.status !== 'pending';
      const timeoutMs = Math.min(waitMs, AWAIT_OUTCOME_MAX_MS);
      if (!outcomeKnown() && timeoutMs > 0) await condition(outcomeKnown, timeoutMs);
      return snapshot;
    },
    {
      validator: (options: { waitMs: number } | undefined) => {
        const waitMs: unknown = options?.waitMs;
        if (typeof waitMs !== 'number' || !Number.isFinite(waitMs) || waitMs < 0) {
          throw new Error('waitMs must be a non-negative number of milliseconds');
        }
      },
    },
  );
  const acceptVerdict = (signal: string, next: Verdict) => {
    if ((phase === 'submitting' || phase === 'confirming') && verdict === undefined) {
      verdict = next;
      log.info('rail verdict received', { signal, transferId: ref.transferId, outcome: next.outcome });
    } else {
      log.warn('signal ignored: it makes no sense in this state', {
        signal,
        transferId: ref.transferId,
        status: snapshot.status,
        phase,
      });
    }
  };
  setHandler(railConfirmedSignal, () => acceptVerdict('railConfirmed', { outcome: 'confirmed' }));
  setHandler(railFailedSignal, (payload) =>
    acceptVerdict('railFailed', { outcome: 'failed', reason: reasonFrom(payload, 'failed by the rail') }),
  );
  setHandler(railReturnedSignal, (payload) => {
    if ((phase === 'settling' || phase === 'watching_returns') && returned === undefined) {
      returned = { reason: reasonFrom(payload, 'returned by the bank') };
      log.info('rail return received', { transferId: ref.transferId });
    } else {
      log.warn('signal ignored: it makes no sense in this state', {
        signal: 'railReturned',
        transferId: ref.transferId,
        status: snapshot.status,
        phase,
      });
    }
  });

  const finish = async (): Promise<TransferSnapshot> => {
    phase = 'done';
    firstOutcomeApplied = true;
    await condition(allHandlersFinished);
    log.info('transfer settlement finished', { ...snapshot });
    return snapshot;
  };

  // The saga's undo, registered with the step it undoes: voids the hold. Idempotent, so it is also
  // what runs when the transfer turns out to be past the point of failing (it returns it unchanged).
  const undoSubmission = async (reason: string) => {
    phase = 'failing';
    adopt(await failTransfer({ ...ref, reason }));
  };

  /** One submission; undefined when the answer is unknown (every attempt failed transiently). */
  let refused: string | undefined;
  /** Version 3: the transfer as the submission settled it (the rail confirmed at once). */
  let settledBySubmission: TransferSnapshot | undefined;
  const submit = async (): Promise<PayoutSubmission | undefined> => {
    try {
      if (!submitSettlesVersion) return await submitTransferToRail(ref);
      const { submission, settled } = await submitAndSettleTransfer(ref);
      settledBySubmission = settled;
      return submission;
    } catch (error) {
      const cause = activityFailureCause(error);
      if (cause === undefined) throw error;
      // The rail confirmed and the submission is recorded (processing): settle by the ledger step.
      const confirmed = confirmedNotSettled(cause);
      if (confirmed !== undefined) return confirmed;
      if (isRefusal(cause)) {
        refused = `submission refused: ${cause.message}`;
        return undefined;
      }
      log.warn('rail submission outcome unknown; submitting again at the next poll', {
        transferId: ref.transferId,
        error: cause.message,
      });
      return undefined;
    }
  };
  const poll = async (reference: string): Promise<PayoutStatus | undefined> => {
    try {
      return await pollRail({ environment: ref.environment, reference });
    } catch (error) {
      if (!(error instanceof ActivityFailure)) throw error;
      log.warn('rail poll failed; polling again at the next interval', {
        transferId: ref.transferId,
        error: error.message,
      });
      return undefined;
    }
  };

  /** The confirmation window ran out: the rail's answer to a cancellation decides (see CANCEL_ON_EXPIRY_PATCH). */
  const cancelAtRail = async (): Promise<Verdict> => {
    phase = 'canceling';
    let cancellation: PayoutCancellation | undefined;
    // LEDGER_OPTIONS retry every transient failure; a non-retryable one (the rail refused the
    // question itself) is no answer either: the payout may still be made, so the hold stays and the
    // rail is asked again later. Failing the run would strand the hold (nothing restarts it).
    for (let waitMs = confirmationPollMs; cancellation === undefined; waitMs = longerWait(waitMs)) {
      try {
        cancellation = await cancelRailPayout(ref);
      } catch (error) {
        const cause = activityFailureCause(error);
        if (cause === undefined || (cause instanceof ApplicationFailure && cause.type === 'TransferNotFound'))
          throw error;
        log.warn('rail gave no answer to a cancellation; asking again later', {
          transferId: ref.transferId,
          error: cause.message,
        });
        await sleep(waitMs);
      }
    }
    log.info('rail asked to cancel an unconfirmed payout', { transferId: ref.transferId, ...cancellation });
    if (cancellation.outcome === 'confirmed') return { outcome: 'confirmed' };
    if (cancellation.outcome === 'failed') {
      return { outcome: 'failed', reason: reasonFrom(cancellation, 'failed by the rail') };
    }
    return { outcome: 'failed', reason: EXPIRED_REASON };
  };

  // 1. Submit, and wait for the rail's verdict (at once, by signal, or by polling) until the
  //    confirmation times out.
  const confirmationDeadline = Date.now() + confirmationTimeoutMs;
  let submission: PayoutSubmission | undefined;
  let decided: Verdict | undefined;
  for (let round = 0; round <= POLLS_PER_PHASE_MAX + 1 && decided === undefined; round++) {
    if (submission === undefined) {
      submission = await submit();
      if (refused !== undefined) {
        await undoSubmission(refused);
        return finish();
      }
      if (submission !== undefined) {
        phase = 'confirming';
        if (submission.outcome === 'pending') {
          adopt({ ...snapshot, status: 'processing', railReference: submission.reference });
          firstOutcomeApplied = true;
        } else {
          // The rail's own synchronous answer wins over any signal that raced it. The update keeps
          // waiting (firstOutcomeApplied stays false) until the answer is applied. Settled by the
          // submission (version 3), the run goes straight to settled: no processing upsert.
          if (settledBySubmission === undefined) {
            adopt({ ...snapshot, status: 'processing', railReference: submission.reference });
          }
          decided =
            submission.outcome === 'confirmed'
              ? { outcome: 'confirmed' }
              : { outcome: 'failed', reason: reasonFrom(submission, 'refused by the rail') };
          break;
        }
      }
    }
    if (submission !== undefined && verdict !== undefined) {
      decided = verdict;
      break;
    }
    const remainingMs = confirmationDeadline - Date.now();
    if (remainingMs <= 0) break;
    // A signal only decides once the submission is recorded (the transfer is processing, with its
    // reference); until then the next round submits again and learns the answer from the rail.
    if (
      await condition(
        () => submission !== undefined && verdict !== undefined,
        Math.min(confirmationPollMs, remainingMs),
      )
    ) {
      continue;
    }
    if (submission === undefined) continue;
    const status = await poll(submission.reference);
    // A payout the rail reports returned before it confirmed never settled here: it simply failed.
    if (status?.outcome === 'confirmed') verdict ??= { outcome: 'confirmed' };
    else if (status?.outcome === 'failed' || status?.outcome === 'returned') {
      verdict ??= { outcome: 'failed', reason: reasonFrom(status, `${status.outcome} by the rail`) };
    }
  }
  if (decided === undefined) {
    if (patched(CANCEL_ON_EXPIRY_PATCH)) {
      decided = await cancelAtRail();
      if (decided.outcome === 'confirmed') {
        // Paid after all: the submission must be on record (processing, with the rail's reference)
        // before the ledger settles it. The rail answers a repeated submission as before.
        // Unbounded (the hold of a paid payout is never voided), so it backs off: from one poll
        // interval, doubling, to a day at most; an hourly loop would grow the history for good.
        for (let waitMs = confirmationPollMs; submission === undefined; waitMs = longerWait(waitMs)) {
          submission = await submit();
          if (settledBySubmission === undefined && submission?.outcome === 'confirmed') {
            adopt({ ...snapshot, status: 'processing', railReference: submission.reference });
          }
          if (submission === undefined) await sleep(waitMs);
        }
      }
    } else {
      decided = { outcome: 'failed', reason: EXPIRED_REASON };
    }
  }

  if (decided.outcome === 'failed') {
    await undoSubmission(decided.reason);
    return finish();
  }

  // 2. Settle: the hold is posted through fees and FX.
  phase = 'settling';
  adopt(settledBySubmission ?? (await settleTransfer(ref)));
  firstOutcomeApplied = true;
  if (snapshot.status !== 'settled' || snapshot.railReference === null) return finish();

  // 3. The return window: a return signal, or the rail's status on each poll.
  phase = 'watching_returns';
  const reference = snapshot.railReference;
  const returnDeadline = Date.now() + returnWindowMs;
  for (let round = 0; round <= POLLS_PER_PHASE_MAX + 1 && returned === undefined; round++) {
    const remainingMs = returnDeadline - Date.now();
    if (remainingMs <= 0) break;
    if (await condition(() => returned !== undefined, Math.min(returnPollMs, remainingMs))) break;
    const status = await poll(reference);
    if (status?.outcome === 'returned') returned ??= { reason: reasonFrom(status, 'returned by the bank') };
  }
  if (returned !== undefined) {
    phase = 'returning';
    adopt(await returnTransfer({ ...ref, reason: returned.reason }));
  }
  return finish();
}
