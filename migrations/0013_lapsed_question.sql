-- A lapsed lease's question comes `after` past the lapse (issue 43): a
-- claim that finds an in-flight record whose lease lapsed, on a route that
-- inquires, turns it inquiring due the route's `[routes.inquiry] after`
-- past the lease's end, reckoned from that end, instead of due at once
-- (transitions::lapsed_question_in). Until then nobody takes the key with
-- a new token, so the stalled attempt's own answer (same token) can still
-- settle it. The claim and the batch take the route's `after` as a new last
-- argument: new functions beside those of 0012, which stay for instances
-- of the previous build during a rolling upgrade (their claim reads as an
-- `after` of 0: due at once, as before).

-- The claim of 0012, with the route's inquiry `after`. It implements
-- transitions::claim (crates/core/src/transitions.rs).
CREATE FUNCTION idemgate_claim(
    p_route TEXT, p_scope BYTEA, p_key TEXT, p_fingerprint BYTEA,
    p_lease_ms BIGINT, p_retention_ms BIGINT, p_release_lapsed BOOLEAN, p_attempt BIGINT,
    p_inquire_after_ms BIGINT)
RETURNS TABLE (o_outcome TEXT, o_token BIGINT, o_lease_ms BIGINT, o_held_reason TEXT,
               o_status SMALLINT, o_headers BYTEA, o_body BYTEA)
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    r idemgate_records%ROWTYPE;
    v_token BIGINT;
    v_now TIMESTAMPTZ;
    v_lease INTERVAL := p_lease_ms * INTERVAL '1 millisecond';
    v_retention INTERVAL := p_retention_ms * INTERVAL '1 millisecond';
    v_after INTERVAL := COALESCE(p_inquire_after_ms, 0) * INTERVAL '1 millisecond';
    v_due TIMESTAMPTZ;
    v_slot SMALLINT;
BEGIN
    -- The generation new keys go to. Reading it holds idemgate_generation
    -- (ACCESS SHARE) to the end of the transaction, so a rotation, which
    -- locks it exclusively, happens wholly before or wholly after this claim.
    SELECT slot INTO v_slot FROM idemgate_generation WHERE one;
    FOR attempt IN 1..16 LOOP
        v_now := clock_timestamp();
        SELECT * INTO r FROM idemgate_records
         WHERE route = p_route AND scope = p_scope AND key = p_key;

        IF NOT FOUND THEN
            v_token := nextval('idemgate_token_seq');
            INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, attempt,
                                          lease_until, expires_at, created_at, updated_at, slot)
            VALUES (p_route, p_scope, p_key, p_fingerprint, 'in_flight', v_token, p_attempt,
                    clock_timestamp() + v_lease, clock_timestamp() + v_retention,
                    clock_timestamp(), clock_timestamp(), v_slot)
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
            IF r.slot <> v_slot THEN
                -- The record is in the previous generation: it leaves it
                -- (the same re-checked condition, so a write that revived
                -- it wins), and the next pass, finding nothing, inserts the
                -- key in the current one.
                DELETE FROM idemgate_records
                 WHERE route = p_route AND scope = p_scope AND key = p_key AND token = r.token
                   AND expires_at <= clock_timestamp()
                   AND NOT (state = 'in_flight' AND lease_until > clock_timestamp());
                CONTINUE;
            END IF;
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
            -- The route inquires: the record turns inquiring with the
            -- lapsed attempt's token (which may still settle it), reckoned
            -- from the lapse and due p_inquire_after_ms past it
            -- (transitions::lapsed_question_in), kept at least a retention
            -- from now. (In SET, lease_until is the lapsed lease's end.)
            UPDATE idemgate_records
               SET state = 'inquiring',
                   lease_until = GREATEST(lease_until + v_after, clock_timestamp()),
                   inquiries = 0, inquiring_since = lease_until, updated_at = clock_timestamp(),
                   expires_at = GREATEST(expires_at, clock_timestamp() + v_retention)
             WHERE route = p_route AND scope = p_scope AND key = p_key
               AND token = r.token AND state = 'in_flight' AND lease_until <= clock_timestamp()
            RETURNING lease_until INTO v_due;
            IF FOUND THEN
                RETURN QUERY SELECT 'inquiring'::TEXT, r.token,
                                    GREATEST(CEIL(EXTRACT(EPOCH FROM (v_due - clock_timestamp()))
                                                  * 1000), 0)::BIGINT,
                                    NULL::TEXT, NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA;
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

-- The batch of 0012, passing each claim's `after`.
CREATE FUNCTION idemgate_batch(
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
    p_wake TEXT[],               -- completions: the wake id to announce, or NULL
    p_inquire_after_ms BIGINT[]) -- claims: the route's inquiry `after` (routes that inquire)
RETURNS TABLE (o_index BIGINT, o_outcome TEXT, o_token BIGINT, o_lease_ms BIGINT,
               o_held_reason TEXT, o_status SMALLINT, o_headers BYTEA, o_body BYTEA)
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    op RECORD;
BEGIN
    -- The generation first, as a claim reads it, before any completion
    -- below locks the records: every transaction then takes the two in the
    -- order a rotation does (crates/store/src/postgres/generations.rs).
    PERFORM 1 FROM idemgate_generation WHERE one;
    FOR op IN
        SELECT * FROM unnest(p_kinds, p_routes, p_scopes, p_keys, p_fingerprints, p_attempts,
                             p_lease_ms, p_release_lapsed, p_retention_ms, p_tokens,
                             p_statuses, p_headers, p_bodies, p_wake, p_inquire_after_ms)
                             WITH ORDINALITY
            AS t(kind, op_route, op_scope, op_key, op_fingerprint, op_attempt, op_lease_ms,
                 op_release_lapsed, op_retention_ms, op_token, op_status, op_headers,
                 op_body, op_wake, op_inquire_after_ms, op_index)
    LOOP
        IF op.kind = 'claim' THEN
            RETURN QUERY
                SELECT op.op_index, c.* FROM idemgate_claim(
                    op.op_route, op.op_scope, op.op_key, op.op_fingerprint, op.op_lease_ms,
                    op.op_retention_ms, op.op_release_lapsed, op.op_attempt,
                    op.op_inquire_after_ms) c;
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
