//! Erasure on the Redis store (`keys erase`). Redis has no index of its
//! own, and erasure never scans every record: the store keeps one sorted
//! set per route and scope (per bucket on a cluster, in the bucket's slot:
//! [`super::layout`]) of its scoped records' keys, scored by when each
//! expires. The claim enters a new scoped record, after dropping the
//! members whose score has passed; every script that lengthens a scoped
//! record's life moves its score and keeps the set alive at least as long
//! ([`super::scripts::SCOPED`]), so a member past its score is gone, and
//! the set expires with its last record; a record deleted, released or
//! abandoned leaves its set with it. The cost is one member per scoped
//! record (its key name and a score) and nothing for unscoped ones.
//!
//! [`ERASE`] reads one such set: the scope's records of one route in one
//! bucket, never another route's or another scope's, in runs of bounded
//! length. A step walks the buckets in order for at most its limit in all.

use std::collections::VecDeque;
use std::sync::LazyLock;

use deadpool_redis::redis::{self, Script, Value};
use futures_util::future::join_all;

use super::layout::Layout;
use super::scripts::NOW;
use super::store::{bytes, corrupt, int};
use super::{BUCKETS_AT_ONCE, RedisStore};
use crate::{EraseStep, EraseStepFailed, Erased, RecordKey, StoreError};

/// KEYS = the scope set of one route in one bucket, that route's due
/// questions and inquiring records there; ARGV = force (1/0), limit, how
/// many members it may visit, and where the walk resumes: the last member
/// it kept and that member's score ('' and '' at first).
/// Deletes up to `limit` of the set's records, earliest to expire first,
/// but (without force) one the upstream may still be working on
/// (`transitions::deletable`: a live lease, an inquiry neither asked nor
/// due); members whose record is gone leave the set. Visits at most so
/// many members, so no run is long however many it keeps or finds gone.
/// Returns whether it reached the set's end (1/0), the names of the
/// records it deleted, where to resume (the last member kept and its
/// score), at the end how many members the set still holds (those kept,
/// and any entered meanwhile), and which deleted records were in flight
/// (their waiters are woken: [`RedisStore::wake_erased`]). Kept members stay at the set's first
/// ranks, before the cursor: a resumed walk starts after its member, or
/// (that member moved or left) at the first member not scored before it.
pub(super) static ERASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local limit, visits = tonumber(ARGV[2]), tonumber(ARGV[3])
local after, after_score = ARGV[4], ARGV[5]
local at = 0
if after ~= '' then
  if redis.call('ZSCORE', KEYS[1], after) == after_score then
    at = redis.call('ZRANK', KEYS[1], after) + 1
  else
    at = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. after_score)
  end
end
local removed, woken, visited, done = {}, {}, 0, 0
while #removed < limit and visited < visits do
  local page = redis.call('ZRANGE', KEYS[1], at, at + math.min(99, visits - visited - 1), 'WITHSCORES')
  if #page == 0 then done = 1 break end
  for i = 1, #page, 2 do
    local name = page[i]
    visited = visited + 1
    local r = redis.call('HMGET', name, 'state', 'lease_until', 'asked')
    local lease = tonumber(r[2] or '0')
    if not r[1] then
      redis.call('ZREM', KEYS[1], name)
    elseif ARGV[1] ~= '1' and lease > now
        and (r[1] == 'in_flight' or (r[1] == 'inquiring' and tonumber(r[3] or '0') == 0)) then
      at = at + 1
      after, after_score = name, page[i + 1]
    else
      redis.call('DEL', name)
      redis.call('ZREM', KEYS[1], name)
      redis.call('ZREM', KEYS[2], name)
      redis.call('ZREM', KEYS[3], name)
      removed[#removed + 1] = name
      if r[1] == 'in_flight' then woken[#woken + 1] = name end
      if #removed >= limit then break end
    end
  end
end
local left = 0
if done == 1 then left = redis.call('ZCARD', KEYS[1]) end
return {done, removed, after, after_score, left, woken}
"#
    ))
});

/// How many members one [`ERASE`] run may visit for each record it may
/// delete: a set of kept or vanished members is walked in runs of this
/// bound, resumed where the last one stopped.
const VISITS_PER_RECORD: usize = 4;

/// Where a bucket's walk stands between [`ERASE`] runs.
#[derive(Debug, Default)]
struct Walk {
    /// The last member kept, and its score, as the script returned them.
    after: Vec<u8>,
    after_score: Vec<u8>,
}

/// What one [`ERASE`] run did.
struct Run {
    /// The Redis keys of the records it deleted.
    removed: Vec<Vec<u8>>,
    /// Those of them that were in flight (forced).
    woken: Vec<Vec<u8>>,
    /// Whether it reached the set's end; then how many members are left.
    done: bool,
    left: u64,
}

/// A script's array of names, or corrupt.
fn names_of(v: Option<&Value>) -> Result<&[Value], StoreError> {
    match v {
        Some(Value::Array(names)) => Ok(names),
        _ => Err(corrupt("an erasure without its keys")),
    }
}

impl RedisStore {
    /// One [`ERASE`] run on one bucket's set of `step`'s route and scope,
    /// for up to `limit` records, resuming at `walk` (moved on).
    async fn erase_run(
        &self,
        tagged: &str,
        step: &EraseStep<'_>,
        limit: usize,
        walk: &mut Walk,
    ) -> Result<Run, StoreError> {
        let sets = Layout::route_sets(tagged, step.route);
        let mut invocation = ERASE.key(Layout::scope_set_in(tagged, step.route, step.scope));
        invocation.key(sets.due).key(sets.inquiring);
        invocation
            .arg(if step.force { "1" } else { "0" })
            .arg(limit)
            .arg(limit.saturating_mul(VISITS_PER_RECORD))
            .arg(&walk.after[..])
            .arg(&walk.after_score[..]);
        let invocation = &invocation;
        let reply: Vec<Value> = self
            .bounded(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await?;
        let names = |names: &[Value]| {
            names
                .iter()
                .map(|name| bytes(Some(name)).ok_or_else(|| corrupt("an erased key")))
                .collect::<Result<Vec<_>, _>>()
        };
        let removed = names(names_of(reply.get(1))?)?;
        let woken = names(names_of(reply.get(5))?)?;
        walk.after = bytes(reply.get(2)).ok_or_else(|| corrupt("an erasure's cursor"))?;
        walk.after_score = bytes(reply.get(3)).ok_or_else(|| corrupt("an erasure's cursor"))?;
        Ok(Run {
            removed,
            woken,
            done: int(reply.first()) == Some(1),
            left: u64::try_from(int(reply.get(4)).unwrap_or(0)).unwrap_or(0),
        })
    }

    /// One step of [`crate::StoreAdmin::erase`], once the route's scope
    /// index is built ([`super::scope_index`]): [`ERASE`] runs on the
    /// buckets in order (one on a single server), [`BUCKETS_AT_ONCE`] at
    /// a time on a cluster, each for its share of the records the step may
    /// still delete (so a step never deletes more than `limit` in all);
    /// a bucket whose run stopped short of its set's end runs again, first.
    /// What is left is counted once every bucket reached its set's end.
    /// A run that fails stops the step once its wave is done, and the step
    /// fails with the keys every run removed until then (its wave's
    /// others included): those records are gone.
    pub(super) async fn erase_buckets(
        &self,
        step: &EraseStep<'_>,
    ) -> Result<Erased, EraseStepFailed> {
        self.ensure_scope_index(step.route).await?;
        let limit = step.limit.max(1);
        let mut pending: VecDeque<(String, Walk)> = self
            .layout
            .buckets()
            .into_iter()
            .map(|bucket| (bucket.tagged, Walk::default()))
            .collect();
        let (mut erased, mut left, mut woken) = (Erased::default(), 0, Vec::new());
        let mut failed = None;
        while erased.keys.len() < limit && !pending.is_empty() && failed.is_none() {
            let remaining = limit - erased.keys.len();
            let wave = pending.len().min(BUCKETS_AT_ONCE).min(remaining);
            let share = remaining / wave;
            let runs = join_all(pending.drain(..wave).map(|(tagged, mut walk)| async move {
                let run = self.erase_run(&tagged, step, share, &mut walk).await;
                (tagged, walk, run)
            }))
            .await;
            let mut unfinished = Vec::new();
            for (tagged, walk, run) in runs {
                let run = match run {
                    Ok(run) => run,
                    Err(error) => {
                        failed.get_or_insert(error);
                        continue;
                    }
                };
                for name in run.removed {
                    match self.layout.parse_record_key(step.route, &name) {
                        Some(key) => erased.keys.push(key.key),
                        None => {
                            failed.get_or_insert(corrupt("an erased key of another route"));
                        }
                    }
                }
                for name in run.woken {
                    woken.extend(self.layout.parse_record_key(step.route, &name));
                }
                if run.done {
                    left += run.left;
                } else {
                    unfinished.push((tagged, walk));
                }
            }
            for bucket in unfinished.into_iter().rev() {
                pending.push_front(bucket);
            }
        }
        self.wake_erased(&woken).await;
        if let Some(source) = failed {
            return Err(EraseStepFailed {
                removed: erased.keys,
                source,
            });
        }
        if pending.is_empty() && !erased.more(step.limit) {
            erased.left = left;
        }
        Ok(erased)
    }

    /// Announce the erased in-flight records, as CLEAR announces a forced
    /// one: a duplicate waiting on one claims again at once instead of at
    /// its next poll. Best effort: a lost announcement costs a waiter that
    /// poll, as any lost announcement does.
    async fn wake_erased(&self, woken: &[RecordKey]) {
        let (mut pipe, mut announced) = (redis::pipe(), 0);
        for key in woken {
            let (channel, id) = self.wake_args(key);
            if !channel.is_empty() {
                pipe.publish(channel, id).ignore();
                announced += 1;
            }
        }
        if announced == 0 {
            return;
        }
        let pipe = &pipe;
        let sent = self
            .bounded(|mut conn| async move { pipe.query_async::<()>(&mut conn).await })
            .await;
        if let Err(error) = sent {
            tracing::debug!(%error, "erased in-flight records not announced");
        }
    }
}
