-- Retention by generations, step 1 of 3 (docs/src/design/retention.md;
-- the layout itself is 0012). Every record gets the generation slot it
-- lives in: the existing ones are slot 0. Neither statement reads the
-- table: the column's constant default is kept in the catalog, not written
-- to each row, and the CHECK that ATTACH will need is added NOT VALID (the
-- next migration validates it without holding up claims and writes).
-- Instances of the previous release insert without naming `slot`, and get
-- 0, which the CHECK allows.
ALTER TABLE idemgate_records ADD COLUMN slot SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE idemgate_records ADD CONSTRAINT idemgate_records_0_slot CHECK (slot = 0) NOT VALID;
