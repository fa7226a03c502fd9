import type { Sql } from './client.ts';
import { claimOutcomeOf, type ClaimOutcome, type ClaimOutcomeRow, type IdempotencyClaim } from './idempotency.ts';
import { postLedgerTransferClaimingKey, type HotPathTransfer } from './ledger.ts';

/** Writes one Shape B transfer with its key claim: `postLedgerTransferClaimingKey`'s contract. */
export type LedgerWrite = (claim: IdempotencyClaim, transfer: HotPathTransfer) => Promise<ClaimOutcome>;

export interface LedgerBatchOptions {
  /** Batches in the database at once; transfers that arrive meanwhile wait and go together. */
  inFlightMax: number;
  /** Transfers in one batch at most. */
  batchMax: number;
  /** Transfers waiting for a batch, all companies together, at most; more are refused. */
  queueMax: number;
  /**
   * Transfers of one company waiting for a batch at most: a flood of one tenant's transfers is
   * refused before it fills the queue for the others.
   */
  companyQueueMax: number;
}

/**
 * The transfer was not queued: as many transfers as the queue holds (`all`) or as one company may
 * have waiting (`company`) are waiting already. Nothing was written; the same request may be sent
 * again shortly.
 */
export class LedgerQueueFullError extends Error {
  readonly full: 'all' | 'company';

  constructor(full: 'all' | 'company') {
    super(
      full === 'company'
        ? "too many of this company's transfers are waiting for the ledger"
        : 'too many transfers are waiting for the ledger',
    );
    this.name = 'LedgerQueueFullError';
    this.full = full;
  }
}

export interface LedgerBatcher {
  write: LedgerWrite;
  /**
   * Batches sent and transfers in them, batches written again one by one, and transfers refused
   * because the queue was full, since start (for tests and the benchmark).
   */
  stats(): { batches: number; batchedTransfers: number; fallbacks: number; refused: number };
}

/**
 * A transfer the batch statement refused, carrying what postgres.js would have put on the error
 * of the single statement (`code`, `detail`, `constraint_name`), so callers map it the same way.
 */
export class BatchedTransferError extends Error {
  readonly code: string;
  readonly detail: string | undefined;
  readonly constraint_name: string | undefined;

  constructor(code: string, message: string, detail: string | undefined, constraint: string | undefined) {
    super(message);
    this.name = 'BatchedTransferError';
    this.code = code;
    this.detail = detail;
    this.constraint_name = constraint;
  }
}

/** How far into a company's queue a batch looks for transfers whose accounts are free, × batchMax. */
const SCAN_FACTOR = 4;

interface Pending {
  claim: IdempotencyClaim;
  transfer: HotPathTransfer;
  resolve: (outcome: ClaimOutcome) => void;
  reject: (error: unknown) => void;
}

type BatchRow = ClaimOutcomeRow & {
  ordinal: number;
  error_code: string | null;
  error_message: string | null;
  error_detail: string | null;
  error_constraint: string | null;
};

/**
 * Group commit for the Shape B hot path. Transfers queue per company; once the event loop has
 * handled what is ready (the requests that arrived together), the queues go to the database while
 * there are free slots (fewer than `inFlightMax` batches in it): up to `batchMax` transfers of one
 * company in one statement and one commit (`post_ledger_transfers_idempotent`, migration 00018),
 * companies taking turns; a transfer alone in its queue goes through the single statement. So an
 * idle API answers as fast as before (one turn of the event loop later), and a busy one spends one
 * round trip, one commit and one WAL flush on many transfers instead of one each. Waiting one turn
 * made the batches of a loaded API larger: 6 % of its transfers went alone instead of 39 %.
 *
 * Every transfer keeps its own outcome: the batch statement runs each in a subtransaction and
 * reports refusals per transfer. If the batch statement itself fails (its commit included, or the
 * connection, when it is unknown whether it committed), each of its transfers is written again on
 * its own: the key claims make that safe, since a transfer that did commit comes back `existing`
 * with its stored response, and one that did not is written now.
 */
export function createLedgerBatcher(sql: Sql, options: LedgerBatchOptions): LedgerBatcher {
  if (!Number.isInteger(options.inFlightMax) || options.inFlightMax < 1) throw new Error('inFlightMax must be ≥ 1');
  if (!Number.isInteger(options.batchMax) || options.batchMax < 1) throw new Error('batchMax must be ≥ 1');
  const { queueMax, companyQueueMax } = options;
  if (!Number.isInteger(queueMax) || queueMax < 1) throw new Error('queueMax must be ≥ 1');
  if (!Number.isInteger(companyQueueMax) || companyQueueMax < 1) throw new Error('companyQueueMax must be ≥ 1');
  const queues = new Map<string, Pending[]>();
  /** Companies with transfers waiting, in the order they take their turns. */
  const turns: string[] = [];
  let inFlight = 0;
  /** Transfers in the queues, all companies together. */
  let queued = 0;
  const counts = { batches: 0, batchedTransfers: 0, fallbacks: 0, refused: 0 };

  const single = (item: Pending) =>
    postLedgerTransferClaimingKey(sql, item.claim, item.transfer).then(item.resolve, item.reject);

  async function runBatch(batch: Pending[]): Promise<void> {
    if (batch.length === 1) return single(batch[0]!);
    counts.batches += 1;
    counts.batchedTransfers += batch.length;
    let rows: BatchRow[];
    try {
      rows = await sql<BatchRow[]>`select * from post_ledger_transfers_idempotent(${sql.json(batch.map(itemJson))})`;
    } catch {
      // Nothing of the batch committed, or it is unknown whether it did: each transfer on its own.
      counts.fallbacks += 1;
      await Promise.all(batch.map(single));
      return;
    }
    const answered = new Set<number>();
    for (const row of rows) {
      const item = batch[row.ordinal];
      if (!item || answered.has(row.ordinal)) continue;
      answered.add(row.ordinal);
      if (row.error_code !== null) {
        item.reject(
          new BatchedTransferError(
            row.error_code,
            row.error_message ?? '',
            row.error_detail ?? undefined,
            row.error_constraint ?? undefined,
          ),
        );
      } else {
        item.resolve(claimOutcomeOf(row));
      }
    }
    // Committed without a row for it cannot happen; if it did, the key claim makes asking again safe.
    await Promise.all(batch.filter((_, index) => !answered.has(index)).map(single));
  }

  /** Accounts the batches in the database hold (or will): a transfer naming one waits for the next turn. */
  const busyAccounts = new Map<string, number>();
  const accountsOf = (item: Pending) => [item.transfer.sourceAccountId, item.transfer.destinationAccountId];

  /**
   * The next batch from `queue`: its transfers in arrival order, skipping (for now) those that name
   * an account a batch in the database holds, so that batches in flight never wait on each other's
   * row locks and the transfers of a hot account gather into the batch after. Looks at most
   * SCAN_FACTOR × batchMax transfers, so a long queue costs no more than a short one.
   */
  function takeBatch(queue: Pending[]): Pending[] {
    const batch: Pending[] = [];
    const scanEnd = Math.min(queue.length, options.batchMax * SCAN_FACTOR);
    let kept = 0;
    for (let index = 0; index < scanEnd; index++) {
      const item = queue[index]!;
      if (batch.length < options.batchMax && !accountsOf(item).some((account) => busyAccounts.has(account))) {
        batch.push(item);
      } else {
        queue[kept++] = item;
      }
    }
    queue.splice(kept, scanEnd - kept);
    queued -= batch.length;
    return batch;
  }

  function hold(batch: Pending[], delta: 1 | -1): void {
    for (const item of batch) {
      for (const account of accountsOf(item)) {
        const count = (busyAccounts.get(account) ?? 0) + delta;
        if (count === 0) busyAccounts.delete(account);
        else busyAccounts.set(account, count);
      }
    }
  }

  function start(batch: Pending[]): void {
    inFlight += 1;
    hold(batch, 1);
    void runBatch(batch)
      .catch((error: unknown) => {
        for (const item of batch) item.reject(error);
      })
      .finally(() => {
        inFlight -= 1;
        hold(batch, -1);
        schedulePump();
      });
  }

  /** Starts batches while there are free slots and transfers that can go: companies take turns. */
  function pump(): void {
    let idleLooks = 0; // companies looked at in a row without a batch: a whole round of them ends it
    while (inFlight < options.inFlightMax && turns.length > 0 && idleLooks < turns.length) {
      const companyId = turns.shift()!;
      const queue = queues.get(companyId)!;
      const batch = takeBatch(queue);
      if (queue.length === 0) queues.delete(companyId);
      else turns.push(companyId);
      if (batch.length === 0) {
        idleLooks += 1;
        continue;
      }
      idleLooks = 0;
      start(batch);
    }
  }

  /**
   * Pumps once the event loop has handled every request and answer that is ready now: the
   * transfers of requests that arrived together go together, instead of the first taking a free
   * slot alone. (A pump scheduled for the check phase runs after this poll phase's callbacks.)
   */
  let pumpScheduled = false;
  const schedulePump = () => {
    if (pumpScheduled) return;
    pumpScheduled = true;
    setImmediate(() => {
      pumpScheduled = false;
      pump();
    });
  };

  return {
    write(claim, transfer) {
      return new Promise<ClaimOutcome>((resolve, reject) => {
        const queue = queues.get(claim.companyId);
        const full = (queue?.length ?? 0) >= companyQueueMax ? 'company' : queued >= queueMax ? 'all' : undefined;
        if (full !== undefined) {
          counts.refused += 1;
          reject(new LedgerQueueFullError(full));
          return;
        }
        queued += 1;
        if (queue) queue.push({ claim, transfer, resolve, reject });
        else {
          queues.set(claim.companyId, [{ claim, transfer, resolve, reject }]);
          turns.push(claim.companyId);
        }
        schedulePump();
      });
    },
    stats: () => ({ ...counts }),
  };
}

/** One transfer as post_ledger_transfers_idempotent reads it (`i`: its index in the batch). */
function itemJson(item: Pending, index: number) {
  const { claim, transfer } = item;
  return {
    i: index,
    company_id: claim.companyId,
    environment: claim.environment,
    key: claim.key,
    method: claim.requestMethod,
    path: claim.requestPath,
    hash: claim.requestHash.toString('base64'),
    ttl_ms: claim.ttlMs,
    status: claim.response.status,
    headers: claim.response.headers,
    body: claim.response.body.toString('base64'),
    id: transfer.id,
    amount: transfer.amount.toString(),
    currency: transfer.currency,
    source: transfer.sourceAccountId,
    destination: transfer.destinationAccountId,
    created_at: transfer.createdAt.toISOString(),
  };
}
