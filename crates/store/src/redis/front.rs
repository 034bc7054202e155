//! The Redis half of the front store (crates/store/src/front/): what the front
//! keeps per record, and the scripts that change it, each atomic on the
//! server and fenced by tokens so that a late write can never bring back
//! what a newer attempt, a release or an operator's delete removed.
//!
//! Per record, two keys (`{prefix}front:rec:…` and `{prefix}fence:rec:…`,
//! the record's name as the Redis store spells it):
//!
//! - the **entry**, a hash: `kind` (`in_flight`, `completed`, `held`), the
//!   attempt's `token`, the request's `fp`, and for `in_flight` its `end`
//!   (ms since the epoch), for `completed` the response (`status`,
//!   `headers`, `body`), for `held` its `reason`; its TTL ends with the
//!   lease (`in_flight`, at `end`) or the retention. A claim reads it with
//!   one `HMGET`, not a script;
//! - the **fence**, the highest token whose attempt is known to be over
//!   for good (released, abandoned, deleted): no entry of that token or an
//!   older one is written again while the fence lives.
//!
//! An entry is only ever replaced by one of a newer token, or by its own
//! attempt's settled record: written by the settling instance after
//! PostgreSQL's commit, in place of the entry it finds of that attempt
//! only (its marker); by the settling instance's publishing task, for an
//! attempt it never marked (a completed or held record does not change in
//! PostgreSQL but by its own attempt, and a delete fences the front at a
//! token at or above it first); and by the relay and read-repair, which
//! read PostgreSQL under a share lock (so no change to the record commits
//! until they are done).

use std::time::Duration;

use bytes::Bytes;
use deadpool_redis::redis::Script;
use http::StatusCode;
use std::sync::LazyLock;

use super::{Layout, RedisStore, corrupt, millis};
use crate::{
    HeldReason, RecordKey, StoreError, StoredResponse, Token, decode_headers, encode_headers,
};

/// What the front holds for a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrontEntry {
    /// An attempt holds a live lease (the marker ends with it).
    InFlight {
        /// The request's fingerprint.
        fingerprint: Vec<u8>,
        /// Time left on the marker.
        left: Duration,
        /// Time left before the record expires at the earliest (none: a
        /// marker of an older version, which did not say).
        expires_in: Option<Duration>,
    },
    /// A recorded response.
    Completed {
        /// The request's fingerprint.
        fingerprint: Vec<u8>,
        /// The response.
        response: StoredResponse,
        /// Time left before the entry ends with the record's retention
        /// (none: an entry of an older version, which did not say).
        expires_in: Option<Duration>,
    },
    /// The key is held.
    Held {
        /// The request's fingerprint.
        fingerprint: Vec<u8>,
        /// Why.
        reason: HeldReason,
        /// Time left before the entry ends with the record's retention
        /// (none: an entry of an older version, which did not say).
        expires_in: Option<Duration>,
    },
}

/// A settled state to publish.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Settled<'a> {
    /// A recorded response.
    Completed(&'a StoredResponse),
    /// A held key.
    Held(HeldReason),
}

/// Most bytes of responses one [`PUBLISH`] script carries.
const PUBLISH_BYTES: usize = 1024 * 1024;

/// The fields a claim reads from an entry (one `HMGET`): every kind's;
/// `end`, when the entry ends (ms since the epoch: an in-flight marker's
/// lease, a settled record's retention); and `exp`, when a marked
/// attempt's record expires at the earliest.
const READ_FIELDS: [&str; 8] = [
    "kind", "fp", "status", "headers", "body", "reason", "end", "exp",
];

/// Test builds only: KEYS = entry, fence; ARGV = ms. The entry's `end` and
/// TTL that far into the past, the entry deleted if that ends it (the
/// fence is left: it only ever keeps stale writes out).
#[cfg(feature = "test-hooks")]
static AGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{}{}",
        super::scripts::AGE_TTL,
        r#"
local by = tonumber(ARGV[1])
for _, field in ipairs({'end', 'exp'}) do
  local at = tonumber(redis.call('HGET', KEYS[1], field) or '')
  if at then redis.call('HSET', KEYS[1], field, at - by) end
end
age_ttl(KEYS[1], by)
return 1
"#
    ))
});

/// KEYS = entry and fence of each record; ARGV = token, fingerprint, end,
/// record expiry (ms since the epoch) of each. A claimed attempt's marker, unless the
/// fence covers it or an entry of this attempt or a newer one is there.
/// Returns how many were written.
static MARK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local n = 0
for i = 1, #KEYS / 2 do
  local entry, fence, a = KEYS[2 * i - 1], KEYS[2 * i], 4 * (i - 1)
  local t = tonumber(ARGV[a + 1])
  local cur = tonumber(redis.call('HGET', entry, 'token') or '0')
  if cur < t and tonumber(redis.call('GET', fence) or '0') < t then
    redis.call('DEL', entry)
    redis.call('HSET', entry, 'kind', 'in_flight', 'token', ARGV[a + 1], 'fp', ARGV[a + 2],
               'end', ARGV[a + 3], 'exp', ARGV[a + 4])
    redis.call('PEXPIREAT', entry, ARGV[a + 3])
    n = n + 1
  end
end
return n
"#,
    )
});

/// KEYS = entry and fence of each record; ARGV = token, kind, fingerprint,
/// status, headers, body, reason, end (ms since the epoch), own (1/0) of
/// each. A settled record, unless the fence covers it. With own, only in
/// place of an entry of the same attempt, whose fingerprint it keeps (the
/// settling instance replacing its marker after PostgreSQL's commit: a
/// front that lost the marker, flushed or fenced, stays without it);
/// without, unless a newer attempt's entry is there (the relay and
/// read-repair, which read PostgreSQL under a share lock, and the
/// completing instance for an attempt it never marked). Returns how many
/// were written.
static PUBLISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local n = 0
for i = 1, #KEYS / 2 do
  local entry, fence, a = KEYS[2 * i - 1], KEYS[2 * i], 9 * (i - 1)
  local t = tonumber(ARGV[a + 1])
  if tonumber(redis.call('GET', fence) or '0') < t then
    local cur = redis.call('HMGET', entry, 'token', 'fp')
    local fp, ok = ARGV[a + 3], true
    if ARGV[a + 9] == '1' then
      ok = cur[1] and tonumber(cur[1]) == t and cur[2]
      fp = cur[2]
    elseif cur[1] and tonumber(cur[1]) > t then
      ok = false
    end
    if ok then
      redis.call('DEL', entry)
      redis.call('HSET', entry, 'kind', ARGV[a + 2], 'token', ARGV[a + 1], 'fp', fp,
                 'status', ARGV[a + 4], 'headers', ARGV[a + 5], 'body', ARGV[a + 6],
                 'reason', ARGV[a + 7], 'end', ARGV[a + 8])
      redis.call('PEXPIREAT', entry, ARGV[a + 8])
      n = n + 1
    end
  end
end
return n
"#,
    )
});

/// KEYS = entry, fence; ARGV = token, fence life (ms). Every attempt up to
/// `token` is over: raise the fence to it and drop an entry it covers.
static INVALIDATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = tonumber(ARGV[1])
if t > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
elseif redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
local cur = redis.call('HGET', KEYS[1], 'token')
if cur and tonumber(cur) <= t then redis.call('DEL', KEYS[1]) end
return 1
"#,
    )
});

/// KEYS = entry and fence of each record; ARGV = the token of each, whose
/// attempt completed. For each, 1 if the front shows that completion or
/// something newer (an entry of a newer attempt, a fence at or above the
/// token), so that publishing it would change nothing; else 0.
static SHOWN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local out = {}
for i = 1, #ARGV do
  local t = tonumber(ARGV[i])
  local r = redis.call('HMGET', KEYS[2 * i - 1], 'token', 'kind')
  local cur = tonumber(r[1] or '0')
  local shown = cur > t or (cur == t and r[2] == 'completed')
  if not shown then shown = tonumber(redis.call('GET', KEYS[2 * i]) or '0') >= t end
  out[i] = shown and 1 or 0
end
return out
"#,
    )
});

/// KEYS = entry (and the fence, unused); ARGV = token, end (ms since the
/// epoch). A renewed lease:
/// the attempt's marker lives on with it.
static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local r = redis.call('HMGET', KEYS[1], 'token', 'kind')
if r[1] == ARGV[1] and r[2] == 'in_flight' then
  redis.call('HSET', KEYS[1], 'end', ARGV[2])
  redis.call('PEXPIREAT', KEYS[1], ARGV[2])
  return 1
end
return 0
"#,
    )
});

/// A claimed attempt's marker ([`RedisStore::front_mark`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark<'a> {
    /// The record.
    pub key: &'a RecordKey,
    /// The attempt.
    pub token: Token,
    /// The request's fingerprint.
    pub fingerprint: &'a [u8],
    /// When the marker ends (ms since the epoch): never after the lease.
    pub until_ms: i64,
    /// When the record expires at the earliest (ms since the epoch): the
    /// claim's start plus the route's retention; none: unknown (the
    /// front's refusals under it are left to PostgreSQL).
    pub expires_ms: Option<i64>,
}

/// A settled record to show ([`RedisStore::front_publish`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Publish<'a> {
    /// The record.
    pub key: &'a RecordKey,
    /// The attempt that settled it.
    pub token: Token,
    /// The request's fingerprint (unused with `own`: the marker's is kept).
    pub fingerprint: &'a [u8],
    /// What it settled as.
    pub settled: Settled<'a>,
    /// When it ends (ms since the epoch): never after the retention.
    pub until_ms: i64,
    /// Only in place of the attempt's own entry (its marker).
    pub own: bool,
}

impl RedisStore {
    /// The entry's and the fence's Redis keys.
    fn front_keys(&self, key: &RecordKey) -> (Vec<u8>, Vec<u8>) {
        let name = Layout::record_name(key);
        let prefix = self.layout.prefix.as_bytes();
        let entry = [prefix, b"front:", &name].concat();
        let fence = [prefix, b"fence:", &name].concat();
        (entry, fence)
    }

    async fn front_script(
        &self,
        script: &Script,
        key: &RecordKey,
        args: &[&[u8]],
    ) -> Result<bool, StoreError> {
        let (entry, fence) = self.front_keys(key);
        let (entry, fence) = (&entry, &fence);
        let n: i64 = self
            .bounded(|mut conn| async move {
                let mut invocation = script.key(&entry[..]);
                invocation.key(&fence[..]);
                for a in args {
                    invocation.arg(*a);
                }
                invocation.invoke_async(&mut conn).await
            })
            .await?;
        Ok(n == 1)
    }

    /// What the front holds for `key`, at `now_ms` (ms since the epoch,
    /// this host's clock: the one markers' ends were set by).
    pub(crate) async fn front_read(
        &self,
        key: &RecordKey,
        now_ms: i64,
    ) -> Result<Option<FrontEntry>, StoreError> {
        let (entry, _) = self.front_keys(key);
        let entry = &entry;
        let fields: Vec<Option<Vec<u8>>> = self
            .bounded(|mut conn| async move {
                deadpool_redis::redis::cmd("HMGET")
                    .arg(&entry[..])
                    .arg(&READ_FIELDS[..])
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        let [kind, fp, status, headers, body, reason, end, exp]: [Option<Vec<u8>>; 8] = fields
            .try_into()
            .map_err(|_| corrupt("an HMGET reply of the wrong length"))?;
        let Some(kind) = kind else {
            return Ok(None);
        };
        let fingerprint = fp.ok_or_else(|| corrupt("a front entry with no fingerprint"))?;
        let number = |field: Option<&Vec<u8>>| -> Option<i64> {
            std::str::from_utf8(field?).ok()?.parse().ok()
        };
        // Time left until an instant; none for an entry without it (one
        // written by an older version).
        let left_until = |at: Option<&Vec<u8>>| {
            number(at).map(|at| Duration::from_millis(at.saturating_sub(now_ms).max(0) as u64))
        };
        Ok(Some(match &kind[..] {
            b"in_flight" => {
                // (A marker without its end, written by an older version,
                // is left to PostgreSQL.)
                let left = number(end.as_ref()).map_or(0, |end| end.saturating_sub(now_ms));
                if left <= 0 {
                    return Ok(None);
                }
                FrontEntry::InFlight {
                    fingerprint,
                    left: Duration::from_millis(left as u64),
                    expires_in: left_until(exp.as_ref()),
                }
            }
            b"completed" => FrontEntry::Completed {
                fingerprint,
                response: StoredResponse {
                    status: number(status.as_ref())
                        .and_then(|s| u16::try_from(s).ok())
                        .and_then(|s| StatusCode::from_u16(s).ok())
                        .ok_or_else(|| corrupt("a bad status"))?,
                    headers: decode_headers(&headers.unwrap_or_default())
                        .ok_or_else(|| corrupt("undecodable headers"))?,
                    body: Bytes::from(body.unwrap_or_default()),
                },
                expires_in: left_until(end.as_ref()),
            },
            b"held" => FrontEntry::Held {
                fingerprint,
                reason: reason
                    .and_then(|r| HeldReason::parse(std::str::from_utf8(&r).ok()?))
                    .ok_or_else(|| corrupt("an unknown held reason"))?,
                expires_in: left_until(end.as_ref()),
            },
            other => {
                return Err(corrupt(&format!(
                    "a front entry of kind {:?}",
                    String::from_utf8_lossy(other)
                )));
            }
        }))
    }

    /// For each completion (key, token), whether the front shows it or
    /// something newer ([`SHOWN`]), in one round trip.
    pub(crate) async fn front_shown(
        &self,
        completed: &[(&RecordKey, Token)],
    ) -> Result<Vec<bool>, StoreError> {
        if completed.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = SHOWN.prepare_invoke();
        for (key, token) in completed {
            let (entry, fence) = self.front_keys(key);
            invocation.key(entry).key(fence).arg(*token);
        }
        let invocation = &invocation;
        let shown: Vec<i64> = self
            .bounded(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await?;
        if shown.len() != completed.len() {
            return Err(corrupt("a SHOWN reply of the wrong length"));
        }
        Ok(shown.into_iter().map(|n| n == 1).collect())
    }

    /// Mark each attempt in flight until its end ([`MARK`]), in one round
    /// trip; returns how many markers were written.
    pub(crate) async fn front_mark(&self, marks: &[Mark<'_>]) -> Result<u64, StoreError> {
        if marks.is_empty() {
            return Ok(0);
        }
        let mut invocation = MARK.prepare_invoke();
        for mark in marks {
            let (entry, fence) = self.front_keys(mark.key);
            invocation
                .key(entry)
                .key(fence)
                .arg(mark.token)
                .arg(mark.fingerprint)
                .arg(mark.until_ms)
                .arg(
                    mark.expires_ms
                        .map_or_else(String::new, |at| at.to_string()),
                );
        }
        let invocation = &invocation;
        self.bounded(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await
    }

    /// Show each settled record until its end ([`PUBLISH`]): one round
    /// trip per [`PUBLISH_BYTES`] of responses (a larger record goes
    /// alone); returns how many were written.
    pub(crate) async fn front_publish(&self, records: &[Publish<'_>]) -> Result<u64, StoreError> {
        let mut written = 0;
        let mut rest = records;
        while !rest.is_empty() {
            let (mut n, mut bytes) = (0, 0);
            while n < rest.len() && (n == 0 || bytes < PUBLISH_BYTES) {
                if let Settled::Completed(response) = rest[n].settled {
                    bytes += response.size();
                }
                n += 1;
            }
            let (script, later) = rest.split_at(n);
            written += self.publish_script(script).await?;
            rest = later;
        }
        Ok(written)
    }

    /// One [`PUBLISH`] script for `records`.
    async fn publish_script(&self, records: &[Publish<'_>]) -> Result<u64, StoreError> {
        let mut invocation = PUBLISH.prepare_invoke();
        for record in records {
            let (entry, fence) = self.front_keys(record.key);
            invocation.key(entry).key(fence).arg(record.token);
            match record.settled {
                Settled::Completed(response) => invocation
                    .arg("completed")
                    .arg(record.fingerprint)
                    .arg(response.status.as_u16())
                    .arg(encode_headers(&response.headers))
                    .arg(&response.body[..])
                    .arg(""),
                Settled::Held(reason) => invocation
                    .arg("held")
                    .arg(record.fingerprint)
                    .arg("")
                    .arg("")
                    .arg("")
                    .arg(reason.as_str()),
            };
            invocation
                .arg(record.until_ms)
                .arg(if record.own { "1" } else { "0" });
        }
        let invocation = &invocation;
        self.bounded(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await
    }

    /// The prefix of every key the front writes (`[store] prefix`).
    pub(crate) fn prefix(&self) -> &str {
        &self.layout.prefix
    }

    /// Every attempt of `key` up to `token` is over: fence them out for `life`.
    pub(crate) async fn front_invalidate(
        &self,
        key: &RecordKey,
        token: Token,
        life: Duration,
    ) -> Result<(), StoreError> {
        let (token, life) = (token.to_string(), millis(life).to_string());
        self.front_script(&INVALIDATE, key, &[token.as_bytes(), life.as_bytes()])
            .await
            .map(|_| ())
    }

    /// Delete every entry and fence the front holds (`SCAN` in steps of
    /// 1,000, each bounded by the timeout); returns how many keys went.
    pub(crate) async fn front_wipe(&self) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for kind in ["front:", "fence:"] {
            let pattern = format!("{}{kind}*", self.layout.prefix);
            let pattern = &pattern;
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<Vec<u8>>) = self
                    .bounded(|mut conn| async move {
                        deadpool_redis::redis::cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(pattern)
                            .arg("COUNT")
                            .arg(1000)
                            .query_async(&mut conn)
                            .await
                    })
                    .await?;
                if !keys.is_empty() {
                    let keys = &keys;
                    let n: u64 = self
                        .bounded(|mut conn| async move {
                            deadpool_redis::redis::cmd("UNLINK")
                                .arg(keys)
                                .query_async(&mut conn)
                                .await
                        })
                        .await?;
                    deleted += n;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(deleted)
    }

    /// Test builds only (`StoreAdmin::age` of the front store): move the
    /// entry's end and TTL `by` into the past (deleted if that ends it).
    #[cfg(feature = "test-hooks")]
    pub(crate) async fn front_age(&self, key: &RecordKey, by: Duration) -> Result<(), StoreError> {
        let by = millis(by).to_string();
        self.front_script(&AGE, key, &[by.as_bytes()])
            .await
            .map(|_| ())
    }

    /// Attempt `token` renewed its lease: its marker lives until `until_ms`.
    pub(crate) async fn front_extend(
        &self,
        key: &RecordKey,
        token: Token,
        until_ms: i64,
    ) -> Result<bool, StoreError> {
        let (token, until) = (token.to_string(), until_ms.to_string());
        self.front_script(&EXTEND, key, &[token.as_bytes(), until.as_bytes()])
            .await
    }
}
