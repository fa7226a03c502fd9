-- The application role writes an account's balances (through the entries' trigger, which the
-- balance guard admits only from there) and nothing else of it: its overdraft limit, name, purpose
-- and the rest are fixed when the account is opened, and no code path changes them. Before, a
-- code path or a crafted statement could raise `overdraft_limit` and then overdraw the account.
revoke update on ledger_accounts from payments_app;
grant update (posted, pending_debits, pending_credits) on ledger_accounts to payments_app;

-- No application path updates or deletes a company: verification (which allows live keys) and the
-- master, block and active flags are the CLI's, which connects as the owner. Before, a code path or a
-- crafted statement of the app role could verify its own company or make it the master.
revoke update, delete on companies from payments_app;
