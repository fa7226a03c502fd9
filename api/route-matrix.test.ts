// Role × route × (own, foreign, missing) matrix, built from the app's own route list: a new route is
// covered the moment it is added, and a route whose path names an object without a fixture here
// fails this test until someone says how to make one.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { OPERATOR_ROLES, type OperatorRole } from '../db/operators.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { createApiKey } from '../services/api-keys.ts';
import { createOperator } from '../services/operators.ts';
import { createLedgerTransfer } from '../services/transfers.ts';
import { withTenant } from '../db/tenant.ts';
import { insertWebhookEndpoint } from '../db/webhooks.ts';
import { newId } from '../platform/ids.ts';
import { generateWebhookSecret } from '../services/webhook-endpoints.ts';
import { call, provisionTestTenant, signIn, startTestApp, type TestApp, type TestTenant } from '../test-support/app.ts';
import { allows } from './auth/permissions.ts';
import type { RouteDefinition } from './route.ts';

/** How to make an object of each resource type in a company; returns its ID. */
const FIXTURES: Record<string, (testApp: TestApp, tenant: TestTenant) => Promise<string>> = {
  api_key: async (testApp, tenant) =>
    (
      await createApiKey(
        testApp.ownerSql,
        { companyId: tenant.company.id, environment: 'sandbox', name: 'matrix', createdBy: null },
        SYSTEM_ACTOR,
      )
    ).apiKey.id,
  ledger_account: async (_testApp, tenant) => tenant.sandbox.usdWalletId,
  transfer: async (testApp, tenant) =>
    (
      await createLedgerTransfer(
        testApp.ownerSql,
        { companyId: tenant.company.id, environment: 'sandbox' },
        { amount: 1n, currency: 'USD', source: tenant.sandbox.usdWalletId, destination: tenant.sandbox.usdAccountId },
        `matrix-${Math.random()}`,
      )
    ).id,
  webhook_endpoint: async (testApp, tenant) =>
    (
      await withTenant(testApp.ownerSql, tenant.company.id, (tx) =>
        insertWebhookEndpoint(tx, {
          companyId: tenant.company.id,
          environment: 'sandbox',
          id: newId('we'),
          url: 'https://hooks.example.com/matrix',
          description: '',
          eventTypes: [],
          secret: generateWebhookSecret(),
        }),
      )
    ).id,
  event: async (testApp, tenant) => {
    const transferId = await FIXTURES.transfer!(testApp, tenant);
    const [event] = await testApp.ownerSql<{ id: string }[]>`select id from events where object_id = ${transferId}`;
    return event!.id;
  },
};

// The sandbox simulation routes act on external-rail transfers; a ledger transfer is enough to show
// the tenancy boundary (own: reached and refused as NOT_SIMULATABLE; foreign and missing: 404).
FIXTURES.rail_transfer = FIXTURES.transfer!;

const MISSING_IDS: Record<string, string> = {
  rail_transfer: 'tr_00000000000000000000000000000000',
  api_key: 'key_00000000000000000000000000000000',
  ledger_account: 'wal_00000000000000000000000000000000',
  transfer: 'tr_00000000000000000000000000000000',
  webhook_endpoint: 'we_00000000000000000000000000000000',
  event: 'evt_00000000000000000000000000000000',
};

/** Bodies that must name the caller's own objects to be valid; other routes use their example. */
const BODIES: Record<string, (tenant: TestTenant, testApp: TestApp) => unknown> = {
  createTransfer: (tenant) => ({ amount: 1, currency: 'USD', source: tenant.sandbox.usdWalletId, destination: tenant.sandbox.usdAccountId }),
  resendWebhookEvent: async (tenant, testApp) => ({ event: await FIXTURES.event!(testApp, tenant) }),
};

let idempotencyCounter = 0;
const idempotencyHeaders = (method: string): Record<string, string> =>
  method === 'GET' ? {} : { 'idempotency-key': `matrix-${process.pid}-${++idempotencyCounter}` };

function pathFor(route: RouteDefinition, id?: string): string {
  return route.path.replace(/:([A-Za-z0-9_]+)/g, (_, name: string) => {
    assert.equal(name, route.resource?.param, `${route.method} ${route.path}: path parameter without a resource`);
    return encodeURIComponent(id!);
  });
}

/** Statuses that mean "the caller got in and the object was found". */
function reached(status: number): boolean {
  return ![401, 403, 404, 405].includes(status) && status < 500;
}

describe('route × role × tenancy matrix', { timeout: 300_000 }, () => {
  let testApp: TestApp;
  let own: TestTenant;
  let foreign: TestTenant;
  const tokens = new Map<OperatorRole, string>();

  before(async () => {
    testApp = await startTestApp();
    own = await provisionTestTenant(testApp);
    foreign = await provisionTestTenant(testApp);
    for (const role of OPERATOR_ROLES) {
      const email = `${role.replace('_', '-')}@matrix.example`;
      await createOperator(testApp.ownerSql, { companyId: own.company.id, email, password: `matrix-${role}-password`, role }, SYSTEM_ACTOR);
      tokens.set(role, await signIn(testApp, email, `matrix-${role}-password`));
    }
  });
  after(async () => testApp.close());

  it('covers every route: a fixture for each resource, an example for each body', () => {
    for (const route of testApp.app.routes) {
      if (route.resource) assert.ok(FIXTURES[route.resource.type], `no fixture for resource ${route.resource.type}`);
      if (route.body && route.auth.kind !== 'public') assert.ok(route.example !== undefined, `${route.method} ${route.path} has no example body`);
      if (/:\w+/.test(route.path)) assert.ok(route.resource, `${route.method} ${route.path} names an object but declares no resource`);
    }
  });

  it('answers 401 to every non-public route without credentials', async () => {
    for (const route of testApp.app.routes.filter((candidate) => candidate.auth.kind !== 'public')) {
      const id = route.resource ? MISSING_IDS[route.resource.type] : undefined;
      const response = await call(testApp, route.method, pathFor(route, id), route.body ? { body: route.example } : {});
      assert.equal(response.status, 401, `${route.method} ${route.path}`);
    }
  });

  it('lets each role reach exactly what the permission table allows, and only in its own company', async () => {
    const operatorRoutes = testApp.app.routes.filter((route) => route.auth.kind === 'operator' && route.operationId !== 'logout');
    for (const route of operatorRoutes) {
      const permission = route.auth.kind === 'operator' ? route.auth.permission : undefined;
      for (const role of OPERATOR_ROLES) {
        const token = tokens.get(role)!;
        const label = `${role} → ${route.method} ${route.path}`;
        const request = (id?: string) => call(testApp, route.method, pathFor(route, id), { token, ...(route.body ? { body: route.example } : {}) });
        const allowed = allows(role, permission!);
        if (!route.resource) {
          const response = await request();
          if (allowed) assert.ok(reached(response.status), `${label}: expected access, got ${response.status}`);
          else assert.equal(response.status, 403, `${label}: expected 403, got ${response.status}`);
          continue;
        }
        const fixture = FIXTURES[route.resource.type]!;
        const ownId = await fixture(testApp, own);
        const foreignId = await fixture(testApp, foreign);
        const [ownResponse, foreignResponse, missingResponse] = [
          await request(ownId),
          await request(foreignId),
          await request(MISSING_IDS[route.resource.type]),
        ];
        if (allowed) {
          assert.ok(reached(ownResponse.status), `${label} (own): got ${ownResponse.status}`);
          assert.equal(foreignResponse.status, 404, `${label} (foreign): a foreign object must look missing`);
          assert.equal(missingResponse.status, 404, `${label} (missing)`);
          assert.deepEqual(
            { ...foreignResponse.body, request_id: null },
            { ...missingResponse.body, request_id: null },
            `${label}: foreign and missing answers must be indistinguishable`,
          );
        } else {
          for (const response of [ownResponse, foreignResponse, missingResponse]) {
            assert.equal(response.status, 403, `${label}: expected 403, got ${response.status}`);
          }
        }
      }
    }
  });

  it('lets an API key reach /v1 routes only for its own company and environment', async () => {
    const keyRoutes = testApp.app.routes.filter((route) => route.auth.kind === 'api_key');
    assert.ok(keyRoutes.length > 0);
    for (const route of keyRoutes) {
      const label = `api key → ${route.method} ${route.path}`;
      const body = route.body ? { body: (await BODIES[route.operationId]?.(own, testApp)) ?? route.example } : {};
      const request = (id?: string) =>
        call(testApp, route.method, pathFor(route, id), { token: own.sandboxApiKey, headers: idempotencyHeaders(route.method), ...body });
      if (!route.resource) {
        const response = await request();
        assert.ok(reached(response.status), `${label}: got ${response.status} ${JSON.stringify(response.body)}`);
        continue;
      }
      const fixture = FIXTURES[route.resource.type]!;
      const ownResponse = await request(await fixture(testApp, own));
      const foreignResponse = await request(await fixture(testApp, foreign));
      const missingResponse = await request(MISSING_IDS[route.resource.type]);
      assert.ok(reached(ownResponse.status), `${label} (own): got ${ownResponse.status}`);
      assert.equal(foreignResponse.status, 404, `${label} (foreign)`);
      assert.equal(missingResponse.status, 404, `${label} (missing)`);
      assert.deepEqual({ ...foreignResponse.body, request_id: null }, { ...missingResponse.body, request_id: null }, label);
    }
  });

  it('keeps the foreign company untouched by everything the matrix did', async () => {
    const foreignKeys = await testApp.ownerSql<{ revoked: number }[]>`
      select count(*)::int as revoked from api_keys where company_id = ${foreign.company.id} and revoked_at is not null`;
    assert.equal(foreignKeys[0]!.revoked, 0);
  });
});
