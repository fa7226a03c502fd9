-- Identity and tenancy: companies, console operators, their sessions, payment API keys, the
-- idempotency store and the hash-chained security audit trail.
--
-- Tenancy is enforced twice: every query in code names its company, and PostgreSQL row-level
-- security (forced, so even the table owner is subject to it) hides every row whose company is not
-- the one set for the transaction (`app.company_id`). Application connections run as the role
-- `payments_app`; only connections that declare `app.scope = 'system'` (migrations, the CLI, system
-- workflows, and the three narrow sign-in lookup functions below) see across companies.

do $$
begin
  if not exists (select 1 from pg_roles where rolname = 'payments_app') then
    create role payments_app nologin;
  end if;
end
$$;

create function tenant_visible(row_company_id text) returns boolean
language sql stable parallel safe as $$
  select row_company_id = current_setting('app.company_id', true)
      or current_setting('app.scope', true) = 'system'
$$;

-- Companies (tenants). Field names of the interface (SPEC 2.1) map one to one.
create table companies (
  id                   text primary key check (id ~ '^co_[0-9a-f]{32}$'),
  name                 text not null check (length(name) between 1 and 200),
  origin               text not null default '' check (length(origin) <= 500),
  backend              text not null default '' check (length(backend) <= 500),
  country_code         text not null default '' check (country_code ~ '^([A-Z]{2})?$'),
  maintance            boolean not null default false,
  is_block             boolean not null default false,
  is_active            boolean not null default true,
  is_master_company    boolean not null default false,
  custom               jsonb not null default '{}'::jsonb check (jsonb_typeof(custom) = 'object'),
  apis                 jsonb not null default '{}'::jsonb check (jsonb_typeof(apis) = 'object'),
  email                jsonb not null default '{}'::jsonb check (jsonb_typeof(email) = 'object'),
  sms                  jsonb not null default '{}'::jsonb check (jsonb_typeof(sms) = 'object'),
  verification_status  text not null default 'unverified'
                       check (verification_status in ('unverified', 'pending', 'verified', 'rejected')),
  verified_at          timestamptz,
  created_at           timestamptz not null default now(),
  updated_at           timestamptz not null default now(),
  constraint companies_verified_at check ((verification_status = 'verified') = (verified_at is not null))
);
-- Exactly one master company can exist.
create unique index companies_one_master on companies ((true)) where is_master_company;

create table operators (
  id               text primary key check (id ~ '^op_[0-9a-f]{32}$'),
  company_id       text not null references companies (id),
  email            text not null check (email = lower(email) and length(email) between 3 and 254 and email like '%_@_%'),
  first_name       text not null default '' check (length(first_name) <= 100),
  last_name        text not null default '' check (length(last_name) <= 100),
  role             text not null check (role in ('owner', 'admin', 'compliance', 'support_manager', 'support_agent', 'viewer')),
  password_hash    text not null check (password_hash like '$argon2id$%'),
  is_blocked       boolean not null default false,
  failed_logins    integer not null default 0 check (failed_logins >= 0),
  locked_until     timestamptz,
  last_login_at    timestamptz,
  created_at       timestamptz not null default now(),
  updated_at       timestamptz not null default now(),
  -- Sign-in is by email alone, so an email belongs to one operator across the platform.
  constraint operators_email_unique unique (email)
);
create index operators_company_idx on operators (company_id, id desc);

create table admin_sessions (
  id            text primary key check (id ~ '^ses_[0-9a-f]{32}$'),
  company_id    text not null references companies (id),
  operator_id   text not null references operators (id),
  token_hash    bytea not null check (length(token_hash) = 32),
  created_at    timestamptz not null default now(),
  expires_at    timestamptz not null,
  revoked_at    timestamptz,
  last_seen_at  timestamptz,
  ip            text check (length(ip) <= 64),
  user_agent    text check (length(user_agent) <= 500),
  constraint admin_sessions_token_unique unique (token_hash),
  constraint admin_sessions_expiry check (expires_at > created_at)
);
create index admin_sessions_operator_idx on admin_sessions (operator_id) where revoked_at is null;

create table api_keys (
  id            text primary key check (id ~ '^key_[0-9a-f]{32}$'),
  company_id    text not null references companies (id),
  environment   text not null check (environment in ('sandbox', 'live')),
  name          text not null check (length(name) between 1 and 100),
  -- The visible, unique part of the secret (`sk_<env>_<lookup>`), used to find the row.
  lookup        text not null check (lookup ~ '^[0-9A-Za-z]{12}$'),
  -- SHA-256 of the whole secret. The secret has 190 random bits, so a fast hash is enough.
  secret_hash   bytea not null check (length(secret_hash) = 32),
  last4         text not null check (length(last4) = 4),
  created_by    text references operators (id),
  created_at    timestamptz not null default now(),
  revoked_at    timestamptz,
  revoked_by    text references operators (id),
  last_used_at  timestamptz,
  constraint api_keys_lookup_unique unique (lookup),
  constraint api_keys_revoked_after_created check (revoked_at is null or revoked_at >= created_at)
);
create index api_keys_company_idx on api_keys (company_id, id desc);

-- Idempotency: one row per (company, environment, key). The first request inserts it as
-- 'running' with a lease; its response is stored when it completes and replayed afterwards.
create table idempotency_keys (
  company_id        text not null references companies (id),
  environment       text not null check (environment in ('sandbox', 'live', 'admin')),
  key               text not null check (length(key) between 1 and 255),
  request_method    text not null check (request_method in ('POST', 'PUT', 'PATCH', 'DELETE')),
  request_path      text not null check (length(request_path) <= 2000),
  request_hash      bytea not null check (length(request_hash) = 32),
  status            text not null check (status in ('running', 'completed')),
  locked_until      timestamptz,
  response_status   integer check (response_status between 100 and 599),
  response_headers  jsonb,
  response_body     bytea,
  created_at        timestamptz not null default now(),
  completed_at      timestamptz,
  expires_at        timestamptz not null,
  primary key (company_id, environment, key),
  constraint idempotency_completed_has_response check (
    (status = 'completed') = (response_status is not null and completed_at is not null)
  ),
  constraint idempotency_running_has_lease check ((status = 'running') = (locked_until is not null)),
  constraint idempotency_kept_a_day check (expires_at >= created_at + interval '24 hours')
);
create index idempotency_keys_expiry_idx on idempotency_keys (expires_at);

-- Security audit trail: a closed list of event names, each event hash-chained per company.
create table audit_event_types (
  name         text primary key check (name ~ '^[a-z_]+\.[a-z_]+$'),
  description  text not null
);
insert into audit_event_types (name, description) values
  ('auth.login_succeeded', 'An operator signed in.'),
  ('auth.login_failed', 'A sign-in failed (wrong password, blocked user or company, locked account).'),
  ('auth.account_locked', 'Repeated failures locked an operator account.'),
  ('auth.logout', 'An operator signed out; the session token was revoked.'),
  ('company.created', 'A company (tenant) was created.'),
  ('company.verified', 'A company passed verification and may hold live credentials.'),
  ('company.config_changed', 'A company''s configuration was changed.'),
  ('company.module_visibility_changed', 'Module visibility for a company was changed.'),
  ('operator.created', 'A console operator was created.'),
  ('operator.updated', 'A console operator was updated (role, names).'),
  ('user.blocked', 'A user was blocked.'),
  ('user.unblocked', 'A user was unblocked.'),
  ('api_key.created', 'A payment API key was created.'),
  ('api_key.revoked', 'A payment API key was revoked.'),
  ('kyc.decision_recorded', 'A KYC watchlist decision was recorded.'),
  ('kyc.alert_assigned', 'A KYC watchlist alert was assigned.'),
  ('workspace.ownership_transferred', 'A workspace changed owner.'),
  ('security.ip_blocked', 'An IP address was blocked by its reputation.'),
  ('security.ip_reputation_rechecked', 'A cached IP reputation verdict was purged for a recheck.');

create table audit_chain_heads (
  company_id  text primary key references companies (id),
  seq         bigint not null check (seq >= 0),
  hash        bytea not null check (length(hash) = 32)
);

create table audit_events (
  id           bigint generated always as identity primary key,
  company_id   text not null references companies (id),
  seq          bigint not null check (seq >= 1),
  event        text not null references audit_event_types (name),
  actor_type   text not null check (actor_type in ('operator', 'api_key', 'system', 'anonymous')),
  actor_id     text check (length(actor_id) <= 100),
  object_type  text check (length(object_type) <= 100),
  object_id    text check (length(object_id) <= 200),
  data         jsonb not null default '{}'::jsonb
               check (jsonb_typeof(data) = 'object' and octet_length(data::text) <= 16384),
  ip           text check (length(ip) <= 64),
  request_id   text check (length(request_id) <= 200),
  -- Milliseconds: the value that was hashed must be the value stored.
  occurred_at  timestamptz not null check (occurred_at = date_trunc('milliseconds', occurred_at)),
  prev_hash    bytea not null check (length(prev_hash) = 32),
  hash         bytea not null check (length(hash) = 32),
  constraint audit_events_seq_unique unique (company_id, seq),
  constraint audit_events_object_pair check ((object_type is null) = (object_id is null)),
  constraint audit_events_actor_named check (actor_type in ('system', 'anonymous') or actor_id is not null)
);
create index audit_events_query_idx on audit_events (company_id, occurred_at desc, id desc);

-- Append-only: no role, not even the owner, edits or deletes an audit event through SQL.
create function audit_events_append_only() returns trigger language plpgsql as $$
begin
  raise exception 'audit_events is append-only' using errcode = 'insufficient_privilege';
end
$$;
create trigger audit_events_no_update before update or delete on audit_events
  for each row execute function audit_events_append_only();
create trigger audit_events_no_truncate before truncate on audit_events
  for each statement execute function audit_events_append_only();

-- Row-level security on every tenant table.
do $$
declare
  t text;
begin
  foreach t in array array['companies', 'operators', 'admin_sessions', 'api_keys', 'idempotency_keys',
                           'audit_chain_heads', 'audit_events', 'outbox']
  loop
    execute format('alter table %I enable row level security', t);
    execute format('alter table %I force row level security', t);
  end loop;
end
$$;
create policy tenant_isolation on companies using (tenant_visible(id)) with check (tenant_visible(id));
create policy tenant_isolation on operators using (tenant_visible(company_id)) with check (tenant_visible(company_id));
create policy tenant_isolation on admin_sessions using (tenant_visible(company_id)) with check (tenant_visible(company_id));
create policy tenant_isolation on api_keys using (tenant_visible(company_id)) with check (tenant_visible(company_id));
create policy tenant_isolation on idempotency_keys using (tenant_visible(company_id)) with check (tenant_visible(company_id));
create policy tenant_isolation on audit_chain_heads using (tenant_visible(company_id)) with check (tenant_visible(company_id));
create policy tenant_isolation on audit_events using (tenant_visible(company_id)) with check (tenant_visible(company_id));
-- Outbox rows without a company belong to the platform and are visible to system scope only.
create policy tenant_isolation on outbox using (tenant_visible(company_id)) with check (tenant_visible(company_id));

-- Sign-in lookups happen before the company is known. Each is one narrow function that sees
-- across companies for the duration of its own call only (function-level SET).
create function auth_operator_for_login(p_email text)
returns table (operator_id text, company_id text, password_hash text, role text, is_blocked boolean,
               failed_logins integer, locked_until timestamptz, company_blocked boolean, company_active boolean)
language sql stable set app.scope = 'system' as $$
  select o.id, o.company_id, o.password_hash, o.role, o.is_blocked, o.failed_logins, o.locked_until,
         c.is_block, c.is_active
  from operators o join companies c on c.id = o.company_id
  where o.email = lower(p_email)
$$;

create function auth_session(p_token_hash bytea)
returns table (session_id text, operator_id text, company_id text, role text, expires_at timestamptz,
               operator_blocked boolean, company_blocked boolean, company_active boolean, is_master_company boolean)
language sql stable set app.scope = 'system' as $$
  select s.id, s.operator_id, s.company_id, o.role, s.expires_at, o.is_blocked, c.is_block, c.is_active,
         c.is_master_company
  from admin_sessions s
  join operators o on o.id = s.operator_id
  join companies c on c.id = s.company_id
  where s.token_hash = p_token_hash and s.revoked_at is null and s.expires_at > now()
$$;

create function auth_api_key(p_lookup text)
returns table (key_id text, company_id text, environment text, secret_hash bytea, company_blocked boolean,
               company_active boolean, verification_status text)
language sql stable set app.scope = 'system' as $$
  select k.id, k.company_id, k.environment, k.secret_hash, c.is_block, c.is_active, c.verification_status
  from api_keys k join companies c on c.id = k.company_id
  where k.lookup = p_lookup and k.revoked_at is null
$$;

grant usage on schema public to payments_app;
grant select, insert, update, delete on companies, operators, admin_sessions, api_keys, idempotency_keys,
  outbox to payments_app;
grant select, insert, update on audit_chain_heads to payments_app;
grant select, insert on audit_events to payments_app;
grant select on audit_event_types, migrations to payments_app;
grant usage on all sequences in schema public to payments_app;
grant execute on function tenant_visible(text), auth_operator_for_login(text), auth_session(bytea),
  auth_api_key(text) to payments_app;
