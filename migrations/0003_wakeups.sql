-- Wake-ups for waiting duplicates (docs/DESIGN.md §11, `concurrent =
-- "wait"`): whenever a record leaves `in_flight` — completed, held,
-- released, abandoned or deleted, by any instance or by `idemgate keys` —
-- a NOTIFY on channel `idemgate_keys` names it by its wake id, which every
-- instance's listener hands to its waiters (src/waiters.rs). NOTIFY is
-- delivered at commit, so a waiter woken by it always sees the change.

-- SHA-256 over the route and the scope, each after its length as a 4-byte
-- big-endian integer, then the key: the bytes of `waiters::wake_id`.
CREATE FUNCTION idemgate_wake_id(p_route TEXT, p_scope BYTEA, p_key TEXT)
RETURNS TEXT LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(sha256(int4send(octet_length(p_route)) || convert_to(p_route, 'UTF8')
                         || int4send(length(p_scope)) || p_scope
                         || convert_to(p_key, 'UTF8')), 'hex')
$$;

CREATE FUNCTION idemgate_announce() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idemgate_keys', idemgate_wake_id(OLD.route, OLD.scope, OLD.key));
    RETURN NULL;
END
$$;

-- A renewal or a takeover keeps the record in flight: no announcement.
CREATE TRIGGER idemgate_settled AFTER UPDATE ON idemgate_records
    FOR EACH ROW WHEN (OLD.state = 'in_flight' AND NEW.state <> 'in_flight')
    EXECUTE FUNCTION idemgate_announce();

CREATE TRIGGER idemgate_removed AFTER DELETE ON idemgate_records
    FOR EACH ROW WHEN (OLD.state = 'in_flight')
    EXECUTE FUNCTION idemgate_announce();
