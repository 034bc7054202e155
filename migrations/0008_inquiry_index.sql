-- The records that can be due for a status inquiry (in flight or
-- inquiring), by when: the inquirer's take reads only these.
--
-- Not CONCURRENTLY: that waits for every transaction with an older
-- snapshot, and another instance starting at the same moment waits in
-- pg_advisory_lock for this migration to end, so the two deadlock (seen:
-- two gateways migrating one database at once). The build holds a SHARE
-- lock, which blocks writes to the table while it scans. On a large table,
-- create the index yourself before upgrading, without blocking anything:
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_records_open
--       ON idemgate_records (lease_until) WHERE state IN ('in_flight', 'inquiring');
-- (it works before migration 0006 too: a predicate may name a state the
-- CHECK does not allow yet), and this migration finds it and does nothing.
CREATE INDEX IF NOT EXISTS idemgate_records_open ON idemgate_records (lease_until)
    WHERE state IN ('in_flight', 'inquiring');
