//! Upgrading the Redis store from the release that kept every route's
//! status questions in one sorted set (`{prefix}due`) to sets per route
//! (docs/src/guide/status-inquiry.md#stores): records written before the
//! upgrade stay entered in the old set, and a take moves the due entries
//! of its routes into their route's set and asks about them; another
//! route's live entry stays as it was, due, for the instances that ask
//! about it; an entry whose record is gone leaves.

use std::time::Duration;

use deadpool_redis::redis::{self, aio::MultiplexedConnection};

use super::conformance::key;
use super::inquiry::{due_now, routes_named, take_due, take_within};
use crate::support::{Backend, TestStore};

async fn score(conn: &mut MultiplexedConnection, set: &str, member: &str) -> Option<f64> {
    redis::cmd("ZSCORE")
        .arg(set)
        .arg(member)
        .query_async(conn)
        .await
        .unwrap()
}

/// Move `member` from `from` to `to`, keeping its score, as the earlier
/// release would have entered it.
async fn move_entry(conn: &mut MultiplexedConnection, from: &str, to: &str, member: &str) -> f64 {
    let due = score(conn, from, member)
        .await
        .expect("entered when inquiring");
    let _: () = redis::pipe()
        .atomic()
        .cmd("ZREM")
        .arg(from)
        .arg(member)
        .ignore()
        .cmd("ZADD")
        .arg(to)
        .arg(due)
        .arg(member)
        .ignore()
        .query_async(conn)
        .await
        .unwrap();
    due
}

#[tokio::test]
async fn a_take_moves_its_routes_questions_out_of_the_old_due_set() {
    let storage = TestStore::new(Backend::Redis).await;
    let store = storage.open().await;
    let s = store.as_ref();
    let prefix = storage.prefix().to_string();
    let client = redis::Client::open(storage.url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let old = format!("{prefix}due");
    let ours = format!("{prefix}rec:1:r::ours");
    let theirs = format!("{prefix}rec:5:other::theirs");
    let gone = format!("{prefix}rec:5:other::gone");
    due_now(s, "r", "ours").await;
    due_now(s, "other", "theirs").await;
    move_entry(&mut conn, &format!("{prefix}due:1:r"), &old, &ours).await;
    let their_due = move_entry(&mut conn, &format!("{prefix}due:5:other"), &old, &theirs).await;
    let _: () = redis::cmd("ZADD")
        .arg(&old)
        .arg(1)
        .arg(&gone)
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let taken = take_due(s, 1).await;
    assert_eq!(taken[0].key, key("ours"));
    assert_eq!(score(&mut conn, &old, &ours).await, None);
    let next = score(&mut conn, &format!("{prefix}due:1:r"), &ours).await;
    assert!(next.is_some_and(|at| at > their_due), "{next:?}");
    // Another route's live question: untouched, still due; a dead entry left.
    assert_eq!(score(&mut conn, &old, &theirs).await, Some(their_due));
    assert_eq!(score(&mut conn, &old, &gone).await, None);
    // An upgraded instance of that route takes it at once.
    let within = Duration::from_secs(1);
    let taken = take_within(s, &routes_named(&["other"]), 1, 10, within).await;
    assert_eq!(taken[0].key.key, "theirs");
    assert_eq!(score(&mut conn, &old, &theirs).await, None);
}
