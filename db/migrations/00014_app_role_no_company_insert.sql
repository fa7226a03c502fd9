-- 00011 left the application role no company to update or delete, so that it cannot verify its own
-- company; it could still INSERT one, already verified (row-level security only asks that the new
-- row's id be the transaction's app.company_id, which the role sets itself), and then issue that
-- company a live API key that authenticates. No application path creates a company: tenants are the
-- CLI's, which connects as the owner.
revoke insert on companies from payments_app;
