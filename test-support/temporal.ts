import { readFile } from 'node:fs/promises';
import type { ConnectionPlugin } from '@temporalio/client';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { Runtime, DefaultLogger } from '@temporalio/worker';
import { resolveTemporalTestServer } from '../platform/temporal.ts';
import { SEARCH_ATTRIBUTES } from '../workflows/shared/search-attributes.ts';
import { testEnv } from './env.ts';

let runtimeInstalled = false;

function installQuietRuntime(): void {
  if (runtimeInstalled) return;
  runtimeInstalled = true;
  Runtime.install({ logger: new DefaultLogger('ERROR'), shutdownSignals: [] });
}

/**
 * The client connection pings every 30 s by default, and the Java test server (gRPC-Java's default
 * permit of one ping per 5 min) answers a long test file's pings with GOAWAY "excess pings"; on a
 * loaded machine the calls in flight then stall until the file times out
 * (temporalio/sdk-typescript#2185). A local test server needs no keepalive: ping every 10 min.
 */
const QUIET_KEEPALIVE: ConnectionPlugin = {
  name: 'quiet-keepalive',
  configureConnection: (options) => ({
    ...options,
    channelArgs: {
      ...options.channelArgs,
      'grpc.keepalive_time_ms': 600_000,
      'grpc.keepalive_permit_without_calls': 0,
    },
  }),
};

/**
 * The time-skipping test server (the Java test server, from PyPI). The SDK waits only a few seconds
 * for it to come up, which a loaded 2-core machine can miss, so a failed start is retried.
 */
export async function createTimeSkippingEnv(attempts = 3): Promise<TestWorkflowEnvironment> {
  installQuietRuntime();
  const path = resolveTemporalTestServer({ TEMPORAL_TEST_SERVER_PATH: process.env.TEMPORAL_TEST_SERVER_PATH });
  let lastError: unknown;
  for (let attempt = 1; attempt <= attempts; attempt++) {
    try {
      const env = await TestWorkflowEnvironment.createTimeSkipping({
        server: { executable: { type: 'existing-path', path } },
        plugins: [QUIET_KEEPALIVE],
      });
      await registerSearchAttributes(env);
      return env;
    } catch (error) {
      lastError = error;
      await new Promise((resolve) => setTimeout(resolve, 500 * attempt));
    }
  }
  throw lastError;
}

/** The project's search attributes, as `npm start` registers them on the dev server. */
async function registerSearchAttributes(env: TestWorkflowEnvironment): Promise<void> {
  await env.connection.operatorService.addSearchAttributes({
    namespace: env.namespace ?? 'default',
    searchAttributes: Object.fromEntries(
      // 2 = INDEXED_VALUE_TYPE_KEYWORD (the proto enum is not importable from ESM here).
      Object.values(SEARCH_ATTRIBUTES).map((key) => [key.name, 2]),
    ),
  });
}

/**
 * `env.sleep` with a deadline. Time skips only while the test server holds no lock, and it takes one
 * for every workflow task and activity in flight, released when that task completes. Two things leave
 * such a lock held for the rest of the server's life, after which every `env.sleep` waits in real time
 * (a day's sleep hangs the file):
 * - terminating a run while it has a workflow task or an activity in flight (the completion is then
 *   refused and the lock never released; temporalio/sdk-java#1138);
 * - a query that reaches a run while the workflow task that continues it as new is in flight: the
 *   server then schedules one more workflow task on the closed run, which can never complete.
 * This fails after `deadlineMs` with that explanation instead of waiting out the test's timeout.
 */
export async function sleepWithin(env: TestWorkflowEnvironment, duration: string, deadlineMs = 30_000): Promise<void> {
  try {
    await env.connection.withDeadline(Date.now() + deadlineMs, () => env.sleep(duration));
  } catch (error) {
    throw new Error(
      `env.sleep('${duration}') did not return within ${deadlineMs / 1000} s: time skipping is locked on the ` +
        'test server (a run terminated mid-task, or queried while continuing as new?)',
      { cause: error },
    );
  }
}

let bundle: Promise<{ code: string }> | undefined;

/** The workflow bundle scripts/test.ts built once for the whole run. */
export function testWorkflowBundle(): Promise<{ code: string }> {
  bundle ??= readFile(testEnv().TEST_WORKFLOW_BUNDLE_PATH, 'utf8').then((code) => ({ code }));
  return bundle;
}
