// The short seeded bank run for `npm test`: 20 s of concurrent transfers while the API and the
// worker are SIGKILLed every 3–6 s. The long run is `npm run bank-test` (bank/run.ts).
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { descendants } from '../platform/processes.ts';
import { BankTestError, runBankTest, type BankReport } from './bank.ts';

describe('bank test (short, seeded)', { timeout: 240_000 }, () => {
  it('keeps every money invariant while the API and the worker are killed and restarted', async (t) => {
    // tsx's esbuild service already runs under this process; anything else afterwards is a leak.
    const before = new Set(descendants(process.pid).map((child) => child.pid));
    const dataDir = await mkdtemp(join(tmpdir(), 'payments-bank-'));
    let report: BankReport;
    try {
      report = await runBankTest({ seed: 1, durationMs: 20_000, clients: 8, killEveryMs: [3_000, 6_000], dataDir });
    } catch (error) {
      if (error instanceof BankTestError) assert.fail(`${error.message}\n${JSON.stringify(error.report, null, 2)}`);
      throw error;
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
    const { conservation: _conservation, ...summary } = report;
    t.diagnostic(JSON.stringify(summary));
    assert.deepEqual(report.violations, []);
    assert.ok(report.kills.events >= 2, `expected at least 2 kills, got ${report.kills.events}`);
    assert.ok(report.created201.B > 0, 'some Shape B transfers were created');
    assert.ok(report.created201.A > 0, 'some Shape A payouts were created');
    // Every settlement path ran under the kills, and a kill landed between a commit and its answer.
    for (const status of ['settled', 'failed', 'returned'])
      assert.ok((report.transfers.aByStatus[status] ?? 0) > 0, `some payouts ended ${status}`);
    assert.ok(report.simulations.asked > 0, 'some payouts were settled, failed or returned by simulation');
    assert.ok(report.kills.api > 0 && report.kills.worker > 0, 'both the API and the worker were killed');
    assert.ok(report.committedBeforeLostAnswer > 0, 'a kill landed after a commit and before its answer');
    assert.equal(report.workflows.other, 0);
    assert.ok(report.replays >= 1, 'at least one idempotent replay');
    assert.ok((report.byCode.IDEMPOTENCY_KEY_REUSED ?? 0) >= 1, 'at least one 422 IDEMPOTENCY_KEY_REUSED');
    assert.equal(report.keys.unresolved, 0);
    assert.deepEqual(report.leftoverProcesses, []);
    assert.deepEqual(
      descendants(process.pid).filter((child) => !before.has(child.pid)),
      [],
      'no process left behind',
    );
  });
});
