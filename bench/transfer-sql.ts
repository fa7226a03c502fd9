// The transfer's SQL as ONE statement, exactly the CTE of `postLedgerTransfer` (db/ledger.ts): the
// transfer row, its two posted entries (balances move by trigger, overdraft and double-entry checks
// are the database's) and its status history. Used by the pgbench script and the bare Koa route.

/** postgres.js form: $1 id, $2 company, $3 environment, $4 key, $5 amount, $6 currency, $7 source, $8 destination. */
export const TRANSFER_STATEMENT = `
with transfer as (
  insert into transfers (id, company_id, environment, idempotency_key, rail, status, amount, currency,
                         source_account_id, destination_account_id)
  values ($1, $2, $3, $4, 'ledger', 'settled', $5, $6, $7, $8)
  returning id, company_id, environment, idempotency_key, rail, status, amount, currency, source_account_id,
            destination_account_id, created_at
), entries as (
  insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind)
  select t.company_id, t.environment, t.id, e.account_id, t.currency, e.amount, 'posted'
  from transfer t
  cross join lateral (values (t.source_account_id, -t.amount), (t.destination_account_id, t.amount)) as e(account_id, amount)
  order by e.account_id
), history as (
  insert into transfer_status_history (transfer_id, company_id, status)
  select id, company_id, status from transfer
)
select * from transfer`;

const literal = (value: string) => `'${value.replaceAll("'", "''")}'`;

/**
 * A pgbench script: a random source and a different random destination among `accounts`, a random
 * amount, a random unique ID and key, and the same single statement.
 */
export function pgbenchScript(companyId: string, accounts: readonly string[]): string {
  const n = accounts.length;
  const array = `(array[${accounts.map(literal).join(',')}]::text[])`;
  const statement = TRANSFER_STATEMENT.replace('$1', `'tr_' || md5(random()::text || clock_timestamp()::text)`)
    .replace('$2', literal(companyId))
    .replace('$3', `'sandbox'`)
    .replace('$4', `'pgb_' || md5(random()::text || clock_timestamp()::text)`)
    .replace('$5', ':amount')
    .replace('$6', `'USD'`)
    .replace('$7', `${array}[:s + 1]`)
    .replace('$8', `${array}[:d + 1]`);
  // pgbench needs one statement on one line (or continuation); ';' ends it.
  return [
    `\\set s random(0, ${n - 1})`,
    `\\set d (:s + random(1, ${n - 1})) % ${n}`,
    `\\set amount random(1, 100)`,
    `${statement.replace(/\s+/g, ' ').trim()};`,
    '',
  ].join('\n');
}

/**
 * A pgbench script for the API's own hot path without the API: one call of
 * post_ledger_transfer_idempotent (migration 00006) per transaction, with a new key, a 32-byte
 * request hash and a response of the API's size, run as payments_app (row-level security), so its
 * gap to `pgbenchScript` is the database's price of the key, the account checks and the policies.
 */
export function pgbenchHotPathScript(companyId: string, accounts: readonly string[]): string {
  const n = accounts.length;
  const array = `(array[${accounts.map(literal).join(',')}]::text[])`;
  const id = `'tr_' || md5(random()::text || clock_timestamp()::text)`;
  const call = [
    'select outcome from post_ledger_transfer_idempotent(',
    `${literal(companyId)}, 'sandbox', 'pgbf_' || md5(random()::text || clock_timestamp()::text), 'POST', '/v1/transfers',`,
    `sha256(convert_to(random()::text, 'UTF8')), 86400000, 201,`,
    `'{"content-type": "application/json; charset=utf-8", "location": "/v1/transfers/tr_00000000000000000000000000000000"}'::jsonb,`,
    `convert_to(repeat('x', 330), 'UTF8'), ${id}, :amount, 'USD', ${array}[:s + 1], ${array}[:d + 1], now())`,
  ].join(' ');
  return [
    `\\set s random(0, ${n - 1})`,
    `\\set d (:s + random(1, ${n - 1})) % ${n}`,
    `\\set amount random(1, 100)`,
    `${call};`,
    '',
  ].join('\n');
}
