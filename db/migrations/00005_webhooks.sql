-- Webhooks (issue 5, DESIGN 8): every state change becomes an event in the same transaction as the
-- change, written by triggers so no code path can change a state without its event. A dispatcher
-- fans each event out to the company's matching endpoints (one delivery per event and endpoint)
-- and hands each delivery to a durable workflow; attempts are recorded.

-- Events: the outbox of state changes and the `GET /v1/events` backstop. `snapshot` is the row as it
-- was at that version (numbers that exceed JSON's safe range are strings); the API renders it with
-- the same code that renders the live object.
create table events (
  id              text primary key check (id ~ '^evt_[0-9a-f]{32}$'),
  company_id      text not null references companies (id),
  environment     text not null check (environment in ('sandbox', 'live')),
  type            text not null check (type ~ '^[a-z_]{1,40}\.[a-z_]{1,40}$'),
  object_type     text not null check (object_type in ('transfer', 'webhook_endpoint')),
  object_id       text not null,
  object_version  integer not null check (object_version >= 1),
  snapshot        jsonb not null,
  created_at      timestamptz not null default now(),
  dispatched_at   timestamptz,
  -- One event per version of an object: a state change is announced once.
  constraint events_one_per_version unique (object_id, object_version)
);
-- Indexes are kept to what the API and the dispatcher need: every one is paid by every transfer.
create index events_company_idx on events (company_id, environment, id desc);
create index events_undispatched_idx on events (created_at) where dispatched_at is null;

create function new_event_id() returns text language sql volatile as $$
  select 'evt_' || replace(uuidv7()::text, '-', '')
$$;

create function transfer_snapshot(t transfers) returns jsonb language sql immutable as $$
  select jsonb_build_object(
    'id', t.id, 'company_id', t.company_id, 'environment', t.environment, 'idempotency_key', t.idempotency_key,
    'rail', t.rail, 'status', t.status, 'amount', t.amount::text, 'currency', t.currency,
    'source_account_id', t.source_account_id, 'destination_account_id', t.destination_account_id,
    'destination_external_account_id', t.destination_external_account_id,
    'out_amount', t.out_amount::text, 'out_currency', t.out_currency, 'fee_amount', t.fee_amount::text,
    'fx_rate', t.fx_rate::text, 'failure_reason', t.failure_reason, 'workflow_id', t.workflow_id,
    'version', t.version, 'created_at', t.created_at, 'updated_at', t.updated_at)
$$;

-- A transfer's creation and every change of its status are events `transfer.<status>`.
create function transfers_emit_event() returns trigger language plpgsql as $$
begin
  if tg_op = 'INSERT' or new.status is distinct from old.status then
    insert into events (id, company_id, environment, type, object_type, object_id, object_version, snapshot)
    values (new_event_id(), new.company_id, new.environment, 'transfer.' || new.status, 'transfer', new.id,
            new.version, transfer_snapshot(new));
  end if;
  return null;
end
$$;
create trigger transfers_emit_event after insert or update of status on transfers
  for each row execute function transfers_emit_event();

-- Endpoints. The signing secret must be readable to sign (HMAC), so it is stored as issued; during a
-- rotation the previous secret keeps signing until `previous_secret_expires_at`.
create table webhook_endpoints (
  id                          text primary key check (id ~ '^we_[0-9a-f]{32}$'),
  company_id                  text not null references companies (id),
  environment                 text not null check (environment in ('sandbox', 'live')),
  url                         text not null check (length(url) between 1 and 2048),
  description                 text not null default '' check (length(description) <= 500),
  -- Empty: every event type.
  event_types                 text[] not null default '{}' check (cardinality(event_types) <= 50),
  status                      text not null default 'enabled' check (status in ('enabled', 'disabled')),
  disabled_reason             text check (length(disabled_reason) <= 500),
  secret                      text not null check (secret ~ '^whsec_[A-Za-z0-9+/]{32,}={0,2}$'),
  previous_secret             text check (previous_secret ~ '^whsec_[A-Za-z0-9+/]{32,}={0,2}$'),
  previous_secret_expires_at  timestamptz,
  last_success_at             timestamptz,
  version                     integer not null default 1 check (version >= 1),
  created_at                  timestamptz not null default now(),
  updated_at                  timestamptz not null default now(),
  deleted_at                  timestamptz,
  constraint webhook_endpoints_previous_secret check ((previous_secret is null) = (previous_secret_expires_at is null)),
  constraint webhook_endpoints_disabled_reason check ((status = 'disabled') or disabled_reason is null),
  constraint webhook_endpoints_scope unique (id, company_id, environment)
);
create index webhook_endpoints_company_idx on webhook_endpoints (company_id, environment, id desc) where deleted_at is null;

create function webhook_endpoint_snapshot(w webhook_endpoints) returns jsonb language sql immutable as $$
  select jsonb_build_object(
    'id', w.id, 'company_id', w.company_id, 'environment', w.environment, 'url', w.url,
    'description', w.description, 'event_types', to_jsonb(w.event_types), 'status', w.status,
    'disabled_reason', w.disabled_reason, 'version', w.version, 'created_at', w.created_at,
    'updated_at', w.updated_at)
$$;

-- Endpoints move between enabled and disabled (bumping their version); a deleted one never changes
-- again; the terms that identify an endpoint never change.
create function webhook_endpoints_guard() returns trigger language plpgsql as $$
begin
  if (new.id, new.company_id, new.environment, new.created_at) is distinct from (old.id, old.company_id, old.environment, old.created_at) then
    raise exception 'a webhook endpoint''s identity never changes' using errcode = 'insufficient_privilege';
  end if;
  if old.deleted_at is not null then
    raise exception 'webhook endpoint % is deleted', old.id using errcode = 'check_violation';
  end if;
  if new.status is distinct from old.status then
    if new.version <> old.version + 1 then
      raise exception 'a status change bumps the version by one' using errcode = 'check_violation';
    end if;
    insert into events (id, company_id, environment, type, object_type, object_id, object_version, snapshot)
    values (new_event_id(), new.company_id, new.environment, 'webhook_endpoint.' || new.status, 'webhook_endpoint',
            new.id, new.version, webhook_endpoint_snapshot(new));
  end if;
  return new;
end
$$;
create trigger webhook_endpoints_guard before update on webhook_endpoints
  for each row execute function webhook_endpoints_guard();

-- One delivery per (event, endpoint); its workflow ID derives from the pair.
create table webhook_deliveries (
  id            text primary key default 'whd_' || replace(uuidv7()::text, '-', '') check (id ~ '^whd_[0-9a-f]{32}$'),
  company_id    text not null references companies (id),
  environment   text not null check (environment in ('sandbox', 'live')),
  event_id      text not null references events (id),
  endpoint_id   text not null,
  status        text not null default 'pending' check (status in ('pending', 'succeeded', 'failed', 'canceled')),
  attempts      integer not null default 0 check (attempts >= 0),
  created_at    timestamptz not null default now(),
  completed_at  timestamptz,
  constraint webhook_deliveries_once unique (event_id, endpoint_id),
  constraint webhook_deliveries_completed check ((status = 'pending') = (completed_at is null)),
  constraint webhook_deliveries_endpoint_fk foreign key (endpoint_id, company_id, environment)
    references webhook_endpoints (id, company_id, environment)
);
create index webhook_deliveries_endpoint_idx on webhook_deliveries (endpoint_id, id desc);

-- Every HTTP attempt. `attempt_key` makes a retried activity (a worker lost mid-attempt) a new row
-- rather than an overwrite; `in_flight` rows are the per-endpoint concurrency leases.
create table webhook_attempts (
  id             text primary key default 'wha_' || replace(uuidv7()::text, '-', '') check (id ~ '^wha_[0-9a-f]{32}$'),
  company_id     text not null references companies (id),
  delivery_id    text not null references webhook_deliveries (id),
  endpoint_id    text not null,
  event_id       text not null,
  attempt_key    text not null check (length(attempt_key) <= 200),
  trigger        text not null check (trigger in ('scheduled', 'manual')),
  state          text not null default 'in_flight' check (state in ('in_flight', 'succeeded', 'failed')),
  url            text not null,
  status_code    integer check (status_code between 100 and 599),
  latency_ms     integer check (latency_ms >= 0),
  error          text check (length(error) <= 500),
  response_body  text check (octet_length(response_body) <= 1024),
  started_at     timestamptz not null default now(),
  lease_until    timestamptz not null,
  finished_at    timestamptz,
  constraint webhook_attempts_once unique (delivery_id, attempt_key),
  constraint webhook_attempts_finished check ((state = 'in_flight') = (finished_at is null))
);
create index webhook_attempts_endpoint_idx on webhook_attempts (endpoint_id, id desc);
create index webhook_attempts_in_flight_idx on webhook_attempts (endpoint_id) where state = 'in_flight';

do $$
declare
  t text;
begin
  foreach t in array array['events', 'webhook_endpoints', 'webhook_deliveries', 'webhook_attempts']
  loop
    execute format('alter table %I enable row level security', t);
    execute format('alter table %I force row level security', t);
    execute format('create policy tenant_isolation on %I using (tenant_visible(company_id)) with check (tenant_visible(company_id))', t);
  end loop;
end
$$;

grant select, insert, update on events to payments_app;
grant select, insert, update on webhook_endpoints, webhook_deliveries, webhook_attempts to payments_app;

-- An event is a record of the past: only the dispatcher's mark ever changes.
create function events_guard() returns trigger language plpgsql as $$
begin
  if (new.id, new.company_id, new.environment, new.type, new.object_type, new.object_id, new.object_version,
      new.snapshot, new.created_at)
     is distinct from
     (old.id, old.company_id, old.environment, old.type, old.object_type, old.object_id, old.object_version,
      old.snapshot, old.created_at) then
    raise exception 'events never change' using errcode = 'insufficient_privilege';
  end if;
  return new;
end
$$;
create trigger events_guard before update on events for each row execute function events_guard();
