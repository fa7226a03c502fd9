import { createHash } from 'node:crypto';
import { copyFile, mkdir, readdir, readFile, rename, writeFile } from 'node:fs/promises';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { bundleWorkflowCode, DefaultLogger } from '@temporalio/worker';

const PROJECT_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
export const WORKFLOWS_DIR = join(PROJECT_ROOT, 'workflows');
export const WORKFLOWS_ENTRY = join(WORKFLOWS_DIR, 'index.ts');

async function listFiles(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true });
  const nested = await Promise.all(
    entries.map((entry) => (entry.isDirectory() ? listFiles(join(dir, entry.name)) : Promise.resolve([join(dir, entry.name)]))),
  );
  return nested.flat().filter((file) => file.endsWith('.ts') && !file.endsWith('.test.ts')).sort();
}

/** Content hash of everything that goes into the bundle: workflow sources and the locked SDK versions. */
export async function workflowSourceHash(): Promise<string> {
  const hash = createHash('sha256');
  for (const file of await listFiles(WORKFLOWS_DIR)) {
    hash.update(relative(PROJECT_ROOT, file)).update('\0').update(await readFile(file)).update('\0');
  }
  hash.update(await readFile(join(PROJECT_ROOT, 'package-lock.json')).catch(() => Buffer.alloc(0)));
  return hash.digest('hex').slice(0, 16);
}

/** Where loadWorkflowBundle keeps the bundle of the current sources in `cacheDir`. */
async function cachedBundlePath(cacheDir: string): Promise<string> {
  return join(cacheDir, `workflow-bundle-${await workflowSourceHash()}.js`);
}

/**
 * Puts a bundle already built from the current sources (the test runner's) in `cacheDir` under the
 * name loadWorkflowBundle looks for, so that a worker using that cache does not run webpack.
 */
export async function seedWorkflowBundleCache(cacheDir: string, from: string): Promise<void> {
  const path = await cachedBundlePath(cacheDir);
  await mkdir(cacheDir, { recursive: true });
  const temporary = `${path}.${process.pid}.tmp`;
  await copyFile(from, temporary);
  await rename(temporary, path);
}

/**
 * The workflow bundle, built once: webpack runs only when the workflow sources changed since the
 * cached bundle in `cacheDir` was written. Workers and tests load the same code this way.
 */
export async function loadWorkflowBundle(cacheDir: string): Promise<{ code: string; path: string }> {
  const path = await cachedBundlePath(cacheDir);
  const cached = await readFile(path, 'utf8').catch(() => undefined);
  if (cached !== undefined) return { code: cached, path };
  const { code } = await bundleWorkflowCode({ workflowsPath: WORKFLOWS_ENTRY, logger: new DefaultLogger('WARN') });
  await mkdir(cacheDir, { recursive: true });
  const temporary = `${path}.${process.pid}.tmp`;
  await writeFile(temporary, code);
  await rename(temporary, path);
  return { code, path };
}
