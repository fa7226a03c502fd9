-- The Shape B hot path (issue 4): a new ledger-rail transfer is ONE statement and ONE commit.
--
-- `post_ledger_transfer_idempotent` claims the Idempotency-Key, checks both accounts, writes the
-- transfer, its two posted entries and its status history, and stores the response the API will
-- send, in the caller's single (autocommit) transaction. The API signs the response before the call
-- (it chooses the transfer's ID and creation time), so the stored response is the exact body sent.
--
-- Nothing the database guarantees is relaxed: the function runs with the caller's rights
-- (SECURITY INVOKER, as payments_app) under row-level security for `p_company_id` (it sets
-- app.company_id itself, transaction-local, exactly as withTenant does); balances still move only
-- through entries by trigger; the overdraft check constraint, the commit-time double-entry check,
-- the composite foreign keys and every trigger on `transfers` (status guard, event outbox) fire as
-- for any insert.
--
-- Idempotency, as the generic layer (api/middleware/idempotency.ts) defines it:
--   * the key row is inserted already `completed` with the response: if the transfer fails, the
--     whole statement rolls back and no row is left;
--   * a key that exists (committed) is not touched: its state and response come back (outcome
--     'existing') and the API replays it, or answers 422 (another request) or 409 (a request of the
--     generic layer still running);
--   * a concurrent request with the same key waits on the first one's uncommitted row (ON CONFLICT)
--     and then sees it: completed → replayed; rolled back → it executes itself. No key settles twice,
--     and `transfers_idempotency_unique` says so again;
--   * no row at all (it vanished between the insert and the read: released or purged): outcome
--     'retry', nothing was written.
--
-- Decided refusals are raised with SQLSTATEs of their own, so the API maps them to its stable codes:
--   PT404 ACCOUNT_NOT_FOUND (detail: 'source' or 'destination'; a system account or another
--         company's account is "not found" too), PT422 CURRENCY_MISMATCH (detail: JSON with both
--         accounts' currencies), PT500 the API's clock is more than 5 minutes off the database's;
--   the overdraft check raises 23514 on ledger_accounts_no_overdraft as before.
create function post_ledger_transfer_idempotent(
  p_company_id        text,
  p_environment       text,
  p_idempotency_key   text,
  p_request_method    text,
  p_request_path      text,
  p_request_hash      bytea,
  p_ttl_ms            double precision,
  p_response_status   integer,
  p_response_headers  jsonb,
  p_response_body     bytea,
  p_transfer_id       text,
  p_amount            bigint,
  p_currency          text,
  p_source            text,
  p_destination       text,
  p_created_at        timestamptz
)
returns table (
  outcome           text,
  key_status        text,
  same_request      boolean,
  locked_until      timestamptz,
  lease_expired     boolean,
  response_status   integer,
  response_headers  jsonb,
  response_body     bytea
)
language plpgsql volatile security invoker
as $$
#variable_conflict use_column
declare
  v_source       record;
  v_destination  record;
  v_claimed      integer;
begin
  perform set_config('app.company_id', p_company_id, true);

  insert into idempotency_keys as k
    (company_id, environment, key, request_method, request_path, request_hash, status, locked_until,
     response_status, response_headers, response_body, completed_at, expires_at)
  values (p_company_id, p_environment, p_idempotency_key, p_request_method, p_request_path, p_request_hash,
          'completed', null, p_response_status, p_response_headers, p_response_body, now(),
          now() + p_ttl_ms * interval '1 millisecond')
  on conflict (company_id, environment, key) do nothing;
  get diagnostics v_claimed = row_count;
  if v_claimed = 0 then
    -- A new statement, so a new snapshot: it sees the row a concurrent request just committed.
    return query
      select case when k.key is null then 'retry' else 'existing' end, k.status, k.request_hash = p_request_hash,
             k.locked_until, k.locked_until <= clock_timestamp(), k.response_status, k.response_headers,
             k.response_body
      from (select 1) as one
      left join idempotency_keys k
        on k.company_id = p_company_id and k.environment = p_environment and k.key = p_idempotency_key;
    return;
  end if;

  select a.type, a.currency into v_source
  from ledger_accounts a where a.id = p_source and a.company_id = p_company_id and a.environment = p_environment;
  if not found or v_source.type = 'system' then
    raise exception 'no source account % in this environment', p_source using errcode = 'PT404', detail = 'source';
  end if;
  select a.type, a.currency into v_destination
  from ledger_accounts a where a.id = p_destination and a.company_id = p_company_id and a.environment = p_environment;
  if not found or v_destination.type = 'system' then
    raise exception 'no destination account % in this environment', p_destination using errcode = 'PT404', detail = 'destination';
  end if;
  if v_source.currency <> p_currency or v_destination.currency <> p_currency then
    raise exception 'currency mismatch' using errcode = 'PT422',
      detail = json_build_object('source', v_source.currency, 'destination', v_destination.currency)::text;
  end if;
  -- The API chose created_at (it is in the signed response): refuse a clock that is far off.
  if p_created_at not between clock_timestamp() - interval '5 minutes' and clock_timestamp() + interval '5 minutes' then
    raise exception 'the API clock is more than 5 minutes off the database clock (created_at %)', p_created_at
      using errcode = 'PT500';
  end if;

  -- The same statement as postLedgerTransfer (db/ledger.ts) and the benchmark's ceilings.
  with transfer as (
    insert into transfers (id, company_id, environment, idempotency_key, rail, status, amount, currency,
                           source_account_id, destination_account_id, created_at, updated_at)
    values (p_transfer_id, p_company_id, p_environment, p_idempotency_key, 'ledger', 'settled', p_amount, p_currency,
            p_source, p_destination, p_created_at, p_created_at)
    returning id, company_id, environment, status, amount, currency, source_account_id, destination_account_id
  ), entries as (
    insert into ledger_entries (company_id, environment, transfer_id, account_id, currency, amount, kind)
    select t.company_id, t.environment, t.id, e.account_id, t.currency, e.amount, 'posted'
    from transfer t
    cross join lateral (values (t.source_account_id, -t.amount), (t.destination_account_id, t.amount)) as e(account_id, amount)
    -- Accounts are locked (by the balance trigger) in ID order, so opposite transfers never deadlock.
    order by e.account_id
  ), history as (
    insert into transfer_status_history (transfer_id, company_id, status, occurred_at)
    select id, company_id, status, p_created_at from transfer
  )
  select count(*) into v_claimed from transfer;

  return query select 'created'::text, 'completed'::text, true, null::timestamptz, null::boolean, null::integer,
                      null::jsonb, null::bytea;
end
$$;

revoke all on function post_ledger_transfer_idempotent(text, text, text, text, text, bytea, double precision, integer,
  jsonb, bytea, text, bigint, text, text, text, timestamptz) from public;
grant execute on function post_ledger_transfer_idempotent(text, text, text, text, text, bytea, double precision, integer,
  jsonb, bytea, text, bigint, text, text, text, timestamptz) to payments_app;
