-- no-transaction
-- The records that can be due for a status inquiry (in flight or
-- inquiring), by when: the inquirer's take reads only these. Built
-- CONCURRENTLY (outside a transaction, hence the first line), so claims go
-- on meanwhile. A build that was interrupted leaves an invalid index of
-- this name: drop it (DROP INDEX CONCURRENTLY idemgate_records_open) and
-- migrate again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idemgate_records_open ON idemgate_records (lease_until)
    WHERE state IN ('in_flight', 'inquiring');
