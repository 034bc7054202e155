-- Status inquiry on SQLite (docs/src/guide/status-inquiry.md), as
-- PostgreSQL's migrations/0006_inquiry.sql: the 'inquiring' state, the
-- number of questions asked and when the inquiry began. SQLite cannot
-- change a CHECK constraint, so the table is rebuilt (inside the
-- migration's BEGIN IMMEDIATE transaction: other processes wait).

CREATE TABLE idemgate_records_new (
    route           TEXT    NOT NULL,
    scope           BLOB    NOT NULL,
    key             TEXT    NOT NULL,
    fingerprint     BLOB    NOT NULL,
    state           TEXT    NOT NULL
                    CHECK (state IN ('in_flight', 'completed', 'held', 'inquiring')),
    token           INTEGER NOT NULL,
    attempt         INTEGER,
    lease_until     INTEGER,                   -- in_flight: the lease; inquiring: the next question
    expires_at      INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    held_reason     TEXT,
    status          INTEGER,
    headers         BLOB,
    body            BLOB,
    inquiries       INTEGER NOT NULL DEFAULT 0, -- inquiring: questions asked
    inquiring_since INTEGER,                   -- inquiring: since when
    PRIMARY KEY (route, scope, key)
);
INSERT INTO idemgate_records_new (route, scope, key, fingerprint, state, token, attempt,
                                  lease_until, expires_at, created_at, updated_at,
                                  held_reason, status, headers, body)
    SELECT route, scope, key, fingerprint, state, token, attempt, lease_until, expires_at,
           created_at, updated_at, held_reason, status, headers, body
      FROM idemgate_records;
DROP TABLE idemgate_records;
ALTER TABLE idemgate_records_new RENAME TO idemgate_records;
CREATE INDEX idemgate_records_expires_at ON idemgate_records (expires_at);
CREATE INDEX idemgate_records_listing ON idemgate_records (route, state, updated_at);
-- Only the records that can be due: finding due questions scans no others.
CREATE INDEX idemgate_records_open ON idemgate_records (lease_until)
    WHERE state IN ('in_flight', 'inquiring');
