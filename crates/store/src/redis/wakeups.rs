//! Waking waiters from Redis: the scripts that settle a record announce
//! its wake id on `{prefix}keys` (routes that wait only), and one
//! subscriber per instance wakes the waiters each announcement names.

use std::sync::atomic::Ordering;

use deadpool_redis::redis;
use futures_util::StreamExt;

use super::RedisStore;
use crate::RecordKey;
use crate::waiters::{Waiters, parse_wake_id};

impl RedisStore {
    /// The wake-up channel and this key's wake id (hex), the last two
    /// arguments of every script that can settle a record.
    /// Empty on a route that does not wait: nobody listens for it, so its
    /// settled records are not announced.
    pub(super) fn wake_args(&self, key: &RecordKey) -> (String, String) {
        if self.wait_routes.contains(&key.route) {
            (self.wake_channel(), hex::encode(key.wake_id()))
        } else {
            (String::new(), String::new())
        }
    }

    /// `{prefix}keys`: where the scripts announce settled records.
    fn wake_channel(&self) -> String {
        format!("{}keys", self.layout.prefix)
    }

    /// Subscribe to the wake-up channel and wake the waiters each message
    /// names, until the connection is lost (`Ok`) or cannot be made.
    /// On a cluster, each attempt subscribes on the next node (the seed,
    /// then each primary seen): classic Pub/Sub reaches every node, so any
    /// live one hears every announcement.
    pub(super) async fn listen(&self, waiters: &Waiters) -> Result<(), redis::RedisError> {
        let turn = self.listens.fetch_add(1, Ordering::Relaxed);
        let subscribe = async {
            let client = match self.one_server() {
                // The one server, or the primary the sentinels name now.
                Some(server) => server.client().await?,
                None => {
                    let urls = self.node_urls();
                    super::tcp::client(urls[turn % urls.len()].as_str())?
                }
            };
            client.get_async_pubsub().await
        };
        let mut pubsub = tokio::time::timeout(self.timeout, subscribe)
            .await
            .map_err(|_| {
                redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
            })??;
        pubsub.subscribe(self.wake_channel()).await?;
        // Anything announced before this subscription is lost.
        waiters.wake_all();
        let mut messages = pubsub.on_message();
        while let Some(message) = messages.next().await {
            if let Ok(text) = message.get_payload::<String>()
                && let Some(id) = parse_wake_id(&text)
            {
                waiters.wake(&id);
            }
        }
        Ok(())
    }
}
