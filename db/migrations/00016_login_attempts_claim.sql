-- Two corrections to 00013's auth_claim_login_attempt:
--   * the row is created or locked in ONE statement: with the insert and the locking read apart, a
--     row deleted in between (a success, the retention purge) left nothing to lock, and the attempt
--     was answered "claimed" without being counted;
--   * a lock that has run out starts the count again: the count stayed at or above p_lock_after, so
--     one wrong attempt an hour kept any email locked out for good.
create or replace function auth_claim_login_attempt(p_email text, p_throttle_after integer, p_throttle_base_ms integer,
                                                    p_lock_after integer, p_lock_ms integer)
returns table (claimed boolean, failures integer, locked_until timestamptz)
language plpgsql volatile set app.scope = 'system' as $$
declare
  v_hash bytea := sha256(convert_to(lower(p_email), 'UTF8'));
  v_now timestamptz := clock_timestamp();
  v_row login_attempts;
begin
  insert into login_attempts as a (email_hash) values (v_hash)
  on conflict (email_hash) do update set email_hash = excluded.email_hash
  returning a.* into v_row;
  if v_row.locked_until is not null and v_row.locked_until > v_now then
    return query select false, v_row.failures, v_row.locked_until;
    return;
  end if;
  if v_row.failures >= p_lock_after then
    v_row.failures := 0; -- the lock has run out: a fresh start, throttled again from p_throttle_after
  end if;
  v_row.failures := v_row.failures + 1;
  v_row.locked_until := case
    when v_row.failures >= p_lock_after then v_now + make_interval(secs => p_lock_ms / 1000.0)
    when v_row.failures >= p_throttle_after
      then v_now + make_interval(secs => p_throttle_base_ms * power(2, v_row.failures - p_throttle_after) / 1000.0)
    else null
  end;
  update login_attempts a set failures = v_row.failures, locked_until = v_row.locked_until, updated_at = v_now
  where a.email_hash = v_hash;
  return query select true, v_row.failures, v_row.locked_until;
end
$$;
