// The boundary to the outside world: a payout rail (a bank over ACH, later a chain). Everything past
// this interface is outside the machine; adapters implement it, and only adapters are mocked.

export type RailOutcome = 'confirmed' | 'pending' | 'failed' | 'returned';

export interface PayoutRequest {
  transferId: string;
  /** What the recipient receives, as a decimal string in `currency` (e.g. "99.50"). */
  amount: string;
  currency: string;
  destination: { externalAccountId: string; routingNumber: string; accountLast4: string };
  /** What leaves the wallet, in minor units of `sourceCurrency`. */
  sourceAmountMinor: bigint;
  sourceCurrency: string;
}

export interface PayoutSubmission {
  reference: string;
  outcome: 'confirmed' | 'pending' | 'failed';
  reason?: string;
}

export interface PayoutStatus {
  outcome: RailOutcome;
  reason?: string;
}

/**
 * What a cancellation found: `canceled`, the payout will not be made (also one the rail never
 * received, which it must then refuse if it arrives later); `confirmed`, too late, it was made;
 * `failed`, the rail had refused it.
 */
export interface PayoutCancellation {
  outcome: 'canceled' | 'confirmed' | 'failed';
  reason?: string;
}

export interface PayoutRail {
  /** Idempotent on transferId: submitting twice returns the same reference and outcome. */
  submit(request: PayoutRequest): Promise<PayoutSubmission>;
  status(reference: string): Promise<PayoutStatus>;
  /**
   * Stops a payout the rail has not made yet, by transfer ID (and its reference when one was
   * recorded). Idempotent: asking again answers the same. The settlement calls it before it gives
   * up on a payout the rail never confirmed, so that no hold is released for money that left.
   */
  cancel(request: { transferId: string; reference?: string }): Promise<PayoutCancellation>;
}

/** One rail per environment: sandbox money never reaches a live rail, and the reverse. */
export interface PayoutRails {
  sandbox: PayoutRail;
  live: PayoutRail;
}
