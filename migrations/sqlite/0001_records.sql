-- idemgate records on SQLite (docs/DESIGN.md §3, §15): one row per
-- (route, scope, key), as in PostgreSQL's migrations/0001_records.sql and
-- 0002_attempts.sql. Times are microseconds since the Unix epoch (the
-- wall clock of the processes sharing the file). The state machine itself
-- runs in crates/store/src/sqlite (crates/core/src/transitions.rs), inside
-- `BEGIN IMMEDIATE` transactions.

CREATE TABLE idemgate_records (
    route        TEXT    NOT NULL,
    scope        BLOB    NOT NULL,          -- SHA-256 of the scope, or empty
    key          TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL,          -- SHA-256 of the request
    state        TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed', 'held')),
    token        INTEGER NOT NULL,          -- fencing token of the current attempt
    attempt      INTEGER,                   -- the current attempt's id
    lease_until  INTEGER,                   -- in_flight only
    expires_at   INTEGER NOT NULL,          -- retention
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    held_reason  TEXT,                      -- held only
    status       INTEGER,                   -- completed only
    headers      BLOB,                      -- completed only
    body         BLOB,                      -- completed only
    PRIMARY KEY (route, scope, key)
);

CREATE INDEX idemgate_records_expires_at ON idemgate_records (expires_at);
CREATE INDEX idemgate_records_listing ON idemgate_records (route, state, updated_at);

-- The store-wide fencing token counter: tokens never repeat for a key,
-- even after its record was released, deleted or expired.
CREATE TABLE idemgate_tokens (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
);
INSERT INTO idemgate_tokens (id, last) VALUES (1, 0);

-- Announcements of settled records on waiting routes (docs/DESIGN.md §11),
-- for waiters in other processes sharing the file; pruned by the sweeper.
CREATE TABLE idemgate_wakeups (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    wake_id  BLOB    NOT NULL,
    at       INTEGER NOT NULL
);
