//! The PostgreSQL and Redis servers every test shares, found or started
//! once per test binary, so `cargo test` passes on a machine where neither
//! runs as a service:
//!
//! 1. the server `IDEMGATE_TEST_PG` / `IDEMGATE_TEST_REDIS` names;
//! 2. else the one answering on the default port (5432, 6379 on 127.0.0.1);
//! 3. else a private one started for this binary on a free port (a
//!    throwaway PostgreSQL cluster, initdb run as the `postgres` user when
//!    the tests run as root; a `redis-server` without persistence), shared by
//!    every test, stopped and removed within a second of the binary's exit.
//!    A missing server binary fails with the package to install.
//!
//! The Redis Cluster backend's three nodes are only ever private (or named
//! by `IDEMGATE_TEST_REDIS_CLUSTER`), started when a test first needs them.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use super::servers::{PgCluster, PrivateRedis, RedisCluster};

const DEFAULT_PG: &str = "postgres://postgres@127.0.0.1:5432/postgres";
const DEFAULT_REDIS: &str = "redis://127.0.0.1:6379/";

/// The PostgreSQL server tests create their databases on (a role that may
/// `CREATE DATABASE`).
pub fn postgres_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        find("IDEMGATE_TEST_PG", DEFAULT_PG, 5432).unwrap_or_else(|| {
            // Started on a thread of its own: the caller may be inside a
            // runtime, where another cannot block.
            std::thread::spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let cluster = runtime.block_on(PgCluster::for_the_binary());
                let url = cluster.url();
                cluster.stop_at_exit();
                eprintln!("tests: no PostgreSQL on 127.0.0.1:5432; started one at {url}");
                url
            })
            .join()
            .expect("the private PostgreSQL cluster starts")
        })
    })
    .clone()
}

/// The Redis server tests use (each test under a key prefix of its own).
pub fn redis_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        find("IDEMGATE_TEST_REDIS", DEFAULT_REDIS, 6379).unwrap_or_else(|| {
            let redis = PrivateRedis::for_the_binary();
            let url = redis.url();
            redis.stop_at_exit();
            eprintln!("tests: no Redis on 127.0.0.1:6379; started one at {url}");
            url
        })
    })
    .clone()
}

/// The seed node and every node of the Redis Cluster tests share (each
/// test under a key prefix of its own): the nodes `IDEMGATE_TEST_REDIS_CLUSTER`
/// names (comma-separated `redis://` URLs, the seed first), else three
/// private nodes started for this binary when a test first asks.
pub fn redis_cluster_urls() -> Vec<String> {
    static URLS: OnceLock<Vec<String>> = OnceLock::new();
    URLS.get_or_init(|| {
        if let Ok(urls) = std::env::var("IDEMGATE_TEST_REDIS_CLUSTER") {
            return urls.split(',').map(str::to_string).collect();
        }
        let cluster = RedisCluster::for_the_binary();
        let urls = cluster.node_urls();
        cluster.stop_at_exit();
        eprintln!("tests: started a Redis Cluster at {}", urls.join(", "));
        urls
    })
    .clone()
}

/// The URL in `variable`, else `default` if something listens on `port`.
fn find(variable: &str, default: &str, port: u16) -> Option<String> {
    if let Ok(url) = std::env::var(variable) {
        return Some(url);
    }
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .is_ok()
        .then(|| default.to_string())
}
