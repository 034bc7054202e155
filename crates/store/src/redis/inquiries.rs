//! The Redis store's side of the status inquiry: taking the due questions
//! of the routes an instance asks for, and counting their `inquiring`
//! keys (the other inquiry writes are attempt writes, in
//! [`super::scripts`]).
//!
//! Each route that inquires has its own due set and its own set of
//! `inquiring` records, per bucket on a cluster ([`super::layout`]). An
//! instance takes from the due sets of exactly its routes, so instances
//! with other routes sharing the Redis (two services, a rolling deploy that
//! adds an inquiring route) never see, move or delay its questions.
//!
//! Upgrade: the previous releases kept every route's questions in one set
//! per bucket ([`super::layout::Bucket::legacy_due`]). [`TAKE`] moves the
//! due entries of the routes it asks for from there into their route's set
//! (as they are, still due) and takes them as any other; entries of other
//! routes stay where they are, untouched, for the instances that ask for
//! them (an entry whose record is gone or settled is dropped: it stands
//! for no question). A take looks at the old set's 1,000 earliest due
//! entries: more live questions than that of routes no upgraded instance
//! asks for would hide later ones until they are moved or expire. Nothing
//! writes the old set any more once every instance runs this release; it
//! empties as its routes' instances move their entries.
//!
//! A route that stops inquiring everywhere leaves its sets behind: no
//! take reads them any more, and they keep at most one entry per record
//! it had in flight or inquiring then (the records themselves expire).

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::{Script, Value};
use futures_util::stream::{self, StreamExt};

use super::RedisStore;
use super::layout::{Bucket, Layout};
use super::scripts::{INQUIRING, NOW, SCOPED};
use super::store::{bytes, corrupt, int, millis};
use crate::{InquiringRoute, Inquiry, StoreError};

/// Buckets asked at once on a cluster.
const CONCURRENCY: usize = 16;

/// KEYS = token counter, the bucket's due set of before the sets per route,
/// then per route this instance asks for its due set and its set of
/// inquiring records; ARGV = lease ms, limit, then per route its
/// record-name prefix, retention ms and inquiry `after` ms (in the order of
/// the KEYS), then per route how its scope sets' names start. Takes up to
/// `limit` due questions of these routes, earliest
/// due first (`transitions::take_applies`: an in-flight record whose lease
/// lapsed only `after` past the lapse, reckoned from it; until then it is
/// due again then): each gets a new token and a lease, is due
/// again when the lease ends, and lives at least its route's retention
/// more. Entries whose record is gone or settled leave the route's sets; a
/// renewed in-flight record is due again at its lease's new end. First,
/// the due entries of these routes in the old set move to their route's
/// set (upgrade; the module's doc). Returns, per taken record, its name,
/// token, questions asked and milliseconds since it became inquiring.
pub(super) static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{INQUIRING}{SCOPED}{}",
        r#"
local taken = {}
local limit = tonumber(ARGV[2])
local routes = (#KEYS - 2) / 2
local function route_of(name)
  for i = 1, routes do
    local start = ARGV[3 * i]
    if string.sub(name, 1, #start) == start then return i end
  end
  return nil
end
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1000)
for j = 1, #old, 2 do
  local name = old[j]
  local i = route_of(name)
  if i then
    redis.call('ZADD', KEYS[1 + 2 * i], old[j + 1], name)
    redis.call('ZREM', KEYS[2], name)
  else
    local state = redis.call('HGET', name, 'state')
    if not (state == 'in_flight' or state == 'inquiring') then redis.call('ZREM', KEYS[2], name) end
  end
end
local due = {}
for i = 1, routes do
  local found = redis.call('ZRANGEBYSCORE', KEYS[1 + 2 * i], '-inf', now, 'WITHSCORES', 'LIMIT', 0, 4 * limit)
  for j = 1, #found, 2 do due[#due + 1] = {tonumber(found[j + 1]), found[j], i} end
  redis.call('ZREMRANGEBYSCORE', KEYS[2 + 2 * i], '-inf', now)
end
table.sort(due, function(a, b) return a[1] < b[1] end)
for _, entry in ipairs(due) do
  if #taken >= limit then break end
  local name, set, inquiring_set = entry[2], KEYS[1 + 2 * entry[3]], KEYS[2 + 2 * entry[3]]
  local r = redis.call('HMGET', name, 'state', 'lease_until', 'asked', 'since')
  local lease = tonumber(r[2] or '0')
  if not (r[1] == 'in_flight' or r[1] == 'inquiring') then
    redis.call('ZREM', set, name)
    redis.call('ZREM', inquiring_set, name)
  elseif lease > now then
    redis.call('ZADD', set, lease, name)
  elseif r[1] == 'in_flight' and lease + tonumber(ARGV[3 * entry[3] + 2]) > now then
    redis.call('ZADD', set, lease + tonumber(ARGV[3 * entry[3] + 2]), name)
  else
    local retention = tonumber(ARGV[3 * entry[3] + 1])
    local asked, since = 0, lease
    if r[1] == 'inquiring' then asked, since = tonumber(r[3] or '0'), tonumber(r[4] or now) end
    local token = redis.call('INCR', KEYS[1])
    local until_ = now + tonumber(ARGV[1])
    redis.call('HSET', name, 'state', 'inquiring', 'token', token, 'lease_until', until_, 'asked', asked, 'since', since, 'updated_at', now)
    redis.call('ZADD', set, until_, name)
    if redis.call('PTTL', name) < retention then redis.call('PEXPIRE', name, retention) end
    local scope = string.match(string.sub(name, #ARGV[3 * entry[3]] + 1), '^(%x+):')
    if scope then scoped(ARGV[3 * routes + 2 + entry[3]] .. scope, name) end
    inquiring(inquiring_set, name)
    taken[#taken + 1] = {name, token, asked, now - since}
  end
end
return taken
"#
    ))
});

/// KEYS = sets of inquiring records. Read-only: how many records they
/// hold that have not expired.
pub(super) static COUNT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
local n = 0
for _, set in ipairs(KEYS) do n = n + redis.call('ZCOUNT', set, '(' .. now, '+inf') end
return n
"#
    ))
});

impl RedisStore {
    /// [`TAKE`] on every bucket (one on a single server): a script may only
    /// touch keys of one slot. A cluster's 1,024 buckets are asked
    /// [`CONCURRENCY`] at a time, each for its share of what is left of
    /// `limit` (so a tick takes at most `limit` plus one share per
    /// concurrent call). A bucket that fails is logged and left for the
    /// next tick; the others' questions are kept.
    pub(super) async fn take_due(
        &self,
        routes: &[InquiringRoute],
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Inquiry>, StoreError> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        if routes.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let buckets = self.layout.buckets();
        let lease = millis(lease).to_string();
        let share = limit.div_ceil(CONCURRENCY.min(buckets.len())).max(1);
        let left = AtomicUsize::new(limit);
        let results: Vec<Result<Vec<Vec<Value>>, StoreError>> = stream::iter(buckets)
            .map(|bucket| {
                let (lease, left) = (&lease, &left);
                async move {
                    let asking = left.load(Ordering::Relaxed).min(share);
                    if asking == 0 {
                        return Ok(Vec::new());
                    }
                    let reply = self.take_in(&bucket, routes, lease, asking).await?;
                    let _ = left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        Some(n.saturating_sub(reply.len()))
                    });
                    Ok(reply)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut replies = Vec::with_capacity(results.len());
        let mut failed = None;
        for result in results {
            match result {
                Ok(reply) => replies.push(reply),
                Err(error) => failed = Some(error),
            }
        }
        match failed {
            Some(error) if replies.is_empty() => return Err(error),
            Some(error) => {
                tracing::warn!(%error, "some Redis buckets could not be asked for due inquiries; the next tick asks again");
            }
            None => {}
        }
        replies
            .into_iter()
            .flatten()
            .map(|row| self.taken(routes, &row))
            .collect()
    }

    /// [`TAKE`] on one bucket, for up to `limit` questions.
    async fn take_in(
        &self,
        bucket: &Bucket,
        routes: &[InquiringRoute],
        lease: &str,
        limit: usize,
    ) -> Result<Vec<Vec<Value>>, StoreError> {
        let mut invocation = TAKE.key(&bucket.token);
        invocation
            .key(&bucket.legacy_due)
            .arg(lease)
            .arg(limit.to_string());
        for route in routes {
            let sets = Layout::route_sets(&bucket.tagged, &route.name);
            invocation.key(sets.due).key(sets.inquiring);
        }
        for route in routes {
            invocation
                .arg(Layout::route_start(&bucket.tagged, &route.name))
                .arg(millis(route.retention).to_string())
                .arg(super::store::offset_millis(route.after).to_string());
        }
        for route in routes {
            invocation.arg(Layout::scope_start(&bucket.tagged, &route.name));
        }
        let invocation = &invocation;
        self.bounded(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await
    }

    /// One question [`TAKE`] answered.
    fn taken(&self, routes: &[InquiringRoute], row: &[Value]) -> Result<Inquiry, StoreError> {
        let name = bytes(row.first()).ok_or_else(|| corrupt("a taken question without a key"))?;
        let key = routes
            .iter()
            .find_map(|route| self.layout.parse_record_key(&route.name, &name))
            .ok_or_else(|| corrupt("a taken question of no inquiring route"))?;
        Ok(Inquiry {
            key,
            token: int(row.get(1)).ok_or_else(|| corrupt("a taken question without a token"))?,
            asked: u32::try_from(int(row.get(2)).unwrap_or(0)).unwrap_or(0),
            inquiring_for: Duration::from_millis(
                u64::try_from(int(row.get(3)).unwrap_or(0)).unwrap_or(0),
            ),
        })
    }

    /// How many `inquiring` records `routes` have: [`COUNT`] on every
    /// bucket's sets of these routes ([`CONCURRENCY`] buckets at a time on
    /// a cluster), summed. A bucket that fails fails the count.
    pub(super) async fn count_in_buckets(
        &self,
        routes: &[InquiringRoute],
    ) -> Result<u64, StoreError> {
        if routes.is_empty() {
            return Ok(0);
        }
        let counts: Vec<Result<i64, StoreError>> = self
            .per_bucket(|bucket| {
                let mut invocation = COUNT.prepare_invoke();
                for route in routes {
                    invocation.key(Layout::route_sets(&bucket.tagged, &route.name).inquiring);
                }
                invocation
            })
            .await;
        counts
            .into_iter()
            .try_fold(0u64, |sum, n| Ok(sum + u64::try_from(n?).unwrap_or(0)))
    }
}
