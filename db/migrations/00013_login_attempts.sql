-- Sign-in throttling per email, known or not, claimed before the password is checked.
--
-- Before, the lock was read with the candidate, the password verified (tens of milliseconds), and
-- only then the failure counted: every attempt of a concurrent burst passed the same check, so a
-- burst verified any number of guesses and a right one among them signed in. And only a registered
-- email could ever answer 429/423, which told registered emails from unknown ones.
--
-- Now each attempt is counted as a failure up front, under the row's lock (a success deletes the
-- row), and refused without a password check while the email is throttled or locked. The table is
-- the platform's (no company): visible in system scope only, which the two functions below declare
-- for their own call.
create table login_attempts (
  email_hash    bytea primary key check (length(email_hash) = 32),
  failures      integer not null default 0 check (failures >= 0),
  locked_until  timestamptz,
  updated_at    timestamptz not null default now()
);
create index login_attempts_updated_idx on login_attempts (updated_at);
alter table login_attempts enable row level security;
alter table login_attempts force row level security;
create policy system_only on login_attempts
  using (current_setting('app.scope', true) = 'system')
  with check (current_setting('app.scope', true) = 'system');

-- Claims one attempt: claimed = false (with the count and the lock) while sign-in is blocked;
-- otherwise counts it and applies the throttle (a doubling delay from p_throttle_after failures)
-- or the lock (p_lock_ms from p_lock_after failures).
create function auth_claim_login_attempt(p_email text, p_throttle_after integer, p_throttle_base_ms integer,
                                         p_lock_after integer, p_lock_ms integer)
returns table (claimed boolean, failures integer, locked_until timestamptz)
language plpgsql volatile set app.scope = 'system' as $$
declare
  v_hash bytea := sha256(convert_to(lower(p_email), 'UTF8'));
  v_now timestamptz := clock_timestamp();
  v_row login_attempts;
begin
  insert into login_attempts (email_hash) values (v_hash) on conflict (email_hash) do nothing;
  select * into v_row from login_attempts a where a.email_hash = v_hash for update;
  if v_row.locked_until is not null and v_row.locked_until > v_now then
    return query select false, v_row.failures, v_row.locked_until;
    return;
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

-- A successful sign-in clears the email's count.
create function auth_reset_login_attempts(p_email text) returns void
language sql volatile set app.scope = 'system' as $$
  delete from login_attempts where email_hash = sha256(convert_to(lower(p_email), 'UTF8'))
$$;

grant select, insert, update, delete on login_attempts to payments_app;
grant execute on function auth_claim_login_attempt(text, integer, integer, integer, integer),
  auth_reset_login_attempts(text) to payments_app;
