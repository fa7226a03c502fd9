// The determinism wall is a lint rule; prove it fires, so a refactor of eslint.config.js cannot
// silently drop it.
import assert from 'node:assert/strict';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { ESLint } from 'eslint';
import tseslint from 'typescript-eslint';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

async function lint(relativePath: string, code: string): Promise<string[]> {
  // The probe files exist only in memory, so the type-aware rules (which need them in the program)
  // are switched off; the import rule under test is purely syntactic.
  const eslint = new ESLint({ cwd: root, overrideConfig: [tseslint.configs.disableTypeChecked] });
  const [result] = await eslint.lintText(code, { filePath: join(root, relativePath) });
  return (result?.messages ?? []).map((message) => `${message.ruleId ?? 'parse'}: ${message.message}`);
}

describe('workflow determinism lint rule', { timeout: 120_000 }, () => {
  it('rejects Node built-ins, I/O libraries and I/O layers in workflows/', async () => {
    const messages = await lint(
      'workflows/probe.ts',
      [
        "import { readFileSync } from 'node:fs';",
        "import postgres from 'postgres';",
        "import { Client } from '@temporalio/client';",
        "import { createSql } from '../db/client.ts';",
        'export const probe = [readFileSync, postgres, Client, createSql];',
      ].join('\n'),
    );
    const restricted = messages.filter((message) => message.startsWith('@typescript-eslint/no-restricted-imports'));
    assert.equal(restricted.length, 4, messages.join('\n'));
  });

  it('allows type-only imports of activities and the workflow SDK', async () => {
    const messages = await lint(
      'workflows/probe.ts',
      [
        "import { proxyActivities } from '@temporalio/workflow';",
        "import type { DataRetentionActivities } from '../activities/data-retention.ts';",
        "export const probe = proxyActivities<DataRetentionActivities>({ startToCloseTimeout: '1 minute' });",
      ].join('\n'),
    );
    assert.deepEqual(messages.filter((message) => message.includes('restricted')), []);
  });

  it('keeps the domain kernel free of activities, even as types', async () => {
    const messages = await lint(
      'workflows/shared/probe.ts',
      "import type { DataRetentionActivities } from '../../activities/data-retention.ts';\nexport type Probe = DataRetentionActivities;\n",
    );
    assert.ok(messages.some((message) => message.startsWith('@typescript-eslint/no-restricted-imports')), messages.join('\n'));
  });
});
