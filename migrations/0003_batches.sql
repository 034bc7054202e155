-- Batched operations (docs/DESIGN.md §6, crates/store/src/postgres/batch.rs): the
-- claims and completions that arrive while earlier ones are being committed
-- go to PostgreSQL together, in one call of this function, one round trip
-- and one commit. Each operation does exactly what it does alone:
--   * a claim is one call of idemgate_claim (0002);
--   * a completion is the compare-and-set UPDATE of PgStore::complete,
--     announced on idemgate_keys when the caller passes a wake id (routes
--     with waiters only).
-- Operations run in array order. The gateway sorts them by (route, scope,
-- key), keeping arrival order among operations on one key, so every batch
-- takes its row locks in one global order (no deadlock between concurrent
-- batches) and duplicates inside a batch resolve as if sequential.
-- Returns one row per claim and one per completion that applied, each
-- naming its operation by its 1-based position (o_index).
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
                   expires_at = clock_timestamp() + op.op_retention_ms * INTERVAL '1 millisecond',
                   updated_at = clock_timestamp()
             WHERE route = op.op_route AND scope = op.op_scope AND key = op.op_key
               AND token = op.op_token
               AND (state IN ('in_flight', 'completed')
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
