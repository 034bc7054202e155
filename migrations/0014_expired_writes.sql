-- A completion no longer applies to a record past its retention and not
-- held by a live lease: such a record is gone for every purpose
-- (transitions::expired), though it stays in the table until swept, and
-- the Redis store, whose records expire by themselves, never revived one.
-- Found by the differential test (tests/it/stores/differential/). The
-- batch of 0013, same arguments, replaced in place: an instance of the
-- previous build calls it too, and gets the same answer as this one
-- (its own other writes, statements of its binary, still reach such a
-- record until every instance runs this build).

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
                    OR (state = 'held' AND held_reason = 'lease_lapsed'))
               -- Not past retention (unless a live lease holds it): such a
               -- record is gone for every purpose (transitions::expired).
               AND (expires_at > clock_timestamp()
                    OR (state = 'in_flight' AND lease_until > clock_timestamp()));
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
