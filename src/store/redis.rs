//! The Redis store (`redis://`), on deadpool-redis. Every transition is one
//! Lua script, so it is atomic on the server; each is fenced by the same
//! token rules as the PostgreSQL store, and reads the clock with Redis's own
//! `TIME`, so every gateway instance agrees on leases.
//!
//! A record is one hash, `{prefix}rec:{len(route)}:{route}:{hex(scope)}:{key}`,
//! whose TTL is the retention; the lease is a field, separate from the TTL.
//! Tokens come from one counter, `{prefix}token`. Durability is whatever the
//! server's persistence gives: see the README's "Choosing a store".

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use bytes::Bytes;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self, Script, Value};
use deadpool_redis::{Config as PoolSettings, Connection, Pool, PoolConfig, Runtime, Timeouts};
use http::StatusCode;

use super::info::from_epoch_millis;
use super::{
    AttemptId, Cas, Claim, ClaimRequest, HeldReason, RecordInfo, RecordKey, RecordState, Store,
    StoreAdmin, StoreError, StoredResponse, Token, decode_headers, encode_headers, redact_url,
};
use super::{StoreConfig, UnknownOutcome};

/// Milliseconds since the epoch by the server's clock, as `now`.
const NOW: &str =
    "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)\n";

/// The claim: KEYS = record, token counter; ARGV = fingerprint, lease ms,
/// retention ms, release-lapsed (1/0), attempt id. Implements `transitions::claim`
/// (the record expires by its TTL, which a live lease extends: `transitions::expired`).
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'fp', 'state', 'token', 'lease_until', 'held_reason', 'status', 'headers', 'body')
if not r[2] then
  local token = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'state', 'in_flight', 'token', token, 'attempt', ARGV[5],
             'lease_until', now + tonumber(ARGV[2]), 'created_at', now, 'updated_at', now)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'claimed', token}
end
if r[1] ~= ARGV[1] then return {'mismatch'} end
if r[2] == 'completed' then return {'replay', tonumber(r[3]), tonumber(r[6]), r[7], r[8]} end
if r[2] == 'held' then return {'held', tonumber(r[3]), r[5]} end
local left = tonumber(r[4]) - now
if left > 0 then return {'in_flight', tonumber(r[3]), left} end
if ARGV[4] == '1' then
  local token = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], 'token', token, 'attempt', ARGV[5], 'lease_until', now + tonumber(ARGV[2]), 'updated_at', now)
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return {'takeover', token}
end
redis.call('HSET', KEYS[1], 'state', 'held', 'held_reason', 'lease_lapsed', 'updated_at', now)
redis.call('HDEL', KEYS[1], 'lease_until')
return {'held', tonumber(r[3]), 'lease_lapsed'}
"#
    ))
});

/// KEYS = record; ARGV = token, lease ms. `transitions::write_applies(Renew)`.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'token', 'state')
if r[1] ~= ARGV[1] or r[2] ~= 'in_flight' then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[2]), 'updated_at', now)
-- A live lease outlives retention: the key must not expire under it.
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"#
    ))
});

/// KEYS = record; ARGV = token, status, headers, body, retention ms.
/// `transitions::write_applies(Complete)`.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'token', 'state', 'held_reason')
if r[1] ~= ARGV[1] then return 0 end
if not (r[2] == 'in_flight' or r[2] == 'completed' or (r[2] == 'held' and r[3] == 'lease_lapsed')) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[2], 'headers', ARGV[3], 'body', ARGV[4], 'updated_at', now)
redis.call('HDEL', KEYS[1], 'lease_until', 'held_reason')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"#
    ))
});

/// KEYS = record; ARGV = token. `transitions::write_applies(Release)`.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local r = redis.call('HMGET', KEYS[1], 'token', 'state')
if r[1] ~= ARGV[1] or r[2] ~= 'in_flight' then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#,
    )
});

/// KEYS = record; ARGV = attempt id. `transitions::abandon_applies`.
static ABANDON: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local r = redis.call('HMGET', KEYS[1], 'attempt', 'state', 'held_reason')
if r[1] ~= ARGV[1] then return 0 end
if not (r[2] == 'in_flight' or (r[2] == 'held' and r[3] == 'lease_lapsed')) then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#,
    )
});

/// KEYS = record; ARGV = token, reason, retention ms. `transitions::write_applies(Hold)`.
static HOLD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'token', 'state')
if r[1] ~= ARGV[1] or not (r[2] == 'in_flight' or r[2] == 'held') then return 0 end
redis.call('HSET', KEYS[1], 'state', 'held', 'held_reason', ARGV[2], 'updated_at', now)
redis.call('HDEL', KEYS[1], 'lease_until')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"#
    ))
});

/// KEYS = record. Read-only: the fields key administration shows, the
/// body's length, and the expiry as server time (ms).
static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'state', 'held_reason', 'token', 'created_at', 'updated_at', 'lease_until', 'status')
if not r[1] then return false end
local ttl = redis.call('PTTL', KEYS[1])
return {r[1], r[2] or '', r[3], r[4] or '0', r[5] or '0', r[6] or '', r[7] or '', redis.call('HSTRLEN', KEYS[1], 'body'), now + math.max(ttl, 0)}
"#
    ))
});

/// KEYS = record; ARGV = force (1/0), whether completed records go too (1/0).
/// Deletes a held record, an in-flight one whose lease lapsed (or any
/// in-flight one with force), and a completed one if asked:
/// `transitions::clearable` (completed: 0) and `transitions::deletable` (1).
static CLEAR: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NOW}{}",
        r#"
local r = redis.call('HMGET', KEYS[1], 'state', 'lease_until')
if not r[1] then return 0 end
if r[1] == 'in_flight' and ARGV[1] ~= '1' and tonumber(r[2]) > now then return 0 end
if r[1] == 'completed' and ARGV[2] ~= '1' then return 0 end
return redis.call('DEL', KEYS[1])
"#
    ))
});

/// A Redis-backed [`Store`].
pub struct RedisStore {
    pool: Pool,
    lanes: Lanes,
    prefix: String,
    timeout: Duration,
}

/// `pool_size` multiplexed connections, each carrying many concurrent
/// operations (pipelined by the redis crate), used round-robin.
///
/// deadpool-redis recycles a connection on every `get()` with an `UNWATCH` +
/// `PING` round trip, which doubled the round trips of every operation. A
/// lane instead keeps its connection (made by the pool, then taken out of
/// it) until an operation fails at the transport or times out; then every
/// lane forgets its connection, and the next operation on a lane makes a
/// new one.
struct Lanes {
    /// Each lane's connection and the generation it was opened in.
    slots: Vec<Mutex<Option<(MultiplexedConnection, u64)>>>,
    /// Bumped by each reset; a failure resets only if its connection is of
    /// the current generation, so the late failures of connections already
    /// forgotten cannot throw away their replacements.
    generation: AtomicU64,
    /// One connect at a time per lane: after a reset, the operations that
    /// find a lane empty wait for its one new connection instead of each
    /// opening their own (at most `pool_size` connects, however many
    /// requests are in flight).
    connecting: Vec<tokio::sync::Mutex<()>>,
    next: AtomicUsize,
}

impl Lanes {
    fn new(count: usize) -> Self {
        let count = count.max(1);
        Self {
            slots: (0..count).map(|_| Mutex::new(None)).collect(),
            connecting: (0..count).map(|_| tokio::sync::Mutex::new(())).collect(),
            generation: AtomicU64::new(0),
            next: AtomicUsize::new(0),
        }
    }

    /// The next lane, its connection if it has one, and the generation an
    /// operation on it belongs to.
    fn pick(&self) -> (usize, Option<MultiplexedConnection>, u64) {
        let lane = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        match self.slot(lane).clone() {
            Some((conn, generation)) => (lane, Some(conn), generation),
            None => (lane, None, self.generation.load(Ordering::SeqCst)),
        }
    }

    fn slot(&self, lane: usize) -> std::sync::MutexGuard<'_, Option<(MultiplexedConnection, u64)>> {
        // A panic while holding this lock cannot leave the Option invalid.
        self.slots[lane]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forget every lane's connection: when one breaks at the transport
    /// (the server restarted, the network dropped), the others almost
    /// certainly did too, and each would otherwise fail one operation before
    /// being replaced.
    fn reset(&self, failed: u64) {
        let current = self.generation.load(Ordering::SeqCst);
        if failed != current
            || self
                .generation
                .compare_exchange(current, current + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return; // already reset since that connection was opened
        }
        for lane in 0..self.slots.len() {
            let mut slot = self.slot(lane);
            if slot.as_ref().is_some_and(|(_, g)| *g <= current) {
                *slot = None;
            }
        }
    }

    fn open(&self) -> usize {
        (0..self.slots.len())
            .filter(|&lane| self.slot(lane).is_some())
            .count()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("redis script returned {what}"))
}

fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn bytes(v: Option<&Value>) -> Option<Vec<u8>> {
    match v? {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

/// Keep the `limit` least recently changed records, oldest first.
fn least_recent_first(found: &mut Vec<RecordInfo>, limit: usize) {
    found.sort_by_key(|info| info.updated_at);
    found.truncate(limit);
}

fn cas(v: i64) -> Cas {
    if v == 1 { Cas::Applied } else { Cas::Fenced }
}

impl RedisStore {
    /// Connect (and check the server answers), failing with a clear message.
    pub async fn connect(config: &StoreConfig) -> Result<Self, StoreError> {
        let shown = redact_url(&config.url);
        let mut settings = PoolSettings::from_url(config.url.clone());
        settings.pool = Some(PoolConfig {
            max_size: config.pool_size as usize,
            timeouts: Timeouts {
                wait: Some(config.timeout),
                create: Some(config.timeout),
                recycle: Some(config.timeout),
            },
            ..PoolConfig::default()
        });
        let pool = settings
            .create_pool(Some(Runtime::Tokio1))
            .map_err(|e| StoreError::Unavailable(format!("invalid store URL {shown}: {e}")))?;
        let store = Self {
            pool,
            lanes: Lanes::new(config.pool_size as usize),
            prefix: config.prefix.clone(),
            timeout: config.timeout,
        };
        store.ping().await.map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot reach store at {shown}: {e}; start Redis or point [store] url at a reachable server"
            ))
        })?;
        Ok(store)
    }

    fn record_key(&self, key: &RecordKey) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.route.len() + key.key.len() + 80);
        k.extend_from_slice(self.prefix.as_bytes());
        k.extend_from_slice(
            format!(
                "rec:{}:{}:{}:",
                key.route.len(),
                key.route,
                hex::encode(&key.scope)
            )
            .as_bytes(),
        );
        k.extend_from_slice(key.key.as_bytes());
        k
    }

    /// The prefix of every record key of one route.
    fn route_prefix(&self, route: &str) -> Vec<u8> {
        format!("{}rec:{}:{}:", self.prefix, route.len(), route).into_bytes()
    }

    /// The [`RecordKey`] a Redis key of `route` stands for.
    fn parse_record_key(&self, route: &str, redis_key: &[u8]) -> Option<RecordKey> {
        let rest = redis_key.strip_prefix(&self.route_prefix(route)[..])?;
        let colon = rest.iter().position(|b| *b == b':')?;
        Some(RecordKey {
            route: route.to_string(),
            scope: hex::decode(&rest[..colon]).ok()?,
            key: String::from_utf8(rest[colon + 1..].to_vec()).ok()?,
        })
    }

    async fn clear_script(
        &self,
        key: &RecordKey,
        force: bool,
        completed_too: bool,
    ) -> Result<bool, StoreError> {
        let record = self.record_key(key);
        let flag = |b: bool| if b { "1" } else { "0" };
        let n: i64 = self
            .bounded(|mut conn| async move {
                CLEAR
                    .key(&record[..])
                    .arg(flag(force))
                    .arg(flag(completed_too))
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(n == 1)
    }

    fn token_key(&self) -> String {
        format!("{}token", self.prefix)
    }

    /// The lane's connection, opened (through the pool) if it has none. Only
    /// one operation per lane connects; the others wait and share it.
    async fn open_lane(&self, lane: usize) -> Result<(MultiplexedConnection, u64), StoreError> {
        let _turn = self.lanes.connecting[lane].lock().await;
        if let Some(opened) = self.lanes.slot(lane).clone() {
            return Ok(opened);
        }
        let generation = self.lanes.generation.load(Ordering::SeqCst);
        let conn = Connection::take(
            self.pool
                .get()
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?,
        );
        *self.lanes.slot(lane) = Some((conn.clone(), generation));
        Ok((conn, generation))
    }

    /// Run `op` on a lane's connection, bounded by `[store] timeout`. A
    /// connection that fails or does not answer in time is dropped from its
    /// lane (a half-open TCP connection would otherwise time out forever).
    async fn bounded<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let (lane, conn, picked) = self.lanes.pick();
        // The generation of the connection the operation ends up on.
        let generation = AtomicU64::new(picked);
        let work = async {
            let conn = match conn {
                Some(conn) => conn,
                None => {
                    let (conn, opened) = self.open_lane(lane).await?;
                    generation.store(opened, Ordering::Relaxed);
                    conn
                }
            };
            op(conn).await.map_err(|e| {
                if !matches!(e.kind(), redis::ErrorKind::Server(_)) {
                    self.lanes.reset(generation.load(Ordering::Relaxed));
                }
                StoreError::Unavailable(e.to_string())
            })
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => {
                self.lanes.reset(generation.load(Ordering::Relaxed));
                Err(StoreError::Unavailable(format!(
                    "no answer within {:?}",
                    self.timeout
                )))
            }
        }
    }

    async fn cas_script(
        &self,
        script: &Script,
        key: &RecordKey,
        args: &[&[u8]],
    ) -> Result<Cas, StoreError> {
        let record = self.record_key(key);
        let n: i64 = self
            .bounded(|mut conn| async move {
                let mut invocation = script.key(&record[..]);
                for a in args {
                    invocation.arg(*a);
                }
                invocation.invoke_async(&mut conn).await
            })
            .await?;
        Ok(cas(n))
    }
}

#[async_trait::async_trait]
impl Store for RedisStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let record = self.record_key(req.key);
        let token_key = self.token_key();
        let release = if req.on_unknown_outcome == UnknownOutcome::Release {
            "1"
        } else {
            "0"
        };
        let reply: Vec<Value> = self
            .bounded(|mut conn| async move {
                CLAIM
                    .key(&record[..])
                    .key(token_key)
                    .arg(&req.fingerprint[..])
                    .arg(millis(req.lease))
                    .arg(millis(req.retention))
                    .arg(release)
                    .arg(req.attempt)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        let outcome = bytes(reply.first()).ok_or_else(|| corrupt("no outcome"))?;
        Ok(match &outcome[..] {
            b"claimed" | b"takeover" => Claim::Claimed {
                token: int(reply.get(1)).ok_or_else(|| corrupt("no token"))?,
                takeover: outcome == b"takeover",
            },
            b"mismatch" => Claim::Mismatch,
            b"replay" => Claim::Replay(StoredResponse {
                status: int(reply.get(2))
                    .and_then(|s| u16::try_from(s).ok())
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .ok_or_else(|| corrupt("a bad status"))?,
                headers: decode_headers(&bytes(reply.get(3)).unwrap_or_default())
                    .ok_or_else(|| corrupt("undecodable headers"))?,
                body: Bytes::from(bytes(reply.get(4)).unwrap_or_default()),
            }),
            b"held" => Claim::Held(
                bytes(reply.get(2))
                    .and_then(|r| HeldReason::parse(std::str::from_utf8(&r).ok()?))
                    .ok_or_else(|| corrupt("an unknown held reason"))?,
            ),
            b"in_flight" => Claim::InFlight {
                retry_after: Duration::from_millis(int(reply.get(2)).unwrap_or(0).max(0) as u64),
            },
            other => {
                return Err(corrupt(&format!(
                    "outcome {:?}",
                    String::from_utf8_lossy(other)
                )));
            }
        })
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        let (token, lease) = (token.to_string(), millis(lease).to_string());
        self.cas_script(&RENEW, key, &[token.as_bytes(), lease.as_bytes()])
            .await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: Token,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let token = token.to_string();
        let status = response.status.as_u16().to_string();
        let headers = encode_headers(&response.headers);
        let retention = millis(retention).to_string();
        let args: [&[u8]; 5] = [
            token.as_bytes(),
            status.as_bytes(),
            &headers,
            &response.body,
            retention.as_bytes(),
        ];
        self.cas_script(&COMPLETE, key, &args).await
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        let token = token.to_string();
        self.cas_script(&RELEASE, key, &[token.as_bytes()]).await
    }

    async fn hold(
        &self,
        key: &RecordKey,
        token: Token,
        reason: HeldReason,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let (token, retention) = (token.to_string(), millis(retention).to_string());
        let args: [&[u8]; 3] = [
            token.as_bytes(),
            reason.as_str().as_bytes(),
            retention.as_bytes(),
        ];
        self.cas_script(&HOLD, key, &args).await
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        let attempt = attempt.to_string();
        self.cas_script(&ABANDON, key, &[attempt.as_bytes()]).await
    }
}

#[async_trait::async_trait]
impl StoreAdmin for RedisStore {
    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        let record = self.record_key(key);
        let reply: Option<Vec<Value>> = self
            .bounded(
                |mut conn| async move { INSPECT.key(&record[..]).invoke_async(&mut conn).await },
            )
            .await?;
        let Some(f) = reply else {
            return Ok(None);
        };
        let text = |i: usize| {
            bytes(f.get(i))
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_default()
        };
        let state = text(0);
        let held = text(1);
        let lease = int(f.get(5)).map(from_epoch_millis);
        let status = int(f.get(6)).and_then(|s| u16::try_from(s).ok());
        let completed = state == "completed";
        RecordInfo::from_parts(
            key,
            &state,
            (!held.is_empty()).then_some(held.as_str()),
            int(f.get(2)).unwrap_or(0),
            [int(f.get(3)), int(f.get(4)), int(f.get(8))]
                .map(|t| from_epoch_millis(t.unwrap_or(0))),
            lease.filter(|_| state == "in_flight"),
            status.filter(|_| completed),
            int(f.get(7))
                .and_then(|n| u64::try_from(n).ok())
                .filter(|_| completed),
        )
        .map(Some)
        .ok_or_else(|| corrupt(&format!("a record in unknown state {state:?}")))
    }

    async fn list(
        &self,
        route: &str,
        state: RecordState,
        limit: usize,
    ) -> Result<Vec<RecordInfo>, StoreError> {
        // Glob-escape the route: the pattern must match it literally.
        let mut pattern = Vec::new();
        for b in self.route_prefix(route) {
            if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
                pattern.push(b'\\');
            }
            pattern.push(b);
        }
        pattern.push(b'*');
        // The whole route is scanned: the least recently changed records may
        // be anywhere in it. At most 2 × limit are kept in memory.
        let mut found = Vec::new();
        let mut cursor = 0u64;
        loop {
            let pattern = pattern.clone();
            let (next, keys): (u64, Vec<Vec<u8>>) = self
                .bounded(|mut conn| async move {
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(&mut conn)
                        .await
                })
                .await?;
            for redis_key in keys {
                let Some(key) = self.parse_record_key(route, &redis_key) else {
                    continue;
                };
                if let Some(info) = self.inspect(&key).await?
                    && info.state == state
                {
                    found.push(info);
                    if found.len() > limit.saturating_mul(2).max(64) {
                        least_recent_first(&mut found, limit);
                    }
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        least_recent_first(&mut found, limit);
        Ok(found)
    }

    async fn clear(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        self.clear_script(key, force, false).await
    }

    async fn delete(&self, key: &RecordKey, force: bool) -> Result<bool, StoreError> {
        self.clear_script(key, force, true).await
    }

    async fn sweep(&self, _batch: usize) -> Result<u64, StoreError> {
        // Retention is the keys' TTL: Redis expires records by itself.
        Ok(0)
    }

    fn pool_stats(&self) -> Option<super::PoolStats> {
        // Multiplexed: an open connection is never busy, so all are idle.
        let open = self.lanes.open() as u64;
        Some(super::PoolStats {
            connections: open,
            idle: open,
            max: self.lanes.slots.len() as u64,
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(
            |mut conn| async move { redis::cmd("PING").query_async::<String>(&mut conn).await },
        )
        .await
        .map(|_| ())
    }
}
