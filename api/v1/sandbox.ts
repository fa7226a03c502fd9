import { setTimeout as sleep } from 'node:timers/promises';
import { z } from 'zod';
import { WorkflowNotFoundError, type Client, type WorkflowHandle } from '@temporalio/client';
import type { Sql } from '../../db/client.ts';
import { findTransfer, type TransferStatus } from '../../db/ledger.ts';
import { withTenant } from '../../db/tenant.ts';
import { DomainError, notFound } from '../../workflows/shared/errors.ts';
import {
  railConfirmedSignal,
  railFailedSignal,
  railReturnedSignal,
  transferSnapshotQuery,
} from '../../workflows/shared/transfer-settlement.ts';
import { apiKeyPrincipalOf } from '../auth/authenticate.ts';
import { problems } from '../problem.ts';
import { defineRoute } from '../route.ts';
import { signed, transferResource, type TransferSigner } from './resources.ts';

type Action = 'settle' | 'fail' | 'return';

const FROM: Record<Action, TransferStatus[]> = {
  settle: ['pending', 'processing'],
  fail: ['pending', 'processing'],
  return: ['settled'],
};
const TO: Record<Action, TransferStatus> = { settle: 'settled', fail: 'failed', return: 'returned' };
const OUTCOME_WAIT_MS = 5_000;

export interface SandboxRouteDeps {
  sql: Sql;
  signer: TransferSigner;
  rails: { temporal: Client };
}

/** How long a return waits for the run to say where it is (a worker must answer the query). */
const RUN_QUERY_WAIT_MS = 3_000;
/** How long a simulated rail event waits for Temporal to take its signal. */
const SIGNAL_WAIT_MS = 5_000;

/** How long Temporal itself has to answer when a query went unanswered. */
const TEMPORAL_REACH_WAIT_MS = 1_000;

/**
 * The transfer's status as its settlement run sees it; 'unknown' when no worker answers in time.
 * An unanswered query looks the same whether the worker is busy or Temporal is out of reach, so the
 * server is asked about the run once more: an error from that (not "no such run") propagates, and
 * the route answers 503 instead of "retry in a moment" for an outage.
 */
async function runStatus(temporal: Client, handle: WorkflowHandle): Promise<string> {
  try {
    const snapshot = await temporal.connection.withDeadline(Date.now() + RUN_QUERY_WAIT_MS, () =>
      handle.query(transferSnapshotQuery),
    );
    return snapshot.status;
  } catch (error) {
    if (error instanceof WorkflowNotFoundError) throw error;
    await temporal.connection.withDeadline(Date.now() + TEMPORAL_REACH_WAIT_MS, () => handle.describe());
    return 'unknown';
  }
}

/**
 * Simulation controls for the sandbox's external rails: what a bank would report, delivered to the
 * transfer's settlement workflow as the same signal a real rail webhook sends.
 */
function simulation(action: Action, deps: SandboxRouteDeps) {
  return defineRoute({
    method: 'POST',
    path: `/v1/sandbox/transfers/:id/${action}`,
    operationId: `sandbox${action[0]!.toUpperCase()}${action.slice(1)}Transfer`,
    summary: `Sandbox only: make the rail ${action === 'settle' ? 'confirm' : action} this external-rail transfer.`,
    tags: ['sandbox'],
    auth: { kind: 'api_key' },
    resource: { param: 'id', type: 'rail_transfer' },
    params: z.object({ id: z.string().max(100) }),
    body: z.strictObject({ reason: z.string().min(1).max(200).optional() }),
    example: action === 'settle' ? {} : { reason: action === 'fail' ? 'R01 insufficient funds' : 'R03 no account' },
    responses: {
      200: 'The transfer after the simulated event.',
      202: 'The event was delivered; the transfer has not moved yet (its settlement is busy): read it again shortly.',
      403: 'SANDBOX_ONLY',
      409: 'INVALID_TRANSFER_STATE: the transfer is in another state, moved to another one first, or its settlement is not running.',
    },
    async handler(ctx, { params, body }) {
      const { companyId, environment } = apiKeyPrincipalOf(ctx);
      if (environment !== 'sandbox') {
        throw new DomainError('forbidden', 'SANDBOX_ONLY', 'Simulation endpoints take a sandbox key.');
      }
      const scope = { companyId, environment };
      const load = () => withTenant(deps.sql, companyId, (tx) => findTransfer(tx, scope, params.id));
      const transfer = await load();
      if (!transfer) throw notFound('transfer');
      if (transfer.rail !== 'ach' || !transfer.workflowId) {
        throw new DomainError(
          'conflict',
          'NOT_SIMULATABLE',
          'Ledger transfers settle at once; only external-rail transfers can be simulated.',
        );
      }
      if (!FROM[action].includes(transfer.status)) {
        throw new DomainError(
          'conflict',
          'INVALID_TRANSFER_STATE',
          `A ${transfer.status} transfer cannot be made to ${action}.`,
        );
      }
      const handle = deps.rails.temporal.workflow.getHandle(transfer.workflowId);
      const reason = body.reason ?? (action === 'fail' ? 'sandbox: simulated failure' : 'sandbox: simulated return');
      try {
        // The database says settled as soon as the settling transaction commits, but the run takes
        // a return only once it has applied that outcome itself; in between (for as long as a
        // killed worker takes to replay, too) a return signal would be ignored while this route
        // answered 202. So the run is asked first, and "not yet" is a 409 to retry.
        if (action === 'return' && (await runStatus(deps.rails.temporal, handle)) !== 'settled') {
          throw new DomainError(
            'conflict',
            'INVALID_TRANSFER_STATE',
            'The settlement of this transfer is still being applied; retry in a moment.',
          );
        }
        await deps.rails.temporal.connection.withDeadline(Date.now() + SIGNAL_WAIT_MS, () =>
          action === 'settle'
            ? handle.signal(railConfirmedSignal)
            : action === 'fail'
              ? handle.signal(railFailedSignal, { reason })
              : handle.signal(railReturnedSignal, { reason }),
        );
      } catch (error) {
        if (error instanceof DomainError) throw error;
        if (!(error instanceof WorkflowNotFoundError)) {
          // Not "no such run" but no answer at all (Temporal down or unreachable): a dependency
          // outage, answered as one, not as a 500 after the client's retries run out.
          ctx.state.logger.warn(
            { err: error, workflowId: transfer.workflowId },
            'sandbox: the rail event was not delivered',
          );
          throw problems.unavailable(
            "The simulated rail event could not be delivered to the transfer's settlement now; retry in a moment.",
            1,
          );
        }
        // Not started yet (the outbox relay starts it), or finished (a return window that closed).
        throw new DomainError(
          'conflict',
          'INVALID_TRANSFER_STATE',
          `The settlement of this ${transfer.status} transfer is not running, so it cannot be made to ${action} now.`,
        );
      }

      // Wait for the transfer to leave the state the event applies to: to the one asked for, or to
      // another that a concurrent event (a settle racing a fail) reached first.
      let current = transfer;
      for (
        const deadline = Date.now() + OUTCOME_WAIT_MS;
        FROM[action].includes(current.status) && Date.now() < deadline;
      ) {
        await sleep(50);
        current = (await load()) ?? current;
      }
      if (current.status !== TO[action] && !FROM[action].includes(current.status)) {
        throw new DomainError(
          'conflict',
          'INVALID_TRANSFER_STATE',
          `The transfer became ${current.status} before it could be made to ${action}.`,
        );
      }
      ctx.status = current.status === TO[action] ? 200 : 202;
      ctx.body = await signed(deps.signer, transferResource(current));
    },
  });
}

export function sandboxRoutes(deps: SandboxRouteDeps) {
  return (['settle', 'fail', 'return'] as const).map((action) => simulation(action, deps));
}
