-- The outbox (migration 0004) also says what a record became: its new
-- state and token (NULL for a delete). A relay that finds the front
-- already showing a completion (the completing instance wrote it before
-- answering, as it nearly always does) deletes the row without reading
-- the record again or writing Redis (crates/store/src/postgres/outbox.rs). Rows
-- written before this migration have no state and take the full path.
-- A held record whose reason changes under the same token now writes a
-- row too, so that the front's held answer follows it.

ALTER TABLE idemgate_front_outbox
    ADD COLUMN state       TEXT,    -- the record's new state; NULL: deleted
    ADD COLUMN state_token BIGINT;  -- the token of that state

CREATE OR REPLACE FUNCTION idemgate_front_outbox_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF OLD.state = NEW.state AND OLD.token = NEW.token
           AND OLD.held_reason IS NOT DISTINCT FROM NEW.held_reason THEN
            RETURN NULL;  -- a renewal: the front's marker is renewed directly
        END IF;         -- (a held record's new reason is a change: a row)
        INSERT INTO idemgate_front_outbox (route, scope, key, token, state, state_token)
        VALUES (OLD.route, OLD.scope, OLD.key, OLD.token, NEW.state, NEW.token);
        RETURN NULL;
    END IF;
    IF OLD.expires_at <= clock_timestamp()
       AND NOT (OLD.state = 'in_flight' AND OLD.lease_until > clock_timestamp()) THEN
        RETURN NULL;      -- swept: expired in the front too
    END IF;
    INSERT INTO idemgate_front_outbox (route, scope, key, token)
    VALUES (OLD.route, OLD.scope, OLD.key, OLD.token);
    RETURN NULL;
END;
$$;

-- A queue table: every row is deleted moments after it is inserted, so
-- the table holds a few live rows and many dead ones, which every relay
-- pass steps over until a vacuum removes them. Vacuum it after every
-- thousand dead rows, without the cost-based pauses, instead of after
-- 50 + a fifth of its live rows counted at some earlier moment.
ALTER TABLE idemgate_front_outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
