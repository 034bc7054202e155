//! Where the Redis store keeps what: the names of record keys and token
//! counters, for a single server and for a Redis Cluster.
//!
//! Single server (`cluster = false`; records and tokens unchanged since the
//! first release):
//!
//! - record: `{prefix}rec:{len(route)}:{route}:{hex(scope)}:{key}`
//! - tokens: `{prefix}token`, one counter for every record.
//! - due questions (status inquiry): `{prefix}due:{len(route)}:{route}`,
//!   one sorted set per route that inquires, of its record keys scored by
//!   when each is due; an instance takes from the sets of exactly the routes
//!   it asks for, so instances with other routes never hide its questions.
//! - inquiring keys: `{prefix}inquiring:{len(route)}:{route}`, one sorted
//!   set per route of its `inquiring` record keys scored by when each record
//!   expires (read for `idemgate_inquiries_pending`).
//! - records by scope: `{prefix}scope:{len(route)}:{route}:{hex(scope)}`,
//!   one sorted set per route and scope of its scoped record keys, scored
//!   by when each expires, and living as long as its longest-lived member
//!   (read by `keys erase`, [`super::erase`]); unscoped records are in none.
//! - `{prefix}scope-index:{len(route)}:{route}`: set (to the time, ms)
//!   once the route's records written before the scope sets were entered
//!   in them ([`super::scope_index`]); one key, on a cluster too.
//! - `{prefix}due`: the one due set of every route before the sets per
//!   route; no longer written. Taking moves the due entries of the routes it
//!   asks for into their route's set (upgrade: [`Bucket::legacy_due`]).
//! - the records' marker: `{prefix}dataset`, a random id set once
//!   ([`super::dataset`]).
//!
//! Redis Cluster (`cluster = true`): a script may only touch keys of one
//! hash slot, and the claim touches the record and a token counter. Tokens
//! must never repeat for a key, even after its record expired or was
//! released, so a counter per record (which would expire with it) will not
//! do. Instead there are [`BUCKETS`] counters; a record's bucket `N` is a
//! stable hash (FNV-1a) of its single-server key, and every key of the
//! bucket carries the hash tag `{bN}`:
//!
//! - record: `{prefix}{bN}rec:{len(route)}:{route}:{hex(scope)}:{key}`
//! - tokens: `{prefix}{bN}token`
//! - due questions: `{prefix}{bN}due:{len(route)}:{route}`
//! - inquiring keys: `{prefix}{bN}inquiring:{len(route)}:{route}`
//! - records by scope: `{prefix}{bN}scope:{len(route)}:{route}:{hex(scope)}`
//! - before the sets per route: `{prefix}{bN}due`
//!
//! Every key of one bucket is in one slot, so a script's keys are too (the
//! claim's record, counter and its route's sets; a take's sets of every
//! route it asks for);
//! the 1024 buckets spread records over every primary. The prefix may hold
//! no brace on a cluster (`StoreConfig::validate`): Redis would take the
//! hash tag from it.

use super::super::RecordKey;

/// How many token counters a cluster has (the hash tags `{b0}`…`{b1023}`).
pub(super) const BUCKETS: u64 = 1024;

/// A route's sets in one bucket ([`Layout::route_sets`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RouteSets {
    /// Its due questions, scored by when each is due.
    pub(super) due: String,
    /// Its `inquiring` records, scored by when each expires.
    pub(super) inquiring: String,
}

/// The keys every route of one bucket shares ([`Layout::buckets`]).
#[derive(Debug, Clone)]
pub(super) struct Bucket {
    /// The prefix and, on a cluster, the bucket's hash tag.
    pub(super) tagged: String,
    /// The bucket's token counter.
    pub(super) token: String,
    /// The one due set of every route before the sets per route, read only
    /// to move its entries into theirs (upgrade).
    pub(super) legacy_due: String,
}

/// The key names of one store.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) prefix: String,
    pub(super) cluster: bool,
}

/// FNV-1a (64 bits): the same on every machine and in every release, which
/// the bucket of a record must be.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Escape `bytes` for a `SCAN MATCH` glob, so that they match literally.
fn glob_escape(bytes: &[u8], into: &mut Vec<u8>) {
    for b in bytes {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            into.push(b'\\');
        }
        into.push(*b);
    }
}

impl Layout {
    /// `rec:{len(route)}:{route}:{hex(scope)}:{key}`: the record's name after
    /// the prefix (and the hash tag, on a cluster).
    pub(crate) fn record_name(key: &RecordKey) -> Vec<u8> {
        use std::io::Write as _;
        let scope_hex = 2 * key.scope.len();
        let mut k = Vec::with_capacity(key.route.len() + scope_hex + key.key.len() + 28);
        // (Written in place: this runs for every store operation.)
        let _ = write!(k, "rec:{}:", key.route.len());
        k.extend_from_slice(key.route.as_bytes());
        k.push(b':');
        let at = k.len();
        k.resize(at + scope_hex, 0);
        hex::encode_to_slice(&key.scope, &mut k[at..]).expect("sized for the scope");
        k.push(b':');
        k.extend_from_slice(key.key.as_bytes());
        k
    }

    /// The hash tag of a record's bucket, `{bN}`.
    fn tag(name: &[u8]) -> String {
        format!("{{b{}}}", fnv1a(name) % BUCKETS)
    }

    /// The record's Redis key.
    pub(super) fn record_key(&self, key: &RecordKey) -> Vec<u8> {
        let name = Self::record_name(key);
        let mut k = Vec::with_capacity(self.prefix.len() + name.len() + 8);
        k.extend_from_slice(self.prefix.as_bytes());
        if self.cluster {
            k.extend_from_slice(Self::tag(&name).as_bytes());
        }
        k.extend_from_slice(&name);
        k
    }

    /// The token counter of the record's claims.
    pub(super) fn token_key(&self, key: &RecordKey) -> String {
        if self.cluster {
            format!("{}{}token", self.prefix, Self::tag(&Self::record_name(key)))
        } else {
            format!("{}token", self.prefix)
        }
    }

    /// The marker whose id changes only when the records are lost (one
    /// server: [`super::dataset`]).
    pub(super) fn dataset_key(&self) -> String {
        format!("{}dataset", self.prefix)
    }

    /// `{prefix}scope-index:{len(route)}:{route}`: set once `route`'s
    /// scope sets hold every record written before them
    /// ([`super::scope_index`]).
    pub(super) fn scope_index_marker(&self, route: &str) -> String {
        format!("{}scope-index:{}:{route}", self.prefix, route.len())
    }

    /// The prefix and, on a cluster, the hash tag of the record's bucket:
    /// what every key of its bucket starts with.
    pub(super) fn tagged(&self, key: &RecordKey) -> String {
        if self.cluster {
            format!("{}{}", self.prefix, Self::tag(&Self::record_name(key)))
        } else {
            self.prefix.clone()
        }
    }

    /// The record's route's sets in its bucket: the due questions it is
    /// entered in, and the `inquiring` records.
    pub(super) fn sets(&self, key: &RecordKey) -> RouteSets {
        Self::route_sets(&self.tagged(key), &key.route)
    }

    /// The set of the record's route and scope in its bucket, the index
    /// `keys erase` reads; none for an unscoped record.
    pub(super) fn scope_set(&self, key: &RecordKey) -> Option<String> {
        (!key.scope.is_empty())
            .then(|| Self::scope_set_in(&self.tagged(key), &key.route, &key.scope))
    }

    /// The set of `route` and `scope` in the bucket whose keys start with
    /// `tagged`.
    pub(super) fn scope_set_in(tagged: &str, route: &str, scope: &[u8]) -> String {
        format!("{}{}", Self::scope_start(tagged, route), hex::encode(scope))
    }

    /// How the names of `route`'s scope sets start, after `tagged`: the
    /// scripts that cannot name a record's set in advance (the take)
    /// append the scope's hex read from the record's name.
    pub(super) fn scope_start(tagged: &str, route: &str) -> String {
        format!("{tagged}scope:{}:{route}:", route.len())
    }

    /// The two sets of `route` in the bucket whose keys start with `tagged`.
    pub(super) fn route_sets(tagged: &str, route: &str) -> RouteSets {
        RouteSets {
            due: format!("{tagged}due:{}:{route}", route.len()),
            inquiring: format!("{tagged}inquiring:{}:{route}", route.len()),
        }
    }

    /// Every bucket (one on a single server): the prefix with its tag, its
    /// token counter and its due set of before the sets per route.
    pub(super) fn buckets(&self) -> Vec<Bucket> {
        let bucket = |tagged: String| Bucket {
            token: format!("{tagged}token"),
            legacy_due: format!("{tagged}due"),
            tagged,
        };
        if !self.cluster {
            return vec![bucket(self.prefix.clone())];
        }
        (0..BUCKETS)
            .map(|n| bucket(format!("{}{{b{n}}}", self.prefix)))
            .collect()
    }

    /// How every record key of `route` starts, after `tagged` (the prefix,
    /// and a bucket's tag on a cluster).
    pub(super) fn route_start(tagged: &str, route: &str) -> String {
        format!("{tagged}rec:{}:{route}:", route.len())
    }

    /// The `SCAN MATCH` pattern of every record key of one route.
    pub(super) fn route_pattern(&self, route: &str) -> Vec<u8> {
        let mut pattern = Vec::new();
        glob_escape(self.prefix.as_bytes(), &mut pattern);
        if self.cluster {
            pattern.extend_from_slice(b"{b*}");
        }
        glob_escape(
            format!("rec:{}:{}:", route.len(), route).as_bytes(),
            &mut pattern,
        );
        pattern.push(b'*');
        pattern
    }

    /// The [`RecordKey`] a Redis key of `route` stands for, if it is one
    /// (on a cluster: with the tag of its own bucket).
    pub(super) fn parse_record_key(&self, route: &str, redis_key: &[u8]) -> Option<RecordKey> {
        let rest = redis_key.strip_prefix(self.prefix.as_bytes())?;
        let name = if self.cluster {
            let close = rest.iter().position(|b| *b == b'}')?;
            let (tag, name) = rest.split_at(close + 1);
            (tag == Self::tag(name).as_bytes()).then_some(name)?
        } else {
            rest
        };
        let rest = name.strip_prefix(format!("rec:{}:{}:", route.len(), route).as_bytes())?;
        let colon = rest.iter().position(|b| *b == b':')?;
        Some(RecordKey {
            route: route.to_string(),
            scope: hex::decode(&rest[..colon]).ok()?,
            key: String::from_utf8(rest[colon + 1..].to_vec()).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(route: &str, key: &str) -> RecordKey {
        RecordKey {
            route: route.to_string(),
            scope: vec![0xab, 0x01],
            key: key.to_string(),
        }
    }

    fn layout(cluster: bool) -> Layout {
        Layout {
            prefix: "idemgate:".to_string(),
            cluster,
        }
    }

    /// CRC16/XMODEM of the hash tag (or the whole key), mod 16384: the slot
    /// Redis Cluster puts a key in.
    fn slot(key: &[u8]) -> u16 {
        let hashed = key
            .iter()
            .position(|b| *b == b'{')
            .and_then(|open| {
                let close = key[open + 1..].iter().position(|b| *b == b'}')?;
                (close > 0).then(|| &key[open + 1..open + 1 + close])
            })
            .unwrap_or(key);
        let mut crc: u16 = 0;
        for b in hashed {
            crc ^= u16::from(*b) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc % 16384
    }

    #[test]
    fn single_server_keys_are_unchanged() {
        let l = layout(false);
        let k = key("orders", "k-1");
        assert_eq!(l.record_key(&k), b"idemgate:rec:6:orders:ab01:k-1".to_vec());
        assert_eq!(l.token_key(&k), "idemgate:token");
        assert_eq!(l.sets(&k).due, "idemgate:due:6:orders");
        assert_eq!(l.sets(&k).inquiring, "idemgate:inquiring:6:orders");
        assert_eq!(l.scope_set(&k).unwrap(), "idemgate:scope:6:orders:ab01");
        let unscoped = RecordKey {
            scope: Vec::new(),
            ..key("orders", "k")
        };
        assert_eq!(l.scope_set(&unscoped), None);
        assert_eq!(l.buckets()[0].legacy_due, "idemgate:due");
        assert_eq!(l.route_pattern("a*b"), b"idemgate:rec:3:a\\*b:*".to_vec());
        assert_eq!(l.parse_record_key("orders", &l.record_key(&k)), Some(k));
    }

    #[test]
    fn cluster_keys_share_a_slot_with_their_counter() {
        // The reference value of the cluster spec: CRC16("123456789") = 0x31C3.
        assert_eq!(slot(b"123456789"), 0x31c3);
        assert_eq!(slot(b"a{123456789}b"), slot(b"123456789"));
        let l = layout(true);
        let mut buckets = std::collections::HashSet::new();
        for i in 0..2000 {
            let k = key("orders", &format!("key-{i}"));
            let (record, token) = (l.record_key(&k), l.token_key(&k));
            assert_eq!(slot(&record), slot(token.as_bytes()), "{k:?}");
            let sets = l.sets(&k);
            assert_eq!(slot(&record), slot(sets.due.as_bytes()), "{k:?}");
            assert_eq!(slot(&record), slot(sets.inquiring.as_bytes()), "{k:?}");
            let scope = l.scope_set(&k).expect("a scoped record");
            assert_eq!(slot(&record), slot(scope.as_bytes()), "{k:?}");
            assert!(String::from_utf8_lossy(&record).starts_with("idemgate:{b"));
            assert_eq!(l.parse_record_key("orders", &record), Some(k.clone()));
            assert_eq!(l.parse_record_key("other", &record), None);
            buckets.insert(token);
        }
        // Spread over (almost) every bucket, so over every primary.
        assert!(buckets.len() > 800, "{}", buckets.len());
    }

    #[test]
    fn a_record_keeps_its_bucket_across_releases() {
        // Pinned: a new hash would move records away from their counters.
        let k = key("orders", "k-1");
        assert_eq!(
            layout(true).record_key(&k),
            b"idemgate:{b963}rec:6:orders:ab01:k-1".to_vec()
        );
        assert_eq!(layout(true).token_key(&k), "idemgate:{b963}token");
        assert_eq!(layout(true).sets(&k).due, "idemgate:{b963}due:6:orders");
        let bucket = &layout(true).buckets()[963];
        assert_eq!(bucket.legacy_due, "idemgate:{b963}due");
        let sets = Layout::route_sets(&bucket.tagged, "orders");
        assert_eq!(sets, layout(true).sets(&k));
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn a_forged_tag_is_not_a_record() {
        let l = layout(true);
        assert_eq!(
            l.parse_record_key("r", b"idemgate:{b9999}rec:1:r:ab:k"),
            None
        );
        assert_eq!(l.parse_record_key("r", b"idemgate:rec:1:r:ab:k"), None);
    }
}
