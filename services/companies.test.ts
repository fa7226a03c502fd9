import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { withSystemScope } from '../db/tenant.ts';
import { createTestDatabase, type TestDatabase } from '../test-support/db.ts';
import { SYSTEM_ACTOR } from './audit-context.ts';
import { verifyCompany } from './companies.ts';
import { provisionTenant } from './tenants.ts';

describe('verifyCompany', () => {
  let database: TestDatabase;
  before(async () => {
    database = await createTestDatabase();
  });
  after(async () => {
    await database?.drop();
  });

  it('records one company.verified event, however often and concurrently it is called', async () => {
    const { company } = await provisionTenant(
      database.sql,
      { name: 'Verify Twice', ownerEmail: 'owner@verify-twice.example' },
      SYSTEM_ACTOR,
    );
    const first = await verifyCompany(database.sql, company.id, SYSTEM_ACTOR);
    const again = await Promise.all([1, 2, 3].map(() => verifyCompany(database.sql, company.id, SYSTEM_ACTOR)));
    for (const later of again) assert.deepEqual(later, first, 'a repeat changes nothing, not even updatedAt');
    const events = await withSystemScope(
      database.sql,
      (tx) => tx<{ data: { previousStatus: string } }[]>`
        select data from audit_events where company_id = ${company.id} and event = 'company.verified'`,
    );
    assert.deepEqual(
      events.map((event) => event.data),
      [{ previousStatus: 'unverified' }],
    );
  });
});
