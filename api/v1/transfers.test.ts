import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { insertRunningIdempotencyKey } from '../../db/idempotency.ts';
import { LedgerQueueFullError } from '../../db/ledger-batch.ts';
import { withTenant } from '../../db/tenant.ts';
import { call, provisionTestTenant, startTestApp, type TestApp, type TestTenant } from '../../test-support/app.ts';
import { requestFingerprint } from '../middleware/idempotency.ts';

describe('/v1 accounts and ledger transfers (Shape B)', () => {
  let testApp: TestApp;
  let tenant: TestTenant;
  let other: TestTenant;
  let keyCounter = 0;
  const key = () => `test-key-${process.pid}-${++keyCounter}`;

  before(async () => {
    testApp = await startTestApp();
    tenant = await provisionTestTenant(testApp);
    other = await provisionTestTenant(testApp);
  });
  after(async () => testApp.close());

  const v1 = (
    method: string,
    path: string,
    options: { body?: unknown; idempotencyKey?: string; apiKey?: string } = {},
  ) =>
    call(testApp, method, path, {
      token: options.apiKey ?? tenant.sandboxApiKey,
      ...(options.body !== undefined ? { body: options.body } : {}),
      ...(options.idempotencyKey ? { headers: { 'idempotency-key': options.idempotencyKey } } : {}),
    });
  /** POST /v1/transfers with the body text as written (JSON.stringify would rewrite numbers and escapes). */
  const postRaw = (body: string) =>
    fetch(`${testApp.url}/v1/transfers`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${tenant.sandboxApiKey}`,
        'content-type': 'application/json',
        'idempotency-key': key(),
      },
      body,
    });
  const balances = async (id: string, apiKey?: string) =>
    (await v1('GET', `/v1/accounts/${id}`, apiKey ? { apiKey } : {})).body.balances;

  it('lists the preloaded sandbox wallets and account with decimal-string balances', async () => {
    const response = await v1('GET', '/v1/accounts');
    assert.equal(response.status, 200);
    const byId = new Map(response.body.data.map((account: { id: string }) => [account.id, account]));
    assert.equal(byId.size, 3);
    assert.deepEqual((byId.get(tenant.sandbox.usdcWalletId) as any).balances, {
      available: '10000.000000',
      pending: '0.000000',
      posted: '10000.000000',
    });
    assert.deepEqual((byId.get(tenant.sandbox.usdWalletId) as any).balances, {
      available: '10000.00',
      pending: '0.00',
      posted: '10000.00',
    });
    assert.equal((byId.get(tenant.sandbox.usdAccountId) as any).type, 'account');
    assert.equal((byId.get(tenant.sandbox.usdAccountId) as any).balances.posted, '0.00');
    assert.equal((await v1('GET', '/v1/accounts', { apiKey: 'sk_sandbox_bad' })).status, 401);
  });

  it('lists accounts newest first across wallets and accounts, page by page', async () => {
    // Provisioning opens the USDC wallet, the USD wallet, then the USD account: newest first is the reverse.
    const all = await v1('GET', '/v1/accounts');
    assert.deepEqual(
      all.body.data.map((account: { id: string }) => account.id),
      [tenant.sandbox.usdAccountId, tenant.sandbox.usdWalletId, tenant.sandbox.usdcWalletId],
    );
    const seen: string[] = [];
    let cursor: string | null = null;
    do {
      const page: Awaited<ReturnType<typeof v1>> = await v1(
        'GET',
        `/v1/accounts?limit=1${cursor ? `&cursor=${cursor}` : ''}`,
      );
      seen.push(...page.body.data.map((account: { id: string }) => account.id));
      cursor = page.body.next_cursor;
    } while (cursor);
    assert.deepEqual(
      seen,
      all.body.data.map((account: { id: string }) => account.id),
    );
  });

  it('settles a transfer in the request, signs it, and replays it for the same key without moving money twice', async () => {
    const idempotencyKey = key();
    const body = {
      amount: 1050,
      currency: 'USD',
      source: tenant.sandbox.usdWalletId,
      destination: tenant.sandbox.usdAccountId,
    };
    const first = await fetch(`${testApp.url}/v1/transfers`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${tenant.sandboxApiKey}`,
        'content-type': 'application/json',
        'idempotency-key': idempotencyKey,
      },
      body: JSON.stringify(body),
    });
    assert.equal(first.status, 201);
    const firstText = await first.text();
    const transfer = JSON.parse(firstText);
    assert.match(transfer.id, /^tr_[0-9a-f]{32}$/);
    assert.equal(transfer.status, 'settled');
    assert.equal(transfer.amount, 1050);
    assert.equal(transfer.currency, 'USD');
    assert.equal(transfer.rail, 'ledger');
    assert.match(transfer.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.match(transfer.signature, /^[A-Za-z0-9_-]+\.\.[A-Za-z0-9_-]+$/);
    const { signature, ...unsigned } = transfer;
    assert.equal(await testApp.signer.verify(unsigned, signature), true);
    assert.equal(await testApp.signer.verify({ ...unsigned, amount: 1051 }, signature), false);
    assert.deepEqual(await balances(tenant.sandbox.usdWalletId), {
      available: '9989.50',
      pending: '0.00',
      posted: '9989.50',
    });
    assert.deepEqual(await balances(tenant.sandbox.usdAccountId), {
      available: '10.50',
      pending: '0.00',
      posted: '10.50',
    });

    const replay = await fetch(`${testApp.url}/v1/transfers`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${tenant.sandboxApiKey}`,
        'content-type': 'application/json',
        'idempotency-key': idempotencyKey,
      },
      body: JSON.stringify(body),
    });
    assert.equal(replay.status, 201);
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
    assert.equal(await replay.text(), firstText, 'the replay is the first response, byte for byte');
    assert.equal((await balances(tenant.sandbox.usdAccountId)).posted, '10.50', 'no second settlement');

    const mismatch = await v1('POST', '/v1/transfers', { idempotencyKey, body: { ...body, amount: 1051 } });
    assert.equal(mismatch.status, 422);
    assert.equal(mismatch.body.code, 'IDEMPOTENCY_KEY_REUSED');

    const fetched = await v1('GET', `/v1/transfers/${transfer.id}`);
    assert.equal(fetched.status, 200);
    assert.deepEqual(
      fetched.body.status_history.map((change: { status: string }) => change.status),
      ['settled'],
    );
    const { signature: fetchedSignature, ...fetchedUnsigned } = fetched.body;
    assert.equal(await testApp.signer.verify(fetchedUnsigned, fetchedSignature), true);
  });

  it('requires an Idempotency-Key on every /v1 write', async () => {
    const response = await v1('POST', '/v1/transfers', {
      body: {
        amount: 1,
        currency: 'USD',
        source: tenant.sandbox.usdWalletId,
        destination: tenant.sandbox.usdAccountId,
      },
    });
    assert.equal(response.status, 400);
    assert.equal(response.body.code, 'IDEMPOTENCY_KEY_REQUIRED');
  });

  it('answers business-rule failures with stable 4xx codes and moves nothing', async () => {
    const before = await balances(tenant.sandbox.usdWalletId);
    const attempt = async (body: Record<string, unknown>) =>
      v1('POST', '/v1/transfers', { idempotencyKey: key(), body });
    const base = {
      amount: 100,
      currency: 'USD',
      source: tenant.sandbox.usdWalletId,
      destination: tenant.sandbox.usdAccountId,
    };

    const insufficient = await attempt({ ...base, amount: 100_000_000_00 });
    assert.equal(insufficient.status, 422);
    assert.equal(insufficient.body.code, 'INSUFFICIENT_FUNDS');

    const mismatch = await attempt({ ...base, source: tenant.sandbox.usdcWalletId });
    assert.equal(mismatch.status, 422);
    assert.equal(mismatch.body.code, 'CURRENCY_MISMATCH');

    const same = await attempt({ ...base, destination: tenant.sandbox.usdWalletId });
    assert.equal(same.status, 422);
    assert.equal(same.body.code, 'SAME_ACCOUNT');

    const missing = await attempt({ ...base, destination: 'acct_00000000000000000000000000000000' });
    const foreign = await attempt({ ...base, destination: other.sandbox.usdAccountId });
    assert.equal(missing.status, 404);
    assert.equal(missing.body.code, 'ACCOUNT_NOT_FOUND');
    assert.deepEqual(
      { ...foreign.body, request_id: null, detail: null },
      { ...missing.body, request_id: null, detail: null },
    );

    const unsupported = await attempt({ ...base, currency: 'XYZ' });
    assert.equal(unsupported.status, 400);
    assert.equal(unsupported.body.code, 'UNSUPPORTED_CURRENCY');

    assert.deepEqual(await balances(tenant.sandbox.usdWalletId), before);
    assert.deepEqual(await balances(other.sandbox.usdAccountId, other.sandboxApiKey), {
      available: '0.00',
      pending: '0.00',
      posted: '0.00',
    });
  });

  it('rejects amounts of the wrong type, sign, scale or size and bodies of another shape with 400', async () => {
    const base = {
      amount: 100,
      currency: 'USD',
      source: tenant.sandbox.usdWalletId,
      destination: tenant.sandbox.usdAccountId,
    };
    const cases: [string, Record<string, unknown>, string][] = [
      ['string amount', { ...base, amount: '10.50' }, 'body.amount'],
      ['fractional amount', { ...base, amount: 10.5 }, 'body.amount'],
      ['negative amount', { ...base, amount: -5 }, 'body.amount'],
      ['zero amount', { ...base, amount: 0 }, 'body.amount'],
      ['huge amount', { ...base, amount: 1e16 }, 'body.amount'],
      ['unknown field', { ...base, memo: 'x' }, 'body'],
      ['lower-case currency', { ...base, currency: 'usd' }, 'body.currency'],
      [
        'Shape A mixed in',
        { ...base, source: { currency: 'USDC', rail: 'stablecoin', amount: '1.00' } },
        'body.source',
      ],
    ];
    for (const [label, body, path] of cases) {
      const response = await v1('POST', '/v1/transfers', { idempotencyKey: key(), body });
      assert.equal(response.status, 400, label);
      assert.equal(response.body.code, 'VALIDATION_FAILED', label);
      assert.ok(
        response.body.errors.some((error: { path: string }) => error.path === path),
        `${label}: ${JSON.stringify(response.body.errors)}`,
      );
    }
  });

  it('says a too-large amount is too large, and only a fractional one that it must be an integer', async () => {
    const post = async (amount: string) => {
      // The amount goes in as written: a 40-digit JSON number, not what JSON.stringify makes of it.
      const response = await postRaw(
        `{"amount":${amount},"currency":"USD","source":"${tenant.sandbox.usdWalletId}","destination":"${tenant.sandbox.usdAccountId}"}`,
      );
      assert.equal(response.status, 400, amount);
      const problem = (await response.json()) as { code: string; errors: { path: string; message: string }[] };
      assert.equal(problem.code, 'VALIDATION_FAILED', amount);
      return problem.errors;
    };
    const tooLarge = [{ path: 'body.amount', message: 'amount may not exceed 1000000000000000 minor units' }];
    assert.deepEqual(await post('1234567890123456789012345678901234567890'), tooLarge);
    assert.deepEqual(await post('10000000000000000'), tooLarge);
    assert.deepEqual(await post('10.5'), [
      { path: 'body.amount', message: 'amount is an integer number of minor units' },
    ]);
    assert.deepEqual(await post('-1234567890123456789012345678901234567890'), [
      { path: 'body.amount', message: 'amount must be positive' },
    ]);
  });

  it('conserves money under concurrent transfers: exactly as many succeed as the balance allows', async () => {
    const fresh = await provisionTestTenant(testApp);
    const requests = Array.from({ length: 20 }, () =>
      v1('POST', '/v1/transfers', {
        apiKey: fresh.sandboxApiKey,
        idempotencyKey: key(),
        body: {
          amount: 600_00,
          currency: 'USD',
          source: fresh.sandbox.usdWalletId,
          destination: fresh.sandbox.usdAccountId,
        },
      }),
    );
    const results = await Promise.all(requests);
    const created = results.filter((response) => response.status === 201).length;
    const refused = results.filter((response) => response.body?.code === 'INSUFFICIENT_FUNDS').length;
    assert.equal(created, 16, JSON.stringify(results.map((response) => response.status)));
    assert.equal(refused, 4);
    assert.deepEqual(await balances(fresh.sandbox.usdWalletId, fresh.sandboxApiKey), {
      available: '400.00',
      pending: '0.00',
      posted: '400.00',
    });
    assert.equal((await balances(fresh.sandbox.usdAccountId, fresh.sandboxApiKey)).posted, '9600.00');
  });

  const post = (idempotencyKey: string, body: unknown, apiKey = tenant.sandboxApiKey) =>
    fetch(`${testApp.url}/v1/transfers`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${apiKey}`,
        'content-type': 'application/json',
        'idempotency-key': idempotencyKey,
      },
      body: JSON.stringify(body),
    });
  const transfersUnder = async (idempotencyKey: string) =>
    Number(
      (
        await testApp.ownerSql<
          { n: number }[]
        >`select count(*)::int as n from transfers where idempotency_key = ${idempotencyKey}`
      )[0]!.n,
    );

  it('stores exactly the signed body it sends, with the transfer, in one commit', async () => {
    const idempotencyKey = key();
    const body = {
      amount: 3,
      currency: 'USD',
      source: tenant.sandbox.usdWalletId,
      destination: tenant.sandbox.usdAccountId,
    };
    const response = await post(idempotencyKey, body);
    assert.equal(response.status, 201);
    const text = await response.text();
    const transfer = JSON.parse(text);
    assert.equal(response.headers.get('location'), `/v1/transfers/${transfer.id}`);
    const [stored] = await testApp.ownerSql<
      { response_body: Buffer; response_headers: Record<string, string>; status: string }[]
    >`
      select response_body, response_headers, status from idempotency_keys where key = ${idempotencyKey}`;
    assert.equal(stored?.status, 'completed');
    assert.equal(stored?.response_body.toString('utf8'), text);
    assert.equal(stored?.response_headers.location, `/v1/transfers/${transfer.id}`);
    const [row] = await testApp.ownerSql<
      { created_at: Date }[]
    >`select created_at from transfers where id = ${transfer.id}`;
    assert.equal(row?.created_at.toISOString(), transfer.created_at, 'the signed created_at is the stored one');
  });

  it('stores a refusal under its key and replays it byte for byte', async () => {
    const idempotencyKey = key();
    const body = {
      amount: 100_000_000_00,
      currency: 'USD',
      source: tenant.sandbox.usdWalletId,
      destination: tenant.sandbox.usdAccountId,
    };
    const first = await post(idempotencyKey, body);
    assert.equal(first.status, 422);
    const firstText = await first.text();
    assert.equal(JSON.parse(firstText).code, 'INSUFFICIENT_FUNDS');
    const again = await post(idempotencyKey, body);
    assert.equal(again.status, 422);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.equal(await again.text(), firstText);
    for (const [label, refused] of [
      ['currency', { ...body, amount: 1, source: tenant.sandbox.usdcWalletId }],
      ['account', { ...body, amount: 1, destination: other.sandbox.usdAccountId }],
    ] as const) {
      const refusalKey = key();
      const once = await post(refusalKey, refused);
      const twice = await post(refusalKey, refused);
      assert.equal(twice.status, once.status, label);
      assert.equal(twice.headers.get('idempotent-replayed'), 'true', label);
      assert.equal(await twice.text(), await once.text(), label);
    }
  });

  it('answers a burst of one request with one transfer and the same signed body for all', async () => {
    const idempotencyKey = key();
    const body = {
      amount: 7,
      currency: 'USD',
      source: tenant.sandbox.usdWalletId,
      destination: tenant.sandbox.usdAccountId,
    };
    const responses = await Promise.all(Array.from({ length: 8 }, () => post(idempotencyKey, body)));
    const texts = await Promise.all(responses.map((response) => response.text()));
    assert.deepEqual(
      responses.map((response) => response.status),
      Array.from({ length: 8 }, () => 201),
    );
    assert.equal(new Set(texts).size, 1, 'every answer is the one stored response');
    assert.equal(responses.filter((response) => response.headers.get('idempotent-replayed') === 'true').length, 7);
    assert.equal(await transfersUnder(idempotencyKey), 1);
  });

  it('answers 409 while a classic request holds the key, and takes over one whose lease expired', async () => {
    const body = {
      amount: 2,
      currency: 'USD',
      source: tenant.sandbox.usdWalletId,
      destination: tenant.sandbox.usdAccountId,
    };
    const hold = (idempotencyKey: string, leaseMs: number) =>
      withTenant(testApp.appSql, tenant.company.id, (tx) =>
        insertRunningIdempotencyKey(tx, {
          companyId: tenant.company.id,
          environment: 'sandbox',
          key: idempotencyKey,
          requestMethod: 'POST',
          requestPath: '/v1/transfers',
          requestHash: requestFingerprint('POST', '/v1/transfers', body),
          leaseMs,
          ttlMs: 24 * 60 * 60 * 1000,
        }),
      );
    const busyKey = key();
    await hold(busyKey, 60_000);
    const busy = await post(busyKey, body);
    assert.equal(busy.status, 409);
    assert.equal(busy.headers.get('retry-after'), '1');
    assert.equal(((await busy.json()) as { code: string }).code, 'IDEMPOTENCY_REQUEST_IN_PROGRESS');
    assert.equal(await transfersUnder(busyKey), 0);

    const deadKey = key();
    await hold(deadKey, -1_000);
    const takenOver = await post(deadKey, body);
    assert.equal(takenOver.status, 201);
    assert.equal(await transfersUnder(deadKey), 1);
    const replay = await post(deadKey, body);
    assert.equal(replay.headers.get('idempotent-replayed'), 'true');
  });

  it('refuses a key that a transfer already used after its record was purged (IDEMPOTENCY_KEY_USED)', async () => {
    const idempotencyKey = key();
    const body = {
      amount: 4,
      currency: 'USD',
      source: tenant.sandbox.usdWalletId,
      destination: tenant.sandbox.usdAccountId,
    };
    assert.equal((await post(idempotencyKey, body)).status, 201);
    await testApp.ownerSql`delete from idempotency_keys where key = ${idempotencyKey}`;
    testApp.idempotency.clearReplayCache(); // the purge comes 24 h on, long after the cache forgot it
    const reused = await post(idempotencyKey, body);
    assert.equal(reused.status, 409);
    assert.equal(((await reused.json()) as { code: string }).code, 'IDEMPOTENCY_KEY_USED');
    assert.equal(await transfersUnder(idempotencyKey), 1);
  });

  it('lists transfers newest first with filters and a cursor', async () => {
    const fresh = await provisionTestTenant(testApp);
    for (let index = 1; index <= 3; index++) {
      await v1('POST', '/v1/transfers', {
        apiKey: fresh.sandboxApiKey,
        idempotencyKey: key(),
        body: {
          amount: index,
          currency: 'USD',
          source: fresh.sandbox.usdWalletId,
          destination: fresh.sandbox.usdAccountId,
        },
      });
    }
    const list = await v1('GET', '/v1/transfers?limit=2&status=settled&rail=ledger', { apiKey: fresh.sandboxApiKey });
    assert.equal(list.status, 200);
    assert.equal(list.body.data.length, 2);
    assert.equal(list.body.has_more, true);
    for (const transfer of list.body.data) assert.match(transfer.signature, /\.\./);
    const next = await v1('GET', `/v1/transfers?limit=2&status=settled&cursor=${list.body.next_cursor}`, {
      apiKey: fresh.sandboxApiKey,
    });
    // 3 created + 2 sandbox preloads (USDC wallet and USD wallet funding)
    assert.equal(list.body.data.length + next.body.data.length + (next.body.has_more ? 1 : 0) >= 4, true);
    const future = await v1('GET', `/v1/transfers?created[gte]=${new Date(Date.now() + 60_000).toISOString()}`, {
      apiKey: fresh.sandboxApiKey,
    });
    assert.deepEqual(future.body.data, []);
    assert.equal((await v1('GET', '/v1/transfers?status=lost', { apiKey: fresh.sandboxApiKey })).status, 400);
    assert.equal((await v1('GET', '/v1/transfers/tr_00000000000000000000000000000000')).status, 404);
    // Inputs PostgreSQL cannot take are 400s, not 500s: year 0000, a NUL in a path ID or in a cursor.
    for (const path of [
      '/v1/transfers?created[gte]=0000-01-01T00:00:00Z',
      '/v1/transfers?created[lt]=0000-06-01T00:00:00Z',
      '/v1/transfers/%00',
      `/v1/transfers?cursor=${Buffer.from(JSON.stringify({ i: 'tr_\u0000' })).toString('base64url')}`,
    ]) {
      const refused = await v1('GET', path, { apiKey: fresh.sandboxApiKey });
      assert.equal(refused.status, 400, path);
      assert.equal(refused.body.code, 'VALIDATION_FAILED', path);
    }
  });

  it('refuses a query parameter the route does not take, naming what it takes; public routes ignore them', async () => {
    const misspelt = await v1('GET', '/v1/transfers?limt=5&status=settled');
    assert.equal(misspelt.status, 400);
    assert.equal(misspelt.body.code, 'VALIDATION_FAILED');
    assert.deepEqual(misspelt.body.errors, [
      {
        path: 'query.limt',
        message: 'unknown query parameter; this route takes limit, cursor, status, rail, created[gte], created[lt]',
      },
    ]);
    const none = await v1('GET', `/v1/accounts/${tenant.sandbox.usdWalletId}?expand=entries`);
    assert.equal(none.status, 400);
    assert.deepEqual(none.body.errors, [
      { path: 'query.expand', message: 'unknown query parameter; this route takes no query parameters' },
    ]);
    const write = await v1('POST', '/v1/transfers?dry_run=true', {
      idempotencyKey: key(),
      body: {
        amount: 1,
        currency: 'USD',
        source: tenant.sandbox.usdWalletId,
        destination: tenant.sandbox.usdAccountId,
      },
    });
    assert.equal(write.status, 400, 'a write with a parameter it does not take moves nothing');
    assert.equal((await call(testApp, 'GET', '/healthz?probe=1')).status, 200);
  });

  it('refuses an unpaired surrogate in a body value or field name with a 400, not a 500', async () => {
    // Valid JSON text whose parsed strings hold a lone surrogate: RFC 8785 canonicalization (the
    // idempotency fingerprint, the transfer signature) cannot take them.
    for (const [body, path] of [
      [
        `{"amount":1,"currency":"USD","source":"\\ud800","destination":"${tenant.sandbox.usdAccountId}"}`,
        'body.source',
      ],
      [
        `{"amount":1,"currency":"USD","source":"${tenant.sandbox.usdWalletId}","destination":"x\\udc00"}`,
        'body.destination',
      ],
      [`{"amount":1,"currency":"USD","source":"a","destination":"b","\\ud800":1}`, 'body'],
    ] as const) {
      const response = await postRaw(body);
      assert.equal(response.status, 400, body);
      const problem = (await response.json()) as { code: string; errors: { path: string }[] };
      assert.equal(problem.code, 'VALIDATION_FAILED');
      assert.ok(
        problem.errors.some((issue) => issue.path === path),
        `${path} in ${JSON.stringify(problem.errors)}`,
      );
    }
  });
});

describe('/v1/transfers when the ledger queue is full', () => {
  let testApp: TestApp;
  let tenant: TestTenant;
  let refuseNext = 0;

  before(async () => {
    // The batcher itself is tested at its limits (db/ledger-batch.test.ts); here the route meets its refusal.
    testApp = await startTestApp({
      ledger: (write) => (claim, transfer) =>
        refuseNext-- > 0 ? Promise.reject(new LedgerQueueFullError('company')) : write(claim, transfer),
    });
    tenant = await provisionTestTenant(testApp);
  });
  after(async () => testApp.close());

  it('answers 429 LEDGER_BUSY with Retry-After, keeps nothing, and takes the same request again', async () => {
    const post = () =>
      call(testApp, 'POST', '/v1/transfers', {
        token: tenant.sandboxApiKey,
        headers: { 'idempotency-key': `busy-${process.pid}` },
        body: {
          amount: 250,
          currency: 'USD',
          source: tenant.sandbox.usdWalletId,
          destination: tenant.sandbox.usdAccountId,
        },
      });
    refuseNext = 1;
    const refused = await post();
    assert.equal(refused.status, 429, JSON.stringify(refused.body));
    assert.equal(refused.body.code, 'LEDGER_BUSY');
    assert.equal(refused.headers.get('retry-after'), '1');
    const keys =
      await testApp.ownerSql`select count(*)::int as n from idempotency_keys where key = ${`busy-${process.pid}`}`;
    assert.equal(keys[0]!.n, 0, 'a 429 is not the key’s answer');

    const retried = await post();
    assert.equal(retried.status, 201, JSON.stringify(retried.body));
    assert.equal(retried.headers.get('idempotent-replayed'), null);
    const account = await call(testApp, 'GET', `/v1/accounts/${tenant.sandbox.usdAccountId}`, {
      token: tenant.sandboxApiKey,
    });
    assert.equal(account.body.balances.posted, '2.50');
  });
});
