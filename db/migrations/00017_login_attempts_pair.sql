-- Sign-in counts per email and client address, and per email from every address (services/auth.ts).
--
-- 1. The throttle's doubling delay never outlasts the lock. With a count that throttles long before
--    it locks (the email's own: from the 50th failure, locked at the 100th) the delay doubled past the
--    lock time from the 62nd failure on, up to 2^49 s: it blocked the email everywhere, even for the
--    right password, and the lock that starts the count again was never reached.
-- 2. Both counts are claimed in one call, each row locked (the address's first, then the email's,
--    in that order for everyone) and both checked before either is counted: an attempt one of them
--    refuses counts against neither, so an operator retrying while the email is blocked elsewhere
--    does not lock their own address too, and guesses an address may not make do not add to the
--    email's count.

create or replace function auth_login_attempt_next(p_row login_attempts, p_now timestamptz, p_throttle_after integer,
                                                   p_throttle_base_ms integer, p_lock_after integer, p_lock_ms integer)
returns login_attempts language plpgsql immutable as $$
declare
  v_row login_attempts := p_row;
begin
  if v_row.failures >= p_lock_after then
    v_row.failures := 0; -- the lock has run out: a fresh start, throttled again from p_throttle_after
  end if;
  v_row.failures := v_row.failures + 1;
  v_row.locked_until := case
    when v_row.failures >= p_lock_after then p_now + make_interval(secs => p_lock_ms / 1000.0)
    when v_row.failures >= p_throttle_after then p_now + make_interval(secs => least(
      p_throttle_base_ms * power(2, least(v_row.failures - p_throttle_after, 60)), p_lock_ms) / 1000.0)
    else null
  end;
  v_row.updated_at := p_now;
  return v_row;
end
$$;

-- The single count (00016), with the capped delay: still what an API of the previous version calls.
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
  v_row := auth_login_attempt_next(v_row, v_now, p_throttle_after, p_throttle_base_ms, p_lock_after, p_lock_ms);
  update login_attempts a set failures = v_row.failures, locked_until = v_row.locked_until, updated_at = v_now
  where a.email_hash = v_hash;
  return query select true, v_row.failures, v_row.locked_until;
end
$$;

-- Both counts: refused (claimed = false) by the first that blocks, `blocked_by` naming it ('client'
-- or 'email', with its count and block end), and nothing counted; otherwise both counted.
create function auth_claim_login_attempt_pair(p_client_key text, p_email text, p_throttle_base_ms integer,
                                              p_lock_ms integer, p_client_throttle_after integer,
                                              p_client_lock_after integer, p_email_throttle_after integer,
                                              p_email_lock_after integer)
returns table (claimed boolean, blocked_by text, client_failures integer, email_failures integer,
               locked_until timestamptz)
language plpgsql volatile set app.scope = 'system' as $$
declare
  v_client_hash bytea := sha256(convert_to(lower(p_client_key), 'UTF8'));
  v_email_hash bytea := sha256(convert_to(lower(p_email), 'UTF8'));
  v_now timestamptz := clock_timestamp();
  v_client login_attempts;
  v_email login_attempts;
begin
  insert into login_attempts as a (email_hash) values (v_client_hash)
  on conflict (email_hash) do update set email_hash = excluded.email_hash
  returning a.* into v_client;
  insert into login_attempts as a (email_hash) values (v_email_hash)
  on conflict (email_hash) do update set email_hash = excluded.email_hash
  returning a.* into v_email;
  if v_client.locked_until is not null and v_client.locked_until > v_now then
    return query select false, 'client', v_client.failures, v_email.failures, v_client.locked_until;
    return;
  end if;
  if v_email.locked_until is not null and v_email.locked_until > v_now then
    return query select false, 'email', v_client.failures, v_email.failures, v_email.locked_until;
    return;
  end if;
  v_client := auth_login_attempt_next(v_client, v_now, p_client_throttle_after, p_throttle_base_ms,
                                      p_client_lock_after, p_lock_ms);
  v_email := auth_login_attempt_next(v_email, v_now, p_email_throttle_after, p_throttle_base_ms,
                                     p_email_lock_after, p_lock_ms);
  update login_attempts a set failures = v_client.failures, locked_until = v_client.locked_until, updated_at = v_now
  where a.email_hash = v_client_hash;
  update login_attempts a set failures = v_email.failures, locked_until = v_email.locked_until, updated_at = v_now
  where a.email_hash = v_email_hash;
  return query select true, null::text, v_client.failures, v_email.failures, null::timestamptz;
end
$$;

revoke all on function auth_claim_login_attempt_pair(text, text, integer, integer, integer, integer, integer, integer)
  from public;
grant execute on function auth_claim_login_attempt_pair(text, text, integer, integer, integer, integer, integer, integer)
  to payments_app;

-- Blocks the uncapped doubling already wrote (up to 2^49 s) end no later than an hour (the default
-- lock time) after their attempt, as the capped delay would have. Forced row-level security applies
-- to the owner too: system scope for this statement's transaction only.
do $$
begin
  perform set_config('app.scope', 'system', true);
  update login_attempts set locked_until = updated_at + interval '1 hour'
  where locked_until > updated_at + interval '1 hour';
  perform set_config('app.scope', '', true);
end
$$;
