-- A claim that is answered without the key (409, 422, a held key) says
-- when the record expires, so the gateway can tell the client (issue 48:
-- `expires` in problem answers). PostgreSQL cannot change a function's
-- result in place, so the batch that says it is a new function beside
-- 0014's, which stays for instances of the previous build during a
-- rolling upgrade.

-- How long the record under a key is kept from now, in ms rounded down:
-- until its retention ends or, held by a live lease, until that lapses if
-- later (transitions::kept_for). With p_token, only while the record is
-- still that attempt's (else NULL: nothing is stated rather than another
-- incarnation's expiry). VOLATILE, so called from a statement after a
-- claim, it reads with a fresh snapshot and sees what the claim wrote.
CREATE FUNCTION idemgate_kept_ms(p_route TEXT, p_scope BYTEA, p_key TEXT, p_token BIGINT)
RETURNS BIGINT
LANGUAGE sql VOLATILE SET enable_seqscan = off AS $$
    SELECT GREATEST(FLOOR(EXTRACT(EPOCH FROM (
               GREATEST(r.expires_at,
                        CASE WHEN r.state = 'in_flight' AND r.lease_until > clock_timestamp()
                             THEN r.lease_until END)
               - clock_timestamp())) * 1000), 0)::BIGINT
      FROM idemgate_records r
     WHERE r.route = p_route AND r.scope = p_scope AND r.key = p_key
       AND (p_token IS NULL OR r.token = p_token)
$$;

-- The batch of 0014, whose rows gain o_expires_ms: for a claim answered
-- without the key (mismatch, held, in_flight, inquiring), the time its
-- record is kept, read right after that claim (before the batch's next
-- operation); NULL for every other row.
CREATE FUNCTION idemgate_batch_expiry(
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
               o_held_reason TEXT, o_status SMALLINT, o_headers BYTEA, o_body BYTEA,
               o_expires_ms BIGINT)
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
            -- The claim of 0013; the record's expiry only for the answers
            -- that refuse the key (a replay's or a claim's costs nothing).
            RETURN QUERY
                SELECT op.op_index, c.*,
                       CASE WHEN c.o_outcome IN ('mismatch', 'held', 'in_flight', 'inquiring')
                            THEN idemgate_kept_ms(op.op_route, op.op_scope, op.op_key, c.o_token)
                       END
                  FROM idemgate_claim(
                    op.op_route, op.op_scope, op.op_key, op.op_fingerprint, op.op_lease_ms,
                    op.op_retention_ms, op.op_release_lapsed, op.op_attempt,
                    op.op_inquire_after_ms) c;
        ELSIF op.kind = 'complete' THEN
            -- 0014's completion, unchanged.
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
               AND (expires_at > clock_timestamp()
                    OR (state = 'in_flight' AND lease_until > clock_timestamp()));
            IF FOUND THEN
                IF op.op_wake IS NOT NULL THEN
                    PERFORM pg_notify('idemgate_keys', op.op_wake);
                END IF;
                RETURN QUERY SELECT op.op_index, 'applied'::TEXT, NULL::BIGINT, NULL::BIGINT,
                                    NULL::TEXT, NULL::SMALLINT, NULL::BYTEA, NULL::BYTEA,
                                    NULL::BIGINT;
            END IF;
        ELSE
            RAISE EXCEPTION 'idemgate_batch_expiry: unknown operation kind %', op.kind;
        END IF;
    END LOOP;
END;
$$;
