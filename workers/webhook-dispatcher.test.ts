import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Client } from '@temporalio/client';
import { pino } from 'pino';
import type { Sql } from '../db/client.ts';
import { startWebhookDispatcher } from './webhook-dispatcher.ts';

describe('webhook dispatcher loop', () => {
  it('stops promptly when stop() comes while a failing pass is in flight (no error backoff wait)', async () => {
    // A database that is down: each transaction fails after 200 ms, as a connect timeout would.
    const sql = {
      begin: () => new Promise((_, reject) => setTimeout(() => reject(new Error('database unavailable')), 200)),
    } as unknown as Sql;
    const dispatcher = startWebhookDispatcher({
      sql,
      temporal: () => ({}) as Client,
      logger: pino({ level: 'silent' }),
      intervalMs: 5_000, // the first failure would back off 10 s
      batchSize: 100,
    });
    await new Promise((resolve) => setTimeout(resolve, 50));
    const started = performance.now();
    await dispatcher.stop();
    const elapsed = performance.now() - started;
    assert.ok(elapsed < 1_000, `stop() took ${Math.round(elapsed)} ms`);
  });
});
