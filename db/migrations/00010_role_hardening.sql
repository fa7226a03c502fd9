-- Hardening found by a review that ran crafted statements as payments_app, the role every
-- application connection uses. Each item below was a committed exploit before this migration
-- (db/hardening.test.ts runs them again and expects each to be refused).

-- 1. No temporary objects for anyone but the owner. pg_temp comes first in every search path, so a
--    temporary table named `ledger_entries` or `ledger_accounts` shadowed the real one inside the
--    ledger's triggers: crafted SQL faked the commit-time balance check and moved balances with no
--    entries, and a temporary trigger function ran balance updates at trigger depth 2, where the
--    balance guard lets them through. Nothing in the application uses temporary objects. This is a
--    privilege of the database, so a database cloned from this one (CREATE DATABASE … TEMPLATE)
--    needs the same REVOKE again (db/hardening.test.ts does it on its clone).
do $$
begin
  execute format('revoke temporary on database %I from public', current_database());
end
$$;

-- 2. One hold entry per hold and account: a single release (ledger_entries_release_once) could
--    otherwise answer two identical hold entries, leaving the second one's money pending forever.
create unique index ledger_entries_hold_once on ledger_entries (hold_id, account_id) where kind = 'hold';

-- 3. A hold entry waits for a concurrent resolution of its hold (FOR SHARE conflicts with the
--    resolving UPDATE) and then sees the resolved status: before, an entry checked against the
--    pending hold could commit after the hold was voided, its money pending forever.
create or replace function ledger_entries_hold_rules() returns trigger language plpgsql set app.scope = 'system' as $$
declare
  hold record;
begin
  if new.kind = 'posted' then
    return new;
  end if;
  select status, transfer_id into hold from ledger_holds where id = new.hold_id for share;
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

-- 4. A delivery belongs to its event's company and environment. The foreign key named the event
--    alone, so a delivery row could pair another company's event with this company's endpoint, and
--    the delivery would sign and send that event's snapshot there. A trigger rather than a
--    composite key: the key would need one more unique index on `events`, paid by every transfer.
--    Under a tenant's setting another company's event is invisible, so it is "not found" as well.
create function webhook_deliveries_event_scope() returns trigger language plpgsql as $$
begin
  if not exists (select 1 from events e where e.id = new.event_id and e.company_id = new.company_id
                 and e.environment = new.environment) then
    raise exception 'event % is not an event of this company and environment', new.event_id
      using errcode = 'foreign_key_violation';
  end if;
  return new;
end
$$;
create trigger webhook_deliveries_event_scope before insert or update of event_id, company_id, environment
  on webhook_deliveries for each row execute function webhook_deliveries_event_scope();

-- 5. One event per version of an object within its company: unique across companies, one company
--    could take another's (object, version) first and make that company's next state change fail.
alter table events drop constraint events_one_per_version;
alter table events add constraint events_one_per_version unique (object_id, object_version, company_id);
