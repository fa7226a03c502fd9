import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createApiKey } from '../../services/api-keys.ts';
import { SYSTEM_ACTOR } from '../../services/audit-context.ts';
import { verifyCompany } from '../../services/companies.ts';
import { withTenant } from '../../db/tenant.ts';
import { call, provisionTestTenant, startTestApp, type TestApp, type TestTenant } from '../../test-support/app.ts';

/** Names the tests resolve without DNS: public, private, and a name with one private answer among public ones. */
const DNS: Record<string, string[]> = {
  'hooks.example.com': ['93.184.216.34'],
  'internal.example.com': ['10.1.2.3'],
  'mixed.example.com': ['93.184.216.34', '127.0.0.1'],
};
const lookup = async (hostname: string) => {
  const answer = DNS[hostname];
  if (!answer) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: 'ENOTFOUND' });
  return answer;
};

describe('/v1 webhook endpoints and events', () => {
  let testApp: TestApp;
  let tenant: TestTenant;
  let other: TestTenant;
  let liveKey: string;
  let keyCounter = 0;
  const key = () => `hooks-key-${process.pid}-${++keyCounter}`;

  before(async () => {
    // Production policy: private targets refused, a small endpoint limit to reach.
    testApp = await startTestApp({ webhooks: { allowPrivateUrls: false, maxEndpoints: 4, lookup } });
    tenant = await provisionTestTenant(testApp);
    other = await provisionTestTenant(testApp);
    await verifyCompany(testApp.ownerSql, tenant.company.id, SYSTEM_ACTOR);
    liveKey = (
      await createApiKey(
        testApp.ownerSql,
        { companyId: tenant.company.id, environment: 'live', name: 'live', createdBy: null },
        SYSTEM_ACTOR,
      )
    ).secret;
  });
  after(async () => testApp.close());

  const v1 = (
    method: string,
    path: string,
    options: { body?: unknown; apiKey?: string; idempotencyKey?: string } = {},
  ) =>
    call(testApp, method, path, {
      token: options.apiKey ?? tenant.sandboxApiKey,
      ...(options.body !== undefined ? { body: options.body } : {}),
      ...(method === 'GET' ? {} : { headers: { 'idempotency-key': options.idempotencyKey ?? key() } }),
    });

  async function clearEndpoints(apiKey = tenant.sandboxApiKey) {
    const list = await v1('GET', '/v1/webhook_endpoints?limit=100', { apiKey });
    for (const endpoint of list.body.data) await v1('DELETE', `/v1/webhook_endpoints/${endpoint.id}`, { apiKey });
  }

  it('creates an endpoint and shows its secret once; lists, gets, updates and deletes it', async () => {
    const created = await v1('POST', '/v1/webhook_endpoints', {
      body: {
        url: 'https://hooks.example.com/payments',
        events: ['transfer.settled', 'transfer.failed'],
        description: 'ops',
      },
    });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    assert.match(created.body.id, /^we_[0-9a-f]{32}$/);
    assert.equal(created.body.url, 'https://hooks.example.com/payments');
    assert.match(created.body.secret, /^whsec_[A-Za-z0-9+/]{43}=$/);
    assert.deepEqual(created.body.events, ['transfer.failed', 'transfer.settled']);
    assert.equal(created.body.enabled, true);
    assert.equal(created.headers.get('location'), `/v1/webhook_endpoints/${created.body.id}`);

    const fetched = await v1('GET', `/v1/webhook_endpoints/${created.body.id}`);
    assert.equal(fetched.status, 200);
    assert.equal('secret' in fetched.body, false, 'the secret is shown once');
    const listed = await v1('GET', '/v1/webhook_endpoints');
    assert.deepEqual(
      listed.body.data.map((endpoint: { id: string }) => endpoint.id),
      [created.body.id],
    );
    assert.equal('secret' in listed.body.data[0], false);

    const updated = await v1('PATCH', `/v1/webhook_endpoints/${created.body.id}`, {
      body: { url: 'https://hooks.example.com/v2', events: ['*'], enabled: false },
    });
    assert.equal(updated.status, 200, JSON.stringify(updated.body));
    assert.equal(updated.body.url, 'https://hooks.example.com/v2');
    assert.deepEqual(updated.body.events, ['*']);
    assert.equal(updated.body.enabled, false);
    assert.equal(updated.body.status, 'disabled');
    const reenabled = await v1('PATCH', `/v1/webhook_endpoints/${created.body.id}`, { body: { enabled: true } });
    assert.equal(reenabled.body.enabled, true);
    assert.equal(reenabled.body.disabled_reason, null);

    // Each status change is an event about the endpoint.
    const events = await v1('GET', `/v1/events?object=${created.body.id}`);
    assert.deepEqual(
      events.body.data.map((event: { type: string }) => event.type),
      ['webhook_endpoint.enabled', 'webhook_endpoint.disabled'],
    );
    assert.deepEqual(
      events.body.data.map((event: { data: { version: number } }) => event.data.version),
      [3, 2],
    );

    const deleted = await v1('DELETE', `/v1/webhook_endpoints/${created.body.id}`);
    assert.deepEqual(deleted.body, { id: created.body.id, object: 'webhook_endpoint', deleted: true });
    assert.equal((await v1('GET', `/v1/webhook_endpoints/${created.body.id}`)).status, 404);
    assert.equal((await v1('DELETE', `/v1/webhook_endpoints/${created.body.id}`)).status, 404);
    assert.equal(
      (await v1('PATCH', `/v1/webhook_endpoints/${created.body.id}`, { body: { enabled: true } })).status,
      404,
    );
  });

  it('refuses loopback, private, link-local and metadata targets, and bad URLs, with clear 400s', async () => {
    const cases: [string, string][] = [
      ['http://127.0.0.1:8080/hook', 'WEBHOOK_URL_FORBIDDEN'],
      ['http://localhost/hook', 'WEBHOOK_URL_FORBIDDEN'],
      ['https://10.0.0.8/hook', 'WEBHOOK_URL_FORBIDDEN'],
      ['https://169.254.169.254/latest/meta-data', 'WEBHOOK_URL_FORBIDDEN'],
      ['https://[::1]/hook', 'WEBHOOK_URL_FORBIDDEN'],
      ['https://2130706433/hook', 'WEBHOOK_URL_FORBIDDEN'],
      ['https://internal.example.com/hook', 'WEBHOOK_URL_FORBIDDEN'],
      ['https://mixed.example.com/hook', 'WEBHOOK_URL_FORBIDDEN'],
      ['https://nowhere.example.com/hook', 'WEBHOOK_URL_UNRESOLVABLE'],
      ['ftp://hooks.example.com/hook', 'WEBHOOK_URL_INVALID'],
      ['https://user:pw@hooks.example.com/hook', 'WEBHOOK_URL_INVALID'],
      ['not a url', 'WEBHOOK_URL_INVALID'],
    ];
    for (const [url, code] of cases) {
      const response = await v1('POST', '/v1/webhook_endpoints', { body: { url } });
      assert.equal(response.status, 400, `${url}: ${JSON.stringify(response.body)}`);
      assert.equal(response.body.code, code, url);
    }
    // Live endpoints must use https; sandbox may use http for a public host.
    const liveHttp = await v1('POST', '/v1/webhook_endpoints', {
      body: { url: 'http://hooks.example.com/hook' },
      apiKey: liveKey,
    });
    assert.equal(liveHttp.body.code, 'WEBHOOK_URL_INVALID');
    const sandboxHttp = await v1('POST', '/v1/webhook_endpoints', { body: { url: 'http://hooks.example.com/hook' } });
    assert.equal(sandboxHttp.status, 201);
    // An update is checked the same way.
    const update = await v1('PATCH', `/v1/webhook_endpoints/${sandboxHttp.body.id}`, {
      body: { url: 'http://127.0.0.1/x' },
    });
    assert.equal(update.body.code, 'WEBHOOK_URL_FORBIDDEN');
    await clearEndpoints();
  });

  it('validates every field and the limits', async () => {
    const bad: unknown[] = [
      {},
      { url: 'https://hooks.example.com/x', events: ['transfer.exploded'] },
      { url: 'https://hooks.example.com/x', events: [] },
      { url: 'https://hooks.example.com/x', events: 'transfer.settled' },
      { url: 'https://hooks.example.com/x', extra: true },
      { url: `https://hooks.example.com/${'a'.repeat(2100)}` },
      { url: 'https://hooks.example.com/x', description: 'd'.repeat(501) },
    ];
    for (const body of bad) {
      const response = await v1('POST', '/v1/webhook_endpoints', { body });
      assert.equal(response.status, 400, JSON.stringify(body));
      assert.equal(response.body.code, 'VALIDATION_FAILED', JSON.stringify(response.body));
    }
    const created = await v1('POST', '/v1/webhook_endpoints', { body: { url: 'https://hooks.example.com/a' } });
    assert.equal((await v1('PATCH', `/v1/webhook_endpoints/${created.body.id}`, { body: {} })).status, 400);
    assert.equal(
      (await v1('PATCH', `/v1/webhook_endpoints/${created.body.id}`, { body: { enabled: 'yes' } })).status,
      400,
    );
    assert.equal(
      (await v1('POST', `/v1/webhook_endpoints/${created.body.id}/rotate_secret`, { body: { overlap_seconds: -1 } }))
        .status,
      400,
    );
    assert.equal(
      (
        await v1('POST', `/v1/webhook_endpoints/${created.body.id}/rotate_secret`, {
          body: { overlap_seconds: 8 * 86400 },
        })
      ).status,
      400,
    );
    // Writes need an Idempotency-Key.
    const noKey = await call(testApp, 'POST', '/v1/webhook_endpoints', {
      token: tenant.sandboxApiKey,
      body: { url: 'https://hooks.example.com/b' },
    });
    assert.equal(noKey.status, 400);

    // At most 4 endpoints per environment here (16 by default); the live environment counts apart.
    for (let i = 0; i < 3; i++)
      assert.equal(
        (await v1('POST', '/v1/webhook_endpoints', { body: { url: `https://hooks.example.com/${i}` } })).status,
        201,
      );
    const fifth = await v1('POST', '/v1/webhook_endpoints', { body: { url: 'https://hooks.example.com/5' } });
    assert.equal(fifth.status, 422);
    assert.equal(fifth.body.code, 'WEBHOOK_ENDPOINT_LIMIT');
    assert.equal(
      (await v1('POST', '/v1/webhook_endpoints', { body: { url: 'https://hooks.example.com/live' }, apiKey: liveKey }))
        .status,
      201,
    );
    await clearEndpoints();
    await clearEndpoints(liveKey);
  });

  it('replays a create for the same Idempotency-Key instead of making a second endpoint', async () => {
    const idempotencyKey = key();
    const first = await v1('POST', '/v1/webhook_endpoints', {
      body: { url: 'https://hooks.example.com/once' },
      idempotencyKey,
    });
    const again = await v1('POST', '/v1/webhook_endpoints', {
      body: { url: 'https://hooks.example.com/once' },
      idempotencyKey,
    });
    assert.equal(first.status, 201);
    assert.equal(first.headers.get('cache-control'), 'no-store');
    // The secret is shown once: the replay shows the same endpoint without it.
    assert.deepEqual(again.body, { ...first.body, secret: null });
    assert.equal((await v1('GET', '/v1/webhook_endpoints')).body.data.length, 1);
    await clearEndpoints();
  });

  it('rotates the secret with an overlap window', async () => {
    const created = await v1('POST', '/v1/webhook_endpoints', { body: { url: 'https://hooks.example.com/rot' } });
    const rotated = await v1('POST', `/v1/webhook_endpoints/${created.body.id}/rotate_secret`, {
      body: { overlap_seconds: 3600 },
    });
    assert.equal(rotated.status, 200, JSON.stringify(rotated.body));
    assert.notEqual(rotated.body.secret, created.body.secret);
    const expires = Date.parse(rotated.body.previous_secret_expires_at);
    assert.ok(Math.abs(expires - (Date.now() + 3600_000)) < 60_000);
    const [row] = await testApp.ownerSql<{ secret: string; previous_secret: string }[]>`
      select secret, previous_secret from webhook_endpoints where id = ${created.body.id}`;
    assert.deepEqual({ ...row }, { secret: rotated.body.secret, previous_secret: created.body.secret });
    const immediate = await v1('POST', `/v1/webhook_endpoints/${created.body.id}/rotate_secret`, {
      body: { overlap_seconds: 0 },
    });
    assert.equal(immediate.body.previous_secret_expires_at, null);
    await clearEndpoints();
  });

  it('lists events newest first with cursors and filters, each with its object at that version', async () => {
    const transfers: string[] = [];
    for (let i = 0; i < 3; i++) {
      const response = await v1('POST', '/v1/transfers', {
        body: {
          amount: 100 + i,
          currency: 'USD',
          source: tenant.sandbox.usdWalletId,
          destination: tenant.sandbox.usdAccountId,
        },
      });
      assert.equal(response.status, 201);
      transfers.push(response.body.id);
    }
    const first = await v1('GET', '/v1/events?limit=2&type=transfer.settled');
    assert.equal(first.status, 200);
    assert.equal(first.body.data.length, 2);
    assert.equal(first.body.has_more, true);
    const second = await v1('GET', `/v1/events?limit=2&type=transfer.settled&cursor=${first.body.next_cursor}`);
    const seen = [...first.body.data, ...second.body.data].map(
      (event: { data: { object: { id: string } } }) => event.data.object.id,
    );
    assert.deepEqual(seen.slice(0, 3), [...transfers].reverse());
    const event = first.body.data[0];
    assert.match(event.id, /^evt_[0-9a-f]{32}$/);
    assert.equal(event.object, 'event');
    assert.equal(event.type, 'transfer.settled');
    assert.equal(event.livemode, false);
    assert.equal(event.data.version, 1);
    assert.equal(event.data.object.amount, 102);
    assert.equal(typeof event.data.object.signature, 'string');
    const { signature, ...object } = event.data.object;
    assert.equal(await testApp.signer.verify(object, signature), true);

    const one = await v1('GET', `/v1/events/${event.id}`);
    assert.deepEqual(one.body, event);
    assert.equal((await v1('GET', '/v1/events?type=transfer.bogus')).status, 400);
    assert.equal((await v1('GET', '/v1/events?cursor=garbage')).status, 400);
  });

  it('keeps events and endpoints to their company and environment', async () => {
    const mine = await v1('GET', '/v1/events?limit=1');
    const eventId = mine.body.data[0].id;
    assert.equal((await v1('GET', `/v1/events/${eventId}`, { apiKey: other.sandboxApiKey })).status, 404);
    assert.equal((await v1('GET', `/v1/events/${eventId}`, { apiKey: liveKey })).status, 404);
    assert.equal((await v1('GET', '/v1/events', { apiKey: liveKey })).body.data.length, 0);
    // The other company sees only its own events (its sandbox preload transfers).
    const theirs = (await v1('GET', '/v1/events?limit=100', { apiKey: other.sandboxApiKey })).body.data;
    assert.ok(theirs.length > 0);
    for (const event of theirs) assert.equal(event.data.object.source === tenant.sandbox.usdWalletId, false);
    assert.equal(
      theirs.some((event: { id: string }) => event.id === eventId),
      false,
    );

    const endpoint = await v1('POST', '/v1/webhook_endpoints', { body: { url: 'https://hooks.example.com/mine' } });
    for (const apiKey of [other.sandboxApiKey, liveKey]) {
      assert.equal((await v1('GET', `/v1/webhook_endpoints/${endpoint.body.id}`, { apiKey })).status, 404);
      assert.equal(
        (await v1('PATCH', `/v1/webhook_endpoints/${endpoint.body.id}`, { apiKey, body: { enabled: false } })).status,
        404,
      );
      assert.equal((await v1('GET', `/v1/webhook_endpoints/${endpoint.body.id}/attempts`, { apiKey })).status, 404);
      assert.equal(
        (await v1('POST', `/v1/webhook_endpoints/${endpoint.body.id}/resend`, { apiKey, body: { event: eventId } }))
          .status,
        404,
      );
    }
    // A resend of another company's event to my endpoint: no such event.
    const foreignEvent = await testApp.ownerSql<{ id: string }[]>`
      insert into events (id, company_id, environment, type, object_type, object_id, object_version, snapshot)
      values (new_event_id(), ${other.company.id}, 'sandbox', 'transfer.settled', 'transfer', 'tr_x', 1, '{}') returning id`;
    const resend = await v1('POST', `/v1/webhook_endpoints/${endpoint.body.id}/resend`, {
      body: { event: foreignEvent[0]!.id },
    });
    assert.equal(resend.status, 404);
    assert.equal(resend.body.code, 'EVENT_NOT_FOUND');
    await clearEndpoints();
  });

  it('queues a manual resend (202) and refuses one to a disabled endpoint (409)', async () => {
    const eventId = (await v1('GET', '/v1/events?limit=1')).body.data[0].id;
    const endpoint = await v1('POST', '/v1/webhook_endpoints', { body: { url: 'https://hooks.example.com/resend' } });
    const resend = await v1('POST', `/v1/webhook_endpoints/${endpoint.body.id}/resend`, { body: { event: eventId } });
    assert.equal(resend.status, 202, JSON.stringify(resend.body));
    assert.equal(resend.body.status, 'queued');
    assert.equal(resend.body.event, eventId);
    // The workflow is recorded in the outbox with the delivery, so it runs even though this test
    // app's Temporal is unreachable: the outbox relay starts it.
    const [outbox] = await testApp.ownerSql<{ workflow_type: string }[]>`
      select workflow_type from outbox where workflow_id like ${`webhook-resend:${endpoint.body.id}:%`}`;
    assert.equal(outbox?.workflow_type, 'webhookResendWorkflow');
    await v1('PATCH', `/v1/webhook_endpoints/${endpoint.body.id}`, { body: { enabled: false } });
    const refused = await v1('POST', `/v1/webhook_endpoints/${endpoint.body.id}/resend`, { body: { event: eventId } });
    assert.equal(refused.status, 409);
    assert.equal(refused.body.code, 'WEBHOOK_ENDPOINT_DISABLED');
    const attempts = await v1('GET', `/v1/webhook_endpoints/${endpoint.body.id}/attempts`);
    assert.deepEqual(attempts.body, { data: [], has_more: false, next_cursor: null });
    await clearEndpoints();
  });
});

describe('events are written by the database in the same transaction as the change', () => {
  let testApp: TestApp;
  let tenant: TestTenant;

  before(async () => {
    testApp = await startTestApp();
    tenant = await provisionTestTenant(testApp);
  });
  after(async () => testApp.close());

  it('writes one event per transfer version, never changes one, and none for a rolled-back change', async () => {
    const response = await call(testApp, 'POST', '/v1/transfers', {
      token: tenant.sandboxApiKey,
      headers: { 'idempotency-key': 'evt-1' },
      body: {
        amount: 5,
        currency: 'USD',
        source: tenant.sandbox.usdWalletId,
        destination: tenant.sandbox.usdAccountId,
      },
    });
    const rows = await testApp.ownerSql<
      { id: string; type: string; object_version: number; snapshot: { amount: string } }[]
    >`
      select id, type, object_version, snapshot from events where object_id = ${response.body.id}`;
    assert.equal(rows.length, 1);
    assert.equal(rows[0]!.type, 'transfer.settled');
    assert.equal(rows[0]!.snapshot.amount, '5');

    // An event is history: the app role cannot rewrite it, and nobody can change its contents.
    await assert.rejects(
      withTenant(
        testApp.appSql,
        tenant.company.id,
        (tx) => tx`update events set type = 'transfer.failed' where id = ${rows[0]!.id}`,
      ),
      /events never change/,
    );
    await assert.rejects(
      testApp.ownerSql`update events set type = 'transfer.failed' where id = ${rows[0]!.id}`,
      /events never change/,
    );
    await assert.rejects(testApp.appSql`delete from events where id = ${rows[0]!.id}`);
    // A second event for the same version is refused.
    await assert.rejects(
      testApp.ownerSql`
        insert into events (id, company_id, environment, type, object_type, object_id, object_version, snapshot)
        values (new_event_id(), ${tenant.company.id}, 'sandbox', 'transfer.settled', 'transfer', ${response.body.id}, 1, '{}')`,
      /events_one_per_version/,
    );

    // A transfer refused for insufficient funds rolls back with its event: no event without its change.
    const before = await testApp.ownerSql<
      { count: number }[]
    >`select count(*)::int as count from events where company_id = ${tenant.company.id}`;
    const refused = await call(testApp, 'POST', '/v1/transfers', {
      token: tenant.sandboxApiKey,
      headers: { 'idempotency-key': 'evt-2' },
      body: {
        amount: 999_999_999,
        currency: 'USD',
        source: tenant.sandbox.usdWalletId,
        destination: tenant.sandbox.usdAccountId,
      },
    });
    assert.equal(refused.status, 422);
    const afterRefusal = await testApp.ownerSql<
      { count: number }[]
    >`select count(*)::int as count from events where company_id = ${tenant.company.id}`;
    assert.equal(afterRefusal[0]!.count, before[0]!.count);
  });

  it('writes transfer.pending, transfer.processing, transfer.settled and transfer.returned as a payout moves', async () => {
    const [wallet] = await testApp.ownerSql<{ id: string }[]>`select ${tenant.sandbox.usdcWalletId} as id`;
    const transferId = `tr_${'0'.repeat(31)}1`;
    // The rail transfer's lifecycle, driven directly in SQL as the settlement activities do.
    await testApp.ownerSql.begin(async (tx) => {
      await tx`
        insert into transfers (id, company_id, environment, idempotency_key, rail, status, amount, currency, source_account_id,
                               destination_external_account_id, out_amount, out_currency, fee_amount, fx_rate, workflow_id)
        values (${transferId}, ${tenant.company.id}, 'sandbox', 'evt-payout', 'ach', 'pending', 1000000, 'USDC', ${wallet!.id},
                ${tenant.sandbox.achAccountId}, 99, 'USD', 5000, 1, 'wf-evt')`;
    });
    // A settled transfer has the posted entries that moved its money (migration 00012).
    const [funding] = await testApp.ownerSql<{ id: string }[]>`
      select id from ledger_accounts
      where company_id = ${tenant.company.id} and environment = 'sandbox' and currency = 'USDC'
        and system_purpose = 'sandbox_funding'`;
    for (const [status, version] of [
      ['processing', 2],
      ['settled', 3],
      ['returned', 4],
    ] as const) {
      await testApp.ownerSql.begin(async (tx) => {
        if (status === 'settled') {
          await tx`
            insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind)
            values (${tenant.company.id}, 'sandbox', ${transferId}, ${wallet!.id}, 'USDC', -1000000, 'posted'),
                   (${tenant.company.id}, 'sandbox', ${transferId}, ${funding!.id}, 'USDC', 1000000, 'posted')`;
        }
        await tx`update transfers set status = ${status}, version = ${version} where id = ${transferId}`;
      });
    }
    const rows = await testApp.ownerSql<
      { type: string; object_version: number; snapshot: { status: string; out_amount: string; fx_rate: string } }[]
    >`
      select type, object_version, snapshot from events where object_id = ${transferId} order by object_version`;
    assert.deepEqual(
      rows.map((row) => [row.type, row.object_version, row.snapshot.status]),
      [
        ['transfer.pending', 1, 'pending'],
        ['transfer.processing', 2, 'processing'],
        ['transfer.settled', 3, 'settled'],
        ['transfer.returned', 4, 'returned'],
      ],
    );
    assert.equal(rows[0]!.snapshot.out_amount, '99');
    assert.equal(Number(rows[0]!.snapshot.fx_rate), 1);
    // A change that is not a status change writes nothing.
    await testApp.ownerSql`update transfers set updated_at = now() where id = ${transferId}`;
    const count = await testApp.ownerSql<
      { count: number }[]
    >`select count(*)::int as count from events where object_id = ${transferId}`;
    assert.equal(count[0]!.count, 4);
    // The API renders the returned payout's event as GET /v1/transfers shows a payout.
    const events = await call(testApp, 'GET', `/v1/events?object=${transferId}&limit=1`, {
      token: tenant.sandboxApiKey,
    });
    assert.equal(events.body.data[0].type, 'transfer.returned');
    assert.equal(events.body.data[0].data.object.out.amount, '0.99');
    assert.equal(events.body.data[0].data.object.fee.amount, '0.005000');
  });
});
