//! The Redis store's request path: each [`Store`] operation is one Lua
//! script ([`super::scripts`]), fenced by token, run on a lane by
//! [`RedisStore::bounded`].
//!
//! With `[store] replicas = N`, the writes the guarantees rest on (a claim
//! that takes the key, a renewal, a record, a hold) are followed by `WAIT N
//! timeout` on the connection that wrote: a renewal, a record and a hold in
//! the same round
//! trip (pipelined: `WAIT` may not run inside a script), a claim once its
//! answer says it took the key (so replays, `409`s and `422`s never wait;
//! on a cluster, every claim pipelined with its `WAIT`, see the claim),
//! and fewer acknowledgements fail the operation as the store being
//! unavailable, so what the gateway acknowledged is on N replicas. The
//! write stays on the primary: a failed claim is then abandoned by its
//! attempt id (the lost-claims worker), a failed record write is retried
//! (the scripts accept their own earlier write), as after any store error.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use deadpool_redis::redis::{
    self, ErrorKind, FromRedisValue, RedisResult, Script, ScriptInvocation, ServerErrorKind, Value,
};
use http::StatusCode;

use super::RedisStore;
use super::conn::Conn;
use super::scripts::{ABANDON, CLAIM, COMPLETE, HOLD, INQUIRE, RELEASE, RENEW};
use crate::{
    AttemptId, Cas, Claim, ClaimRequest, HeldReason, RecordKey, Store, StoreError, StoredResponse,
    Token, UnknownOutcome, decode_headers, encode_headers, transitions,
};

/// A claim script's reply as a [`Claim`]; `limit`: how long after its
/// send the claim had to run (named in a `late` answer's error).
fn claim_outcome(reply: &[Value], limit: Duration) -> Result<Claim, StoreError> {
    let outcome = bytes(reply.first()).ok_or_else(|| corrupt("no outcome"))?;
    Ok(match &outcome[..] {
        b"claimed" | b"takeover" => Claim::Claimed {
            token: int(reply.get(1)).ok_or_else(|| corrupt("no token"))?,
            takeover: outcome == b"takeover",
        },
        b"mismatch" => Claim::Mismatch {
            expires_in: ms_left(reply.get(2)),
        },
        b"replay" => Claim::Replay(StoredResponse {
            status: int(reply.get(2))
                .and_then(|s| u16::try_from(s).ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or_else(|| corrupt("a bad status"))?,
            headers: decode_headers(&bytes(reply.get(3)).unwrap_or_default())
                .ok_or_else(|| corrupt("undecodable headers"))?,
            body: Bytes::from(bytes(reply.get(4)).unwrap_or_default()),
        }),
        b"held" => Claim::Held {
            reason: bytes(reply.get(2))
                .and_then(|r| HeldReason::parse(std::str::from_utf8(&r).ok()?))
                .ok_or_else(|| corrupt("an unknown held reason"))?,
            expires_in: ms_left(reply.get(3)),
        },
        b"in_flight" => Claim::InFlight {
            retry_after: ms_left(reply.get(2)),
            expires_in: ms_left(reply.get(3)),
        },
        b"inquiring" => Claim::Inquiring {
            retry_after: ms_left(reply.get(2)),
            expires_in: ms_left(reply.get(3)),
        },
        b"late" => {
            // Its caller gives up after [store] timeout, well before the
            // limit: an answer this caller still hears means the
            // server's clock runs ahead of this host's.
            let past = int(reply.get(1)).unwrap_or(0);
            return Err(StoreError::LateClaim(format!(
                "by Redis's clock the claim arrived {past} ms after the instant it had to run \
                 by ({} ms after it was sent, by this host's clock), and did nothing: is the \
                 server's clock ahead of this host's?",
                limit.as_millis()
            )));
        }
        other => {
            return Err(corrupt(&format!(
                "outcome {:?}",
                String::from_utf8_lossy(other)
            )));
        }
    })
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A duration from now to an instant, in ms: zero stays zero (an
/// instant now), where [`millis`] makes a TTL of at least 1 ms (`PEXPIRE
/// 0` would delete the key at once).
pub(crate) fn offset_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("redis script returned {what}"))
}

/// A script's count of ms (a time left) as a duration; a negative one
/// (a TTL Redis reports as none) as zero.
fn ms_left(v: Option<&Value>) -> Duration {
    Duration::from_millis(int(v).unwrap_or(0).max(0) as u64)
}

pub(super) fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

pub(super) fn bytes(v: Option<&Value>) -> Option<Vec<u8>> {
    match v? {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

fn cas(v: i64) -> Cas {
    if v == 1 { Cas::Applied } else { Cas::Fenced }
}

/// Run `invocation`; with `wait` (replicas, ms), `WAIT` after it in the
/// same round trip. The script's reply, and how many replicas
/// acknowledged (`None` without `wait`).
async fn invoke<T: FromRedisValue>(
    invocation: &ScriptInvocation<'_>,
    wait: Option<(u32, u64)>,
    conn: &mut Conn,
) -> RedisResult<(T, Option<i64>)> {
    let Some((replicas, ms)) = wait else {
        return Ok((invocation.invoke_async(conn).await?, None));
    };
    let mut pipe = redis::pipe();
    pipe.invoke_script(invocation)
        .cmd("WAIT")
        .arg(replicas)
        .arg(ms);
    // A pipeline does not load a script the server lacks: load it, again.
    let (reply, acked) = match pipe.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            invocation.load_async(conn).await?;
            pipe.query_async(conn).await?
        }
        sent => sent?,
    };
    Ok((reply, Some(acked)))
}

impl RedisStore {
    /// Fail a write the guarantees rest on when fewer replicas than
    /// `[store] replicas` acknowledged it.
    fn replicated(&self, acked: Option<i64>) -> Result<(), StoreError> {
        match (self.replicas, acked) {
            (Some((wanted, ms)), Some(acked)) if acked < i64::from(wanted) => {
                Err(StoreError::NotReplicated(format!(
                    "{acked} of the {wanted} replicas asked for ([store] replicas) acknowledged it within {ms} ms"
                )))
            }
            _ => Ok(()),
        }
    }

    /// A fenced transition; `waits`: one the guarantees rest on, followed
    /// by `WAIT` with `[store] replicas`.
    async fn cas_script(
        &self,
        script: &Script,
        key: &RecordKey,
        args: &[&[u8]],
        waits: bool,
    ) -> Result<Cas, StoreError> {
        let record = self.layout.record_key(key);
        let sets = self.layout.sets(key);
        let wake = self.wake_args(key);
        // Every transition may move the record in its route's due
        // questions and (all but the renewal, which ignores KEYS[3]) its
        // inquiring records.
        let mut invocation = script.key(&record[..]);
        invocation.key(&sets.due).key(&sets.inquiring);
        // A scoped record's scope set: the TTLs it extends keep its entry.
        if let Some(scope) = self.layout.scope_set(key) {
            invocation.key(scope);
        }
        for a in args {
            invocation.arg(*a);
        }
        invocation.arg(&wake.0).arg(&wake.1);
        let (invocation, wait) = (&invocation, self.replicas.filter(|_| waits));
        let (n, acked): (i64, _) = self
            .bounded(|mut conn| async move { invoke(invocation, wait, &mut conn).await })
            .await?;
        self.replicated(acked)?;
        Ok(cas(n))
    }
}

#[async_trait::async_trait]
impl Store for RedisStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let record = self.layout.record_key(req.key);
        let token_key = self.layout.token_key(req.key);
        let wake = self.wake_args(req.key);
        let wake = &wake;
        let sets = self.layout.sets(req.key);
        let lapsed = match req.on_unknown_outcome {
            UnknownOutcome::Release => "1",
            UnknownOutcome::Hold => "0",
            UnknownOutcome::Inquire => "2",
        };
        // Compared with the server's clock: a claim that reaches the server
        // later (queued behind other scripts' WAITs, or a paused server)
        // writes nothing.
        let limit = transitions::claim_write_limit(req.lease, self.timeout);
        let write_by = SystemTime::now() + limit;
        let write_by = write_by
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        let mut invocation = CLAIM.key(&record[..]);
        invocation
            .key(token_key)
            .key(&sets.due)
            .key(&sets.inquiring)
            .arg(&req.fingerprint[..])
            .arg(millis(req.lease))
            .arg(millis(req.retention))
            .arg(lapsed)
            .arg(req.attempt)
            .arg(write_by.to_string())
            .arg(offset_millis(req.inquire_after))
            .arg(&wake.0)
            .arg(&wake.1);
        if let Some(scope) = self.layout.scope_set(req.key) {
            invocation.key(scope);
        }
        let (invocation, wait) = (&invocation, self.replicas);
        let (reply, acked): (Vec<Value>, _) = self
            .bounded(|mut conn| async move {
                if let (Conn::Cluster(_), Some(_)) = (&conn, wait) {
                    // On a cluster the WAIT rides with the script: sent
                    // alone it could reach another node or connection than
                    // the write (the cluster client re-sends a command to
                    // any node when its own is gone), which would count
                    // nothing pending and acknowledge at once. A pipeline
                    // goes, and is re-sent, whole, to one connection; so
                    // on a cluster every claim waits, replays included.
                    let (reply, acked): (Vec<Value>, _) =
                        invoke(invocation, wait, &mut conn).await?;
                    let took = matches!(
                        bytes(reply.first()).as_deref(),
                        Some(b"claimed" | b"takeover")
                    );
                    return Ok((reply, acked.filter(|_| took)));
                }
                let reply: Vec<Value> = invocation.invoke_async(&mut conn).await?;
                // Only a claim that took the key wrote what G1 rests on:
                // it alone waits, on the connection that wrote (a replay,
                // a 409 or a 422 never holds a lane for the replicas).
                let took = matches!(
                    bytes(reply.first()).as_deref(),
                    Some(b"claimed" | b"takeover")
                );
                let acked = match wait {
                    Some((replicas, ms)) if took => Some(
                        redis::cmd("WAIT")
                            .arg(replicas)
                            .arg(ms)
                            .query_async::<i64>(&mut conn)
                            .await?,
                    ),
                    _ => None,
                };
                Ok((reply, acked))
            })
            .await?;
        self.replicated(acked)?;
        claim_outcome(&reply, limit)
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: Token,
        lease: Duration,
    ) -> Result<Cas, StoreError> {
        let (token, lease) = (token.to_string(), millis(lease).to_string());
        // G7 rests on it: a renewal a failover lost would let the new
        // primary's lease lapse under a live attempt (on a `release` route,
        // taken over and executed again). `WAIT` does not make the replicas
        // take it, it tells whether they did: one they did not is applied
        // on the primary, reported as failed, and the next one tries again.
        self.cas_script(&RENEW, key, &[token.as_bytes(), lease.as_bytes()], true)
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
        self.cas_script(&COMPLETE, key, &args, true).await
    }

    async fn release(&self, key: &RecordKey, token: Token) -> Result<Cas, StoreError> {
        let token = token.to_string();
        self.cas_script(&RELEASE, key, &[token.as_bytes()], false)
            .await
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
        self.cas_script(&HOLD, key, &args, true).await
    }

    async fn inquire(
        &self,
        key: &RecordKey,
        token: Token,
        next: Duration,
        asked: bool,
        retention: Duration,
    ) -> Result<Cas, StoreError> {
        let (token, next) = (token.to_string(), offset_millis(next).to_string());
        let retention = millis(retention).to_string();
        let asked = if asked { "1" } else { "0" };
        let args: [&[u8]; 4] = [
            token.as_bytes(),
            next.as_bytes(),
            asked.as_bytes(),
            retention.as_bytes(),
        ];
        self.cas_script(&INQUIRE, key, &args, false).await
    }

    async fn abandon(&self, key: &RecordKey, attempt: AttemptId) -> Result<Cas, StoreError> {
        let attempt = attempt.to_string();
        self.cas_script(&ABANDON, key, &[attempt.as_bytes()], false)
            .await
    }
}
