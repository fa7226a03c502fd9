// The long bank run: `npm run bank-test -- --duration 300 --clients 16 [--seed N]`.
// Prints the report as JSON (its seed included); exits 1 when an invariant was violated.
import { randomInt } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { BankTestError, runBankTest } from './bank.ts';

const { values } = parseArgs({
  options: {
    seed: { type: 'string' }, // default: a new one each run, printed so a failure can be rerun
    duration: { type: 'string', default: '300' }, // seconds
    clients: { type: 'string', default: '16' },
    'kill-min': { type: 'string', default: '3' }, // seconds
    'kill-max': { type: 'string', default: '8' },
    'data-dir': { type: 'string' },
    keep: { type: 'boolean', default: false },
    help: { type: 'boolean', short: 'h', default: false },
  },
  strict: true,
});

if (values.help) {
  process.stdout.write(
    [
      'npm run bank-test -- [options]: concurrent transfers while the API and the worker are SIGKILLed;',
      'prints the report as JSON and exits 1 when an invariant was violated.',
      "  --seed N        the clients' random workload (default: a new seed, printed; timing is not seeded)",
      '  --duration S    seconds of load (default 300)',
      '  --clients N     concurrent clients (default 16)',
      '  --kill-min S    shortest pause between kills (default 3)',
      '  --kill-max S    longest pause between kills (default 8)',
      '  --data-dir DIR  keep PostgreSQL and Temporal data here (default: a temporary folder)',
      '  --keep          do not delete the temporary folder',
      '',
    ].join('\n'),
  );
  process.exit(0);
}

function positive(name: string, value: string): number {
  const number = Number(value);
  if (!Number.isFinite(number) || number <= 0) {
    process.stderr.write(`--${name} must be a positive number, got ${value}\n`);
    process.exit(2);
  }
  return number;
}

const seed = values.seed === undefined ? randomInt(1, 2 ** 31) : Math.trunc(positive('seed', values.seed));
const durationMs = Math.round(positive('duration', values.duration) * 1000);
const clients = Math.trunc(positive('clients', values.clients));
const killEveryMs: [number, number] = [
  Math.round(positive('kill-min', values['kill-min']) * 1000),
  Math.round(positive('kill-max', values['kill-max']) * 1000),
];
const dataDir = values['data-dir'] ?? (await mkdtemp(join(tmpdir(), 'payments-bank-')));
const log = (line: string) => process.stderr.write(`[bank] ${line}\n`);
log(`seed ${seed} (rerun the same workload with --seed ${seed})`);

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
