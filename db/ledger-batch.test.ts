// Group commit of Shape B transfers (db/ledger-batch.ts, migration 00018), against the real database
// as payments_app: transfers queued behind a busy slot go in one statement, each keeps its own
// outcome (a refusal undoes only itself), a batch the database aborts as a whole is written again
// transfer by transfer, and batches never deadlock, whatever the directions.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import type { ProvisionedTenant } from '../services/tenants.ts';
import { createAppRoleSql, type TestDatabase } from '../test-support/db.ts';
import { newId } from '../platform/ids.ts';
import type { Sql } from './client.ts';
import { createLedgerBatcher, LedgerQueueFullError, type LedgerBatcher } from './ledger-batch.ts';
import { openLedgerAccount, type HotPathTransfer } from './ledger.ts';
import { hotPathClaim, startHotPathFixture, usdHotPathTransfer, type HotPathFixture } from '../test-support/ledger.ts';

/** Queue limits no test here reaches but the one about them. */
const ROOMY_QUEUE = { queueMax: 10_000, companyQueueMax: 10_000 };

describe('Shape B group commit (post_ledger_transfers_idempotent)', () => {
  let fixture: HotPathFixture;
  let database: TestDatabase;
  let ownerSql: Sql;
  let appSql: Sql;
  let tenant: ProvisionedTenant;
  let other: ProvisionedTenant;
  let counter = 0;

  before(async () => {
    fixture = await startHotPathFixture('ledger-batch', 6);
    ({ database, ownerSql, appSql, tenant, other } = fixture);
  });
  after(() => fixture.close());

  const claimFor = (key: string, owner = tenant, body = `{"n":${++counter}}`) =>
    hotPathClaim(owner.company.id, key, body);
  const newKey = () => `batch-${randomBytes(6).toString('hex')}`;
  const usd = (amount: bigint, overrides: Partial<HotPathTransfer> = {}, owner = tenant) =>
    usdHotPathTransfer(owner, amount, overrides);
  const posted = (id: string) => fixture.posted(id);
  const keyRows = async (key: string) =>
    Number((await ownerSql<{ n: number }[]>`select count(*)::int as n from idempotency_keys where key = ${key}`)[0]!.n);
  const transfersUnder = (key: string) => fixture.transfersUnder(key);
  /** After the batcher's pump for what was written so far (it pumps in the event loop's check phase). */
  const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));
  const settle = <T>(promise: Promise<T>) =>
    promise.then(
      (value) => ({ ok: true as const, value }),
      (error: unknown) => ({
        ok: false as const,
        error: error as { code?: string; detail?: string; constraint_name?: string },
      }),
    );

  /** New USD accounts of `owner`'s sandbox, funded from its USD wallet. */
  async function usdAccounts(count: number, funding: bigint, owner = tenant): Promise<string[]> {
    const ids = Array.from({ length: count }, () => newId('acct'));
    await ownerSql.begin(async (tx) => {
      for (const id of ids) {
        await openLedgerAccount(tx, {
          id,
          companyId: owner.company.id,
          environment: 'sandbox',
          type: 'account',
          currency: 'USD',
          name: id,
        });
      }
    });
    const batcher = createLedgerBatcher(appSql, { inFlightMax: 1, batchMax: 64, ...ROOMY_QUEUE });
    for (const id of ids) {
      assert.deepEqual(
        await batcher.write(claimFor(newKey(), owner), usd(funding, { destinationAccountId: id }, owner)),
        { kind: 'created' },
      );
    }
    return ids;
  }

  it('writes a transfer alone when a slot is free, and gathers those that queue into one batch', async () => {
    const batcher = createLedgerBatcher(appSql, { inFlightMax: 1, batchMax: 64, ...ROOMY_QUEUE });
    const [a, b] = await usdAccounts(2, 10_000n);
    const first = batcher.write(claimFor(newKey()), usd(1n, { sourceAccountId: a!, destinationAccountId: b! }));
    await nextTurn(); // the slot is free: it goes alone, and the rest queue behind it
    const queued = Array.from({ length: 20 }, (_, index) =>
      batcher.write(
        claimFor(newKey()),
        usd(BigInt(index + 1), { sourceAccountId: index % 2 ? a! : b!, destinationAccountId: index % 2 ? b! : a! }),
      ),
    );
    const outcomes = await Promise.all([first, ...queued]);
    assert.ok(outcomes.every((outcome) => outcome.kind === 'created'));
    assert.deepEqual(batcher.stats(), { batches: 1, batchedTransfers: 20, fallbacks: 0, refused: 0 });
    // a paid 1 + the even indexes' amounts (2+4+…+20 = 110) and received the odd ones' (1+3+…+19 = 100).
    assert.equal(await posted(a!), 10_000n - 1n - 110n + 100n);
    assert.equal(await posted(b!), 10_000n + 1n + 110n - 100n);
  });

  it('sends the transfers written in one turn of the event loop together, even with slots free', async () => {
    const batcher = createLedgerBatcher(appSql, { inFlightMax: 4, batchMax: 64, ...ROOMY_QUEUE });
    const [a, b] = await usdAccounts(2, 10_000n);
    const together = Array.from({ length: 5 }, (_, index) =>
      batcher.write(claimFor(newKey()), usd(BigInt(index + 1), { sourceAccountId: a!, destinationAccountId: b! })),
    );
    assert.ok((await Promise.all(together)).every((outcome) => outcome.kind === 'created'));
    assert.deepEqual(batcher.stats(), { batches: 1, batchedTransfers: 5, fallbacks: 0, refused: 0 });
    // Alone in its turn, a transfer goes alone (the single statement, no batch).
    assert.equal(
      (await batcher.write(claimFor(newKey()), usd(6n, { sourceAccountId: a!, destinationAccountId: b! }))).kind,
      'created',
    );
    assert.deepEqual(batcher.stats(), { batches: 1, batchedTransfers: 5, fallbacks: 0, refused: 0 });
    assert.equal(await posted(a!), 10_000n - 21n);
    assert.equal(await posted(b!), 10_000n + 21n);
  });

  it('refuses a transfer when its company, or everyone, has as many waiting as the queue allows', async () => {
    const batcher = createLedgerBatcher(appSql, { inFlightMax: 1, batchMax: 64, queueMax: 3, companyQueueMax: 2 });
    const [a, b] = await usdAccounts(2, 1_000n);
    const [c, d] = await usdAccounts(2, 1_000n, other);
    const keys = Array.from({ length: 5 }, () => newKey());
    // In one turn: the tenant's third transfer passes its company's 2, the other's second the queue's 3.
    const outcomes = await Promise.all([
      settle(batcher.write(claimFor(keys[0]!), usd(1n, { sourceAccountId: a!, destinationAccountId: b! }))),
      settle(batcher.write(claimFor(keys[1]!), usd(2n, { sourceAccountId: a!, destinationAccountId: b! }))),
      settle(batcher.write(claimFor(keys[2]!), usd(4n, { sourceAccountId: a!, destinationAccountId: b! }))),
      settle(
        batcher.write(claimFor(keys[3]!, other), usd(8n, { sourceAccountId: c!, destinationAccountId: d! }, other)),
      ),
      settle(
        batcher.write(claimFor(keys[4]!, other), usd(16n, { sourceAccountId: c!, destinationAccountId: d! }, other)),
      ),
    ]);
    assert.deepEqual(
      outcomes.map((outcome) => (outcome.ok ? outcome.value.kind : (outcome.error as LedgerQueueFullError).full)),
      ['created', 'created', 'company', 'created', 'all'],
    );
    assert.ok(
      outcomes.filter((outcome) => !outcome.ok).every((outcome) => outcome.error instanceof LedgerQueueFullError),
    );
    // Nothing of a refused transfer was written: no key, no transfer, no money moved.
    for (const key of [keys[2]!, keys[4]!]) {
      assert.equal(await keyRows(key), 0);
      assert.equal(await transfersUnder(key), 0);
    }
    assert.equal(await posted(a!), 1_000n - 3n);
    assert.equal(await posted(c!), 1_000n - 8n);
    assert.equal(batcher.stats().refused, 2);
    // The queue drained: the same request is taken now.
    assert.deepEqual(
      await batcher.write(claimFor(keys[2]!), usd(4n, { sourceAccountId: a!, destinationAccountId: b! })),
      { kind: 'created' },
    );
    assert.equal(await posted(a!), 1_000n - 7n);
  });

  it('gives each transfer of a batch its own outcome: refusals undo only themselves', async () => {
    const batcher = createLedgerBatcher(appSql, { inFlightMax: 1, batchMax: 64, ...ROOMY_QUEUE });
    const [a, b, poor] = await usdAccounts(3, 1_000n);
    const keys = {
      ok: newKey(),
      overdraft: newKey(),
      missing: newKey(),
      mismatch: newKey(),
      twice: newKey(),
      reused: newKey(),
    };
    const twiceClaim = claimFor(keys.twice);
    const blocker = batcher.write(claimFor(newKey()), usd(1n, { sourceAccountId: a!, destinationAccountId: b! }));
    await nextTurn();
    const [ok, overdraft, missing, mismatch, twice, twiceAgain, reused, reusedOther] = await Promise.all([
      settle(batcher.write(claimFor(keys.ok), usd(10n, { sourceAccountId: a!, destinationAccountId: b! }))),
      settle(
        batcher.write(claimFor(keys.overdraft), usd(1_001n, { sourceAccountId: poor!, destinationAccountId: a! })),
      ),
      settle(
        batcher.write(claimFor(keys.missing), usd(5n, { sourceAccountId: a!, destinationAccountId: 'acct_nope' })),
      ),
      settle(
        batcher.write(
          claimFor(keys.mismatch),
          usd(5n, { sourceAccountId: tenant.sandbox.usdcWalletId, destinationAccountId: b! }),
        ),
      ),
      // The same request twice in one batch: written once, the second gets the first's stored answer.
      settle(batcher.write(twiceClaim, usd(20n, { sourceAccountId: b!, destinationAccountId: a! }))),
      settle(batcher.write(twiceClaim, usd(20n, { sourceAccountId: b!, destinationAccountId: a! }))),
      // A key used by another request in the same batch: that one is told so, nothing is written.
      settle(batcher.write(claimFor(keys.reused), usd(30n, { sourceAccountId: a!, destinationAccountId: b! }))),
      settle(
        batcher.write(
          claimFor(keys.reused, tenant, '{"another":"request"}'),
          usd(31n, { sourceAccountId: a!, destinationAccountId: b! }),
        ),
      ),
    ]);
    await blocker;
    assert.deepEqual(batcher.stats(), { batches: 1, batchedTransfers: 8, fallbacks: 0, refused: 0 });

    assert.deepEqual(ok, { ok: true, value: { kind: 'created' } });
    assert.equal(overdraft.ok ? undefined : overdraft.error.code, '23514');
    assert.equal(overdraft.ok ? undefined : overdraft.error.constraint_name, 'ledger_accounts_no_overdraft');
    assert.equal(missing.ok ? undefined : missing.error.code, 'PT404');
    assert.equal(missing.ok ? undefined : missing.error.detail, 'destination');
    assert.equal(mismatch.ok ? undefined : mismatch.error.code, 'PT422');
    assert.deepEqual(JSON.parse(mismatch.ok ? '{}' : mismatch.error.detail!), { source: 'USDC', destination: 'USD' });
    assert.deepEqual(twice, { ok: true, value: { kind: 'created' } });
    assert.ok(twiceAgain.ok && twiceAgain.value.kind === 'existing');
    const replay = twiceAgain.value.existing;
    assert.equal(replay.sameRequest, true);
    assert.equal(replay.status === 'completed' && replay.response.body.toString(), twiceClaim.response.body.toString());
    assert.deepEqual(reused, { ok: true, value: { kind: 'created' } });
    assert.ok(reusedOther.ok && reusedOther.value.kind === 'existing');
    assert.equal(reusedOther.value.existing.sameRequest, false);

    // Refused transfers left no key and no transfer; the others are there once each.
    for (const key of [keys.overdraft, keys.missing, keys.mismatch]) {
      assert.equal(await keyRows(key), 0, key);
      assert.equal(await transfersUnder(key), 0, key);
    }
    for (const key of [keys.ok, keys.twice, keys.reused]) assert.equal(await transfersUnder(key), 1, key);
    assert.equal(await posted(a!), 1_000n - 1n - 10n + 20n - 30n);
    assert.equal(await posted(b!), 1_000n + 1n + 10n - 20n + 30n);
    assert.equal(await posted(poor!), 1_000n);
  });

  it('keeps companies apart: each batch is one company, under its own row-level security', async () => {
    const batcher = createLedgerBatcher(appSql, { inFlightMax: 1, batchMax: 64, ...ROOMY_QUEUE });
    const mine = await usdAccounts(2, 1_000n);
    const theirs = await usdAccounts(2, 1_000n, other);
    const blocker = batcher.write(
      claimFor(newKey()),
      usd(1n, { sourceAccountId: mine[0]!, destinationAccountId: mine[1]! }),
    );
    await nextTurn();
    const results = await Promise.all([
      settle(batcher.write(claimFor(newKey()), usd(2n, { sourceAccountId: mine[0]!, destinationAccountId: mine[1]! }))),
      settle(
        batcher.write(
          claimFor(newKey(), other),
          usd(3n, { sourceAccountId: theirs[0]!, destinationAccountId: theirs[1]! }, other),
        ),
      ),
      settle(batcher.write(claimFor(newKey()), usd(4n, { sourceAccountId: mine[0]!, destinationAccountId: mine[1]! }))),
      settle(
        batcher.write(
          claimFor(newKey(), other),
          usd(5n, { sourceAccountId: theirs[0]!, destinationAccountId: theirs[1]! }, other),
        ),
      ),
      // Another company's account is not found, in a batch as alone.
      settle(
        batcher.write(claimFor(newKey()), usd(6n, { sourceAccountId: mine[0]!, destinationAccountId: theirs[1]! })),
      ),
    ]);
    await blocker;
    assert.deepEqual(
      results.map((result) => (result.ok ? result.value.kind : result.error.code)),
      ['created', 'created', 'created', 'created', 'PT404'],
    );
    assert.deepEqual(batcher.stats(), { batches: 2, batchedTransfers: 5, fallbacks: 0, refused: 0 });
    assert.equal(await posted(mine[1]!), 1_000n + 1n + 2n + 4n);
    assert.equal(await posted(theirs[1]!), 1_000n + 3n + 5n);
  });

  it('never deadlocks: two batchers (two API processes) moving money both ways among four accounts', async () => {
    const accounts = await usdAccounts(4, 100_000n);
    const batchers = [
      createLedgerBatcher(appSql, { inFlightMax: 2, batchMax: 8, ...ROOMY_QUEUE }),
      createLedgerBatcher(appSql, { inFlightMax: 2, batchMax: 8, ...ROOMY_QUEUE }),
    ];
    const writes = Array.from({ length: 160 }, (_, index) => {
      const from = accounts[index % 4]!;
      const to = accounts[(index * 7 + 1 + (index % 3)) % 4]!;
      const destination = to === from ? accounts[(index + 1) % 4]! : to;
      return settle(
        batchers[index % 2]!.write(
          claimFor(newKey()),
          usd(BigInt(1 + (index % 50)), { sourceAccountId: from, destinationAccountId: destination }),
        ),
      );
    });
    const results = await Promise.all(writes);
    assert.deepEqual(
      results.filter((result) => !result.ok).map((result) => (result.ok ? '' : result.error.code)),
      [],
    );
    const total = (await Promise.all(accounts.map(posted))).reduce((sum, value) => sum + value, 0n);
    assert.equal(total, 400_000n);
    assert.ok(batchers.every((batcher) => batcher.stats().batches > 0));
  });

  it('writes the transfers of a batch the database aborts as a whole again, one by one', async () => {
    // A lock held past the pool's lock_timeout aborts the batch in its first step (locking its
    // accounts); its transfers are then written singly, once the lock is gone.
    const shortLocks = createAppRoleSql(database.url, {
      applicationName: 'payments-test-ledger-batch-locks',
      poolMax: 4,
      statementTimeoutMs: 2_000,
    });
    try {
      const batcher: LedgerBatcher = createLedgerBatcher(shortLocks, { inFlightMax: 1, batchMax: 64, ...ROOMY_QUEUE });
      const [a, b, c, d] = await usdAccounts(4, 1_000n);
      let locked!: () => void;
      const lockTaken = new Promise<void>((resolve) => (locked = resolve));
      const holder = ownerSql.begin(async (tx) => {
        await tx`select 1 from ledger_accounts where id = ${c!} for update`;
        locked();
        await new Promise((resolve) => setTimeout(resolve, 3_000));
      });
      await lockTaken;
      const first = batcher.write(claimFor(newKey()), usd(1n, { sourceAccountId: a!, destinationAccountId: b! }));
      await nextTurn();
      const keys = [newKey(), newKey(), newKey()];
      const batched = keys.map((key, index) =>
        batcher.write(claimFor(key), usd(BigInt(10 + index), { sourceAccountId: c!, destinationAccountId: d! })),
      );
      assert.deepEqual(await first, { kind: 'created' });
      assert.deepEqual(
        await Promise.all(batched),
        keys.map(() => ({ kind: 'created' })),
      );
      await holder;
      assert.deepEqual(batcher.stats(), { batches: 1, batchedTransfers: 3, fallbacks: 1, refused: 0 });
      for (const key of keys) assert.equal(await transfersUnder(key), 1);
      assert.equal(await posted(d!), 1_000n + 10n + 11n + 12n);
    } finally {
      await shortLocks.end({ timeout: 5 });
    }
  });
});
