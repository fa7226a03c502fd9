// The long bank run: `npm run bank-test -- --seed 7 --duration 300 --clients 16`.
// Prints the report as JSON; exits 1 when an invariant was violated.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { BankTestError, runBankTest } from './bank.ts';

const { values } = parseArgs({
  options: {
    seed: { type: 'string', default: '7' },
    duration: { type: 'string', default: '300' }, // seconds
    clients: { type: 'string', default: '16' },
    'kill-min': { type: 'string', default: '3' }, // seconds
    'kill-max': { type: 'string', default: '8' },
    'data-dir': { type: 'string' },
    keep: { type: 'boolean', default: false },
  },
  strict: true,
});

function positive(name: string, value: string): number {
  const number = Number(value);
  if (!Number.isFinite(number) || number <= 0) {
    process.stderr.write(`--${name} must be a positive number, got ${value}\n`);
    process.exit(2);
  }
  return number;
}

const seed = Math.trunc(positive('seed', values.seed));
const durationMs = Math.round(positive('duration', values.duration) * 1000);
const clients = Math.trunc(positive('clients', values.clients));
const killEveryMs: [number, number] = [
  Math.round(positive('kill-min', values['kill-min']) * 1000),
  Math.round(positive('kill-max', values['kill-max']) * 1000),
];
const dataDir = values['data-dir'] ?? (await mkdtemp(join(tmpdir(), 'payments-bank-')));
const log = (line: string) => process.stderr.write(`[bank] ${line}\n`);

let exitCode = 0;
try {
  const report = await runBankTest({ seed, durationMs, clients, killEveryMs, dataDir, log });
  process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
} catch (error) {
  exitCode = 1;
  if (error instanceof BankTestError) process.stdout.write(`${JSON.stringify(error.report, null, 2)}\n`);
  process.stderr.write(`${error instanceof Error ? error.message : String(error)}\n`);
} finally {
  if (!values.keep && !values['data-dir']) await rm(dataDir, { recursive: true, force: true });
}
process.exit(exitCode);
