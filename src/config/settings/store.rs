//! The settings of the `[store]` and `[store.front]` tables. Rows of the
//! settings table (`super`); a reload applies none of them.

use super::DefaultValue::{Derived, Required, Toml, Unset};
use super::{Kind, Reload, Section, Setting};

super::rows! { STORE = Store {
    /// the store, by scheme: `sqlite://PATH` (a relative path is relative to the working directory;
    /// `sqlite:///abs/path`), `postgres://` (or `postgresql://`; several hosts `h1:p1,h2:p2` with
    /// `target_session_attrs=read-write` (the default with several), `primary` or `any`: see [high
    /// availability](../operations/high-availability.md)), `redis://` (`rediss://` for TLS),
    /// `redis+sentinel://s1:26379,s2:26379/mymaster` (`rediss+sentinel://`: the primary Sentinel
    /// names, see [high availability](../operations/high-availability.md#redis-sentinel)),
    /// `memory://`. See [choosing a store](../stores/choosing.md) (the shipped `gateway.toml`:
    /// `DATABASE_URL`, else this default)
    STORE_URL "url" Text Toml(r#""sqlite://idemgate.db""#), Restart;
    /// PostgreSQL, SQLite: apply the embedded migrations (SQLite: create the file and its schema)
    /// when `serve` (or `sweep`, `keys`) starts
    STORE_MIGRATE "migrate" Bool Toml("true"), Restart;
    /// PostgreSQL: most connections in the shared pool, each used by one operation at a time; each
    /// serving thread's own pool (its claims and completions) holds one connection per batch it
    /// sends at once (`batches_in_flight / server_threads`, at least 1), so a gateway opens up to
    /// `pool_size` + `max(batches_in_flight, server_threads)` in all. SQLite: most reader
    /// connections (writes go through one connection per process). Redis: how many multiplexed
    /// connections idemgate keeps, each carrying many concurrent operations (≥ 1), capped at the
    /// host's CPU cores (a cap of at least two, so `pool_size` ≥ 2 always gives two): Redis runs
    /// one command at a time, and more connections only split the pipelining (measured on 2 cores:
    /// 2 connections instead of 16 gave 10 % more new keys per second with less CPU in both
    /// processes); on one server (not a cluster) each serving thread (`server_threads`) also opens
    /// one of its own, before the gateway serves
    STORE_POOL_SIZE "pool_size" Integer Toml("16"), Restart;
    /// PostgreSQL: most batches of claims and completions sent at once (1 ≤ it ≤ `pool_size`); each
    /// serving thread sends `batches_in_flight / server_threads` of its own (at least 1: with the
    /// default and two threads, two batches at once from the serving threads, beside the shared
    /// dispatcher's one for anything sent off them). Claims and completions that arrive while a
    /// batch is committing join the next one; fewer, larger batches commit more keys per second
    /// (measured: 1 beat 2, 4, 8 and 16 at 32 clients). Raise it only if one slow batch (a lock
    /// held by someone else) must not delay the others. See [sizing the store
    /// pool](../operations/sizing.md)
    STORE_BATCHES_IN_FLIGHT "batches_in_flight" Integer Toml("1"), Restart;
    /// longest any store operation, including getting a connection, may take; past it the store
    /// counts as unreachable. PostgreSQL enforces it too, as each pooled connection's
    /// `statement_timeout` and `idle_in_transaction_session_timeout`, so nothing idemgate gave up
    /// on commits later
    STORE_TIMEOUT "timeout" Duration Toml(r#""2s""#), Restart;
    /// PostgreSQL: longest a claim may wait in the batch queue before it is sent (from when the
    /// request asked for it, its wait for room in the queue included). A claim taken off the queue
    /// after waiting longer is not sent: the request gets `503` `overloaded` with `Retry-After` at
    /// once, nothing is written and its key stays free (`idemgate_store_claims_shed_total`).
    /// Completions are never shed. The rule for the default: a quarter of `timeout`, at most
    /// `100ms` — a claim that waited that long is behind a queue the store cannot drain before
    /// clients give up, so sending it only lengthens the queue. More than zero, at most `timeout`.
    /// See [memory and overload](../operations/memory.md)
    STORE_CLAIM_QUEUE_BUDGET "claim_queue_budget" Duration Derived("a quarter of `timeout`, at most `100ms`"), Restart;
    /// Redis: prefix of every key idemgate writes, the keys of a [`[store.front]`](#storefront)
    /// included (with `cluster = true` it may not contain `{` or `}`)
    STORE_PREFIX "prefix" Text Toml(r#""idemgate:""#), Restart;
    /// Redis: `url` names one seed node of a Redis Cluster (`redis://` or `rediss://` only; any
    /// other store is a config error). See [Redis Cluster](../stores/redis.md#redis-cluster)
    STORE_CLUSTER "cluster" Bool Toml("false"), Restart;
    /// Redis: how many replicas must acknowledge a claim that takes a key, a lease renewal, a
    /// record and a hold before the gateway counts it: `WAIT replicas replica_timeout` follows each
    /// of those writes on the connection that made it (a replay, `409` or `422` never waits), and
    /// too few acknowledgements fail them closed (`503`, even under `on_store_error = "fail_open"`:
    /// it is not an outage; a renewal counts as failed and the next one tries again). On a Redis
    /// Cluster the `WAIT` goes to the primary of the key's slot. Any other store with `replicas` >
    /// 0 is a config error. See [high
    /// availability](../operations/high-availability.md#redis-replicas-and-wait)
    STORE_REPLICAS "replicas" Integer Toml("0"), Restart;
    /// Redis with `replicas` > 0: how long `WAIT` waits; more than zero and less than `timeout`
    STORE_REPLICA_TIMEOUT "replica_timeout" Duration Toml(r#""100ms""#), Restart;
    /// memory: most records kept (≥ 1). When full, expired records are swept; if none are, a new
    /// key is a store error (`503` `store-unavailable`, or a forward without idempotency under
    /// `fail_open`)
    STORE_MAX_RECORDS "max_records" Integer Toml("100000"), Restart;
    /// how often the background sweeper runs: SQLite and memory delete expired records, PostgreSQL
    /// retires the previous generation if one is due (Redis expires records by key TTL)
    STORE_SWEEP_INTERVAL "sweep_interval" Duration Toml(r#""60s""#), Restart;
    /// SQLite, memory: most records one sweep statement deletes (≥ 1); a pass repeats until a batch
    /// comes back short
    STORE_SWEEP_BATCH "sweep_batch" Integer Toml("1000"), Restart;
    /// PostgreSQL: how long new keys go to one generation of records before the sweeper retires the
    /// previous one whole (records still live in it move first, at most 10,000; the partition is
    /// swapped for an empty one and dropped). Records take up to twice this room; shorter than the
    /// longest retention, more records are still live at a rotation, and past 10,000 the rotation
    /// waits (a warning). Unset, a reload that changes the longest retention takes effect at
    /// restart. See [retention by generations](../design/retention.md)
    STORE_GENERATION "generation" Duration Derived("the longest route `retention`"), Restart;
    /// PostgreSQL, Redis, SQLite: once this instance has replayed a completed record, it answers
    /// further replays of that key from memory for up to this long, never longer than the
    /// route's `retention` (another body's `422` asks the store, which knows the record's expiry). `"0s"` turns the cache off. See [the replay
    /// cache](../design/stores.md#the-replay-cache)
    STORE_REPLAY_CACHE_TTL "replay_cache_ttl" Duration Toml(r#""5s""#), Restart;
    /// PostgreSQL, Redis, SQLite: most bytes (bodies, headers, keys) the replay cache holds;
    /// least-used records leave first. `"0B"` turns the cache off
    STORE_REPLAY_CACHE_SIZE "replay_cache_size" Size Toml(r#""64MiB""#), Restart;
    /// seal every recorded response (status, headers, body) with AES-256-GCM before the store sees
    /// it: each entry `"<id>:<base64 of 32 bytes>"` (`openssl rand -base64 32`), normally from the
    /// environment (`"k2:${IDEMGATE_RECORD_KEY}"`). The first seals new records; every one opens
    /// the records sealed under its id, so a [rotation](../operations/protecting-stored-responses.md#rotating-keys)
    /// adds the new key, then puts it first, and keeps the old one until its records have expired.
    /// A record whose key id is not listed, or that was not sealed for its key, is answered `500`
    /// (never forwarded). Records stored before keys were set stay readable. Never printed. See
    /// [protecting stored responses](../operations/protecting-stored-responses.md)
    STORE_ENCRYPTION_KEYS "encryption_keys" List Unset("unset: responses are stored as they are"), Restart;
    /// with `encryption_keys`: compress each recorded response (with `compression`) before sealing
    /// it, when it has at least 128 bytes and compressing saves some. `false` keeps each sealed
    /// record's size independent of how compressible its content is. Without `encryption_keys` it
    /// changes nothing (a response stored as it is is never compressed), and a file that writes it
    /// gets a warning. See [protecting stored
    /// responses](../operations/protecting-stored-responses.md#cost)
    STORE_COMPRESS "compress" Bool Toml("true"), Restart;
    /// with `encryption_keys` and `compress`: the codec, `"lz4"` (about a third of zstd's CPU) or
    /// `"zstd"` (level 3: smaller records). Every instance opens records of either codec, whichever
    /// it seals with, but an idemgate older than this setting opens zstd only: on a fleet, keep
    /// `"zstd"` until every instance runs a version that has it. Set with `compress = false`, it is
    /// a config error; without `encryption_keys`, a warning. See [choosing a
    /// codec](../operations/protecting-stored-responses.md#choosing-a-codec)
    STORE_COMPRESSION "compression" Choice Toml(r#""lz4""#), Restart;
    /// with `encryption_keys`: replay records stored before keys were set, as they are. Set `false`
    /// once those have expired (a `retention` after keys were set): a record that is not sealed is
    /// then answered `500 record-unauthentic`, so a response written into the store by someone who
    /// can write to it but has no key is never replayed. `false` without `encryption_keys` is a
    /// config error. See [protecting stored
    /// responses](../operations/protecting-stored-responses.md#threat-model)
    STORE_ACCEPT_PLAIN_RECORDS "accept_plain_records" Bool Toml("true"), Restart;
}}

super::rows! { FRONT = Front {
    /// the front: one Redis server, `redis://` or `rediss://` (TLS), not a cluster. `[store] url`
    /// must be `postgres://` (or `postgresql://`); `[store] prefix` names its keys. How long a
    /// fence lasts is not a setting: the longest `lease` of any route plus 60 s
    FRONT_URL "url" Text Required("required in `[store.front]`"), Restart;
    /// longest any front operation, including getting a connection, may take (> 0); past it, or on
    /// an error, the front counts as down on this instance and requests go to PostgreSQL alone
    /// until Redis answers and the outbox has drained
    FRONT_TIMEOUT "timeout" Duration Toml(r#""250ms""#), Restart;
    /// how long a claimed attempt runs before the front marks it in flight (0 to `60s`; `"0s"`: as
    /// soon as the marker task gets to it). The marker task wakes every half `mark_after` (at least
    /// every millisecond), so a marker lands between 1 and 1.5 times `mark_after` after the claim.
    /// Attempts that settle sooner are never marked, which saves two Redis writes each; their
    /// duplicates meanwhile are answered by PostgreSQL (`409` all the same)
    FRONT_MARK_AFTER "mark_after" Duration Toml(r#""10ms""#), Restart;
}}
