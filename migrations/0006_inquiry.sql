-- Status inquiry (docs/src/guide/status-inquiry.md): a route with
-- on_unknown_outcome = "inquire" asks its upstream what happened to an
-- attempt whose outcome is unknown, instead of holding the key.
--
-- A new state, 'inquiring': the attempt's token is kept until an inquirer
-- takes the question (a new token, fenced like an attempt), lease_until is
-- when the next question is due (or when the inquirer's lease lapses),
-- inquiries counts the questions answered without settling the key, and
-- inquiring_since is when the outcome became unknown.
--
-- Nothing here scans or rewrites the table (a rolling upgrade must not stop
-- claims): the CHECK is replaced NOT VALID (0007 validates it without
-- blocking writes) and the columns have constant defaults. The index comes
-- in 0008, which says how to build it ahead on a large table.
ALTER TABLE idemgate_records DROP CONSTRAINT idemgate_records_state_check;
ALTER TABLE idemgate_records ADD CONSTRAINT idemgate_records_state_check
    CHECK (state IN ('in_flight', 'completed', 'held', 'inquiring')) NOT VALID;
ALTER TABLE idemgate_records
    ADD COLUMN inquiries       INTEGER     NOT NULL DEFAULT 0,
    ADD COLUMN inquiring_since TIMESTAMPTZ;

-- The claim of 0002 (transitions::claim), and: an inquiring record answers
-- 'inquiring' with the time to its next question; a lapsed lease on a route
-- that inquires (p_release_lapsed IS NULL) turns the record inquiring, due
-- at once; a due inquiring record on a route that does not inquire is a
-- lapsed lease (taken over or held by the route's policy). An expired
-- record reused by a new claim starts with no inquiry.
CREATE OR REPLACE FUNCTION idemgate_claim(
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
                   held_reason = NULL, status = NULL, headers = NULL, body = NULL,
                   inquiries = 0, inquiring_since = NULL
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

        IF r.state = 'inquiring' AND (r.lease_until > v_now OR p_release_lapsed IS NULL) THEN
            -- The upstream is being asked: 409 until the next question. (A
            -- due one on a route that no longer inquires goes on below, as
            -- a lapsed lease.)
            RETURN QUERY SELECT 'inquiring'::TEXT, r.token,
                                GREATEST(CEIL(EXTRACT(EPOCH FROM (r.lease_until - v_now)) * 1000),
                                         0)::BIGINT,
                                NULL::TEXT, NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
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
        IF p_release_lapsed IS NULL THEN
            -- The route inquires: the record turns inquiring, due at once,
            -- with the lapsed attempt's token (which may still settle it),
            -- kept at least a retention from now.
            UPDATE idemgate_records
               SET state = 'inquiring', lease_until = clock_timestamp(), inquiries = 0,
                   inquiring_since = clock_timestamp(), updated_at = clock_timestamp(),
                   expires_at = GREATEST(expires_at, clock_timestamp() + v_retention)
             WHERE route = p_route AND scope = p_scope AND key = p_key
               AND token = r.token AND state = 'in_flight' AND lease_until <= clock_timestamp();
            IF FOUND THEN
                RETURN QUERY SELECT 'inquiring'::TEXT, r.token, 0::BIGINT, NULL::TEXT,
                                    NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
                RETURN;
            END IF;
        ELSIF p_release_lapsed THEN
            v_token := nextval('idemgate_token_seq');
            UPDATE idemgate_records
               SET state = 'in_flight', token = v_token, attempt = p_attempt,
                   lease_until = clock_timestamp() + v_lease,
                   expires_at = GREATEST(expires_at, clock_timestamp() + v_lease),
                   inquiries = 0, inquiring_since = NULL, updated_at = clock_timestamp()
             WHERE route = p_route AND scope = p_scope AND key = p_key
               AND token = r.token AND state IN ('in_flight', 'inquiring')
               AND lease_until <= clock_timestamp();
            IF FOUND THEN
                RETURN QUERY SELECT 'takeover'::TEXT, v_token, NULL::BIGINT, NULL::TEXT,
                                    NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
                RETURN;
            END IF;
        ELSE
            UPDATE idemgate_records
               SET state = 'held', held_reason = 'lease_lapsed', lease_until = NULL,
                   inquiring_since = NULL, updated_at = clock_timestamp()
             WHERE route = p_route AND scope = p_scope AND key = p_key
               AND token = r.token AND state IN ('in_flight', 'inquiring')
               AND lease_until <= clock_timestamp();
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

-- The batch of 0003, whose completion also settles an inquiring record
-- (transitions::write_applies): the inquirer records the upstream's answer.
CREATE OR REPLACE FUNCTION idemgate_batch(
    p_kinds TEXT[],              -- 'claim' or 'complete'
    p_routes TEXT[], p_scopes BYTEA[], p_keys TEXT[],
    p_fingerprints BYTEA[],      -- claims
    p_attempts BIGINT[],         -- claims
    p_lease_ms BIGINT[],         -- claims
    p_release_lapsed BOOLEAN[],  -- claims
    p_retention_ms BIGINT[],     -- both
    p_tokens BIGINT[],           -- completions
    p_statuses SMALLINT[],       -- completions
    p_headers BYTEA[],           -- completions
    p_bodies BYTEA[],            -- completions
    p_wake TEXT[])               -- completions: the wake id to announce, or NULL
RETURNS TABLE (o_index BIGINT, o_outcome TEXT, o_token BIGINT, o_lease_ms BIGINT,
               o_held_reason TEXT, o_status SMALLINT, o_headers BYTEA, o_body BYTEA)
LANGUAGE plpgsql AS $$
DECLARE
    op RECORD;
BEGIN
    FOR op IN
        SELECT * FROM unnest(p_kinds, p_routes, p_scopes, p_keys, p_fingerprints, p_attempts,
                             p_lease_ms, p_release_lapsed, p_retention_ms, p_tokens,
                             p_statuses, p_headers, p_bodies, p_wake) WITH ORDINALITY
            AS t(kind, op_route, op_scope, op_key, op_fingerprint, op_attempt, op_lease_ms,
                 op_release_lapsed, op_retention_ms, op_token, op_status, op_headers,
                 op_body, op_wake, op_index)
    LOOP
        IF op.kind = 'claim' THEN
            RETURN QUERY
                SELECT op.op_index, c.* FROM idemgate_claim(
                    op.op_route, op.op_scope, op.op_key, op.op_fingerprint, op.op_lease_ms,
                    op.op_retention_ms, op.op_release_lapsed, op.op_attempt) c;
        ELSIF op.kind = 'complete' THEN
            -- transitions::write_applies(Complete): the token; in flight,
            -- completed already, or held only because this attempt's lease lapsed.
            UPDATE idemgate_records
               SET state = 'completed', status = op.op_status, headers = op.op_headers,
                   body = op.op_body, lease_until = NULL, held_reason = NULL,
                   inquiring_since = NULL,
                   expires_at = clock_timestamp() + op.op_retention_ms * INTERVAL '1 millisecond',
                   updated_at = clock_timestamp()
             WHERE route = op.op_route AND scope = op.op_scope AND key = op.op_key
               AND token = op.op_token
               AND (state IN ('in_flight', 'completed', 'inquiring')
                    OR (state = 'held' AND held_reason = 'lease_lapsed'));
            IF FOUND THEN
                IF op.op_wake IS NOT NULL THEN
                    PERFORM pg_notify('idemgate_keys', op.op_wake);
                END IF;
                RETURN QUERY SELECT op.op_index, 'applied'::TEXT, NULL::BIGINT, NULL::BIGINT,
                                    NULL::TEXT, NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
            END IF;
        ELSE
            RAISE EXCEPTION 'idemgate_batch: unknown operation kind %', op.kind;
        END IF;
    END LOOP;
END;
$$;
