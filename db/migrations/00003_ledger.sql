-- The money core: currencies, ledger accounts (wallets and accounts), transfers, double-entry
-- append-only entries, holds, and the keys that sign transfer objects.
--
-- The database itself makes the bad states impossible, whatever the code does:
--   * balances are maintained by a trigger from the entries, never written directly;
--   * an account's available balance (posted - pending debits) never goes below its floor
--     (0 unless the account has an overdraft limit; platform-side accounts may be unbounded);
--   * every transfer's entries sum to zero per currency and kind, checked at commit;
--   * an entry's currency, company and environment are those of its account and its transfer
--     (composite foreign keys), so sandbox and live money never meet;
--   * entries and status history are append-only; a hold is released at most once per account.

create table currencies (
  code   text primary key check (code ~ '^[A-Z][A-Z0-9]{2,4}$'),
  scale  smallint not null check (scale between 0 and 18),
  kind   text not null check (kind in ('fiat', 'stablecoin'))
);
insert into currencies (code, scale, kind) values
  ('USD', 2, 'fiat'), ('EUR', 2, 'fiat'), ('GBP', 2, 'fiat'), ('MXN', 2, 'fiat'), ('BRL', 2, 'fiat'),
  ('COP', 2, 'fiat'), ('JPY', 0, 'fiat'),
  ('USDC', 6, 'stablecoin'), ('USDT', 6, 'stablecoin'), ('EURC', 6, 'stablecoin'), ('PYUSD', 6, 'stablecoin');

create table ledger_accounts (
  id               text primary key check (id ~ '^(wal|acct|sys)_[0-9a-f]{32}$'),
  company_id       text not null references companies (id),
  environment      text not null check (environment in ('sandbox', 'live')),
  type             text not null check (type in ('wallet', 'account', 'system')),
  currency         text not null references currencies (code),
  name             text not null default '' check (length(name) <= 100),
  posted           bigint not null default 0,
  pending_debits   bigint not null default 0 check (pending_debits >= 0),
  pending_credits  bigint not null default 0 check (pending_credits >= 0),
  -- How far below zero the available balance may go: 0 = no overdraft; null = unbounded, which only
  -- platform-side (system) accounts may be, e.g. the sandbox funding source.
  overdraft_limit  bigint default 0 check (overdraft_limit is null or overdraft_limit >= 0),
  created_at       timestamptz not null default now(),
  constraint ledger_accounts_no_overdraft
    check (overdraft_limit is null or posted - pending_debits >= -overdraft_limit),
  constraint ledger_accounts_unbounded_is_system check (overdraft_limit is not null or type = 'system'),
  constraint ledger_accounts_prefix check (
    (type = 'wallet' and id like 'wal\_%') or (type = 'account' and id like 'acct\_%') or (type = 'system' and id like 'sys\_%')
  ),
  constraint ledger_accounts_scope unique (id, company_id, environment, currency)
);
create index ledger_accounts_company_idx on ledger_accounts (company_id, environment, id desc);

create table transfers (
  id                      text primary key check (id ~ '^tr_[0-9a-f]{32}$'),
  company_id              text not null references companies (id),
  environment             text not null check (environment in ('sandbox', 'live')),
  idempotency_key         text not null check (length(idempotency_key) between 1 and 255),
  rail                    text not null check (rail in ('ledger')),
  status                  text not null check (status in ('pending', 'processing', 'settled', 'failed', 'canceled', 'returned')),
  amount                  bigint not null check (amount > 0),
  currency                text not null references currencies (code),
  source_account_id       text not null,
  destination_account_id  text not null,
  version                 integer not null default 1 check (version >= 1),
  created_at              timestamptz not null default now(),
  updated_at              timestamptz not null default now(),
  constraint transfers_idempotency_unique unique (company_id, environment, idempotency_key),
  constraint transfers_scope unique (id, company_id, environment),
  constraint transfers_distinct_accounts check (source_account_id <> destination_account_id),
  constraint transfers_source_fk foreign key (source_account_id, company_id, environment, currency)
    references ledger_accounts (id, company_id, environment, currency),
  constraint transfers_destination_fk foreign key (destination_account_id, company_id, environment, currency)
    references ledger_accounts (id, company_id, environment, currency)
);
create index transfers_company_idx on transfers (company_id, environment, id desc);

create table transfer_status_history (
  id           bigint generated always as identity primary key,
  transfer_id  text not null references transfers (id),
  company_id   text not null references companies (id),
  status       text not null check (status in ('pending', 'processing', 'settled', 'failed', 'canceled', 'returned')),
  reason       text check (length(reason) <= 500),
  occurred_at  timestamptz not null default now()
);
create index transfer_status_history_transfer_idx on transfer_status_history (transfer_id, id);

create table ledger_holds (
  id           text primary key check (id ~ '^hold_[0-9a-f]{32}$'),
  company_id   text not null references companies (id),
  transfer_id  text not null references transfers (id),
  status       text not null default 'pending' check (status in ('pending', 'posted', 'voided')),
  created_at   timestamptz not null default now(),
  resolved_at  timestamptz,
  constraint ledger_holds_resolved check ((status = 'pending') = (resolved_at is null))
);

create table ledger_entries (
  id           bigint generated always as identity primary key,
  company_id   text not null,
  environment  text not null,
  transfer_id  text not null,
  account_id   text not null,
  currency     text not null,
  -- Signed minor units: positive credits the account, negative debits it.
  amount       bigint not null check (amount <> 0),
  -- posted: moves the posted balance. hold: reserves (negative) or announces (positive) money.
  -- hold_release: undoes a hold (same sign as the hold), when it is posted or voided.
  kind         text not null check (kind in ('posted', 'hold', 'hold_release')),
  hold_id      text references ledger_holds (id),
  created_at   timestamptz not null default now(),
  constraint ledger_entries_hold_named check (kind = 'posted' or hold_id is not null),
  constraint ledger_entries_account_fk foreign key (account_id, company_id, environment, currency)
    references ledger_accounts (id, company_id, environment, currency),
  constraint ledger_entries_transfer_fk foreign key (transfer_id, company_id, environment)
    references transfers (id, company_id, environment)
);
create index ledger_entries_transfer_idx on ledger_entries (transfer_id);
create index ledger_entries_account_idx on ledger_entries (account_id, id);
-- A hold is released once per account: posting or voiding it twice is impossible.
create unique index ledger_entries_release_once on ledger_entries (hold_id, account_id) where kind = 'hold_release';

-- Balances follow the entries, in the same statement.
create function ledger_apply_entry() returns trigger language plpgsql as $$
begin
  if new.kind = 'posted' then
    update ledger_accounts set posted = posted + new.amount where id = new.account_id;
  elsif new.kind = 'hold' then
    if new.amount < 0 then
      update ledger_accounts set pending_debits = pending_debits - new.amount where id = new.account_id;
    else
      update ledger_accounts set pending_credits = pending_credits + new.amount where id = new.account_id;
    end if;
  else -- hold_release
    if new.amount < 0 then
      update ledger_accounts set pending_debits = pending_debits + new.amount where id = new.account_id;
    else
      update ledger_accounts set pending_credits = pending_credits - new.amount where id = new.account_id;
    end if;
  end if;
  return null;
end
$$;
create trigger ledger_entries_apply after insert on ledger_entries
  for each row execute function ledger_apply_entry();

-- Double entry, checked when the transaction commits.
create function ledger_check_balanced() returns trigger language plpgsql as $$
begin
  if exists (
    select 1 from ledger_entries where transfer_id = new.transfer_id
    group by currency, kind having sum(amount) <> 0
  ) then
    raise exception 'ledger entries of transfer % do not balance', new.transfer_id using errcode = 'check_violation';
  end if;
  return null;
end
$$;
create constraint trigger ledger_entries_balanced after insert on ledger_entries
  deferrable initially deferred for each row execute function ledger_check_balanced();

create function ledger_append_only() returns trigger language plpgsql as $$
begin
  raise exception '% is append-only', tg_table_name using errcode = 'insufficient_privilege';
end
$$;
create trigger ledger_entries_append_only before update or delete on ledger_entries
  for each row execute function ledger_append_only();
create trigger ledger_entries_no_truncate before truncate on ledger_entries
  for each statement execute function ledger_append_only();
create trigger transfer_status_history_append_only before update or delete on transfer_status_history
  for each row execute function ledger_append_only();

-- Balances and holds change only through entries: direct edits of the money columns are refused.
create function ledger_accounts_guard() returns trigger language plpgsql as $$
begin
  if pg_trigger_depth() < 2 and (new.posted, new.pending_debits, new.pending_credits)
     is distinct from (old.posted, old.pending_debits, old.pending_credits) then
    raise exception 'balances change only through ledger entries' using errcode = 'insufficient_privilege';
  end if;
  if (new.company_id, new.environment, new.currency, new.type) is distinct from
     (old.company_id, old.environment, old.currency, old.type) then
    raise exception 'an account keeps its company, environment, currency and type' using errcode = 'insufficient_privilege';
  end if;
  return new;
end
$$;
create trigger ledger_accounts_guard before update on ledger_accounts
  for each row execute function ledger_accounts_guard();
create function ledger_accounts_open_empty() returns trigger language plpgsql as $$
begin
  if new.posted <> 0 or new.pending_debits <> 0 or new.pending_credits <> 0 then
    raise exception 'an account opens with zero balances' using errcode = 'check_violation';
  end if;
  return new;
end
$$;
create trigger ledger_accounts_open_empty before insert on ledger_accounts
  for each row execute function ledger_accounts_open_empty();

-- A hold goes from pending to posted or voided, once.
create function ledger_holds_guard() returns trigger language plpgsql as $$
begin
  if old.status <> 'pending' or new.status = 'pending'
     or (new.id, new.company_id, new.transfer_id, new.created_at) is distinct from
        (old.id, old.company_id, old.transfer_id, old.created_at) then
    raise exception 'a hold is posted or voided exactly once' using errcode = 'check_violation';
  end if;
  return new;
end
$$;
create trigger ledger_holds_guard before update on ledger_holds
  for each row execute function ledger_holds_guard();

-- Keys that sign transfer objects (Ed25519, JWS). Platform-wide, not tenant data. The private key
-- is kept here for the single-database deployment; a KMS is where it belongs in production.
create table signing_keys (
  kid          text primary key check (length(kid) between 8 and 64),
  algorithm    text not null check (algorithm = 'EdDSA'),
  public_jwk   jsonb not null,
  private_jwk  jsonb not null,
  status       text not null check (status in ('active', 'retired')),
  created_at   timestamptz not null default now(),
  retired_at   timestamptz,
  constraint signing_keys_retired check ((status = 'retired') = (retired_at is not null))
);
create unique index signing_keys_one_active on signing_keys ((true)) where status = 'active';

do $$
declare
  t text;
begin
  foreach t in array array['ledger_accounts', 'transfers', 'transfer_status_history', 'ledger_holds', 'ledger_entries']
  loop
    execute format('alter table %I enable row level security', t);
    execute format('alter table %I force row level security', t);
    execute format('create policy tenant_isolation on %I using (tenant_visible(company_id)) with check (tenant_visible(company_id))', t);
  end loop;
end
$$;

grant select on currencies to payments_app;
grant select, insert, update on ledger_accounts, transfers, ledger_holds to payments_app;
grant select, insert on ledger_entries, transfer_status_history to payments_app;
grant select, insert, update on signing_keys to payments_app;
