//! The SQLite store as a user runs it (docs/src/stores/sqlite.md): the real binary
//! on a file, killed and restarted, several processes sharing the file, the
//! schema applied by `migrate` and by processes starting together, the room
//! of swept records given back, erasure's plan through the primary key. (The
//! conformance suite and the guarantees' tests run on SQLite through
//! `per_backend!`, like every other store.)

use std::time::Duration;

use http::StatusCode;
use sqlx::Connection;

use crate::support::process::{GatewayProcess, run_command};
use crate::support::{Backend, Set, TestConfig, TestStore, Upstream, client, post};

/// A gateway config on `store`'s SQLite file.
fn config(store: &TestStore, upstream: &Upstream) -> TestConfig {
    store.config(&upstream.url()).store(|s| {
        s.set("timeout", "5s");
    })
}

/// Erasure (`keys erase`) finds a scope's records on a route through the
/// primary key `(route, scope, key)`, never by reading the table, each
/// step from its cursor on (`key>?` bounds the index's range) in the
/// index's order: the plan SQLite gives its statement. The negative
/// controls: without the route, the scope is no prefix of any index and
/// the table is scanned; a cursor the index cannot use is no bound.
#[tokio::test]
async fn erasure_finds_a_scope_by_index() {
    let store = TestStore::new(Backend::Sqlite).await;
    let _backend = store.open().await;
    let mut conn = sqlx::SqliteConnection::connect(&store.url).await.unwrap();
    let mut read = async |statement: &str| {
        let explain = format!("EXPLAIN QUERY PLAN {statement}");
        let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(explain))
            .fetch_all(&mut conn)
            .await
            .unwrap();
        rows.into_iter().map(|r| r.3).collect::<Vec<_>>().join("\n")
    };
    let erase = idemgate::store::sqlite::ERASE;
    let found = read(erase).await;
    let from_the_cursor =
        "USING INDEX sqlite_autoindex_idemgate_records_1 (route=? AND scope=? AND key>?)";
    assert!(
        found.contains(from_the_cursor)
            && !found.contains("SCAN idemgate_records")
            && !found.contains("TEMP B-TREE"),
        "erasure reads the table, or the scope's range from its start and not from the \
         cursor, or sorts what it read:\n{found}"
    );
    let scanned = read(&erase.replace("route = ?1 AND ", "")).await;
    assert!(
        scanned.contains("SCAN idemgate_records"),
        "this test cannot tell an index from a scan:\n{scanned}"
    );
    // The cursor as a filter only: the range is read from its start.
    let filtered = read(&erase.replace("key > ?6", "key || '' > ?6")).await;
    assert!(
        filtered.contains("(route=? AND scope=?)") && !filtered.contains(from_the_cursor),
        "this test cannot tell a cursor the index starts at from a filter:\n{filtered}"
    );
}

async fn schema_version(url: &str) -> i64 {
    let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
    sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_a_killed_gateway() {
    let store = TestStore::new(Backend::Sqlite).await;
    let upstream = Upstream::start().await;
    let config = config(&store, &upstream);
    let http = client();

    let mut first = GatewayProcess::start("sqlite-a", &config).await;
    // `serve` says what the store reaches.
    assert!(
        first.stderr().contains("this host only"),
        "{}",
        first.stderr()
    );
    let created = post(&http, &first.url("/v1/payments"), "k1", r#"{"n":1}"#).await;
    assert_eq!(created.status, StatusCode::CREATED);
    first.kill9();

    let second = GatewayProcess::start("sqlite-b", &config).await;
    let replay = post(&http, &second.url("/v1/payments"), "k1", r#"{"n":1}"#).await;
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(replay.body, created.body);
    let mismatch = post(&http, &second.url("/v1/payments"), "k1", r#"{"n":2}"#).await;
    assert_eq!(mismatch.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(upstream.count("k1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_sharing_the_file_forward_each_key_once() {
    let store = TestStore::new(Backend::Sqlite).await;
    let upstream = Upstream::start().await;
    // A slow upstream: every duplicate arrives while the first is in flight.
    let config = config(&store, &upstream);
    let a = GatewayProcess::start("sqlite-share-a", &config).await;
    let b = GatewayProcess::start("sqlite-share-b", &config).await;
    let http = client();
    let mut tasks = Vec::new();
    for key in ["s1", "s2", "s3", "s4"] {
        for i in 0..8 {
            let url = if i % 2 == 0 {
                a.url("/v1/slow/300")
            } else {
                b.url("/v1/slow/300")
            };
            let http = http.clone();
            tasks.push(tokio::spawn(async move {
                (key, post(&http, &url, key, "{}").await)
            }));
        }
    }
    for task in tasks {
        let (key, reply) = task.await.unwrap();
        assert!(
            reply.status == StatusCode::CREATED || reply.status == StatusCode::CONFLICT,
            "{key}: {reply:?}"
        );
    }
    for key in ["s1", "s2", "s3", "s4"] {
        assert_eq!(upstream.count(key), 1, "{key}");
        let from_a = post(&http, &a.url("/v1/slow/300"), key, "{}").await;
        let from_b = post(&http, &b.url("/v1/slow/300"), key, "{}").await;
        assert!(from_a.is_replay() && from_b.is_replay(), "{key}");
        assert_eq!(from_a.body, from_b.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_file_and_its_schema_once() {
    let store = TestStore::new(Backend::Sqlite).await;
    let config = TestConfig::new(&store.url, "http://127.0.0.1:9");
    let (status, stdout, stderr) = run_command("migrate", &config, Duration::from_secs(30)).await;
    assert!(status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("2 schema scripts applied"), "{stdout}");
    assert_eq!(schema_version(&store.url).await, 2);
    let (status, stdout, stderr) = run_command("migrate", &config, Duration::from_secs(30)).await;
    assert!(status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("0 schema scripts applied"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_creating_a_new_file_together_apply_the_schema_once() {
    for round in 0..3 {
        let store = TestStore::new(Backend::Sqlite).await;
        // Each waits for the others' locks up to `timeout`: ample, so a
        // loaded machine is not taken for a failure.
        let config = TestConfig::new(&store.url, "http://127.0.0.1:9").store(|s| {
            s.set("timeout", "10s");
        });
        let runs: Vec<_> = (0..4)
            .map(|i| {
                GatewayProcess::spawn_command(&format!("migrate-{round}-{i}"), "migrate", &config)
            })
            .collect();
        let mut applied = 0;
        for mut run in runs {
            let status = run.wait(Duration::from_secs(30)).await;
            let (stdout, stderr) = (run.stdout(), run.stderr());
            assert!(status.is_some_and(|s| s.success()), "{stdout}{stderr}");
            applied += u32::from(stdout.contains("2 schema scripts applied"));
        }
        assert_eq!(
            applied, 1,
            "round {round}: exactly one process applies the schema"
        );
        assert_eq!(schema_version(&store.url).await, 2);
    }
}

/// SIGTERM: the gateway drains, checkpoints the file and closes it, so
/// only the database file is left (no `-wal`/`-shm`), its last log line
/// says it stopped, and the record is there for the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_leaves_only_the_database_file() {
    let store = TestStore::new(Backend::Sqlite).await;
    let upstream = Upstream::start().await;
    let config = config(&store, &upstream);
    let file = std::path::PathBuf::from(store.url.trim_start_matches("sqlite://"));
    let http = client();

    let mut gateway = GatewayProcess::start("sqlite-stop", &config).await;
    let created = post(&http, &gateway.url("/v1/payments"), "k1", "{}").await;
    assert_eq!(created.status, StatusCode::CREATED);
    let wal = file.with_extension("db-wal");
    assert!(wal.exists(), "a serving gateway writes through the log");
    gateway.terminate();
    let status = gateway.wait(Duration::from_secs(30)).await;
    let stderr = gateway.stderr();
    assert!(status.is_some_and(|s| s.success()), "{status:?}\n{stderr}");
    for leftover in ["db-wal", "db-shm"] {
        let path = file.with_extension(leftover);
        assert!(!path.exists(), "{} left behind\n{stderr}", path.display());
    }
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("idemgate stopped"), "{stderr}");

    let again = GatewayProcess::start("sqlite-stop-2", &config).await;
    let replay = post(&http, &again.url("/v1/payments"), "k1", "{}").await;
    assert!(replay.is_replay(), "{replay:?}");
    assert_eq!(upstream.count("k1"), 1);
}

/// A file made by an older release (schema 1, before the status inquiry)
/// is upgraded in place: its table is rebuilt for the `inquiring` state and
/// its records are kept, a replay and a held key alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_file_is_upgraded_with_its_records() {
    let store = TestStore::new(Backend::Sqlite).await;
    {
        let options = store
            .url
            .parse::<sqlx::sqlite::SqliteConnectOptions>()
            .unwrap();
        let mut conn = sqlx::SqliteConnection::connect_with(&options.create_if_missing(true))
            .await
            .unwrap();
        let v1 = include_str!("../../../migrations/sqlite/0001_records.sql");
        sqlx::raw_sql(sqlx::AssertSqlSafe(v1))
            .execute(&mut conn)
            .await
            .unwrap();
        sqlx::raw_sql(
            "PRAGMA user_version = 1;
             INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token,
                 expires_at, created_at, updated_at, held_reason)
             VALUES ('api', x'', 'old-held', x'00', 'held', 7, 9999999999999999, 0, 0,
                     'upstream_timeout')",
        )
        .execute(&mut conn)
        .await
        .unwrap();
    }
    let opened = store.open().await;
    assert_eq!(schema_version(&store.url).await, 2);
    let key = idemgate::store::RecordKey {
        route: "api".into(),
        scope: Vec::new(),
        key: "old-held".into(),
    };
    let info = opened
        .inspect(&key)
        .await
        .unwrap()
        .expect("the record was kept");
    assert_eq!(info.state, idemgate::store::RecordState::Held);
    assert_eq!(info.held_reason, Some("upstream_timeout"));
    assert_eq!(info.token, 7);
}

/// The file's pages, and how many of them are free.
async fn pages(url: &str) -> (i64, i64) {
    let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
    let count = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let free = sqlx::query_scalar("PRAGMA freelist_count")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    (count, free)
}

/// A swept peak gives its room back: on a file the store created
/// (`auto_vacuum = INCREMENTAL`), 20,000 expired records of 2 KB are swept
/// and the file shrinks to its live data plus at most a quarter free. The
/// control: a file created without it (as older releases did, here an
/// empty file made by hand before the store opened it) keeps its peak size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swept_peak_gives_its_room_back() {
    for made_by_the_store in [true, false] {
        let store = TestStore::new(Backend::Sqlite).await;
        if !made_by_the_store {
            let options = store
                .url
                .parse::<sqlx::sqlite::SqliteConnectOptions>()
                .unwrap()
                .create_if_missing(true);
            let mut conn = sqlx::SqliteConnection::connect_with(&options)
                .await
                .unwrap();
            sqlx::raw_sql("PRAGMA auto_vacuum = NONE; CREATE TABLE made_by_hand (x INTEGER)")
                .execute(&mut conn)
                .await
                .unwrap();
        }
        let opened = store.open().await;
        {
            let mut conn = sqlx::SqliteConnection::connect(&store.url).await.unwrap();
            sqlx::raw_sql(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
                 INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token,
                     expires_at, created_at, updated_at, status, headers, body)
                 SELECT 'api', x'', 'peak-' || i, x'00', 'completed', i, 0, 0, 0, 201, x'',
                        randomblob(2000)
                   FROM n",
            )
            .execute(&mut conn)
            .await
            .unwrap();
        }
        let (peak, _) = pages(&store.url).await;
        let swept = idemgate::sweep_once(opened.as_ref(), 1000, None)
            .await
            .unwrap();
        assert_eq!(swept, 20_000);
        let (after, free) = pages(&store.url).await;
        println!(
            "made by the store: {made_by_the_store}; pages at the peak {peak}, after the sweep {after} ({free} free)"
        );
        assert!(peak > 10_000, "the peak was not written: {peak} pages");
        if made_by_the_store {
            assert!(
                after < peak / 5 && free <= after / 4 + 1,
                "the swept room was not given back: {peak} pages at the peak, {after} after ({free} free)"
            );
        } else {
            assert!(
                after >= peak * 9 / 10,
                "a file made without auto_vacuum shrank ({peak} → {after} pages): the control proves nothing"
            );
        }
    }
}
