-- The Shape B hot path, batched (issue 4): the API hands the ledger-rail transfers that queue up
-- while its batches are busy to the database together, one statement and one commit for many
-- (TigerBeetle's batching, on PostgreSQL). db/ledger-batch.ts decides when; this function does it.
--
-- Each transfer is exactly `post_ledger_transfer_idempotent` (migration 00006): the same key claim,
-- checks, rows, triggers and stored response, each in its own subtransaction, so a transfer the
-- database refuses (overdraft, missing account, currency mismatch, a key held elsewhere) is undone
-- alone and reported in its row (SQLSTATE, message, detail, constraint), while the others commit.
-- Nothing the database guarantees is relaxed: the overdraft check constraint, the commit-time
-- double-entry check and every trigger fire per transfer as before; a failure that aborts the
-- whole statement (or its commit) commits nothing, and the API then runs each transfer on its own.
--
-- One company per call: row-level security reads app.company_id, set once for the transaction
-- (the per-transfer function sets the same value again).
--
-- Deadlocks: a single transfer locks its two accounts in ID order (the balance trigger); a batch
-- locks every account it names, its company's only, in ID order, before its first transfer, so
-- that two batches (or a batch and a single transfer) never wait on each other in a cycle.
--
-- p_items: a JSON array of objects, each with `i` (the caller's index, returned as `ordinal`) and
-- the single function's arguments: company_id, environment, key, method, path, hash (base64),
-- ttl_ms, status, headers (object), body (base64), id, amount (decimal text), currency, source,
-- destination, created_at (ISO 8601).
create function post_ledger_transfers_idempotent(p_items jsonb)
returns table (
  ordinal           integer,
  outcome           text,
  key_status        text,
  same_request      boolean,
  locked_until      timestamptz,
  lease_expired     boolean,
  response_status   integer,
  response_headers  jsonb,
  response_body     bytea,
  error_code        text,
  error_message     text,
  error_detail      text,
  error_constraint  text
)
language plpgsql volatile security invoker
as $$
#variable_conflict use_column
declare
  v_company     text;
  v_companies   integer;
  v_item        record;
  v_code        text;
  v_message     text;
  v_detail      text;
  v_constraint  text;
begin
  select min(x.company_id), count(distinct x.company_id) into v_company, v_companies
  from jsonb_to_recordset(p_items) as x(company_id text);
  if v_companies <> 1 then
    raise exception 'a batch of transfers belongs to exactly one company (got %)', v_companies;
  end if;
  perform set_config('app.company_id', v_company, true);

  perform 1
  from ledger_accounts a
  where a.company_id = v_company
    and a.id in (select x.source from jsonb_to_recordset(p_items) as x(source text)
                 union
                 select x.destination from jsonb_to_recordset(p_items) as x(destination text))
  order by a.id
  for no key update;

  for v_item in
    select x.*
    from jsonb_to_recordset(p_items) as x(
      i integer, company_id text, environment text, key text, method text, path text, hash text,
      ttl_ms double precision, status integer, headers jsonb, body text, id text, amount bigint,
      currency text, source text, destination text, created_at timestamptz)
    order by x.i
  loop
    begin
      return query
        select v_item.i, r.outcome, r.key_status, r.same_request, r.locked_until, r.lease_expired,
               r.response_status, r.response_headers, r.response_body,
               null::text, null::text, null::text, null::text
        from post_ledger_transfer_idempotent(
          v_item.company_id, v_item.environment, v_item.key, v_item.method, v_item.path,
          decode(v_item.hash, 'base64'), v_item.ttl_ms, v_item.status, v_item.headers,
          decode(v_item.body, 'base64'), v_item.id, v_item.amount, v_item.currency, v_item.source,
          v_item.destination, v_item.created_at) as r;
    exception when others then
      get stacked diagnostics v_code = returned_sqlstate, v_message = message_text,
                              v_detail = pg_exception_detail, v_constraint = constraint_name;
      return query
        select v_item.i, null::text, null::text, null::boolean, null::timestamptz, null::boolean,
               null::integer, null::jsonb, null::bytea, v_code, v_message, nullif(v_detail, ''),
               nullif(v_constraint, '');
    end;
  end loop;
end
$$;

revoke all on function post_ledger_transfers_idempotent(jsonb) from public;
grant execute on function post_ledger_transfers_idempotent(jsonb) to payments_app;
