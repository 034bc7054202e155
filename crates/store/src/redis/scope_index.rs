//! Building a route's scope index once (`keys erase` on Redis): records
//! written before the scope sets existed ([`super::erase`]), or by an
//! instance of an earlier version, are in no set, and erasure would not
//! see them. The first erasure on a route finds no marker for it, so it
//! `SCAN`s the route's record keys (on a cluster, on every primary) in
//! batches of 1,000, enters every scoped one in its set with
//! [`INDEX`] (the scope is part of the record's name, so its set can be
//! named), and then writes the marker; later erasures read the marker
//! alone. Records an earlier version writes after the marker are not
//! entered: deleting the marker builds the index again.

use std::collections::HashMap;
use std::sync::LazyLock;

use deadpool_redis::redis::{self, Script};
use futures_util::stream::{self, StreamExt};

use super::scripts::{NOW, SCOPED};
use super::{BUCKETS_AT_ONCE, RedisStore};
use crate::StoreError;

/// KEYS = pairs of a record and its scope set, all in one bucket. Enters
/// each record that still has a TTL in its set, scored by when it expires,
/// and keeps the set at least as long ([`SCOPED`]); a record gone since
/// the scan is skipped.
static INDEX: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{SCOPED}{}",
        r#"
for i = 1, #KEYS, 2 do scoped(KEYS[i + 1], KEYS[i]) end
return #KEYS / 2
"#
    ))
});

impl RedisStore {
    /// Build `route`'s scope index unless its marker says it was built.
    pub(super) async fn ensure_scope_index(&self, route: &str) -> Result<(), StoreError> {
        let marker = self.layout.scope_index_marker(route);
        let marker = &marker;
        let built: Option<String> = self
            .bounded(|mut conn| async move {
                redis::cmd("GET").arg(marker).query_async(&mut conn).await
            })
            .await?;
        if built.is_some() {
            return Ok(());
        }
        let mut scan = self.scan_route(route).await?;
        while let Some(keys) = scan.next(self).await? {
            self.index_batch(route, keys).await?;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        self.bounded(|mut conn| async move {
            redis::cmd("SET")
                .arg(marker)
                .arg(now.to_string())
                .query_async::<()>(&mut conn)
                .await
        })
        .await
    }

    /// [`INDEX`] the scoped records among `keys` (record keys of `route`),
    /// one script per bucket.
    async fn index_batch(&self, route: &str, keys: Vec<Vec<u8>>) -> Result<(), StoreError> {
        let mut by_bucket: HashMap<String, Vec<(Vec<u8>, String)>> = HashMap::new();
        for redis_key in keys {
            let Some(key) = self.layout.parse_record_key(route, &redis_key) else {
                continue;
            };
            if let Some(set) = self.layout.scope_set(&key) {
                by_bucket
                    .entry(self.layout.tagged(&key))
                    .or_default()
                    .push((redis_key, set));
            }
        }
        let results: Vec<Result<i64, StoreError>> = stream::iter(by_bucket.into_values())
            .map(|pairs| async move {
                let mut invocation = INDEX.prepare_invoke();
                for (record, set) in &pairs {
                    invocation.key(&record[..]).key(set);
                }
                let invocation = &invocation;
                self.bounded(|mut conn| async move { invocation.invoke_async(&mut conn).await })
                    .await
            })
            .buffer_unordered(BUCKETS_AT_ONCE)
            .collect()
            .await;
        results.into_iter().try_for_each(|r| r.map(|_| ()))
    }
}
