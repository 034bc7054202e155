//! Whether the Redis server may evict idemgate's records. An evicted
//! record is a forgotten key: its retry is forwarded again. Every record
//! has a TTL, so the `volatile-*` policies evict them as readily as the
//! `allkeys-*` ones; only `noeviction` (writes fail when memory is full,
//! and idemgate fails closed) or no `maxmemory` keeps them. Read from
//! `INFO memory` when the store opens, and warned about; a server that
//! does not say (a managed service hiding it) is left alone.

use super::RedisStore;

/// What `INFO memory` says about eviction.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Eviction {
    /// No `maxmemory`, or `noeviction`: records stay until they expire.
    Kept,
    /// Records may be evicted before they expire.
    Possible {
        /// `maxmemory_policy`.
        policy: String,
        /// `maxmemory`, in bytes.
        maxmemory: u64,
    },
    /// The reply does not say.
    Unknown,
}

/// Read an `INFO memory` reply.
pub(super) fn assess(info: &str) -> Eviction {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let (Some(maxmemory), Some(policy)) = (
        field("maxmemory").and_then(|v| v.parse::<u64>().ok()),
        field("maxmemory_policy"),
    ) else {
        return Eviction::Unknown;
    };
    if maxmemory == 0 || policy == "noeviction" {
        Eviction::Kept
    } else {
        Eviction::Possible {
            policy: policy.to_string(),
            maxmemory,
        }
    }
}

impl RedisStore {
    /// Warn if the server may evict records (one server; a cluster's
    /// nodes are not asked).
    pub(super) async fn warn_if_evicting(&self, shown: &str) {
        if self.layout.cluster {
            return;
        }
        let Ok(info) = self.info("memory").await else {
            return;
        };
        if let Eviction::Possible { policy, maxmemory } = assess(&info) {
            tracing::warn!(
                store = %shown,
                maxmemory,
                maxmemory_policy = %policy,
                "Redis may evict idemgate's records before they expire (maxmemory is set and \
                 maxmemory-policy is not noeviction): an evicted record is a forgotten key, \
                 and its retry is forwarded again. Set maxmemory-policy noeviction (a full \
                 server then fails writes and idemgate fails closed), or remove maxmemory"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_limit_with_an_evicting_policy_is_flagged() {
        let info = |max: &str, policy: &str| {
            format!(
                "# Memory\r\nused_memory:1\r\nmaxmemory:{max}\r\nmaxmemory_human:x\r\nmaxmemory_policy:{policy}\r\n"
            )
        };
        assert_eq!(assess(&info("0", "allkeys-lru")), Eviction::Kept);
        assert_eq!(assess(&info("1000", "noeviction")), Eviction::Kept);
        assert_eq!(
            assess(&info("1000", "volatile-ttl")),
            Eviction::Possible {
                policy: "volatile-ttl".into(),
                maxmemory: 1000
            }
        );
        assert_eq!(assess("# Memory\r\nused_memory:1\r\n"), Eviction::Unknown);
    }
}
