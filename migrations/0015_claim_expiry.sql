-- A claim that is answered without the key (409, 422, a held key) says
-- when the record expires, so the gateway can tell the client (issue 48:
-- `expires` in problem answers). The batch of 0014, whose rows gain
-- o_expires_ms: for those outcomes, the time left before the record's
-- `expires_at`, read after the claim in the same transaction (so it is
-- what the claim left: a lapsed lease turned inquiring has its new
-- retention); NULL for the others. PostgreSQL cannot change a function's
-- result in place, so this is a new function beside 0014's batch, which
-- stays for instances of the previous build during a rolling upgrade.
-- The lookup costs one index probe, only on answers that are no claim and
-- no replay.

CREATE FUNCTION idemgate_batch_expiry(
    p_kinds TEXT[], p_routes TEXT[], p_scopes BYTEA[], p_keys TEXT[],
    p_fingerprints BYTEA[], p_attempts BIGINT[], p_lease_ms BIGINT[],
    p_release_lapsed BOOLEAN[], p_retention_ms BIGINT[], p_tokens BIGINT[],
    p_statuses SMALLINT[], p_headers BYTEA[], p_bodies BYTEA[], p_wake TEXT[],
    p_inquire_after_ms BIGINT[])
RETURNS TABLE (o_index BIGINT, o_outcome TEXT, o_token BIGINT, o_lease_ms BIGINT,
               o_held_reason TEXT, o_status SMALLINT, o_headers BYTEA, o_body BYTEA,
               o_expires_ms BIGINT)
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    b RECORD;
    v_expires_ms BIGINT;
BEGIN
    FOR b IN
        SELECT * FROM idemgate_batch(p_kinds, p_routes, p_scopes, p_keys, p_fingerprints,
                                     p_attempts, p_lease_ms, p_release_lapsed, p_retention_ms,
                                     p_tokens, p_statuses, p_headers, p_bodies, p_wake,
                                     p_inquire_after_ms)
    LOOP
        v_expires_ms := NULL;
        IF b.o_outcome IN ('mismatch', 'held', 'in_flight', 'inquiring') THEN
            -- Until its retention ends or, held by a live lease, that
            -- lapses if later (transitions::kept_for); rounded down: the
            -- record is kept at least that long.
            SELECT GREATEST(FLOOR(EXTRACT(EPOCH FROM (
                       GREATEST(r.expires_at,
                                CASE WHEN r.state = 'in_flight' AND r.lease_until > clock_timestamp()
                                     THEN r.lease_until END)
                       - clock_timestamp())) * 1000), 0)::BIGINT
              INTO v_expires_ms
              FROM idemgate_records r
             WHERE r.route = p_routes[b.o_index] AND r.scope = p_scopes[b.o_index]
               AND r.key = p_keys[b.o_index];
        END IF;
        o_index := b.o_index; o_outcome := b.o_outcome; o_token := b.o_token;
        o_lease_ms := b.o_lease_ms; o_held_reason := b.o_held_reason; o_status := b.o_status;
        o_headers := b.o_headers; o_body := b.o_body; o_expires_ms := v_expires_ms;
        RETURN NEXT;
    END LOOP;
END;
$$;
