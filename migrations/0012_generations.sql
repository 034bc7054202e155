-- Retention by generations, step 3 of 3 (docs/src/design/retention.md;
-- 0010 and 0011 gave every record its slot). Deleting
-- expired rows one by one leaves dead rows that only vacuum reclaims; at
-- about 100 M records autovacuum fell behind, the table grew and new keys
-- ran at 0.45x their rate on an empty table. Instead, records live in two
-- partitions, one per generation: new keys go to the current one, the
-- claim reads both, and a rotation (crates/store/src/postgres/generations.rs)
-- swaps the older one for an empty table and drops it, after moving into
-- the other the few records that are still live in it.
--
-- A key has at most one record across the two: a claim that finds its key
-- only in the previous generation acts on that record where it is, and one
-- that finds it there expired deletes it before inserting in the current
-- generation. Rotations and claims exclude each other through
-- idemgate_generation (see the claim below).
--
-- The existing table becomes slot 0 as it is: its rows are not rewritten,
-- its indexes are kept, and nothing here reads it. The rename and the
-- ATTACH hold it exclusively for a moment; ATTACH finds its partition
-- constraint implied by the CHECK (slot = 0) 0011 validated, and the
-- partitioned indexes take over the existing ones (same definitions).

CREATE TABLE idemgate_generation (
    one   BOOLEAN     PRIMARY KEY DEFAULT TRUE CHECK (one),
    slot  SMALLINT    NOT NULL CHECK (slot IN (0, 1)),   -- where new keys go
    since TIMESTAMPTZ NOT NULL                            -- when it began
);
INSERT INTO idemgate_generation (slot, since) VALUES (0, now());

ALTER TABLE idemgate_records RENAME TO idemgate_records_0;
CREATE TABLE idemgate_records (LIKE idemgate_records_0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY LIST (slot);
-- LIKE copied slot 0's own CHECK; the partitioned table allows both slots.
ALTER TABLE idemgate_records DROP CONSTRAINT idemgate_records_0_slot;
ALTER TABLE idemgate_records ATTACH PARTITION idemgate_records_0 FOR VALUES IN (0);
-- A key is unique within a partition; across the two, the claim keeps it so.
CREATE TABLE idemgate_records_1 PARTITION OF idemgate_records (PRIMARY KEY (route, scope, key))
    FOR VALUES IN (1);
-- Partitioned indexes: slot 0's existing ones are attached, slot 1 gets new.
CREATE INDEX idemgate_records_by_expiry ON idemgate_records (expires_at);
CREATE INDEX idemgate_records_open_by_lease ON idemgate_records (lease_until)
    WHERE state IN ('in_flight', 'inquiring');
-- The front's outbox trigger (0004) stayed on slot 0: it moves to the
-- partitioned table, which gives it to both partitions.
DROP TRIGGER idemgate_front_outbox ON idemgate_records_0;
CREATE TRIGGER idemgate_front_outbox
    AFTER UPDATE OR DELETE ON idemgate_records
    FOR EACH ROW
    WHEN (current_setting('idemgate.front', true) = 'on')
    EXECUTE FUNCTION idemgate_front_outbox_write();

-- Instances of earlier releases, still running during a rolling upgrade,
-- sweep with
--   DELETE FROM idemgate_records WHERE ctid IN (SELECT ctid ... expired ...)
-- A ctid is a row's position within its own partition, so on the
-- partitioned table that DELETE also matches the row at the same position
-- in the other partition, which may be live: a key forgotten, executed
-- twice. A statement that names ctid (this release never does) deletes
-- only records past their retention, in whichever partition; the others
-- it matched are kept. Releases, abandons and an operator's deletes, which
-- name their key, are untouched.
CREATE FUNCTION idemgate_records_keep_live() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.expires_at <= clock_timestamp()
       AND NOT (OLD.state = 'in_flight' AND OLD.lease_until > clock_timestamp()) THEN
        RETURN OLD;   -- expired: the sweep's to delete
    END IF;
    RETURN NULL;      -- live: matched by its position only
END;
$$;
CREATE TRIGGER idemgate_records_positional_delete
    BEFORE DELETE ON idemgate_records
    FOR EACH ROW
    WHEN (strpos(current_query(), 'ctid') > 0)
    EXECUTE FUNCTION idemgate_records_keep_live();

-- The claim of 0006 with generations: new keys go to the current slot; an
-- expired record in the previous one is replaced there.
CREATE OR REPLACE FUNCTION idemgate_claim(
    p_route TEXT, p_scope BYTEA, p_key TEXT, p_fingerprint BYTEA,
    p_lease_ms BIGINT, p_retention_ms BIGINT, p_release_lapsed BOOLEAN, p_attempt BIGINT)
RETURNS TABLE (o_outcome TEXT, o_token BIGINT, o_lease_ms BIGINT, o_held_reason TEXT,
               o_status SMALLINT, o_headers BYTEA, o_body BYTEA)
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    r idemgate_records%ROWTYPE;
    v_token BIGINT;
    v_now TIMESTAMPTZ;
    v_lease INTERVAL := p_lease_ms * INTERVAL '1 millisecond';
    v_retention INTERVAL := p_retention_ms * INTERVAL '1 millisecond';
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

-- The batch of 0006, reading the generation first. Never JIT inside the
-- claim or the batch: with sequential scans off, a statement whose only
-- plan is one costs 1e10 and crosses jit_above_cost, and compiling took
-- 100 ms per call (seen: the generation's one-row table, read without a
-- condition, cut new keys to 212/s).
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
