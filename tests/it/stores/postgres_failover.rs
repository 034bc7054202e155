//! PostgreSQL failover: a primary and a streaming standby (private
//! clusters), one gateway whose store URL names both hosts, the standby
//! first. The gateway writes to the primary only; the primary is killed
//! (SIGKILL) and the standby promoted; the gateway finds it by itself.
//!
//! What survives depends on the standby. Before the kill the standby is
//! cut off (its `primary_conninfo` emptied, so it stops streaming) while
//! more keys are sent, so the primary has commits the standby never
//! received:
//! - synchronous (`synchronous_standby_names`): the primary cannot
//!   acknowledge those commits, so the gateway answers `503` for them and
//!   every key it acknowledged replays after the failover, never executed
//!   twice;
//! - asynchronous (the negative control): the primary acknowledged them,
//!   the promoted standby never had them, and a retry executes them again.
//!   The same check must flag exactly those keys.

use std::time::Duration;

use http::StatusCode;

use crate::support::servers::PgCluster;
use crate::support::upstream::DELAY_HEADER;
use crate::support::{
    Gateway, HttpClient, Set, TestConfig, Upstream, client, eventually, not_replayed, post, sample,
    send,
};

const BODY: &str = r#"{"amount":1}"#;

/// What a failover kept and lost.
#[derive(Debug)]
struct Failover {
    /// Keys answered `201` (not a replay) before the kill.
    acknowledged: Vec<String>,
    /// Acknowledged keys that did not replay afterwards, or reached the
    /// upstream twice.
    lost: Vec<String>,
    /// Keys sent while the standby was cut off, and how many of them the
    /// gateway acknowledged.
    cut_off: (usize, usize),
    /// From the promotion to the first new key served.
    recovered_in: Duration,
}

async fn new_key(http: &HttpClient, url: &str, key: &str) -> StatusCode {
    post(http, url, key, BODY).await.status
}

/// Stop `standby` streaming from `primary`, and wait until the primary
/// sees it gone.
async fn cut_off(primary: &PgCluster, standby: &PgCluster) {
    standby.sql("ALTER SYSTEM SET primary_conninfo = ''").await;
    standby.sql("SELECT pg_reload_conf()").await;
    let gone = eventually(Duration::from_secs(30), || async {
        let streaming = primary
            .sql("SELECT count(*) FROM pg_stat_replication")
            .await;
        (streaming.trim() == "0").then_some(())
    })
    .await;
    assert!(gone.is_some(), "the standby still streams");
}

/// A gateway whose store URL lists `first`'s host, then `second`'s.
async fn gateway_on(first: &PgCluster, second: &PgCluster, upstream: &Upstream) -> Gateway {
    let store = format!(
        "postgres://postgres@{},{}/postgres?target_session_attrs=read-write",
        first.host(),
        second.host()
    );
    Gateway::start(&TestConfig::new(&store, &upstream.url())).await
}

/// Send new keys (`after-N`) until one is served, for up to 30 s: which
/// attempt was. `503` is the only other answer allowed meanwhile.
async fn served_again(http: &HttpClient, url: &str) -> Option<u32> {
    let mut attempt = 0;
    eventually(Duration::from_secs(30), || {
        attempt += 1;
        let (http, url) = (http.clone(), url.to_string());
        async move {
            match new_key(&http, &url, &format!("after-{attempt}")).await {
                StatusCode::CREATED => Some(attempt),
                StatusCode::SERVICE_UNAVAILABLE => None,
                other => panic!("{other} while the gateway finds the new primary"),
            }
        }
    })
    .await
}

/// The scenario above; `synchronous` chooses the standby.
async fn fail_over(synchronous: bool) -> Failover {
    let primary = PgCluster::new().await;
    let standby = PgCluster::standby_of(&primary, synchronous).await;
    let upstream = Upstream::start().await;
    // The standby first: the gateway must pass it over.
    let gateway = gateway_on(&standby, &primary, &upstream).await;
    let (http, url) = (client(), gateway.url("/v1/payments"));

    let mut acknowledged = Vec::new();
    for i in 0..20 {
        let key = format!("before-{i}");
        assert_eq!(new_key(&http, &url, &key).await, StatusCode::CREATED);
        acknowledged.push(key);
    }

    // The standby stops receiving; the primary takes (or, synchronous,
    // waits on) these commits. (Not SIGSTOP: WAL already in the frozen
    // standby's socket buffer would still reach it after SIGCONT.)
    cut_off(&primary, &standby).await;
    let sent = 5;
    let answers = futures_util::future::join_all((0..sent).map(|i| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let key = format!("cut-off-{i}");
            (new_key(&http, &url, &key).await, key)
        }
    }))
    .await;
    let mut kept_while_cut_off = 0;
    for (status, key) in answers {
        match status {
            StatusCode::CREATED => {
                kept_while_cut_off += 1;
                acknowledged.push(key);
            }
            StatusCode::SERVICE_UNAVAILABLE => {}
            other => panic!("{key}: {other} while the standby was cut off"),
        }
    }

    primary.signal("-KILL");
    standby.promote().await;
    let promoted = std::time::Instant::now();
    let back = served_again(&http, &url).await;
    assert!(
        back.is_some(),
        "no new key served within 30 s of the promotion"
    );
    let recovered_in = promoted.elapsed();

    let lost = not_replayed(&http, &url, &upstream, &acknowledged, BODY).await;
    assert!(
        !standby.log().contains("read-only transaction"),
        "the gateway wrote to the standby:\n{}",
        standby.log()
    );
    gateway.shutdown().await;
    Failover {
        acknowledged,
        lost,
        cut_off: (sent, kept_while_cut_off),
        recovered_in,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_standby_keeps_every_acknowledged_key() {
    let failover = fail_over(true).await;
    eprintln!(
        "synchronous standby: new keys served {:?} after the promotion; {failover:?}",
        failover.recovered_in
    );
    assert_eq!(
        failover.cut_off.1, 0,
        "a commit the standby never had was acknowledged: {failover:?}"
    );
    assert_eq!(failover.acknowledged.len(), 20);
    assert!(failover.lost.is_empty(), "lost at failover: {failover:?}");
}

/// The negative control: the same check flags what an asynchronous
/// standby loses, the keys acknowledged while it was cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_standby_loses_what_it_never_received() {
    let failover = fail_over(false).await;
    eprintln!(
        "asynchronous standby: new keys served {:?} after the promotion; {failover:?}",
        failover.recovered_in
    );
    assert_eq!(failover.cut_off, (5, 5), "{failover:?}");
    let expected: Vec<String> = (0..5).map(|i| format!("cut-off-{i}")).collect();
    let mut lost = failover.lost.clone();
    lost.sort();
    assert_eq!(lost, expected, "{failover:?}");
}

/// A switchover: the primary turns read-only (as a demoted primary is)
/// and the standby is promoted, with nothing killed. The gateway's pooled
/// connections to the old primary meet `read_only_sql_transaction`; it
/// drops them and connects to the new primary, without a restart, and
/// what it recorded before replays there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_primary_sends_the_gateway_to_the_new_one() {
    let primary = PgCluster::new().await;
    let standby = PgCluster::standby_of(&primary, true).await;
    let upstream = Upstream::start().await;
    let gateway = gateway_on(&primary, &standby, &upstream).await;
    let (http, url) = (client(), gateway.url("/v1/payments"));
    for i in 0..10 {
        assert_eq!(
            new_key(&http, &url, &format!("before-{i}")).await,
            StatusCode::CREATED
        );
    }

    primary
        .sql("ALTER SYSTEM SET default_transaction_read_only = on")
        .await;
    primary.sql("SELECT pg_reload_conf()").await;
    standby.promote().await;
    let back = served_again(&http, &url).await;
    let took = back.expect("no new key served on the new primary within 30 s");
    eprintln!("served again at attempt {took}");
    let on_new = standby
        .sql("SELECT count(*) FROM idemgate_records WHERE state = 'completed'")
        .await;
    let on_old = primary
        .sql("SELECT count(*) FROM idemgate_records WHERE state = 'completed'")
        .await;
    assert_eq!(on_old.trim(), "10", "a write reached the read-only primary");
    assert_eq!(
        on_new.trim(),
        "11",
        "the new key is recorded on the new primary"
    );
    for i in 0..10 {
        let key = format!("before-{i}");
        let again = post(&http, &url, &key, BODY).await;
        assert!(again.is_replay(), "{key}: {again:?}");
        assert_eq!(upstream.count(&key), 1);
    }
    gateway.shutdown().await;
}

/// After a switchover that keeps the old primary's sessions open, a
/// waiting duplicate (`concurrent = "wait"`) is woken by the new primary's
/// announcement when the first attempt settles: the wake-up listener
/// follows the store's connections to the new host. Left on the old one,
/// it hears nothing, and every waiter is woken by its poll instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_hear_the_new_primary_after_a_switchover() {
    let primary = PgCluster::new().await;
    let standby = PgCluster::standby_of(&primary, true).await;
    let upstream = Upstream::start().await;
    let store = format!(
        "postgres://postgres@{},{}/postgres?target_session_attrs=read-write",
        primary.host(),
        standby.host()
    );
    let config = TestConfig::new(&store, &upstream.url()).route(|r| {
        r.set("concurrent", "wait").set("wait_timeout", "5s");
    });
    let gateway = Gateway::start(&config).await;
    let (http, url) = (client(), gateway.url("/v1/payments"));
    assert_eq!(new_key(&http, &url, "before").await, StatusCode::CREATED);

    primary
        .sql("ALTER SYSTEM SET default_transaction_read_only = on")
        .await;
    primary.sql("SELECT pg_reload_conf()").await;
    standby.promote().await;
    assert!(
        served_again(&http, &url).await.is_some(),
        "no new key served on the new primary within 30 s"
    );

    // The wake-up listener moves to the new primary. (Its reconnection
    // wakes every waiter once; the rounds below start after it.)
    let listening = eventually(Duration::from_secs(30), || async {
        let listeners = standby
            .sql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'")
            .await;
        (listeners.trim() == "1").then_some(())
    })
    .await;
    assert!(
        listening.is_some(),
        "the wake-up listener did not move to the new primary within 30 s"
    );

    // A first attempt held by the upstream, and its duplicate waiting: it
    // is woken by the announcement when the first attempt settles.
    let mut round = 0;
    let woken = eventually(Duration::from_secs(10), || {
        round += 1;
        let (http, url, gateway, upstream) = (http.clone(), url.clone(), &gateway, &upstream);
        async move {
            let key = format!("waited-{round}");
            let first = {
                let (http, url, key) = (http.clone(), url.clone(), key.clone());
                tokio::spawn(async move {
                    let headers = [("idempotency-key", key.as_str()), (DELAY_HEADER, "500")];
                    send(&http, "POST", &url, &headers, BODY).await
                })
            };
            eventually(Duration::from_secs(10), || async {
                (upstream.count(&key) == 1).then_some(())
            })
            .await?;
            let store_wakeups = r#"idemgate_wait_wakeups_total{cause="store"}"#;
            let before = sample(&gateway.metrics().await, store_wakeups);
            let duplicate = post(&http, &url, &key, BODY).await;
            let first = first.await.unwrap();
            assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
            assert!(duplicate.is_replay(), "{duplicate:?}");
            (sample(&gateway.metrics().await, store_wakeups) > before).then_some(())
        }
    })
    .await;
    assert!(
        woken.is_some(),
        "no waiter was woken by an announcement from the new primary"
    );
    gateway.shutdown().await;
}
