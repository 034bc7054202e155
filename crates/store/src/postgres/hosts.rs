//! Several PostgreSQL hosts, and the one to write to: libpq's multi-host
//! URL, `postgres://user@h1:5432,h2:5433/db?target_session_attrs=read-write`.
//!
//! A connection goes to the first host that accepts it and, unless
//! `target_session_attrs=any`, takes writes: with `read-write` (the
//! default when several hosts are named) one whose sessions are not
//! read-only, with `primary` one not in recovery. Hosts are tried in the
//! URL's order, starting from the one that served last, each within its
//! share of `[store] timeout`. A standby is never written to: it is
//! skipped when connecting, and a statement it refuses as read-only ends
//! its connection ([`super::pool`]), so the pool looks for the writable
//! host again. When no host qualifies, connecting fails at once for a
//! while that doubles from 50 ms to 1 s (requests fail closed meanwhile,
//! or as the route's `on_store_error` says), so a failover is not met by
//! a storm of connection attempts.

use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use tokio::time::Instant;

/// The shortest and longest pause after every host failed.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

/// What a host must be to take connections (`target_session_attrs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// Whatever answers (`any`).
    Any,
    /// Sessions are not read-only (`read-write`).
    ReadWrite,
    /// Not in recovery (`primary`).
    Primary,
}

/// The hosts of a store URL and which one served last.
pub(super) struct Hosts {
    /// Each host (as logs show it) and its connection options.
    candidates: Vec<(String, PgConnectOptions)>,
    target: Target,
    /// The host tried first: the last that qualified.
    current: AtomicUsize,
    /// After every host failed: not before this, and the next pause.
    backoff: Mutex<Option<(Instant, Duration, String)>>,
    /// Bumped when a pool of these hosts sees a current connection's
    /// session end: every pool (the shared one and each serving thread's)
    /// reuses no connection opened in an earlier generation.
    generation: AtomicU64,
}

/// Not derived: the connection options hold the password.
impl std::fmt::Debug for Hosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<&str> = self.candidates.iter().map(|(h, _)| h.as_str()).collect();
        f.debug_struct("Hosts")
            .field("hosts", &hosts)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Hosts {
    /// The hosts of `url`, each with `adjust` applied to its options.
    pub(super) fn parse(
        url: &str,
        adjust: impl Fn(PgConnectOptions) -> PgConnectOptions,
    ) -> Result<Self, String> {
        let split = split(url)?;
        let candidates = split
            .hosts
            .iter()
            .map(|host| {
                let one = format!("{}{}{host}{}", split.scheme, split.userinfo, split.rest);
                PgConnectOptions::from_str(&one)
                    .map(|options| (host.clone(), adjust(options)))
                    .map_err(|e| format!("host {host}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            candidates,
            target: split.target,
            current: AtomicUsize::new(0),
            backoff: Mutex::new(None),
            generation: AtomicU64::new(0),
        })
    }

    /// The options of host `i` ([`Self::serving`]: the host that served
    /// last, the first at start).
    pub(super) fn options(&self, i: usize) -> &PgConnectOptions {
        &self.candidates[i].1
    }

    /// Which host served last (an index into the URL's hosts): it changes
    /// when connections go to another host.
    pub(super) fn serving(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// Whether the URL names more than one host.
    pub(super) fn several(&self) -> bool {
        self.candidates.len() > 1
    }

    /// The generation a connection opened now belongs to.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A connection of generation `seen` found its session ended (a
    /// restart, a failover, a host that stopped taking writes): the
    /// connections opened so far are not to be reused. Only the first
    /// such report of a generation starts a new one, so connections
    /// failing one after another do not keep discarding new ones.
    pub(super) fn reset(&self, seen: u64) {
        let _ =
            self.generation
                .compare_exchange(seen, seen + 1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// A connection to a host that qualifies, `timeout` in all. With one
    /// host, its own error; with several, one that names what each said.
    pub(super) async fn connect(&self, timeout: Duration) -> Result<PgConnection, sqlx::Error> {
        let n = self.candidates.len();
        if n == 1 {
            return self.qualify(&self.candidates[0].1).await;
        }
        if let Some((until, _, why)) = &*self.backoff.lock().expect("never poisoned")
            && Instant::now() < *until
        {
            return Err(failed(why.clone()));
        }
        let share = timeout / n as u32;
        let first = self.current.load(Ordering::Relaxed);
        let mut said = Vec::with_capacity(n);
        for i in (0..n).map(|k| (first + k) % n) {
            let (host, options) = &self.candidates[i];
            match tokio::time::timeout(share, self.qualify(options)).await {
                Ok(Ok(conn)) => {
                    if i != first {
                        tracing::warn!(host = %host, was = %self.candidates[first].0, "store: now connecting to another PostgreSQL host");
                    }
                    self.current.store(i, Ordering::Relaxed);
                    *self.backoff.lock().expect("never poisoned") = None;
                    return Ok(conn);
                }
                Ok(Err(e)) => said.push(format!("{host}: {e}")),
                Err(_) => said.push(format!("{host}: no connection within {share:?}")),
            }
        }
        let why = format!("no host to write to ({})", said.join("; "));
        let mut backoff = self.backoff.lock().expect("never poisoned");
        let pause = backoff.as_ref().map_or(BACKOFF.0, |(_, next, _)| *next);
        *backoff = Some((
            Instant::now() + pause,
            (pause * 2).min(BACKOFF.1),
            why.clone(),
        ));
        Err(failed(why))
    }

    /// Connect to one host and check it takes writes (when that is asked).
    async fn qualify(&self, options: &PgConnectOptions) -> Result<PgConnection, sqlx::Error> {
        let mut conn = PgConnection::connect_with(options).await?;
        if self.target == Target::Any {
            return Ok(conn);
        }
        let (recovery, read_only): (bool, String) =
            sqlx::query_as("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")
                .fetch_one(&mut conn)
                .await?;
        let refused = match self.target {
            Target::Primary if recovery => Some("in recovery (a standby)"),
            Target::ReadWrite if read_only == "on" => Some("read-only"),
            _ => None,
        };
        match refused {
            Some(why) => {
                let _ = conn.close().await;
                Err(failed(why.to_string()))
            }
            None => Ok(conn),
        }
    }
}

/// A connection failure of ours, as sqlx reports its own.
fn failed(why: String) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::other(why))
}

/// A store URL taken apart: its hosts, the rest, and the target.
#[derive(Debug, PartialEq)]
struct Split {
    /// `postgres://`
    scheme: String,
    /// `user:password@`, or nothing.
    userinfo: String,
    /// `host:port`, `host` or `[v6]:port`, in the URL's order.
    hosts: Vec<String>,
    /// `/db?…` without `target_session_attrs`.
    rest: String,
    target: Target,
}

/// Take `url` apart. With one host the target defaults to `any` (the URL
/// means that server, whatever it is); with several, to `read-write`.
fn split(url: &str) -> Result<Split, String> {
    let (scheme, after) = url
        .split_once("://")
        .ok_or("a PostgreSQL URL starts with postgres://")?;
    let end = after.find(['/', '?']).unwrap_or(after.len());
    let (authority, rest) = after.split_at(end);
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    let hosts: Vec<String> = hostlist.split(',').map(str::to_string).collect();
    // One host may be empty (`postgres:///db?host=/run/postgresql`).
    if hosts.len() > 1 && hosts.iter().any(String::is_empty) {
        return Err("an empty host in the host list (write host1:port1,host2:port2)".into());
    }
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut target = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => {
                target = Some(match value {
                    "any" => Target::Any,
                    "read-write" => Target::ReadWrite,
                    "primary" => Target::Primary,
                    other => {
                        return Err(format!(
                            "target_session_attrs={other} is not supported: idemgate writes, so use read-write or primary (or any)"
                        ));
                    }
                })
            }
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", kept.join("&"))
    };
    let default = if hosts.len() > 1 {
        Target::ReadWrite
    } else {
        Target::Any
    };
    Ok(Split {
        scheme: format!("{scheme}://"),
        userinfo: userinfo.to_string(),
        hosts,
        rest,
        target: target.unwrap_or(default),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_a_multi_host_url() {
        let s = split("postgres://u:p@h1:5432,h2:5433,[::1]:5434/db?sslmode=disable&target_session_attrs=primary&application_name=x").unwrap();
        assert_eq!(s.scheme, "postgres://");
        assert_eq!(s.userinfo, "u:p@");
        assert_eq!(s.hosts, ["h1:5432", "h2:5433", "[::1]:5434"]);
        assert_eq!(s.rest, "/db?sslmode=disable&application_name=x");
        assert_eq!(s.target, Target::Primary);
    }

    #[test]
    fn the_target_defaults_to_read_write_with_several_hosts_only() {
        assert_eq!(
            split("postgres://h1,h2/db").unwrap().target,
            Target::ReadWrite
        );
        assert_eq!(split("postgres://h1/db").unwrap().target, Target::Any);
        assert_eq!(split("postgres://h1").unwrap().rest, "");
        let any = split("postgresql://h1,h2?target_session_attrs=any").unwrap();
        assert_eq!((any.target, any.rest.as_str()), (Target::Any, ""));
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        let e = split("postgres://h1,h2/db?target_session_attrs=standby").unwrap_err();
        assert!(e.contains("read-write or primary"), "{e}");
        assert!(
            split("postgres://h1,,h2/db")
                .unwrap_err()
                .contains("empty host")
        );
        assert!(split("h1,h2/db").is_err());
        let socket = split("postgres:///db?host=/run/postgresql").unwrap();
        assert_eq!(
            (socket.hosts[0].as_str(), socket.rest.as_str()),
            ("", "/db?host=/run/postgresql")
        );
    }

    #[test]
    fn each_host_gets_the_whole_url_but_its_neighbours() {
        let hosts = Hosts::parse(
            "postgres://u:secret@h1:5432,h2:6543/db?sslmode=disable",
            |o| o,
        )
        .unwrap();
        let seen: Vec<_> = hosts
            .candidates
            .iter()
            .map(|(h, o)| {
                (
                    h.as_str(),
                    o.get_host().to_string(),
                    o.get_port(),
                    o.get_database().map(str::to_string),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("h1:5432", "h1".to_string(), 5432, Some("db".to_string())),
                ("h2:6543", "h2".to_string(), 6543, Some("db".to_string())),
            ]
        );
        assert!(hosts.several());
        assert_eq!(
            crate::redact_url("postgres://u:secret@h1:5432,h2:6543/db"),
            "postgres://u:***@h1:5432,h2:6543/db"
        );
    }
}
