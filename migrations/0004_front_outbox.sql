-- The front store's transactional outbox (docs/DESIGN.md §6 "The front
-- store", crates/store/src/front/). With `[store.front]` configured, every
-- connection of the PostgreSQL store sets the session variable
-- idemgate.front = on, and every change that can make the Redis front
-- stale writes a row here in the same transaction as the change itself:
-- a record's state or token changing (completed, held, taken over,
-- reused after expiry) and a record deleted (released, abandoned, cleared,
-- deleted by an operator). Deletes of expired records (the sweeper) write
-- nothing: the front's copy expired with them.
--
-- A row says only "this key's attempt `token` is over: bring the front in
-- line with PostgreSQL". The relay (every instance runs one) takes rows
-- with FOR UPDATE SKIP LOCKED, reads the records' current state under
-- FOR SHARE, applies it to Redis, and deletes the rows in the same
-- transaction. Instances without a front never set the variable and pay
-- nothing but the trigger's test.

CREATE TABLE idemgate_front_outbox (
    id         BIGSERIAL   PRIMARY KEY,
    route      TEXT        NOT NULL,
    scope      BYTEA       NOT NULL,
    key        TEXT        NOT NULL,
    token      BIGINT      NOT NULL,          -- the attempt whose record changed
    created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- The Redis server the front was last brought in line with (its run_id,
-- new at every server start). A front that comes back as another server
-- process (a restart, perhaps from an old snapshot; a failover) may hold
-- entries the outbox already carried to its predecessor and deleted: it
-- is wiped before any instance uses it again.
CREATE TABLE idemgate_front_state (
    one          BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
    redis_run_id TEXT    NOT NULL
);

CREATE FUNCTION idemgate_front_outbox_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF OLD.state = NEW.state AND OLD.token = NEW.token THEN
            RETURN NULL;  -- a renewal: the front's marker is renewed directly
        END IF;
    ELSIF OLD.expires_at <= clock_timestamp()
          AND NOT (OLD.state = 'in_flight' AND OLD.lease_until > clock_timestamp()) THEN
        RETURN NULL;      -- swept: expired in the front too
    END IF;
    INSERT INTO idemgate_front_outbox (route, scope, key, token)
    VALUES (OLD.route, OLD.scope, OLD.key, OLD.token);
    RETURN NULL;
END;
$$;

CREATE TRIGGER idemgate_front_outbox
    AFTER UPDATE OR DELETE ON idemgate_records
    FOR EACH ROW
    WHEN (current_setting('idemgate.front', true) = 'on')
    EXECUTE FUNCTION idemgate_front_outbox_write();
