//! The Lua scripts of the Redis store: every transition is one script, so
//! it is atomic on the server. Each implements a rule of
//! `store::transitions` (named in its doc) and reads the clock with Redis's
//! own `TIME`, so every gateway instance agrees on leases.

use std::sync::LazyLock;

use deadpool_redis::redis::Script;

/// Milliseconds since the epoch by the server's clock, as `now`; and
/// `announce()`, which publishes the record's wake id (the last argument)
/// on the wake-up channel (the one before it) when it leaves `in_flight`
/// (docs/src/design/decisions.md); an empty channel (a route that does not wait)
/// publishes nothing. Every script that can take a record out of
/// `in_flight` gets these two arguments last.
pub(super) const NOW: &str = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)
local function announce() if ARGV[#ARGV - 1] ~= '' then redis.call('PUBLISH', ARGV[#ARGV - 1], ARGV[#ARGV]) end end\n";

/// `inquiring(set, name)`: enter the record `name`, now `inquiring`, in
/// its route's set of inquiring records, scored by when it expires (after
/// any `PEXPIRE` of the script: a score never falls short of the record's
/// life). For scripts that start with [`NOW`].
pub(super) const INQUIRING: &str = "local function inquiring(set, name)
  local ttl = redis.call('PTTL', name)
  if ttl < 0 then redis.call('ZADD', set, '+inf', name) else redis.call('ZADD', set, now + ttl, name) end
end\n";

/// `scoped(set, name)`: enter the record `name` in its route's and
/// scope's set (the index `keys erase` reads), scored by when it expires,
/// and keep the set at least as long as the record; after any `PEXPIRE`
/// of the script (a score never falls short of the record's life, so
/// members past their score are gone and may be dropped). For scripts that
/// start with [`NOW`]; an unscoped record has no set (`set` is nil).
pub(super) const SCOPED: &str = "local function scoped(set, name)
  if not set then return end
  local ttl = redis.call('PTTL', name)
  if ttl < 0 then return end
  redis.call('ZADD', set, now + ttl, name)
  if redis.call('PTTL', set) < ttl then redis.call('PEXPIRE', set, ttl) end
end\n";

/// The claim: KEYS = record, token counter, due questions, inquiring
/// records (both sets of the record's route), and for a scoped record its
/// scope set ([`SCOPED`]: a new record enters it, after its expired
/// members leave it); ARGV =
/// fingerprint, lease ms, retention ms, what a lapsed lease turns into (1:
/// taken over, 0: held, 2: inquiring), attempt id, the instant (ms since
/// the epoch) after which it must not run, the route's inquiry `after` ms
/// (a lapsed lease's question is due that long past the lapse:
/// `transitions::lapsed_question_in`), wake-up channel, wake id. A
/// claim past that instant answers `late` (and by how many ms, by the
/// server's clock) and reads and writes nothing
/// (`transitions::claim_write_limit`: its caller has given up, and the
/// lost-claims worker may have stopped looking for its record).
/// Implements `transitions::claim` (the record expires by its TTL,
/// which a live lease extends: `transitions::expired`). Every answer that
/// is no claim nor replay ends with the record's TTL (ms): when it expires. On a route that
/// inquires, a new record is entered in the due questions at its lease's
/// end, so the inquirer finds it if its gateway dies.
pub(super) static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{INQUIRING}{SCOPED}{}",
        r#"
if now > tonumber(ARGV[6]) then return {'late', now - tonumber(ARGV[6])} end
local r = redis.call('HMGET', KEYS[1], 'fp', 'state', 'token', 'lease_until', 'held_reason', 'status', 'headers', 'body')
if not r[2] then
  local token = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'state', 'in_flight', 'token', token, 'attempt', ARGV[5],
             'lease_until', now + tonumber(ARGV[2]), 'created_at', now, 'updated_at', now)
  -- A live lease outlives retention: the key must not expire under it.
  redis.call('PEXPIRE', KEYS[1], math.max(tonumber(ARGV[2]), tonumber(ARGV[3])))
  if ARGV[4] == '2' then redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), KEYS[1]) end
  if KEYS[5] then redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now) end
  scoped(KEYS[5], KEYS[1])
  return {'claimed', token}
end
if r[1] ~= ARGV[1] then return {'mismatch', 0, redis.call('PTTL', KEYS[1])} end
if r[2] == 'completed' then return {'replay', tonumber(r[3]), tonumber(r[6]), r[7], r[8]} end
if r[2] == 'held' then return {'held', tonumber(r[3]), r[5], redis.call('PTTL', KEYS[1])} end
local left = tonumber(r[4]) - now
-- A due inquiry on a route that no longer inquires is a lapsed lease.
if r[2] == 'inquiring' and (left > 0 or ARGV[4] == '2') then return {'inquiring', tonumber(r[3]), math.max(left, 0), redis.call('PTTL', KEYS[1])} end
if left > 0 then return {'in_flight', tonumber(r[3]), left, redis.call('PTTL', KEYS[1])} end
if ARGV[4] == '2' then
  -- Reckoned from the lapse, due `after` past it: until then the lapsed
  -- attempt's own answer (same token) may settle the key.
  local lapsed = tonumber(r[4])
  local due = math.max(lapsed + tonumber(ARGV[7]), now)
  redis.call('HSET', KEYS[1], 'state', 'inquiring', 'lease_until', due, 'asked', 0, 'since', lapsed, 'updated_at', now)
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
  scoped(KEYS[5], KEYS[1])
  redis.call('ZADD', KEYS[3], due, KEYS[1])
  inquiring(KEYS[4], KEYS[1])
  announce()
  return {'inquiring', tonumber(r[3]), due - now, redis.call('PTTL', KEYS[1])}
end
redis.call('ZREM', KEYS[3], KEYS[1])
redis.call('ZREM', KEYS[4], KEYS[1])
redis.call('HDEL', KEYS[1], 'asked', 'since')
if ARGV[4] == '1' then
  local token = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'state', 'in_flight', 'token', token, 'attempt', ARGV[5], 'lease_until', now + tonumber(ARGV[2]), 'updated_at', now)
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  scoped(KEYS[5], KEYS[1])
  return {'takeover', token}
end
redis.call('HSET', KEYS[1], 'state', 'held', 'held_reason', 'lease_lapsed', 'updated_at', now)
redis.call('HDEL', KEYS[1], 'lease_until')
if r[2] == 'in_flight' then announce() end
return {'held', tonumber(r[3]), 'lease_lapsed', redis.call('PTTL', KEYS[1])}
"#
    ))
});

/// KEYS = record, due questions (then the inquiring records, unused, and
/// a scoped record's scope set); ARGV = token, lease ms (then the
/// wake-up pair, unused). `transitions::write_applies(Renew)`. A lease
/// renewed shorter than it was (a reload lowered the route's `lease`)
/// moves the record's due question, if it has one, to its new end: the
/// inquirer must find it lapsed then. (A longer one is found due at the
/// old end and put off to the new one by the take.)
pub(super) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{SCOPED}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'token', 'state')
if r[1] ~= ARGV[1] or r[2] ~= 'in_flight' then return 0 end
local ends = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lease_until', ends, 'updated_at', now)
local due = tonumber(redis.call('ZSCORE', KEYS[2], KEYS[1]) or '')
if due and due > ends then redis.call('ZADD', KEYS[2], ends, KEYS[1]) end
-- A live lease outlives retention: the key must not expire under it.
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
scoped(KEYS[4], KEYS[1])
return 1
"#
    ))
});

/// KEYS = record, due questions, inquiring records (and a scoped record's
/// scope set); ARGV = token, status, headers, body,
/// retention ms, wake-up channel, wake id.
/// `transitions::write_applies(Complete)`.
pub(super) static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{SCOPED}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'token', 'state', 'held_reason')
if r[1] ~= ARGV[1] then return 0 end
if not (r[2] == 'in_flight' or r[2] == 'completed' or r[2] == 'inquiring' or (r[2] == 'held' and r[3] == 'lease_lapsed')) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[2], 'headers', ARGV[3], 'body', ARGV[4], 'updated_at', now)
redis.call('HDEL', KEYS[1], 'lease_until', 'held_reason', 'asked', 'since')
redis.call('ZREM', KEYS[2], KEYS[1])
redis.call('ZREM', KEYS[3], KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
scoped(KEYS[4], KEYS[1])
if r[2] == 'in_flight' then announce() end
return 1
"#
    ))
});

/// KEYS = record, due questions, inquiring records (and a scoped record's
/// scope set); ARGV = token, wake-up channel, wake id.
/// `transitions::write_applies(Release)`.
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'token', 'state')
if r[1] ~= ARGV[1] or not (r[2] == 'in_flight' or r[2] == 'inquiring') then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], KEYS[1])
redis.call('ZREM', KEYS[3], KEYS[1])
if KEYS[4] then redis.call('ZREM', KEYS[4], KEYS[1]) end
announce()
return 1
"#
    ))
});

/// KEYS = record, due questions, inquiring records (and a scoped record's
/// scope set, which it leaves); ARGV = attempt id, wake-up channel, wake
/// id. `transitions::abandon_applies`.
pub(super) static ABANDON: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'attempt', 'state', 'held_reason')
if r[1] ~= ARGV[1] then return 0 end
if not (r[2] == 'in_flight' or r[2] == 'inquiring' or (r[2] == 'held' and r[3] == 'lease_lapsed')) then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], KEYS[1])
redis.call('ZREM', KEYS[3], KEYS[1])
if KEYS[4] then redis.call('ZREM', KEYS[4], KEYS[1]) end
if r[2] == 'in_flight' then announce() end
return 1
"#
    ))
});

/// KEYS = record, due questions, inquiring records (and a scoped record's
/// scope set); ARGV = token, reason, retention ms, wake-up channel, wake id.
/// `transitions::write_applies(Hold)`.
pub(super) static HOLD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{SCOPED}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'token', 'state')
if r[1] ~= ARGV[1] or not (r[2] == 'in_flight' or r[2] == 'held' or r[2] == 'inquiring') then return 0 end
redis.call('HSET', KEYS[1], 'state', 'held', 'held_reason', ARGV[2], 'updated_at', now)
redis.call('HDEL', KEYS[1], 'lease_until', 'asked', 'since')
redis.call('ZREM', KEYS[2], KEYS[1])
redis.call('ZREM', KEYS[3], KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
scoped(KEYS[4], KEYS[1])
if r[2] == 'in_flight' then announce() end
return 1
"#
    ))
});

/// KEYS = record. Read-only: the fields key administration shows, the
/// body's length, and the expiry as server time (ms).
pub(super) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'state', 'held_reason', 'token', 'created_at', 'updated_at', 'lease_until', 'status', 'asked', 'since')
if not r[1] then return false end
local ttl = redis.call('PTTL', KEYS[1])
return {r[1], r[2] or '', r[3], r[4] or '0', r[5] or '0', r[6] or '', r[7] or '', redis.call('HSTRLEN', KEYS[1], 'body'), now + math.max(ttl, 0), r[8] or '0', r[9] or ''}
"#
    ))
});

/// KEYS = record, due questions, inquiring records (and a scoped record's
/// scope set, which a deleted record leaves); ARGV = force (1/0), whether
/// completed records go too (1/0), wake-up channel, wake id.
/// Deletes a held record, an in-flight one whose lease lapsed and an
/// inquiring one past its `after` (asked, or due) (any of them with
/// force), and a completed one if asked: `transitions::clearable`
/// (completed: 0) and `transitions::deletable` (1).
pub(super) static CLEAR: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'state', 'lease_until', 'asked')
if not r[1] then return 0 end
if r[1] == 'in_flight' and ARGV[1] ~= '1' and tonumber(r[2]) > now then return 0 end
if r[1] == 'inquiring' and ARGV[1] ~= '1' and tonumber(r[3] or '0') == 0 and tonumber(r[2]) > now then return 0 end
if r[1] == 'completed' and ARGV[2] ~= '1' then return 0 end
local n = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], KEYS[1])
redis.call('ZREM', KEYS[3], KEYS[1])
if KEYS[4] then redis.call('ZREM', KEYS[4], KEYS[1]) end
if r[1] == 'in_flight' then announce() end
return n
"#
    ))
});

/// KEYS = record, due questions, inquiring records (and a scoped record's
/// scope set); ARGV = token, next question in ms, asked
/// (1/0), retention ms, wake-up channel, wake id.
/// `transitions::write_applies(Inquire)`: the record turns (or stays)
/// inquiring, due `next` from now, and lives at least `retention` more.
pub(super) static INQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{INQUIRING}{SCOPED}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'token', 'state', 'asked', 'since')
if r[1] ~= ARGV[1] or not (r[2] == 'in_flight' or r[2] == 'inquiring') then return 0 end
local asked, since = 0, now
if r[2] == 'inquiring' then asked, since = tonumber(r[3] or '0'), tonumber(r[4] or now) end
local due = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'state', 'inquiring', 'lease_until', due, 'asked', asked + tonumber(ARGV[3]), 'since', since, 'updated_at', now)
redis.call('ZADD', KEYS[2], due, KEYS[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
scoped(KEYS[4], KEYS[1])
inquiring(KEYS[3], KEYS[1])
if r[2] == 'in_flight' then announce() end
return 1
"#
    ))
});

/// Test builds only (`StoreAdmin::age`): KEYS = record, due questions,
/// inquiring records; ARGV = ms. Moves every instant of the record (its
/// fields, its scores in the route's sets, its TTL) that far into the
/// past; a record whose TTL that ends is deleted as its expiry would have
/// (its set entries left behind, as an expiry leaves them).
#[cfg(feature = "test-hooks")]
pub(super) static AGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{AGE_TTL}{}",
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local by = tonumber(ARGV[1])
for _, field in ipairs({'lease_until', 'created_at', 'updated_at', 'since'}) do
  local at = tonumber(redis.call('HGET', KEYS[1], field) or '')
  if at then redis.call('HSET', KEYS[1], field, at - by) end
end
for i = 2, 3 do
  local score = tonumber(redis.call('ZSCORE', KEYS[i], KEYS[1]) or '')
  if score and score ~= math.huge then redis.call('ZADD', KEYS[i], score - by, KEYS[1]) end
end
age_ttl(KEYS[1], by)
return 1
"#
    ))
});

/// Test builds only: `age_ttl(name, by)`, the key's TTL `by` ms shorter,
/// the key deleted if that ends it (as its expiry would have).
#[cfg(feature = "test-hooks")]
pub(super) const AGE_TTL: &str = "local function age_ttl(name, by)
  local ttl = redis.call('PTTL', name)
  if ttl >= 0 then
    if ttl <= by then redis.call('DEL', name) else redis.call('PEXPIRE', name, ttl - by) end
  end
end\n";
