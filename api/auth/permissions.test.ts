import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { permissionsMarkdown } from './permissions.ts';

describe('permission table', () => {
  it('is written in the README exactly as the code enforces it', async () => {
    const readme = await readFile(join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'README.md'), 'utf8');
    assert.ok(readme.includes(permissionsMarkdown()), `README must contain:\n${permissionsMarkdown()}`);
  });
});
