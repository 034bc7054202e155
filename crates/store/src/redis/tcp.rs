//! How the Redis store opens its TCP connections: with `TCP_NODELAY`.
//!
//! A store connection carries many operations at once (multiplexed and
//! pipelined), each a small write. The redis crate leaves Nagle's
//! algorithm on, which holds a small write back until everything sent
//! before it is acknowledged: with the store a network away, every
//! operation that finds another in flight on its connection waits one
//! more round trip. Measured through a 2 ms delay line
//! (`bench/results/2026-11-29-redis-nodelay.md`). The upstream and client
//! sockets already set it.

use deadpool_redis::redis::io::tcp::TcpSettings;
use deadpool_redis::redis::{self, IntoConnectionInfo, RedisResult};

/// The TCP settings of every Redis store connection.
pub(super) fn settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// A client for `url` whose connections use [`settings`].
pub(super) fn client(url: impl IntoConnectionInfo) -> RedisResult<redis::Client> {
    redis::Client::open(url.into_connection_info()?.set_tcp_settings(settings()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_turn_nagle_off() {
        let client = client("redis://127.0.0.1:6379/0").unwrap();
        assert!(client.get_connection_info().tcp_settings().nodelay());
        // The control: the crate's own default leaves it on.
        let plain = redis::Client::open("redis://127.0.0.1:6379/0").unwrap();
        assert!(!plain.get_connection_info().tcp_settings().nodelay());
    }
}
