// post_ledger_transfer_idempotent (migration 00006), called as the API calls it: through the app
// pool as payments_app, under row-level security. Each refusal must leave nothing behind (no key, no
// transfer, no balance change), and a key that exists must come back untouched.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import type { ProvisionedTenant } from '../services/tenants.ts';
import type { Sql } from './client.ts';
import { insertRunningIdempotencyKey } from './idempotency.ts';
import { postLedgerTransferClaimingKey, type HotPathTransfer } from './ledger.ts';
import { hotPathClaim, startHotPathFixture, usdHotPathTransfer, type HotPathFixture } from '../test-support/ledger.ts';
import { withTenant } from './tenant.ts';

describe('the Shape B hot-path statement (post_ledger_transfer_idempotent)', () => {
  let fixture: HotPathFixture;
  let ownerSql: Sql;
  let appSql: Sql;
  let tenant: ProvisionedTenant;
  let other: ProvisionedTenant;
  let counter = 0;

  before(async () => {
    fixture = await startHotPathFixture('hot-path', 4);
    ({ ownerSql, appSql, tenant, other } = fixture);
  });
  after(() => fixture.close());

  const claimFor = (key: string, body = `{"n":${++counter}}`) => hotPathClaim(tenant.company.id, key, body);
  const newKey = () => `hot-${randomBytes(6).toString('hex')}`;
  const usd = (amount: bigint, overrides: Partial<HotPathTransfer> = {}) =>
    usdHotPathTransfer(tenant, amount, overrides);
  const keyRow = async (key: string) =>
    (
      await ownerSql`select status, response_status, response_headers, response_body from idempotency_keys where key = ${key}`
    )[0];
  const transfersUnder = (key: string) => fixture.transfersUnder(key);
  const posted = (id: string) => fixture.posted(id);
  const pgError = async (promise: Promise<unknown>) => {
    try {
      await promise;
    } catch (error) {
      return error as { code?: string; detail?: string; constraint_name?: string };
    }
    assert.fail('the statement was expected to fail');
  };

  it('settles the transfer and stores the given response with the key, in one statement', async () => {
    const key = newKey();
    const claim = claimFor(key);
    const transfer = usd(250n, { createdAt: new Date(Date.now() - 1234) });
    const sourceBefore = await posted(tenant.sandbox.usdWalletId);
    assert.deepEqual(await postLedgerTransferClaimingKey(appSql, claim, transfer), { kind: 'created' });

    const [row] = await ownerSql`
      select status, rail, amount, currency, source_account_id, destination_account_id, idempotency_key, created_at, version
      from transfers where id = ${transfer.id}`;
    assert.deepEqual(
      { ...row },
      {
        status: 'settled',
        rail: 'ledger',
        amount: 250n,
        currency: 'USD',
        source_account_id: tenant.sandbox.usdWalletId,
        destination_account_id: tenant.sandbox.usdAccountId,
        idempotency_key: key,
        created_at: transfer.createdAt,
        version: 1,
      },
    );
    const entries =
      await ownerSql`select account_id, amount, kind from ledger_entries where transfer_id = ${transfer.id} order by amount`;
    assert.deepEqual(
      entries.map((entry) => ({ ...entry })),
      [
        { account_id: tenant.sandbox.usdWalletId, amount: -250n, kind: 'posted' },
        { account_id: tenant.sandbox.usdAccountId, amount: 250n, kind: 'posted' },
      ],
    );
    const history =
      await ownerSql`select status, occurred_at from transfer_status_history where transfer_id = ${transfer.id}`;
    assert.deepEqual(
      history.map((change) => ({ ...change })),
      [{ status: 'settled', occurred_at: transfer.createdAt }],
    );
    assert.equal(await posted(tenant.sandbox.usdWalletId), sourceBefore - 250n);

    const stored = await keyRow(key);
    assert.equal(stored?.status, 'completed');
    assert.equal(stored?.response_status, 201);
    assert.deepEqual(stored?.response_headers, claim.response.headers);
    assert.ok((stored?.response_body as Buffer).equals(claim.response.body), 'the exact response bytes');
  });

  it('hands back an existing key untouched: replayable for the same request, flagged for another', async () => {
    const key = newKey();
    const claim = claimFor(key);
    await postLedgerTransferClaimingKey(appSql, claim, usd(5n));
    const sourceBefore = await posted(tenant.sandbox.usdWalletId);

    const again = await postLedgerTransferClaimingKey(appSql, claim, usd(5n));
    assert.equal(again.kind, 'existing');
    assert.ok(again.kind === 'existing' && again.existing.status === 'completed');
    assert.equal(again.existing.sameRequest, true);
    assert.ok(again.existing.response.body.equals(claim.response.body));
    assert.deepEqual(again.existing.response.headers, claim.response.headers);

    const otherRequest = await postLedgerTransferClaimingKey(appSql, { ...claimFor(key, '{"other":true}') }, usd(6n));
    assert.ok(otherRequest.kind === 'existing' && otherRequest.existing.sameRequest === false);
    assert.equal(await transfersUnder(key), 1);
    assert.equal(await posted(tenant.sandbox.usdWalletId), sourceBefore, 'nothing moved twice');
  });

  it('reports a running key of the classic flow with its lease, and writes nothing', async () => {
    const key = newKey();
    const claim = claimFor(key);
    const lease = await withTenant(appSql, tenant.company.id, (tx) =>
      insertRunningIdempotencyKey(tx, { ...claim, leaseMs: 60_000 }),
    );
    const outcome = await postLedgerTransferClaimingKey(appSql, claim, usd(5n));
    assert.ok(outcome.kind === 'existing' && outcome.existing.status === 'running');
    assert.equal(outcome.existing.leaseExpired, false);
    assert.equal(outcome.existing.lockedUntil.getTime(), lease!.getTime());
    assert.equal(await transfersUnder(key), 0);
  });

  it('refuses missing, foreign and system accounts (PT404) and leaves no key behind', async () => {
    const [system] = await ownerSql<{ id: string }[]>`
      select id from ledger_accounts where company_id = ${tenant.company.id} and type = 'system' and currency = 'USD' limit 1`;
    const cases: [string, Parameters<typeof usd>[1], string][] = [
      ['missing source', { sourceAccountId: 'wal_00000000000000000000000000000000' }, 'source'],
      ['foreign destination', { destinationAccountId: other.sandbox.usdAccountId }, 'destination'],
      ['foreign source', { sourceAccountId: other.sandbox.usdWalletId }, 'source'],
      ['system source', { sourceAccountId: system!.id }, 'source'],
    ];
    for (const [label, overrides, field] of cases) {
      const key = newKey();
      const error = await pgError(postLedgerTransferClaimingKey(appSql, claimFor(key), usd(5n, overrides)));
      assert.equal(error.code, 'PT404', label);
      assert.equal(error.detail, field, label);
      assert.equal(await keyRow(key), undefined, `${label}: no key left`);
      assert.equal(await transfersUnder(key), 0, label);
    }
    assert.equal(await posted(other.sandbox.usdAccountId), 0n, 'the other company saw nothing');
  });

  it('refuses a currency mismatch (PT422, with both currencies), an overdraft (23514) and a far-off clock (PT500)', async () => {
    const mismatchKey = newKey();
    const mismatch = await pgError(
      postLedgerTransferClaimingKey(
        appSql,
        claimFor(mismatchKey),
        usd(5n, { sourceAccountId: tenant.sandbox.usdcWalletId }),
      ),
    );
    assert.equal(mismatch.code, 'PT422');
    assert.deepEqual(JSON.parse(mismatch.detail!), { source: 'USDC', destination: 'USD' });

    const overdraftKey = newKey();
    const overdraft = await pgError(postLedgerTransferClaimingKey(appSql, claimFor(overdraftKey), usd(10n ** 14n)));
    assert.equal(overdraft.code, '23514');
    assert.equal(overdraft.constraint_name, 'ledger_accounts_no_overdraft');

    const clockKey = newKey();
    const clock = await pgError(
      postLedgerTransferClaimingKey(
        appSql,
        claimFor(clockKey),
        usd(5n, { createdAt: new Date(Date.now() - 10 * 60_000) }),
      ),
    );
    assert.equal(clock.code, 'PT500');

    for (const key of [mismatchKey, overdraftKey, clockKey]) {
      assert.equal(await keyRow(key), undefined);
      assert.equal(await transfersUnder(key), 0);
    }
  });

  it('settles a key once when the same request races itself: the others get the stored answer', async () => {
    const key = newKey();
    const claim = claimFor(key);
    const outcomes = await Promise.all(
      Array.from({ length: 4 }, () => postLedgerTransferClaimingKey(appSql, claim, usd(7n))),
    );
    assert.equal(outcomes.filter((outcome) => outcome.kind === 'created').length, 1);
    for (const outcome of outcomes.filter((candidate) => candidate.kind !== 'created')) {
      assert.ok(outcome.kind === 'existing' && outcome.existing.status === 'completed' && outcome.existing.sameRequest);
      assert.ok(outcome.existing.response.body.equals(claim.response.body));
    }
    assert.equal(await transfersUnder(key), 1);
  });
});
