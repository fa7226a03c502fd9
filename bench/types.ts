// Messages between the bench orchestrator (bench/run.ts) and its child processes, and what
// bench/run.ts and bench/webhooks.ts share.
import type { Sql } from '../db/client.ts';

export type LoadMode = 'bare' | 'shapeB' | 'replay' | 'shapeA';

export interface SentRequest {
  key: string;
  body: unknown;
}

export interface LoadPlan {
  baseUrl: string;
  path: string;
  mode: LoadMode;
  concurrency: number;
  warmupMs: number;
  durationMs: number;
  /** Bearer token for the real API. */
  apiKey?: string;
  /** Accounts to pick source and destination from (bare, shapeB). */
  accounts?: string[];
  /** Shape A: the bank account paid out to. */
  achAccountId?: string;
  /** replay: requests sent before, sent again with the same keys and bodies. */
  replay?: SentRequest[];
  /** Keep the (key, body) of every 201 for a later replay phase (at most this many). */
  recordLimit?: number;
  /** Prefix for this phase's Idempotency-Keys. */
  keyPrefix: string;
  /** Return every measured latency in the result (small phases only: Shape A). */
  keepLatencies?: boolean;
}

export interface LatencySummary {
  count: number;
  meanMs: number;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  maxMs: number;
}

export interface LoadResult {
  mode: LoadMode;
  concurrency: number;
  measuredMs: number;
  /** Requests completed in the measured window (after warm-up), any status. */
  completed: number;
  /** Of those, 2xx answers. */
  ok: number;
  /** ok per second of the measured window. */
  throughput: number;
  latency: LatencySummary;
  byStatus: Record<string, number>;
  replayed: number;
  networkErrors: number;
  sampleErrors: string[];
  sent: SentRequest[];
  /** Every answered request, warm-up included (for CPU per request over the whole phase). */
  answeredTotal: number;
  /** CPU (user + system) the generator itself used while it ran the plan. */
  cpuSeconds?: number;
  /** Every measured latency (ms), for pooling rounds: only when the plan asks (keepLatencies). */
  latencies?: number[];
}

export function summarize(latencies: number[]): LatencySummary {
  const sorted = [...latencies].sort((a, b) => a - b);
  const at = (q: number) =>
    sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
  const mean = sorted.length === 0 ? 0 : sorted.reduce((sum, value) => sum + value, 0) / sorted.length;
  return {
    count: sorted.length,
    meanMs: mean,
    p50Ms: at(0.5),
    p90Ms: at(0.9),
    p99Ms: at(0.99),
    maxMs: sorted.at(-1) ?? 0,
  };
}

/** The bench-only worker's task queue (bench/baseline-worker.ts). */
export const BENCH_TASK_QUEUE = 'bench-baseline';

/** Events the worker's dispatcher has not fanned out yet (the webhook outbox, migration 00005). */
export async function undispatchedEvents(sql: Sql): Promise<number> {
  const [row] = await sql<{ count: number }[]>`select count(*)::int as count from events where dispatched_at is null`;
  return row?.count ?? 0;
}
