//! A Redis server that may evict records before they expire (a
//! `maxmemory` with any policy but `noeviction`) is warned about when the
//! gateway starts: an evicted record is a forgotten key.

use crate::support::TestConfig;
use crate::support::process::GatewayProcess;
use crate::support::servers::PrivateRedis;

/// `CONFIG SET` on the private server.
async fn config_set(redis: &PrivateRedis, name: &str, value: &str) {
    let client = deadpool_redis::redis::Client::open(redis.url().as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = deadpool_redis::redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// The gateway's stderr once it is listening.
async fn start_and_read(name: &str, redis: &PrivateRedis) -> String {
    let config = TestConfig::new(&redis.url(), "http://127.0.0.1:9");
    let gateway = GatewayProcess::start(name, &config).await;
    gateway
        .stderr_until("the listening line", |s| s.contains("idemgate listening"))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_may_evict_records_is_warned_about() {
    let redis = PrivateRedis::start();
    config_set(&redis, "maxmemory", "64mb").await;
    config_set(&redis, "maxmemory-policy", "volatile-lru").await;
    let stderr = start_and_read("evicting", &redis).await;
    let line = stderr
        .lines()
        .find(|l| l.contains("may evict"))
        .unwrap_or_else(|| panic!("no eviction warning:\n{stderr}"));
    assert!(line.contains("volatile-lru"), "{line}");

    // Negative control: the same limit with noeviction is fine.
    config_set(&redis, "maxmemory-policy", "noeviction").await;
    let stderr = start_and_read("not-evicting", &redis).await;
    assert!(!stderr.contains("may evict"), "{stderr}");
}
