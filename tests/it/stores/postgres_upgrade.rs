//! A PostgreSQL database of the release before the status inquiry (schema
//! 5) is upgraded in place by `migrate`: the state's CHECK is replaced, the
//! new columns come with their defaults, and the open-records index is
//! built (migration 0008, which an operator may build ahead), and the
//! table becomes the first generation's partition (migration 0010), with
//! every record kept and claims answered as before.

use sqlx::Connection;
use sqlx::migrate::Migrator;

use idemgate::store::postgres::MIGRATOR;
use idemgate::store::{RecordKey, RecordState};

use crate::support::{Backend, TestStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_5_database_is_upgraded_with_its_records() {
    let store = TestStore::new(Backend::Postgres).await;
    let mut conn = sqlx::PgConnection::connect(&store.url).await.unwrap();
    let before: Vec<_> = MIGRATOR
        .iter()
        .filter(|m| m.version <= 5)
        .cloned()
        .collect();
    assert_eq!(before.len(), 5);
    Migrator::with_migrations(before)
        .run(&mut conn)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO idemgate_records (route, scope, key, fingerprint, state, token,
                                       expires_at, held_reason)
         VALUES ('api', '', 'old-held', '\\x00', 'held', 7, now() + interval '1 day',
                 'upstream_timeout')",
    )
    .execute(&mut conn)
    .await
    .unwrap();

    // Opening the store migrates (as `[store] migrate = true` does).
    let backend = idemgate::store::open(&store.store_config()).await.unwrap();
    backend.ping().await.unwrap();
    let key = RecordKey {
        route: "api".into(),
        scope: Vec::new(),
        key: "old-held".into(),
    };
    let info = backend
        .inspect(&key)
        .await
        .unwrap()
        .expect("the record was kept");
    assert_eq!(info.state, RecordState::Held);
    assert_eq!(info.held_reason, Some("upstream_timeout"));
    let valid: (bool, bool) = sqlx::query_as(
        "SELECT (SELECT bool_and(convalidated) FROM pg_constraint
                  WHERE conname = 'idemgate_records_state_check'),
                (SELECT indisvalid FROM pg_index
                  WHERE indexrelid = 'idemgate_records_open'::regclass)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        valid,
        (true, true),
        "the CHECK is validated and the index valid"
    );
    let in_first: i64 = sqlx::query_scalar("SELECT count(*) FROM idemgate_records_0")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(in_first, 1, "the table did not become slot 0's partition");
}
