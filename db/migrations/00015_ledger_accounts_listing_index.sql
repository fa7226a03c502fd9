-- GET /v1/accounts lists a company's wallets and accounts newest first by the UUIDv7 after the ID's
-- prefix (wal_ and acct_ would otherwise sort by prefix: db/ledger.ts listLedgerAccounts). This index
-- serves that order and its keyset cursor, and replaces the one by raw ID, whose leading columns it
-- also covers.
create index ledger_accounts_listing_idx
  on ledger_accounts (company_id, environment, split_part(id, '_', 2) desc, id desc);
drop index ledger_accounts_company_idx;
