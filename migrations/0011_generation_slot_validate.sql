-- Retention by generations, step 2 of 3. Validate 0010's CHECK (slot = 0)
-- on every existing record, in a transaction of its own, under a SHARE
-- UPDATE EXCLUSIVE lock: claims and writes go on while it scans. Once it
-- is valid, 0012 attaches the table as slot 0's partition without reading
-- it again.
ALTER TABLE idemgate_records VALIDATE CONSTRAINT idemgate_records_0_slot;
