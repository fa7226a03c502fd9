-- A transfer that says its money moved has the entries that moved it: a transfer inserted or moved
-- to `settled` or `returned` without a posted entry is refused when its transaction commits. Before,
-- a code path (or a crafted statement) could record a settled transfer while the ledger moved
-- nothing. Checked at commit, so the entries may come after the row in the same transaction; one
-- index lookup (ledger_entries_transfer_idx) per such change.
create function transfers_moved_money() returns trigger language plpgsql set app.scope = 'system' as $$
begin
  if not exists (select 1 from ledger_entries e where e.transfer_id = new.id and e.kind = 'posted') then
    raise exception 'transfer % is % but has no posted entry', new.id, new.status using errcode = 'check_violation';
  end if;
  return null;
end
$$;
create constraint trigger transfers_moved_money after insert or update of status on transfers
  deferrable initially deferred for each row when (new.status in ('settled', 'returned'))
  execute function transfers_moved_money();
