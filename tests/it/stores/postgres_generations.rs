//! PostgreSQL's retention by generations (crates/store/src/postgres/generations.rs):
//! what a rotation keeps, drops and refuses, that it gives way to the
//! transactions it must wait for while holding nothing they need, that an
//! earlier release's sweep spares live records, and a storm of claims on
//! the same keys
//! while rotations run back to back, in which every key is executed once
//! and never has two records. The guarantees across a boundary on every
//! store are in the conformance suite
//! (`records_hold_across_generation_boundaries`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use idemgate::config::{StoreConfig, UnknownOutcome};
use idemgate::store::postgres::{MOST_MOVED, PgStore, Rotation};
use idemgate::store::{Backend as Store, Cas, Claim, ClaimRequest, RecordKey};
use sqlx::Connection;

use super::conformance::response;
use crate::support::{Backend, TestStore};

/// A migrated database, a store on it rotating after `generation`, and a
/// connection of the test's own.
async fn open(generation: Duration) -> (TestStore, PgStore, sqlx::PgConnection) {
    let db = TestStore::new(Backend::Postgres).await;
    let config = StoreConfig {
        generation,
        timeout: Duration::from_secs(5),
        ..db.store_config()
    };
    let store = PgStore::connect(&config).await.unwrap();
    store.migrate().await.unwrap();
    let conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    (db, store, conn)
}

/// Records in `slot` straight from SQL: `count` keys named `{prefix}{i}`,
/// completed, expiring `expires` from now (negative: past).
async fn insert(conn: &mut sqlx::PgConnection, slot: i16, prefix: &str, count: i64, expires: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token, expires_at, slot)
         SELECT 'r', '', '{prefix}' || i, '\\x00', 'completed', nextval('idemgate_token_seq'),
                now() + interval '{expires}', {slot}
           FROM generate_series(1, {count}) AS i"
    )))
    .execute(conn)
    .await
    .unwrap();
}

/// Rows per slot, and the slot new keys go to.
async fn layout(conn: &mut sqlx::PgConnection) -> ([i64; 2], i16) {
    let rows: Vec<(i16, i64)> =
        sqlx::query_as("SELECT slot, count(*) FROM idemgate_records GROUP BY slot")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    let mut counts = [0; 2];
    for (slot, n) in rows {
        counts[usize::try_from(slot).unwrap()] = n;
    }
    let current: i16 = sqlx::query_scalar("SELECT slot FROM idemgate_generation")
        .fetch_one(conn)
        .await
        .unwrap();
    (counts, current)
}

#[tokio::test]
async fn a_rotation_keeps_live_records_and_empties_the_old_generation() {
    let (_db, store, mut conn) = open(Duration::ZERO).await;
    insert(&mut conn, 0, "live", 30, "1 hour").await;
    insert(&mut conn, 0, "gone", 70, "-1 hour").await;
    // The first rotation retires the empty slot 1: slot 0 becomes the old one.
    assert!(matches!(
        store.rotate(Duration::ZERO).await.unwrap(),
        Rotation::Rotated { moved: 0, .. }
    ));
    assert_eq!(layout(&mut conn).await, ([100, 0], 1));
    // The second retires slot 0: its live records move, the rest go.
    let done = store.rotate(Duration::ZERO).await.unwrap();
    assert!(
        matches!(done, Rotation::Rotated { moved: 30, .. }),
        "{done:?}"
    );
    assert_eq!(layout(&mut conn).await, ([0, 30], 0));
    // An empty partition took slot 0's place, and the old one is gone.
    let (bytes, retired): (i64, Option<String>) = sqlx::query_as(
        "SELECT pg_relation_size('idemgate_records_0'),
                to_regclass('idemgate_records_retired')::text",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!((bytes, retired), (0, None));
    let live: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idemgate_records WHERE key LIKE 'live%'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(live, 30);
}

#[tokio::test]
async fn a_rotation_waits_for_its_generation_and_for_too_many_live_records() {
    let (_db, store, mut conn) = open(Duration::from_secs(3600)).await;
    assert_eq!(
        store.rotate(Duration::from_secs(3600)).await.unwrap(),
        Rotation::NotDue
    );
    // More live records in the old generation than one rotation moves:
    // nothing is done (the generation is shorter than the retention).
    insert(&mut conn, 1, "live", MOST_MOVED + 1, "1 hour").await;
    assert_eq!(
        store.rotate(Duration::ZERO).await.unwrap(),
        Rotation::TooManyLive
    );
    assert_eq!(layout(&mut conn).await, ([0, MOST_MOVED + 1], 0));
}

#[tokio::test]
async fn a_rotation_gives_way_to_claims_and_writes_in_progress() {
    let (_db, store, mut conn) = open(Duration::ZERO).await;
    // A claim in an open transaction holds the generation's table.
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT * FROM idemgate_claim('r', '', 'k', '\\x01', 30000, 3600000, true, 1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(store.rotate(Duration::ZERO).await.unwrap(), Rotation::Busy);
    tx.commit().await.unwrap();
    assert!(matches!(
        store.rotate(Duration::ZERO).await.unwrap(),
        Rotation::Rotated { .. }
    ));
    // A write in progress on the old generation's record holds its partition.
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("UPDATE idemgate_records SET updated_at = now() WHERE key = 'k'")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(store.rotate(Duration::ZERO).await.unwrap(), Rotation::Busy);
    tx.commit().await.unwrap();
    assert!(matches!(
        store.rotate(Duration::ZERO).await.unwrap(),
        Rotation::Rotated { moved: 1, .. }
    ));
    assert_eq!(layout(&mut conn).await, ([0, 1], 0));
}

/// Keys of one wave of the storm.
const WAVE: usize = 50;
/// Most waves in the first round: it goes on until rotations ran during it.
const MOST_WAVES: usize = 40;
/// Claims racing for each key, in each round.
const CONTENDERS: usize = 4;

fn storm_key(i: usize) -> RecordKey {
    RecordKey {
        route: "r".into(),
        scope: Vec::new(),
        key: format!("k{i}"),
    }
}

/// One contender: claim until the key is settled; the winner completes it.
/// Returns whether it won.
async fn contend(s: Arc<dyn Store>, i: usize, fp: u8, retention: Duration) -> bool {
    let k = storm_key(i);
    loop {
        let claimed = s
            .claim(&ClaimRequest {
                key: &k,
                fingerprint: &[fp; 32],
                attempt: idemgate::store::new_attempt_id(),
                lease: Duration::from_secs(30),
                retention,
                on_unknown_outcome: UnknownOutcome::Hold,
                inquire_after: Duration::ZERO,
            })
            .await
            .unwrap();
        match claimed {
            Claim::Claimed { token, .. } => {
                let body = format!("{i}-{fp}");
                let done = s.complete(&k, token, &response(body), retention).await;
                assert_eq!(done.unwrap(), Cas::Applied);
                return true;
            }
            Claim::InFlight { .. } => tokio::time::sleep(Duration::from_millis(5)).await,
            Claim::Replay(r) => {
                assert_eq!(
                    r.body,
                    format!("{i}-{fp}").into_bytes(),
                    "k{i} replayed another body"
                );
                return false;
            }
            other => panic!("k{i}: {other:?}"),
        }
    }
}

/// Keys `keys` raced by [`CONTENDERS`] claims each with fingerprint
/// `fp`; the number of winners per key.
async fn round(
    s: &Arc<dyn Store>,
    keys: std::ops::Range<usize>,
    fp: u8,
    retention: Duration,
) -> Vec<usize> {
    let mut tasks = Vec::new();
    let start = keys.start;
    for i in keys.clone() {
        for _ in 0..CONTENDERS {
            tasks.push((i, tokio::spawn(contend(s.clone(), i, fp, retention))));
        }
    }
    let mut winners = vec![0; keys.len()];
    for (i, task) in tasks {
        winners[i - start] += usize::from(task.await.unwrap());
    }
    winners
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_claims_across_rotations_executes_each_key_once() {
    let db = TestStore::new(Backend::Postgres).await;
    let config = StoreConfig {
        generation: Duration::ZERO,
        pool_size: 8,
        batches_in_flight: 4,
        timeout: Duration::from_secs(10),
        ..db.store_config()
    };
    let s = db.open_with(&config).await;
    let rotator = PgStore::connect(&config).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let rotations = Arc::new(AtomicUsize::new(0));
    // The generation the rotator waits for, in ms.
    let generation = Arc::new(AtomicU64::new(0));
    // Whether claims are outstanding: only rotations wholly inside a wave count.
    let storming = Arc::new(AtomicBool::new(false));
    let rotating = tokio::spawn({
        let (stop, rotations, generation) = (stop.clone(), rotations.clone(), generation.clone());
        let storming = storming.clone();
        async move {
            while !stop.load(Ordering::Relaxed) {
                let wait = Duration::from_millis(generation.load(Ordering::Relaxed));
                let during = storming.load(Ordering::Relaxed);
                let done = rotator.rotate(wait).await.unwrap();
                if matches!(done, Rotation::Rotated { .. })
                    && during
                    && storming.load(Ordering::Relaxed)
                {
                    rotations.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    // Round 1: new keys, rotations back to back. Round 2, once they
    // expired (made so in SQL, not waited for, so that no key expires
    // during a round): the same keys with another request, each free again
    // exactly once, with a rotation every 0.5 s at most, so that most keys
    // are found expired in the previous generation (and replaced in the
    // current one) rather than dropped by a rotation first.
    let hour = Duration::from_secs(3600);
    // Waves of new keys until three rotations ran while claims were
    // outstanding (on a loaded machine a rotation may give way a few times).
    let mut first = Vec::new();
    while rotations.load(Ordering::Relaxed) < 3 && first.len() < WAVE * MOST_WAVES {
        let wave = first.len()..first.len() + WAVE;
        storming.store(true, Ordering::Relaxed);
        first.extend(round(&s, wave, 1, hour).await);
        storming.store(false, Ordering::Relaxed);
    }
    generation.store(500, Ordering::Relaxed);
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("UPDATE idemgate_records SET expires_at = now() - interval '1 second'")
        .execute(&mut conn)
        .await
        .unwrap();
    let during = rotations.load(Ordering::Relaxed);
    let second = round(&s, 0..first.len(), 2, hour).await;
    stop.store(true, Ordering::Relaxed);
    rotating.await.unwrap();
    assert!(
        during >= 3,
        "{during} rotations in the first round: this test proves nothing"
    );
    for (i, (a, b)) in first.iter().zip(&second).enumerate() {
        assert_eq!((*a, *b), (1, 1), "k{i} was executed {a} and then {b} times");
    }
    let doubled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM idemgate_records
                                GROUP BY route, scope, key HAVING count(*) > 1) d",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(doubled, 0, "keys with a record in both generations");
}

/// The sweep of releases before generations, word for word: rows by their
/// position (ctid), which on the partitioned table matches the row at the
/// same position in the other partition too.
const OLD_SWEEP: &str = "DELETE FROM idemgate_records
      WHERE ctid IN (SELECT ctid FROM idemgate_records
                      WHERE expires_at <= statement_timestamp()
                        AND NOT (state = 'in_flight' AND lease_until > statement_timestamp())
                      LIMIT $1 FOR UPDATE SKIP LOCKED)";

/// Live records in the current slot at the positions of expired ones in
/// the previous slot, swept by an instance of an earlier release (a
/// rolling upgrade): how many live records survive, how many expired do.
async fn old_sweep_keeps(conn: &mut sqlx::PgConnection, round: &str) -> (i64, i64) {
    let current: i16 = sqlx::query_scalar("SELECT slot FROM idemgate_generation")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    insert(
        &mut *conn,
        1 - current,
        &format!("{round}-gone"),
        50,
        "-1 hour",
    )
    .await;
    insert(&mut *conn, current, &format!("{round}-live"), 50, "1 hour").await;
    sqlx::query(OLD_SWEEP)
        .bind(1000_i64)
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE key LIKE '{round}-live%'),
                count(*) FILTER (WHERE key LIKE '{round}-gone%')
           FROM idemgate_records"
    )))
    .fetch_one(conn)
    .await
    .unwrap()
}

#[tokio::test]
async fn an_older_instances_sweep_deletes_only_expired_records() {
    let (_db, store, mut conn) = open(Duration::ZERO).await;
    // Two fresh partitions, so the two rounds' rows share positions.
    for _ in 0..2 {
        assert!(matches!(
            store.rotate(Duration::ZERO).await.unwrap(),
            Rotation::Rotated { .. }
        ));
    }
    // The negative control: without the migration's guard, the old sweep
    // deletes the live records at its expired ones' positions.
    sqlx::query("ALTER TABLE idemgate_records DISABLE TRIGGER idemgate_records_positional_delete")
        .execute(&mut conn)
        .await
        .unwrap();
    let (live, _) = old_sweep_keeps(&mut conn, "unguarded").await;
    assert!(
        live < 50,
        "the old sweep never hit the other partition ({live} kept), so this test proves nothing"
    );
    // Two fresh partitions again, for the same positions.
    sqlx::query("DELETE FROM idemgate_records WHERE key LIKE 'unguarded%'")
        .execute(&mut conn)
        .await
        .unwrap();
    for _ in 0..2 {
        assert!(matches!(
            store.rotate(Duration::ZERO).await.unwrap(),
            Rotation::Rotated { moved: 0, .. }
        ));
    }
    sqlx::query("ALTER TABLE idemgate_records ENABLE TRIGGER idemgate_records_positional_delete")
        .execute(&mut conn)
        .await
        .unwrap();
    assert_eq!(old_sweep_keeps(&mut conn, "guarded").await, (50, 0));
}

/// A backend of this database waiting for an exclusive lock on the
/// generations' tables (a rotation at its `LOCK TABLE`), and the records'
/// relations it holds meanwhile; `None` if nobody waits so. One snapshot
/// of the lock table (`pg_locks` read once), so a rotation that gives up
/// between two reads cannot look as if it held nothing.
async fn waiting_rotation(conn: &mut sqlx::PgConnection) -> Option<(i32, Vec<String>)> {
    sqlx::query_as(
        "WITH l AS MATERIALIZED (SELECT pid, locktype, relation, mode, granted, database
                                   FROM pg_locks)
         SELECT w.pid,
                array(SELECT h.relation::regclass::text FROM l h
                       WHERE h.pid = w.pid AND h.granted AND h.locktype = 'relation'
                         AND h.relation::regclass::text LIKE 'idemgate_records%'
                       ORDER BY 1)
           FROM l w
          WHERE w.locktype = 'relation' AND NOT w.granted AND w.mode = 'AccessExclusiveLock'
            AND w.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          LIMIT 1",
    )
    .fetch_optional(conn)
    .await
    .unwrap()
}

/// Watch for [`waiting_rotation`] for at most `limit`.
async fn watch(conn: &mut sqlx::PgConnection, limit: Duration) -> Option<Vec<String>> {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if let Some((_, held)) = waiting_rotation(conn).await {
            return Some(held);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// A rotation waiting behind a batch that read the generation (as every
/// claim and completion does first) holds nothing of the records, so the
/// batch's writes go on and it ends: the two never deadlock, and the
/// rotation has its locks once the batch commits. (Locking a partition
/// first made every completion on it wait for the rotation's lock
/// timeout, and the rotation give way, under steady traffic.)
#[tokio::test]
async fn a_waiting_rotation_holds_nothing_a_batch_writes() {
    let (db, store, mut batch) = open(Duration::ZERO).await;
    let mut watcher = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("SELECT * FROM idemgate_claim('r', '', 'k', '\\x01', 30000, 3600000, true, 1)")
        .execute(&mut batch)
        .await
        .unwrap();
    let begin_batch = async |conn: &mut sqlx::PgConnection| {
        sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
        sqlx::query("SELECT slot FROM idemgate_generation WHERE one")
            .execute(&mut *conn)
            .await
            .unwrap();
    };
    // The negative control: a rotation that locks a partition first is
    // caught holding it while it waits.
    begin_batch(&mut batch).await;
    let wrong_order = async {
        sqlx::raw_sql(
            "SET lock_timeout = '3s'; BEGIN;
             LOCK TABLE idemgate_records_0 IN ACCESS EXCLUSIVE MODE;
             LOCK TABLE idemgate_generation IN ACCESS EXCLUSIVE MODE",
        )
        .execute(&mut other)
        .await
    };
    let (refused, held) = tokio::join!(wrong_order, watch(&mut watcher, Duration::from_secs(3)));
    assert!(refused.is_err(), "the wrong order got its locks");
    assert_eq!(
        held.expect("the wrong order was not seen waiting"),
        vec!["idemgate_records_0".to_string()],
        "the watcher misses a partition held while waiting, so this test proves nothing"
    );
    sqlx::query("ROLLBACK").execute(&mut batch).await.unwrap();
    // The rotation: it waits for a quarter of `[store] timeout` at most
    // (250 ms), so it is watched for again until it is seen waiting.
    for round in 0.. {
        assert!(round < 20, "the rotation was never seen waiting");
        begin_batch(&mut batch).await;
        let seen = async {
            let held = watch(&mut watcher, Duration::from_millis(250)).await;
            if held.is_some() {
                // The batch's write, while the rotation waits, goes on.
                sqlx::query("UPDATE idemgate_records SET updated_at = now() WHERE key = 'k'")
                    .execute(&mut batch)
                    .await
                    .unwrap();
            }
            sqlx::query("COMMIT").execute(&mut batch).await.unwrap();
            held
        };
        let (rotated, held) = tokio::join!(store.rotate(Duration::ZERO), seen);
        let Some(held) = held else { continue };
        assert_eq!(
            held,
            Vec::<String>::new(),
            "the waiting rotation holds records"
        );
        assert!(
            matches!(rotated.unwrap(), Rotation::Rotated { .. } | Rotation::Busy),
            "the rotation failed"
        );
        break;
    }
}
