//! Shared test support for every module of the `it` binary: fresh stores
//! ([`store`]), gateway configs edited as TOML tables ([`config`]), the one
//! test upstream ([`upstream`]), the gateway in process ([`gateway`]) or as a
//! child process ([`process`]), private PostgreSQL and Redis servers to stop
//! and restart ([`servers`]), the shared PostgreSQL and Redis servers, found
//! or started ([`provision`]), load for the store failover tests
//! ([`failover`]), an HTTP client ([`http`]), throwaway
//! certificates for the TLS tests ([`pki`], and [`client_pki`] for client
//! certificates), the turn-taking
//! between the chaos harness and everything else ([`serial`]), and
//! [`per_backend!`], which runs one test body on each store.

pub mod client_pki;
pub mod config;
pub mod failover;
pub mod gateway;
pub mod http;
pub mod otlp;
pub mod pki;
pub mod process;
pub mod provision;
pub mod serial;
pub mod servers;
pub mod store;
pub mod upstream;

use std::time::Duration;

pub use config::{Set, TestConfig};
pub use gateway::{Gateway, Setup};
pub use http::{HttpClient, Reply, client, post, send, spawn_slow_post};
pub use store::{Backend, TestDb, TestStore, record_state};
pub use upstream::Upstream;

/// Poll `f` every 50 ms until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Of `keys`, each acknowledged once with `body`, the ones a retry through
/// `url` does not replay, or that reached `upstream` more than once: what a
/// store failover lost. A retry answered `503` (the store still settling)
/// is sent again, as a client would, for up to 30 s.
pub async fn not_replayed(
    http: &HttpClient,
    url: &str,
    upstream: &Upstream,
    keys: &[String],
    body: &str,
) -> Vec<String> {
    let mut lost = Vec::new();
    for key in keys {
        let again = eventually(Duration::from_secs(30), || async {
            let reply = post(http, url, key, body).await;
            (reply.status != ::http::StatusCode::SERVICE_UNAVAILABLE).then_some(reply)
        })
        .await;
        let replayed = again
            .as_ref()
            .is_some_and(|r| r.status == ::http::StatusCode::CREATED && r.is_replay());
        let executed = upstream.count(key);
        if !replayed || executed != 1 {
            // Why, for a failed test's output.
            let answer = again.map_or("503 for 30 s".to_string(), |r| {
                let replay = if r.is_replay() { " (a replay)" } else { "" };
                format!("{}{replay} {}", r.status, r.text())
            });
            eprintln!(
                "{key} not replayed: retried, it was answered {answer}; executed {executed}×"
            );
            lost.push(key.clone());
        }
    }
    lost
}

/// The value of one sample (`name{labels}`) in a metrics text; 0 if absent.
pub fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| {
            v.split_whitespace().next().unwrap().parse().unwrap()
        })
}

/// Instantiate test bodies once per store: each named `async fn(Backend)`
/// in the calling module becomes a `#[tokio::test]` in a submodule per
/// backend (`postgres::name`, `redis::name`, `sqlite::name`, `memory::name`).
/// `redis_cluster` (the Redis store on a three-primary cluster) is only run
/// when named in `only [...]`.
///
/// ```ignore
/// per_backend!(replay_is_byte_exact, storm_reaches_the_upstream_once);
/// per_backend!(only [postgres, redis]: a_cached_record_never_outlives_its_retention);
/// ```
macro_rules! per_backend {
    (only [$($backend:ident),+ $(,)?]: $($test:ident),+ $(,)?) => {
        $crate::support::per_backend!(@each [$($backend)+] [$($test)+]);
    };
    (@each [$($backend:ident)+] $tests:tt) => {
        $( $crate::support::per_backend!(@module $backend $tests); )+
    };
    (@module $backend:ident [$($test:ident)+]) => {
        mod $backend {
            $(
                #[tokio::test]
                async fn $test() {
                    super::$test($crate::support::per_backend!(@variant $backend)).await;
                }
            )+
        }
    };
    (@variant postgres) => { $crate::support::Backend::Postgres };
    (@variant redis) => { $crate::support::Backend::Redis };
    (@variant redis_cluster) => { $crate::support::Backend::RedisCluster };
    (@variant sqlite) => { $crate::support::Backend::Sqlite };
    (@variant memory) => { $crate::support::Backend::Memory };
    (@variant front) => { $crate::support::Backend::Front };
    ($($test:ident),+ $(,)?) => {
        $crate::support::per_backend!(only [postgres, redis, sqlite, memory, front]: $($test),+);
    };
}
pub(crate) use per_backend;
