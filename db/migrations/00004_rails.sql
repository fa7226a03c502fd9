-- External rails (Shape A): payouts from a stablecoin balance to a bank account over ACH, settled
-- by a Temporal workflow. The ledger side: a hold on the wallet when the transfer is created; at
-- settlement the hold is released and posted through platform accounts (fees, FX in each currency,
-- ACH payouts); a failure voids the hold; a return after settlement posts reversing entries.

-- Platform-side accounts inside each company's ledger, one per purpose, currency and environment.
alter table ledger_accounts add column system_purpose text
  check (system_purpose in ('sandbox_funding', 'rail_clearing', 'fees', 'fx', 'ach_payouts'));
update ledger_accounts set system_purpose = 'sandbox_funding' where type = 'system';
alter table ledger_accounts add constraint ledger_accounts_system_purpose
  check ((type = 'system') = (system_purpose is not null));
create unique index ledger_accounts_one_per_purpose
  on ledger_accounts (company_id, environment, currency, system_purpose) where type = 'system';

-- Bank accounts the company pays out to. Only a masked number is kept.
create table external_accounts (
  id              text primary key check (id ~ '^ba_[0-9a-f]{32}$'),
  company_id      text not null references companies (id),
  environment     text not null check (environment in ('sandbox', 'live')),
  rail            text not null check (rail in ('ach')),
  currency        text not null references currencies (code),
  label           text not null default '' check (length(label) <= 100),
  routing_number  text not null check (routing_number ~ '^[0-9]{9}$'),
  account_last4   text not null check (account_last4 ~ '^[0-9]{4}$'),
  created_at      timestamptz not null default now(),
  constraint external_accounts_scope unique (id, company_id, environment, currency)
);

alter table transfers drop constraint transfers_rail_check;
alter table transfers add constraint transfers_rail_check check (rail in ('ledger', 'ach'));
alter table transfers alter column destination_account_id drop not null;
alter table transfers drop constraint transfers_distinct_accounts;
alter table transfers add constraint transfers_distinct_accounts
  check (destination_account_id is null or source_account_id <> destination_account_id);
alter table transfers
  add column destination_external_account_id text,
  add column source_rail       text check (source_rail in ('stablecoin')),
  add column out_amount        bigint check (out_amount > 0),
  add column out_currency      text references currencies (code),
  add column fee_amount        bigint check (fee_amount >= 0),
  add column fx_rate           numeric(38, 18) check (fx_rate > 0),
  add column rail_reference    text check (length(rail_reference) <= 200),
  add column failure_reason    text check (length(failure_reason) <= 500),
  add column workflow_id       text check (length(workflow_id) <= 1000),
  add constraint transfers_destination_external_fk
    foreign key (destination_external_account_id, company_id, environment, out_currency)
    references external_accounts (id, company_id, environment, currency),
  -- A ledger transfer names two accounts; a rail transfer names a wallet, a bank account and its quote.
  add constraint transfers_shape check (
    (rail = 'ledger' and destination_account_id is not null and destination_external_account_id is null
       and out_amount is null and source_rail is null)
    or
    (rail = 'ach' and destination_account_id is null and destination_external_account_id is not null
       and source_rail = 'stablecoin' and out_amount is not null and out_currency is not null
       and fee_amount is not null and fx_rate is not null and workflow_id is not null
       and fee_amount < amount)
  );

-- One hold per transfer.
create unique index ledger_holds_one_per_transfer on ledger_holds (transfer_id);

-- A transfer moves forward only: pending → processing → settled, or failed/canceled; settled →
-- returned. Every change bumps the version and is written to the status history by the code in
-- the same transaction (the history table refuses edits).
create function transfers_guard() returns trigger language plpgsql as $$
begin
  if (new.id, new.company_id, new.environment, new.idempotency_key, new.rail, new.amount, new.currency,
      new.source_account_id, new.destination_account_id, new.destination_external_account_id,
      new.out_amount, new.out_currency, new.fee_amount, new.fx_rate, new.created_at)
     is distinct from
     (old.id, old.company_id, old.environment, old.idempotency_key, old.rail, old.amount, old.currency,
      old.source_account_id, old.destination_account_id, old.destination_external_account_id,
      old.out_amount, old.out_currency, old.fee_amount, old.fx_rate, old.created_at) then
    raise exception 'a transfer''s terms never change' using errcode = 'insufficient_privilege';
  end if;
  if new.status is distinct from old.status then
    if not (
      (old.status = 'pending' and new.status in ('processing', 'failed', 'canceled')) or
      (old.status = 'processing' and new.status in ('settled', 'failed')) or
      (old.status = 'settled' and new.status = 'returned')
    ) then
      raise exception 'transfer % cannot go from % to %', old.id, old.status, new.status using errcode = 'check_violation';
    end if;
    if new.version <> old.version + 1 then
      raise exception 'a status change bumps the version by one' using errcode = 'check_violation';
    end if;
  end if;
  return new;
end
$$;
create trigger transfers_guard before update on transfers for each row execute function transfers_guard();

alter table external_accounts enable row level security;
alter table external_accounts force row level security;
create policy tenant_isolation on external_accounts using (tenant_visible(company_id)) with check (tenant_visible(company_id));
grant select, insert on external_accounts to payments_app;

-- Ledger hardening found by the property and constraint tests of 00003:
-- 1. The commit-time double-entry check must see the transfer's entries whatever the transaction's
--    tenant setting is at commit (a transaction that cleared or switched app.company_id could
--    otherwise commit an unbalanced transfer).
alter function ledger_check_balanced() set app.scope = 'system';

-- 2. Holds and status history belong to their transfer's company.
alter table transfers add constraint transfers_company_scope unique (id, company_id);
alter table ledger_holds add constraint ledger_holds_transfer_company_fk
  foreign key (transfer_id, company_id) references transfers (id, company_id);
alter table transfer_status_history add constraint transfer_status_history_transfer_company_fk
  foreign key (transfer_id, company_id) references transfers (id, company_id);

-- 3. A hold entry needs a pending hold of the same transfer; a release mirrors a hold entry exactly
--    (same hold, account and amount) and needs the hold resolved; a resolved hold must have all its
--    entries released by commit.
create function ledger_entries_hold_rules() returns trigger language plpgsql set app.scope = 'system' as $$
declare
  hold record;
begin
  if new.kind = 'posted' then
    return new;
  end if;
  select status, transfer_id into hold from ledger_holds where id = new.hold_id;
  if hold.transfer_id is distinct from new.transfer_id then
    raise exception 'hold % does not belong to transfer %', new.hold_id, new.transfer_id using errcode = 'check_violation';
  end if;
  if new.kind = 'hold' and hold.status <> 'pending' then
    raise exception 'hold % is already resolved', new.hold_id using errcode = 'check_violation';
  end if;
  if new.kind = 'hold_release' then
    if not exists (select 1 from ledger_entries e where e.hold_id = new.hold_id and e.kind = 'hold'
                   and e.account_id = new.account_id and e.amount = new.amount) then
      raise exception 'a release must mirror a hold entry of hold %', new.hold_id using errcode = 'check_violation';
    end if;
  end if;
  return new;
end
$$;
create trigger ledger_entries_hold_rules before insert on ledger_entries
  for each row execute function ledger_entries_hold_rules();

-- Released entries and a resolved status go together, checked at commit (either may come first).
create function ledger_release_resolves_hold() returns trigger language plpgsql set app.scope = 'system' as $$
begin
  if exists (select 1 from ledger_holds where id = new.hold_id and status = 'pending') then
    raise exception 'hold % is released but still pending', new.hold_id using errcode = 'check_violation';
  end if;
  return null;
end
$$;
create constraint trigger ledger_release_resolves_hold after insert on ledger_entries
  deferrable initially deferred for each row when (new.kind = 'hold_release')
  execute function ledger_release_resolves_hold();

create function ledger_holds_released() returns trigger language plpgsql set app.scope = 'system' as $$
begin
  if new.status <> 'pending' and exists (
    select 1 from ledger_entries h where h.hold_id = new.id and h.kind = 'hold'
    and not exists (select 1 from ledger_entries r where r.hold_id = h.hold_id and r.kind = 'hold_release'
                    and r.account_id = h.account_id and r.amount = h.amount)
  ) then
    raise exception 'hold % is % but not every entry of it is released', new.id, new.status using errcode = 'check_violation';
  end if;
  return null;
end
$$;
create constraint trigger ledger_holds_released after update on ledger_holds
  deferrable initially deferred for each row execute function ledger_holds_released();
-- A hold is created pending; it is resolved by an update, which the guards above check.
create function ledger_holds_created_pending() returns trigger language plpgsql as $$
begin
  raise exception 'a hold is created pending' using errcode = 'check_violation';
end
$$;
create trigger ledger_holds_created_pending before insert on ledger_holds
  for each row when (new.status <> 'pending') execute function ledger_holds_created_pending();
