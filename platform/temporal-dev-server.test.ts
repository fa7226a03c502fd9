// The dev server supervisor's start: a CLI that exits while starting is started once more, and a
// start that fails for good says what the CLI printed (a Go panic exits with code 2, and its trace
// is the only clue). A shell script stands in for a CLI that fails; the second test hands over to
// the real CLI on its second attempt.
import assert from 'node:assert/strict';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { resolveTemporalCli } from './temporal.ts';
import { startTemporalDevServer, type DevServerOptions } from './temporal-dev-server.ts';
import { freePort } from '../test-support/ports.ts';

/** A CLI that counts its starts in `count`, and panics on the first `failures` of them. */
async function flakyCli(dir: string, failures: number, then: string): Promise<string> {
  const path = join(dir, 'temporal');
  await writeFile(
    path,
    [
      '#!/bin/sh',
      `count_file='${join(dir, 'count')}'`,
      'n=$(cat "$count_file" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$count_file"',
      `if [ "$n" -le ${failures} ]; then echo "panic: start $n lost a port" >&2; exit 2; fi`,
      then,
      '',
    ].join('\n'),
  );
  await chmod(path, 0o755);
  return path;
}

describe('Temporal dev server start', { timeout: 120_000 }, () => {
  let dir: string;
  const base = async (cliPath: string): Promise<DevServerOptions> => ({
    cliPath,
    dataDir: join(dir, 'data'),
    port: await freePort(),
    uiPort: await freePort(),
    namespace: 'default',
    searchAttributes: [],
    readyTimeoutMs: 60_000,
  });
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'dev-server-start-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('gives up after a second failed attempt, quoting what the CLI printed', async () => {
    const cliPath = await flakyCli(dir, 99, 'exit 0');
    const restarts: Error[] = [];
    await assert.rejects(
      startTemporalDevServer({ ...(await base(cliPath)), onRestart: (error) => restarts.push(error) }),
      (error: Error) => {
        assert.match(error.message, /exited with code 2; its last output:\npanic: start 2 lost a port$/);
        return true;
      },
    );
    assert.equal((await readFile(join(dir, 'count'), 'utf8')).trim(), '2');
    assert.equal(restarts.length, 1);
    assert.match(restarts[0]!.message, /panic: start 1 lost a port/);
    await rm(join(dir, 'count'));
  });

  it('starts the server on its second attempt when the first exits while starting', async () => {
    const real = resolveTemporalCli({ TEMPORAL_CLI_PATH: process.env.TEMPORAL_CLI_PATH }, process.env.PATH);
    const cliPath = await flakyCli(dir, 1, `exec '${real}' "$@"`);
    const restarts: Error[] = [];
    const server = await startTemporalDevServer({
      ...(await base(cliPath)),
      onRestart: (error) => restarts.push(error),
    });
    try {
      assert.equal(restarts.length, 1);
      assert.equal((await readFile(join(dir, 'count'), 'utf8')).trim(), '2');
      assert.equal((await fetch(server.uiUrl)).status, 200);
    } finally {
      await server.stop();
    }
  });
});
