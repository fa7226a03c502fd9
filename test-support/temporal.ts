import { readFile } from 'node:fs/promises';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import { Runtime, DefaultLogger } from '@temporalio/worker';
import { resolveTemporalTestServer } from '../platform/temporal.ts';
import { testEnv } from './env.ts';

let runtimeInstalled = false;

function installQuietRuntime(): void {
  if (runtimeInstalled) return;
  runtimeInstalled = true;
  Runtime.install({ logger: new DefaultLogger('ERROR'), shutdownSignals: [] });
}

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
      return await TestWorkflowEnvironment.createTimeSkipping({ server: { executable: { type: 'existing-path', path } } });
    } catch (error) {
      lastError = error;
      await new Promise((resolve) => setTimeout(resolve, 500 * attempt));
    }
  }
  throw lastError;
}

let bundle: Promise<{ code: string }> | undefined;

/** The workflow bundle scripts/test.ts built once for the whole run. */
export function testWorkflowBundle(): Promise<{ code: string }> {
  bundle ??= readFile(testEnv().TEST_WORKFLOW_BUNDLE_PATH, 'utf8').then((code) => ({ code }));
  return bundle;
}
