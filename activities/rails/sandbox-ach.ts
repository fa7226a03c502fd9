import { ApplicationFailure } from '@temporalio/common';
import { currencyInfo } from '../../workflows/shared/money.ts';
import type { PayoutRail, PayoutRequest, PayoutStatus, PayoutSubmission } from './types.ts';

/**
 * The sandbox ACH rail's simulation controls: the cents of the SOURCE amount
 * (`sourceAmountMinor / 10^(scale − 2) mod 100`, so 25.13 USDC and 25.13 USD both end in .13) pick
 * what the simulated bank does. Any other amount is confirmed at once. Currencies with fewer than
 * two decimals (JPY) have no cents and are always confirmed.
 */
export const SANDBOX_MAGIC = [
  {
    cents: 13,
    code: 'r01',
    submit: 'failed',
    status: 'failed',
    reason: 'R01 insufficient funds at receiving bank',
    description: 'The bank refuses the payout at once: the transfer fails and the hold is voided.',
  },
  {
    cents: 14,
    code: 'r03',
    submit: 'confirmed',
    status: 'returned',
    reason: 'R03 no account',
    description: 'Confirmed at once (the transfer settles), then returned: status() reports the return.',
  },
  {
    cents: 15,
    code: 'slow',
    submit: 'pending',
    status: 'pending',
    reason: undefined,
    description:
      'Pending forever: the transfer stays processing until the sandbox simulation endpoints confirm or fail it, or it expires.',
  },
] as const satisfies readonly {
  cents: number;
  code: string;
  submit: PayoutSubmission['outcome'];
  status: PayoutStatus['outcome'];
  reason: string | undefined;
  description: string;
}[];

type Magic = (typeof SANDBOX_MAGIC)[number];
const DEFAULT_CODE = 'ok';

/** Submissions remembered for idempotency; older ones are forgotten (their reference still says everything). */
const SANDBOX_SUBMISSIONS_MAX = 10_000;

const REFERENCE_PREFIX = 'sbx_ach';
// sbx_ach_<code>_<transferId>: the behaviour is part of the reference, so status() answers the same
// after a worker restart has emptied the in-memory state.
const REFERENCE_PATTERN = /^sbx_ach_(ok|r01|r03|slow)_(tr_[0-9a-f]{32})$/;

function centsOf(amountMinor: bigint, currency: string): number | undefined {
  const info = currencyInfo(currency);
  if (!info || info.scale < 2) return undefined;
  return Number((amountMinor / 10n ** BigInt(info.scale - 2)) % 100n);
}

function magicFor(request: Pick<PayoutRequest, 'sourceAmountMinor' | 'sourceCurrency'>): Magic | undefined {
  const cents = centsOf(request.sourceAmountMinor, request.sourceCurrency);
  return SANDBOX_MAGIC.find((magic) => magic.cents === cents);
}

function magicByCode(code: string): Magic | undefined {
  return SANDBOX_MAGIC.find((magic) => magic.code === code);
}

function withReason<T extends { outcome: string }>(value: T, reason: string | undefined): T & { reason?: string } {
  return reason === undefined ? value : { ...value, reason };
}

export interface SandboxAchRail extends PayoutRail {
  /** How many distinct payouts this instance has accepted (for tests and the sandbox's own checks). */
  submissionCount(): number;
}

/**
 * A deterministic simulated ACH rail for the sandbox environment (see SANDBOX_MAGIC). Its state lives
 * in memory, keyed by transfer ID, and is bounded; nothing is lost with it, because the reference
 * encodes the simulated behaviour.
 */
export function createSandboxAchRail(): SandboxAchRail {
  const submissions = new Map<string, PayoutSubmission>();
  /** Transfers canceled before the rail received them: a late submission of one is refused. */
  const canceled = new Set<string>();

  return {
    async submit(request) {
      const known = submissions.get(request.transferId);
      if (known) return known;
      if (canceled.has(request.transferId)) {
        return { reference: `${REFERENCE_PREFIX}_r01_${request.transferId}`, outcome: 'failed', reason: 'canceled' };
      }
      const magic = magicFor(request);
      const reference = `${REFERENCE_PREFIX}_${magic?.code ?? DEFAULT_CODE}_${request.transferId}`;
      const submission: PayoutSubmission = withReason(
        { reference, outcome: magic?.submit ?? 'confirmed' },
        magic?.submit === 'failed' ? magic.reason : undefined,
      );
      if (submissions.size >= SANDBOX_SUBMISSIONS_MAX) {
        const oldest = submissions.keys().next();
        if (!oldest.done) submissions.delete(oldest.value);
      }
      submissions.set(request.transferId, submission);
      return submission;
    },

    async status(reference) {
      const match = REFERENCE_PATTERN.exec(reference);
      if (!match)
        throw ApplicationFailure.nonRetryable(`Unknown sandbox ACH reference ${reference}.`, 'RailReferenceUnknown');
      const magic = magicByCode(match[1]!);
      if (!magic) return { outcome: 'confirmed' };
      return withReason({ outcome: magic.status }, magic.status === 'pending' ? undefined : magic.reason);
    },

    async cancel(request) {
      // The reference says what the simulated bank did; without one (never submitted, or the
      // answer was lost), the remembered submission does, and a payout never received is canceled.
      const reference = request.reference ?? submissions.get(request.transferId)?.reference;
      const match = reference === undefined ? null : REFERENCE_PATTERN.exec(reference);
      if (reference !== undefined && !match)
        throw ApplicationFailure.nonRetryable(`Unknown sandbox ACH reference ${reference}.`, 'RailReferenceUnknown');
      if (!match) {
        canceled.add(request.transferId);
        return { outcome: 'canceled' };
      }
      const magic = magicByCode(match[1]!);
      if (!magic || magic.submit === 'confirmed') return { outcome: 'confirmed' };
      if (magic.submit === 'failed') return withReason({ outcome: 'failed' as const }, magic.reason);
      return { outcome: 'canceled' }; // slow: still pending at the simulated bank, so it stops
    },

    submissionCount: () => submissions.size,
  };
}
