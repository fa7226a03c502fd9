// Test processes receive their wiring from scripts/test.ts through these variables.
import { z } from 'zod';

const ZTestEnv = z.object({
  TEST_PG_ADMIN_URL: z.string().min(1),
  TEST_PG_TEMPLATE: z.string().min(1),
  TEST_WORKFLOW_BUNDLE_PATH: z.string().min(1),
});

export type TTestEnv = z.infer<typeof ZTestEnv>;

export function testEnv(): TTestEnv {
  const parsed = ZTestEnv.safeParse(process.env);
  if (!parsed.success) throw new Error('run tests with `npm test`: it starts PostgreSQL and sets TEST_* variables');
  return parsed.data;
}
