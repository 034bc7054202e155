//! The `[store]` table: its strings parsed and its defaults applied into a
//! [`StoreConfig`], which then checks itself ([`StoreConfig::validate`]: the
//! store module knows which settings a store can work with).

use crate::config::defaults::{
    DEFAULT_ACCEPT_PLAIN_RECORDS, DEFAULT_BATCHES_IN_FLIGHT, DEFAULT_FRONT_MARK_AFTER,
    DEFAULT_FRONT_TIMEOUT, DEFAULT_REPLAY_CACHE_SIZE, DEFAULT_REPLAY_CACHE_TTL,
    DEFAULT_REPLICA_TIMEOUT, DEFAULT_RETENTION, DEFAULT_STORE_CLUSTER, DEFAULT_STORE_COMPRESS,
    DEFAULT_STORE_COMPRESSION, DEFAULT_STORE_MAX_RECORDS, DEFAULT_STORE_MIGRATE,
    DEFAULT_STORE_POOL_SIZE, DEFAULT_STORE_PREFIX, DEFAULT_STORE_REPLICAS, DEFAULT_STORE_TIMEOUT,
    DEFAULT_STORE_URL, DEFAULT_SWEEP_BATCH, DEFAULT_SWEEP_INTERVAL, MAX_FRONT_MARK_AFTER,
    default_claim_queue_budget,
};
use crate::config::settings as S;
use std::time::Duration;

use crate::config::raw::{RawFront, RawStore};
use crate::config::values::{duration, size};
use crate::config::{ConfigError, invalid};
use crate::store::{FrontConfig, StoreConfig};

/// The `[store]` table, validated.
pub(super) fn store(raw: RawStore) -> Result<StoreConfig, ConfigError> {
    let timeout = duration(
        &S::STORE_TIMEOUT.path(),
        raw.timeout.as_deref(),
        DEFAULT_STORE_TIMEOUT,
    )?;
    if raw.compress == Some(false) && raw.compression.is_some() {
        return Err(invalid(
            S::STORE_COMPRESSION.path(),
            "is set but store.compress = false compresses nothing: remove one of them",
        ));
    }
    let store = StoreConfig {
        url: raw.url.unwrap_or_else(|| DEFAULT_STORE_URL.to_string()),
        migrate: raw.migrate.unwrap_or(DEFAULT_STORE_MIGRATE),
        pool_size: raw.pool_size.unwrap_or(DEFAULT_STORE_POOL_SIZE),
        batches_in_flight: raw.batches_in_flight.unwrap_or(DEFAULT_BATCHES_IN_FLIGHT),
        timeout,
        claim_queue_budget: duration(
            &S::STORE_CLAIM_QUEUE_BUDGET.path(),
            raw.claim_queue_budget.as_deref(),
            default_claim_queue_budget(timeout),
        )?,
        prefix: raw
            .prefix
            .unwrap_or_else(|| DEFAULT_STORE_PREFIX.to_string()),
        cluster: raw.cluster.unwrap_or(DEFAULT_STORE_CLUSTER),
        replicas: raw.replicas.unwrap_or(DEFAULT_STORE_REPLICAS),
        replica_timeout: duration(
            &S::STORE_REPLICA_TIMEOUT.path(),
            raw.replica_timeout.as_deref(),
            DEFAULT_REPLICA_TIMEOUT,
        )?,
        max_records: raw.max_records.unwrap_or(DEFAULT_STORE_MAX_RECORDS),
        sweep_interval: duration(
            &S::STORE_SWEEP_INTERVAL.path(),
            raw.sweep_interval.as_deref(),
            DEFAULT_SWEEP_INTERVAL,
        )?,
        sweep_batch: raw.sweep_batch.unwrap_or(DEFAULT_SWEEP_BATCH),
        // Unset: the longest retention, once the routes are known.
        generation: duration(
            &S::STORE_GENERATION.path(),
            raw.generation.as_deref(),
            DEFAULT_RETENTION,
        )?,
        replay_cache_ttl: duration(
            &S::STORE_REPLAY_CACHE_TTL.path(),
            raw.replay_cache_ttl.as_deref(),
            DEFAULT_REPLAY_CACHE_TTL,
        )?,
        replay_cache_size: size(
            &S::STORE_REPLAY_CACHE_SIZE.path(),
            raw.replay_cache_size.as_deref(),
            DEFAULT_REPLAY_CACHE_SIZE as usize,
        )? as u64,
        // Filled in once the routes are known.
        wait_routes: crate::store::WaitRoutes::default(),
        front: raw.front.map(front).transpose()?,
        encryption_keys: crate::config::record_keys::encryption_keys(raw.encryption_keys)?,
        compress: raw.compress.unwrap_or(DEFAULT_STORE_COMPRESS),
        compression: raw.compression.unwrap_or(DEFAULT_STORE_COMPRESSION),
        accept_plain_records: raw
            .accept_plain_records
            .unwrap_or(DEFAULT_ACCEPT_PLAIN_RECORDS),
    };
    store
        .validate()
        .map_err(|e| invalid(format!("store.{}", e.key), e.message))?;
    Ok(store)
}

/// `compress` and `compression` act only on sealed records: written
/// without `encryption_keys` they change nothing (a plain record is never
/// compressed). Not an error: files copied from an earlier `gateway.toml`,
/// which set both, keep starting; `idemgate check` and `serve` warn.
pub(super) fn unused(raw: &RawStore) -> Vec<String> {
    if raw.encryption_keys.is_some() {
        return Vec::new();
    }
    [
        (raw.compress.is_some(), S::STORE_COMPRESS.path()),
        (raw.compression.is_some(), S::STORE_COMPRESSION.path()),
    ]
    .into_iter()
    .filter(|(written, _)| *written)
    .map(|(_, key)| {
        format!(
            "{key} is set but without store.encryption_keys nothing is compressed (only \
             sealed records are): add encryption_keys or remove the line"
        )
    })
    .collect()
}

/// The `[store.front]` table; its fence life is set once the routes are known.
fn front(raw: RawFront) -> Result<FrontConfig, ConfigError> {
    let url = raw.url.ok_or_else(|| {
        invalid(
            S::FRONT_URL.path(),
            "is required: the Redis server in front of PostgreSQL (redis://HOST:PORT)",
        )
    })?;
    let mark_after = duration(
        &S::FRONT_MARK_AFTER.path(),
        raw.mark_after.as_deref(),
        DEFAULT_FRONT_MARK_AFTER,
    )?;
    if mark_after > MAX_FRONT_MARK_AFTER {
        return Err(invalid(
            S::FRONT_MARK_AFTER.path(),
            "must be at most 60s: an attempt still running by then is marked in flight",
        ));
    }
    Ok(FrontConfig {
        url,
        timeout: duration(
            &S::FRONT_TIMEOUT.path(),
            raw.timeout.as_deref(),
            DEFAULT_FRONT_TIMEOUT,
        )?,
        mark_after,
        fence_life: Duration::ZERO,
    })
}

/// The front's fence life: the longest lease of any route, plus a minute.
pub(in crate::config) fn fence_life(longest_lease: Duration) -> Duration {
    longest_lease + Duration::from_secs(60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{MINIMAL, error, parse};

    #[test]
    fn replay_cache_defaults_and_off_switch() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.store.replay_cache_ttl, DEFAULT_REPLAY_CACHE_TTL);
        assert_eq!(c.store.replay_cache_size, DEFAULT_REPLAY_CACHE_SIZE);
        let off = parse(&format!(
            "[store]\nreplay_cache_ttl = \"0s\"\nreplay_cache_size = \"1MiB\"\n{MINIMAL}"
        ))
        .unwrap();
        assert!(off.store.replay_cache_ttl.is_zero());
        assert_eq!(off.store.replay_cache_size, 1024 * 1024);
        let err = error(&format!("[store]\nreplay_cache_ttl = \"soon\"\n{MINIMAL}"));
        assert!(err.contains("store.replay_cache_ttl"), "{err}");
    }

    /// `[store]` lines that set sealing keys, for the settings that need them.
    const KEYS: &str = "encryption_keys = [\"k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"]\n";

    /// `compress` stays a switch (files that set it keep working) and
    /// `compression` picks the codec; naming a codec while switching
    /// compression off, or a codec that does not exist, is refused.
    #[test]
    fn compression_picks_a_codec_and_compress_switches_it() {
        use crate::store::seal::Codec;
        let s = parse(MINIMAL).unwrap().store;
        assert_eq!(
            (s.compress, s.compression),
            (DEFAULT_STORE_COMPRESS, DEFAULT_STORE_COMPRESSION)
        );
        for (table, compress, codec) in [
            ("compress = true\n", true, DEFAULT_STORE_COMPRESSION),
            ("compress = false\n", false, DEFAULT_STORE_COMPRESSION),
            ("compression = \"lz4\"\n", true, Codec::Lz4),
            ("compression = \"zstd\"\n", true, Codec::Zstd),
            (
                "compress = true\ncompression = \"zstd\"\n",
                true,
                Codec::Zstd,
            ),
        ] {
            let s = parse(&format!("[store]\n{KEYS}{table}{MINIMAL}"))
                .unwrap()
                .store;
            assert_eq!((s.compress, s.compression), (compress, codec), "{table}");
        }
        for table in [
            "compress = false\ncompression = \"lz4\"\n",
            "compression = \"gzip\"\n",
            "compression = true\n",
        ] {
            let err = error(&format!("[store]\n{KEYS}{table}{MINIMAL}"));
            assert!(err.contains("compression"), "{table}: {err}");
        }
    }

    /// Only sealed records are compressed: `compress` or `compression`
    /// written without `encryption_keys` changes nothing, so each one
    /// written is named in a warning, with what to do; the file still
    /// loads. With keys, or left unset, there is nothing to warn about.
    #[test]
    fn compression_settings_without_keys_are_warned_about() {
        for (lines, keys) in [
            ("compress = true\n", &["store.compress"][..]),
            ("compress = false\n", &["store.compress"]),
            ("compression = \"lz4\"\n", &["store.compression"]),
            (
                "compress = true\ncompression = \"zstd\"\n",
                &["store.compress", "store.compression"],
            ),
        ] {
            let warnings = parse(&format!("[store]\n{lines}{MINIMAL}"))
                .unwrap()
                .warnings();
            assert_eq!(warnings.len(), keys.len(), "{lines}: {warnings:?}");
            for (warning, key) in warnings.iter().zip(keys) {
                assert!(warning.starts_with(key), "{lines}: {warning}");
                assert!(
                    warning.contains("add encryption_keys or remove"),
                    "{lines}: {warning}"
                );
            }
            let sealed = parse(&format!("[store]\n{KEYS}{lines}{MINIMAL}")).unwrap();
            assert!(
                sealed.warnings().is_empty(),
                "{lines}: {:?}",
                sealed.warnings()
            );
        }
        assert!(parse(MINIMAL).unwrap().warnings().is_empty());
    }

    #[test]
    fn store_defaults() {
        let s = parse(MINIMAL).unwrap().store;
        assert_eq!(s.pool_size, DEFAULT_STORE_POOL_SIZE);
        assert_eq!(s.batches_in_flight, DEFAULT_BATCHES_IN_FLIGHT);
        assert_eq!(s.timeout, DEFAULT_STORE_TIMEOUT);
        assert_eq!(s.prefix, DEFAULT_STORE_PREFIX);
        assert!(!s.cluster);
        assert_eq!(s.max_records, DEFAULT_STORE_MAX_RECORDS);
        assert_eq!(s.sweep_interval, DEFAULT_SWEEP_INTERVAL);
        assert_eq!(s.sweep_batch, DEFAULT_SWEEP_BATCH);
        let s = parse(&format!("[store]\nsweep_interval = \"2m\"\n{MINIMAL}"))
            .unwrap()
            .store;
        assert_eq!(s.sweep_interval, Duration::from_secs(120));
    }

    #[test]
    fn the_generation_follows_the_longest_retention_unless_set() {
        let c = parse(&format!("[defaults]\nretention = \"36h\"\n{MINIMAL}")).unwrap();
        assert_eq!(c.store.generation, Duration::from_secs(36 * 3600));
        let set = parse(&format!("[store]\ngeneration = \"2h\"\n{MINIMAL}")).unwrap();
        assert_eq!(set.store.generation, Duration::from_secs(2 * 3600));
        let err = error(&format!("[store]\ngeneration = \"0s\"\n{MINIMAL}"));
        assert!(err.contains("store.generation"), "{err}");
    }

    #[test]
    fn a_front_gets_its_defaults_and_a_fence_life_from_the_routes() {
        let c = parse(&format!(
            "[store]\nurl = \"postgres://h/db\"\n[store.front]\nurl = \"redis://h:6379\"\n\
             [defaults]\nlease = \"45s\"\n{MINIMAL}"
        ))
        .unwrap();
        let front = c.store.front.expect("a front");
        assert_eq!(front.url, "redis://h:6379");
        assert_eq!(front.timeout, DEFAULT_FRONT_TIMEOUT);
        assert_eq!(front.mark_after, DEFAULT_FRONT_MARK_AFTER);
        assert_eq!(front.fence_life, Duration::from_secs(45 + 60));
        assert!(parse(MINIMAL).unwrap().store.front.is_none());
        let bad = [
            ("[store.front]\ntimeout = \"1s\"\n", "store.front.url"),
            ("[store.front]\nurl = \"redis://h\"\n", "store.front"),
            (
                "[store]\nurl = \"postgres://h/db\"\n[store.front]\nurl = \"redis://h\"\ntimeout = \"0s\"\n",
                "store.front.timeout",
            ),
            (
                "[store]\nurl = \"postgres://h/db\"\n[store.front]\nurl = \"redis://h\"\nmark_after = \"61s\"\n",
                "store.front.mark_after",
            ),
            (
                "[store]\nurl = \"postgres://h/db\"\n[store.front]\nurl = \"redis://h\"\nprefix = \"x\"\n",
                "prefix",
            ),
        ];
        for (prefix, key) in bad {
            let err = error(&format!("{prefix}{MINIMAL}"));
            assert!(err.contains(key), "{err}");
        }
    }

    #[test]
    fn nonsense_store_values_are_rejected() {
        let bad = [
            ("[store]\nurl = \"postgress://h/db\"\n", "store.url"),
            ("[store]\ntimeout = \"0s\"\n", "store.timeout"),
            ("[store]\npool_size = 0\n", "store.pool_size"),
            (
                "[store]\nurl = \"postgres://h/db\"\ncluster = true\n",
                "store.cluster",
            ),
            (
                "[store]\nreplay_cache_size = \"lots\"\n",
                "store.replay_cache_size",
            ),
        ];
        for (prefix, key) in bad {
            let err = error(&format!("{prefix}{MINIMAL}"));
            assert!(err.contains(key), "{err}");
        }
    }
}
