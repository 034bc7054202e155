-- Attempt ids (docs/DESIGN.md §3): the gateway names each attempt before
-- its claim, and the claim writes the name with the record. A gateway whose
-- claim's answer was lost (a timeout, a cut connection) never forwarded the
-- request; it removes the record it may have created by that name
-- (`abandon` in crates/store/src/postgres.rs), so a key that never reached the
-- upstream never stays in flight or turns held.

ALTER TABLE idemgate_records ADD COLUMN attempt BIGINT;

-- The claim of 0001 with the attempt id written on every path that gives
-- the key to this attempt (insert, reuse after expiry, takeover). It
-- implements transitions::claim (crates/core/src/transitions.rs).
CREATE FUNCTION idemgate_claim(
    p_route TEXT, p_scope BYTEA, p_key TEXT, p_fingerprint BYTEA,
    p_lease_ms BIGINT, p_retention_ms BIGINT, p_release_lapsed BOOLEAN, p_attempt BIGINT)
RETURNS TABLE (o_outcome TEXT, o_token BIGINT, o_lease_ms BIGINT, o_held_reason TEXT,
               o_status SMALLINT, o_headers BYTEA, o_body BYTEA)
LANGUAGE plpgsql AS $$
DECLARE
    r idemgate_records%ROWTYPE;
    v_token BIGINT;
    v_now TIMESTAMPTZ;
    v_lease INTERVAL := p_lease_ms * INTERVAL '1 millisecond';
    v_retention INTERVAL := p_retention_ms * INTERVAL '1 millisecond';
BEGIN
    FOR attempt IN 1..16 LOOP
        v_now := clock_timestamp();
        SELECT * INTO r FROM idemgate_records
         WHERE route = p_route AND scope = p_scope AND key = p_key;

        IF NOT FOUND THEN
            v_token := nextval('idemgate_token_seq');
            INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, attempt,
                                          lease_until, expires_at, created_at, updated_at)
            VALUES (p_route, p_scope, p_key, p_fingerprint, 'in_flight', v_token, p_attempt,
                    clock_timestamp() + v_lease, clock_timestamp() + v_retention,
                    clock_timestamp(), clock_timestamp())
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                RETURN QUERY SELECT 'claimed'::TEXT, v_token, NULL::BIGINT, NULL::TEXT,
                                    NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
                RETURN;
            END IF;
            CONTINUE;  -- someone inserted first: read what they wrote
        END IF;

        IF r.expires_at <= v_now AND NOT (r.state = 'in_flight' AND r.lease_until > v_now) THEN
            -- Past retention (and not held by a live lease): the key is free
            -- again, with a new token.
            v_token := nextval('idemgate_token_seq');
            UPDATE idemgate_records
               SET fingerprint = p_fingerprint, state = 'in_flight', token = v_token,
                   attempt = p_attempt,
                   lease_until = clock_timestamp() + v_lease,
                   expires_at = clock_timestamp() + v_retention,
                   created_at = clock_timestamp(), updated_at = clock_timestamp(),
                   held_reason = NULL, status = NULL, headers = NULL, body = NULL
             WHERE route = p_route AND scope = p_scope AND key = p_key AND token = r.token
               AND expires_at <= clock_timestamp()
               AND NOT (state = 'in_flight' AND lease_until > clock_timestamp());
            IF FOUND THEN
                RETURN QUERY SELECT 'claimed'::TEXT, v_token, NULL::BIGINT, NULL::TEXT,
                                    NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
                RETURN;
            END IF;
            CONTINUE;
        END IF;

        IF r.fingerprint <> p_fingerprint THEN
            RETURN QUERY SELECT 'mismatch'::TEXT, NULL::BIGINT, NULL::BIGINT, NULL::TEXT,
                                NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
            RETURN;
        END IF;

        IF r.state = 'completed' THEN
            RETURN QUERY SELECT 'replay'::TEXT, r.token, NULL::BIGINT, NULL::TEXT,
                                r.status, r.headers, r.body;
            RETURN;
        END IF;

        IF r.state = 'held' THEN
            RETURN QUERY SELECT 'held'::TEXT, r.token, NULL::BIGINT, r.held_reason,
                                NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
            RETURN;
        END IF;

        -- in_flight
        IF r.lease_until > v_now THEN
            RETURN QUERY SELECT 'in_flight'::TEXT, r.token,
                                CEIL(EXTRACT(EPOCH FROM (r.lease_until - v_now)) * 1000)::BIGINT,
                                NULL::TEXT, NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
            RETURN;
        END IF;

        -- The lease lapsed: the attempt's outcome is unknown (G7). Both writes
        -- miss if the attempt renewed, finished or was held meanwhile.
        IF p_release_lapsed THEN
            v_token := nextval('idemgate_token_seq');
            UPDATE idemgate_records
               SET token = v_token, attempt = p_attempt,
                   lease_until = clock_timestamp() + v_lease,
                   expires_at = GREATEST(expires_at, clock_timestamp() + v_lease),
                   updated_at = clock_timestamp()
             WHERE route = p_route AND scope = p_scope AND key = p_key
               AND token = r.token AND state = 'in_flight' AND lease_until <= clock_timestamp();
            IF FOUND THEN
                RETURN QUERY SELECT 'takeover'::TEXT, v_token, NULL::BIGINT, NULL::TEXT,
                                    NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
                RETURN;
            END IF;
        ELSE
            UPDATE idemgate_records
               SET state = 'held', held_reason = 'lease_lapsed', lease_until = NULL,
                   updated_at = clock_timestamp()
             WHERE route = p_route AND scope = p_scope AND key = p_key
               AND token = r.token AND state = 'in_flight' AND lease_until <= clock_timestamp();
            IF FOUND THEN
                RETURN QUERY SELECT 'held'::TEXT, r.token, NULL::BIGINT, 'lease_lapsed'::TEXT,
                                    NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
                RETURN;
            END IF;
        END IF;
    END LOOP;
    -- Never the key itself in an error: logs carry keys only as digests.
    RAISE EXCEPTION 'idemgate_claim: one key kept changing under 16 attempts';
END;
$$;

-- The claim of 0001, kept for instances of an older build during a rolling
-- upgrade: the same claim with no attempt id.
CREATE OR REPLACE FUNCTION idemgate_claim(
    p_route TEXT, p_scope BYTEA, p_key TEXT, p_fingerprint BYTEA,
    p_lease_ms BIGINT, p_retention_ms BIGINT, p_release_lapsed BOOLEAN)
RETURNS TABLE (o_outcome TEXT, o_token BIGINT, o_lease_ms BIGINT, o_held_reason TEXT,
               o_status SMALLINT, o_headers BYTEA, o_body BYTEA)
LANGUAGE sql AS $$
    SELECT * FROM idemgate_claim(p_route, p_scope, p_key, p_fingerprint,
                                 p_lease_ms, p_retention_ms, p_release_lapsed, NULL::BIGINT);
$$;
