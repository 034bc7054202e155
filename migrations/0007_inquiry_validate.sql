-- Validate 0006's CHECK on the rows written before it. In a transaction of
-- its own, under a SHARE UPDATE EXCLUSIVE lock: claims and writes go on
-- while it scans.
ALTER TABLE idemgate_records VALIDATE CONSTRAINT idemgate_records_state_check;
