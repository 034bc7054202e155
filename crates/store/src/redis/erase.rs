//! Erasure on the Redis store (`keys erase`). Redis has no index of its
//! own, and erasure never scans every record: the store keeps one sorted
//! set per route and scope (per bucket on a cluster, in the bucket's slot:
//! [`super::layout`]) of its scoped records' keys, scored by when each
//! expires. The claim enters a new scoped record, after dropping the
//! members whose score has passed; every script that lengthens a scoped
//! record's life moves its score and keeps the set alive at least as long
//! ([`super::scripts::SCOPED`]), so a member past its score is gone, and
//! the set expires with its last record. The cost is one member per scoped
//! record (its key name and a score) and nothing for unscoped ones.
//!
//! [`ERASE`] reads one such set: the scope's records of one route in one
//! bucket, never another route's or another scope's.

use std::sync::LazyLock;

use deadpool_redis::redis::{Script, Value};

use super::RedisStore;
use super::layout::Layout;
use super::scripts::NOW;
use super::store::{bytes, corrupt, int};
use crate::{EraseStep, Erased, StoreError};

/// KEYS = the scope set of one route in one bucket, that route's due
/// questions and inquiring records there; ARGV = force (1/0), limit.
/// Deletes up to `limit` of the set's records, earliest to expire first,
/// but (without force) one the upstream may still be working on
/// (`transitions::deletable`: a live lease, an inquiry neither asked nor
/// due); members whose record is gone leave the set. Returns how many
/// records it kept, and the names of those it deleted. Atomic, so the
/// kept ones are the set's first ranks as it goes.
pub(super) static ERASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local limit = tonumber(ARGV[2])
local removed, kept = {}, 0
while #removed < limit do
  local names = redis.call('ZRANGE', KEYS[1], kept, kept + 99)
  if #names == 0 then break end
  for _, name in ipairs(names) do
    local r = redis.call('HMGET', name, 'state', 'lease_until', 'asked')
    local lease = tonumber(r[2] or '0')
    if not r[1] then
      redis.call('ZREM', KEYS[1], name)
    elseif ARGV[1] ~= '1' and lease > now
        and (r[1] == 'in_flight' or (r[1] == 'inquiring' and tonumber(r[3] or '0') == 0)) then
      kept = kept + 1
    elseif #removed < limit then
      redis.call('DEL', name)
      redis.call('ZREM', KEYS[1], name)
      redis.call('ZREM', KEYS[2], name)
      redis.call('ZREM', KEYS[3], name)
      removed[#removed + 1] = name
    end
  end
end
return {kept, removed}
"#
    ))
});

impl RedisStore {
    /// One step of [`crate::StoreAdmin::erase`]: [`ERASE`] on every bucket
    /// ([`RedisStore::per_bucket`]), each for up to `limit` records, so a step on a cluster may remove
    /// more than `limit`; what is left is counted once no bucket was full.
    pub(super) async fn erase_buckets(&self, step: &EraseStep<'_>) -> Result<Erased, StoreError> {
        let force = if step.force { "1" } else { "0" };
        let limit = step.limit.max(1).to_string();
        let replies: Vec<Result<Vec<Value>, StoreError>> = self
            .per_bucket(|bucket| {
                let sets = Layout::route_sets(&bucket.tagged, step.route);
                let mut invocation =
                    ERASE.key(Layout::scope_set_in(&bucket.tagged, step.route, step.scope));
                invocation.key(sets.due).key(sets.inquiring);
                invocation.arg(force).arg(&limit);
                invocation
            })
            .await;
        let (mut erased, mut full) = (Erased::default(), false);
        for reply in replies {
            let reply = reply?;
            erased.left += u64::try_from(int(reply.first()).unwrap_or(0)).unwrap_or(0);
            let Some(Value::Array(names)) = reply.get(1) else {
                return Err(corrupt("an erasure without its keys"));
            };
            full |= names.len() >= step.limit;
            for name in names {
                let name = bytes(Some(name)).ok_or_else(|| corrupt("an erased key"))?;
                let key = self
                    .layout
                    .parse_record_key(step.route, &name)
                    .ok_or_else(|| corrupt("an erased key of another route"))?;
                erased.keys.push(key.key);
            }
        }
        if full || erased.more(step.limit) {
            erased.left = 0;
        }
        Ok(erased)
    }
}
