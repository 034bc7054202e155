-- The claim and the batch find their record through the primary key,
-- whatever the statistics say. PL/pgSQL keeps each statement's plan on its
-- connection until something invalidates it (a later ANALYZE of the
-- table); one made while the table was empty (and analyzed so) reads the
-- whole table, and stays in use as the table grows until then:
-- new keys fell from 4.3k/s to 0.7k/s within 15 s on a growing table. With
-- sequential scans off inside these two functions, the only plan left is
-- the index, on any pooler (the setting belongs to the function, not to
-- the session).
ALTER FUNCTION idemgate_claim(TEXT, BYTEA, TEXT, BYTEA, BIGINT, BIGINT, BOOLEAN, BIGINT)
    SET enable_seqscan = off;
ALTER FUNCTION idemgate_batch(TEXT[], TEXT[], BYTEA[], TEXT[], BYTEA[], BIGINT[], BIGINT[],
                              BOOLEAN[], BIGINT[], BIGINT[], SMALLINT[], BYTEA[], BYTEA[], TEXT[])
    SET enable_seqscan = off;
