//! Key administration, shared by the CLI (`idemgate keys …`) and the
//! admin listener (`POST /keys`): show, list, release and delete records,
//! found by route, scope value and key exactly as the gateway finds them,
//! and rendered for a person (or as JSON).
//!
//! [`KeyCommand`] is the wire type of `POST /keys`. It is not the CLI's
//! clap type (`cli::KeysCommand`), so renaming a flag cannot change the
//! admin API; the CLI converts one into the other.

use std::fmt::Write as _;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::request::key_source::{self, KeyOfValuesError};
use crate::store::{RecordInfo, RecordKey, RecordState, Store, StoreAdmin, StoreError};

mod erase;

pub use erase::SCOPE_DIGEST_PATTERN;

/// A key administration command, as `POST /keys` carries it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyCommand {
    /// One key's record.
    Show(KeyTarget),
    /// A route's keys in one state, least recently changed first.
    List(ListQuery),
    /// Clear a held or in-flight key so the next request with it is forwarded.
    Release(KeyTarget),
    /// Forget a key in any state (a recorded response too).
    Delete(KeyTarget),
    /// Forget every record of one scope, on every route that reads one.
    Erase(EraseTarget),
}

impl KeyCommand {
    /// Whether the answer is JSON (`show` and `list` with `json`)
    /// rather than text (release and delete always answer a sentence).
    pub fn wants_json(&self) -> bool {
        match self {
            Self::Show(t) => t.json,
            Self::List(q) => q.json,
            Self::Release(_) | Self::Delete(_) | Self::Erase(_) => false,
        }
    }
}

/// Which key, and how to answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyTarget {
    /// The route's name.
    pub route: String,
    /// The scope: one value per `scope_from` part, in order (the
    /// `scope_header` value); none: the anonymous scope. One value travels
    /// as a string, as before composite scopes, so that a CLI and a
    /// gateway one version apart still understand each other.
    #[serde(default, with = "one_or_many", skip_serializing_if = "Vec::is_empty")]
    pub scope: Vec<String>,
    /// The key, bare or quoted as clients send it, on a route that reads
    /// its key from one part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The key as one value per `key_from` part, in order (a composite key).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<String>,
    /// Answer with JSON instead of text.
    #[serde(default)]
    pub json: bool,
    /// release/delete: also remove an in-flight key whose lease is live.
    #[serde(default)]
    pub force: bool,
}

/// Which scope to erase: its values, as `scope` of [`KeyTarget`] (the
/// digest computed per route, as the gateway computes it), or its digest
/// as `keys show` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EraseTarget {
    /// The scope: one value per `scope_from` part, in order; one value
    /// travels as a string.
    #[serde(default, with = "one_or_many", skip_serializing_if = "Vec::is_empty")]
    pub scope: Vec<String>,
    /// Or the scope's SHA-256 digest: 64 hex digits, `sha256:` before
    /// them allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_digest: Option<String>,
    /// Also remove records the upstream may still be working on (a live
    /// lease, an inquiry inside its route's `after`).
    #[serde(default)]
    pub force: bool,
}

/// A list on the wire that is a plain string when it has one element.
mod one_or_many {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(values: &[String], s: S) -> Result<S::Ok, S::Error> {
        match values {
            [one] => one.serialize(s),
            many => many.serialize(s),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
        Null(()),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        Ok(match OneOrMany::deserialize(d)? {
            OneOrMany::One(one) => vec![one],
            OneOrMany::Many(many) => many,
            OneOrMany::Null(()) => Vec::new(),
        })
    }
}

/// Which records to list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// The route's name.
    pub route: String,
    /// Which state.
    pub state: RecordState,
    /// At most this many.
    pub limit: usize,
    /// Answer with one JSON array instead of a table.
    #[serde(default)]
    pub json: bool,
}

/// Why a keys command could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// The route is not in the configuration.
    #[error("no route named {0:?} in the configuration")]
    NoRoute(String),
    /// `--scope` on a route without `scope_from` (or `scope_header`).
    #[error("route {0:?} has no scope_from or scope_header, so --scope does not apply")]
    NoScope(String),
    /// The key is not a valid idempotency key.
    #[error("invalid key: {0}")]
    InvalidKey(#[from] KeyOfValuesError),
    /// A key given as one value on a route that reads several parts, or
    /// neither or both of the two forms.
    #[error("route {route:?} reads its key from {parts}: give one --part per part, in that order")]
    KeyParts {
        /// The route.
        route: String,
        /// Its parts, listed.
        parts: String,
    },
    /// No record for the key.
    #[error(
        "no record for key {key:?} on route {route:?} (never seen, released, deleted or expired)"
    )]
    NotFound {
        /// The route.
        route: String,
        /// The key.
        key: String,
    },
    /// No record for the key, as a gateway's admin listener said (its
    /// `404`, for a `memory://` store).
    #[error("{0}")]
    Absent(String),
    /// release/delete on a key whose lease is live, without --force.
    #[error(
        "key {key:?} is in flight: an attempt holds its lease until {until} and may be at the upstream now; wait for it, or add --force"
    )]
    LiveLease {
        /// The key.
        key: String,
        /// When the lease ends.
        until: String,
    },
    /// release/delete on an inquiring key inside its route's `after` (its
    /// first question neither asked nor due yet), without --force.
    #[error(
        "key {key:?} is inquiring and its first question is not due before {due}: until then (the route's inquiry `after`) the upstream may still be working on the request, and releasing it would let a retry be forwarded while the first attempt may still act; wait for the question, or add --force"
    )]
    InsideAfter {
        /// The key.
        key: String,
        /// When the first question is due.
        due: String,
    },
    /// `erase` given neither or both of the scope's values and its digest.
    #[error("give the scope's values (--scope) or its digest (--scope-digest), one of the two")]
    EraseTarget,
    /// `--scope-digest` that is not 64 hex digits (what was given is not
    /// repeated: it may be a scope value given in the wrong place).
    #[error(
        "that is not a scope digest: give 64 hex digits, with or without sha256: before them, as `keys show` prints it"
    )]
    BadDigest,
    /// `erase` whose scope no configured route reads.
    #[error("no route reads its scope from {0} part(s): {1}")]
    NoScopedRoute(usize, String),
    /// `release` on a completed record.
    #[error(
        "key {0:?} has a recorded response, which release leaves alone; use `keys delete` to forget it"
    )]
    Completed(String),
    /// The record changed between the attempt and the look that explains
    /// why it failed (for example it turned `held`): nothing was removed.
    #[error(
        "key {key:?} changed while the command ran (it is now {state}); nothing was removed: run the command again"
    )]
    Changed {
        /// The key.
        key: String,
        /// Its state now.
        state: &'static str,
    },
    /// The gateway's admin listener (memory store) refused or failed.
    #[error("{0}")]
    Admin(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store failed in the middle of an erasure: what it had removed
    /// by then stays removed, and is counted.
    #[error(
        "the erasure stopped on route {route:?} after removing {removed} record(s): {source}; run it again to finish"
    )]
    EraseFailed {
        /// Records removed before the failure, on every route so far.
        removed: u64,
        /// The route whose step failed.
        route: String,
        /// Why.
        source: StoreError,
    },
}

/// The header with which `POST /keys` marks a `404` as "no record for
/// that key" (any other `404` is not the key administration's answer).
pub const NOT_FOUND_HEADER: &str = "idemgate-keys";

impl KeysError {
    /// No record for the key: `idemgate keys` exits with its own status
    /// (3) for it, so a script can tell "not there" from a failure.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. } | Self::Absent(_))
    }
}

/// Run one command on a store's administration side; returns what to
/// print. `path` is the request path in front of the same store: a key
/// removed here is forgotten there too (the replay cache).
pub async fn execute(
    config: &Config,
    records: &dyn StoreAdmin,
    path: &dyn Store,
    command: KeyCommand,
) -> Result<String, KeysError> {
    match command {
        KeyCommand::Show(target) => {
            let key = record_key(config, &target)?;
            let info = shown(config, records, &key).await?;
            Ok(if target.json {
                json(&info)
            } else {
                describe(&info)
            })
        }
        KeyCommand::List(query) => {
            if !config.routes.iter().any(|r| r.name == query.route) {
                return Err(KeysError::NoRoute(query.route));
            }
            let found = records.list(&query.route, query.state, query.limit).await?;
            Ok(if query.json {
                json(&found)
            } else {
                table(&found)
            })
        }
        KeyCommand::Release(target) => {
            let key = record_key(config, &target)?;
            if records.clear(&key, target.force).await? {
                path.forget(&key);
                return Ok(format!(
                    "released {:?} on route {:?}: the next request with it is forwarded\n",
                    key.key, key.route
                ));
            }
            Err(why_not(records.inspect(&key).await?, key, Removal::Release))
        }
        KeyCommand::Erase(target) => erase::erase(config, records, path, &target).await,
        KeyCommand::Delete(target) => {
            let key = record_key(config, &target)?;
            let deleted = records.delete(&key, target.force).await;
            // Even after a failure: a claim racing the delete may have cached it.
            path.forget(&key);
            if deleted? {
                Ok(format!("deleted {:?} on route {:?}\n", key.key, key.route))
            } else {
                Err(why_not(records.inspect(&key).await?, key, Removal::Delete))
            }
        }
    }
}

/// The record under `key` as `keys show` tells it: a sealed response
/// opened under the configured keys (those in force: a reload leaves
/// them as the gateway started), so it shows the key id it needs and the
/// recorded status and size, not the envelope's, or why it does not open.
async fn shown(
    config: &Config,
    records: &dyn StoreAdmin,
    key: &RecordKey,
) -> Result<RecordInfo, KeysError> {
    let info = records.inspect(key).await?.ok_or_else(|| not_found(key))?;
    if info.state != RecordState::Completed {
        return Ok(info);
    }
    Ok(match records.recorded(key).await {
        Ok(Some(stored)) => {
            info.with_recorded(config.store.encryption_keys.as_deref(), key, stored)
        }
        // Removed or claimed again between the two reads: as first read.
        Ok(None) => info,
        // A stored response the store cannot read back (its status or
        // headers damaged): the record still shows, as first read.
        Err(StoreError::Corrupt(why)) => {
            tracing::warn!(route = %key.route, %why, "keys show: the recorded response is unreadable");
            info
        }
        Err(error) => return Err(error.into()),
    })
}

/// Which removal failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removal {
    Release,
    Delete,
}

/// Why a release or delete removed nothing, judged by the record as it is
/// now: a live lease, an inquiry inside `after`
/// (`transitions::upstream_may_be_working`), a completed record (release
/// leaves those alone), or a record that changed since the attempt (it
/// would have been removed as it is now).
fn why_not(found: Option<RecordInfo>, key: RecordKey, removal: Removal) -> KeysError {
    let Some(info) = found else {
        return not_found(&key);
    };
    match (info.state, info.lease_until) {
        (RecordState::InFlight, Some(until)) if until > SystemTime::now() => KeysError::LiveLease {
            key: key.key,
            until: time(until),
        },
        (RecordState::Inquiring, Some(due))
            if due > SystemTime::now() && info.inquiries.unwrap_or(0) == 0 =>
        {
            KeysError::InsideAfter {
                key: key.key,
                due: time(due),
            }
        }
        (RecordState::Completed, _) if removal == Removal::Release => KeysError::Completed(key.key),
        (state, _) => KeysError::Changed {
            key: key.key,
            state: state.as_str(),
        },
    }
}

fn not_found(key: &RecordKey) -> KeysError {
    KeysError::NotFound {
        route: key.route.clone(),
        key: key.key.clone(),
    }
}

/// The record key the gateway would use for this route, scope value and key.
fn record_key(config: &Config, args: &KeyTarget) -> Result<RecordKey, KeysError> {
    let route = config
        .routes
        .iter()
        .find(|r| r.name == args.route)
        .ok_or_else(|| KeysError::NoRoute(args.route.clone()))?;
    if route.scope_from.is_empty() && !args.scope.is_empty() {
        return Err(KeysError::NoScope(route.name.clone()));
    }
    let scope = key_source::scope_of_values(&route.scope_from, &args.scope)?;
    let key = match (&args.key, args.parts.as_slice()) {
        (Some(key), []) if route.key_from.len() == 1 => {
            key_source::key_of_values(&route.key_from, std::slice::from_ref(key))?
        }
        (None, parts) if !parts.is_empty() => key_source::key_of_values(&route.key_from, parts)?,
        _ => {
            let parts: Vec<String> = route.key_from.iter().map(ToString::to_string).collect();
            return Err(KeysError::KeyParts {
                route: route.name.clone(),
                parts: parts.join(", "),
            });
        }
    };
    Ok(RecordKey {
        route: route.name.clone(),
        scope,
        key,
    })
}

fn json<T: serde::Serialize>(value: &T) -> String {
    let mut out = serde_json::to_string_pretty(value).expect("records serialise");
    out.push('\n');
    out
}

fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn describe(info: &RecordInfo) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<9}{value}");
    };
    line("route", info.route.clone());
    line("key", info.key.clone());
    line(
        "scope",
        if info.scope.is_empty() {
            "(unscoped route)".into()
        } else {
            format!("sha256:{}", info.scope)
        },
    );
    line(
        "state",
        match info.held_reason {
            Some(reason) => format!("{} ({reason})", info.state.as_str()),
            None => info.state.as_str().to_string(),
        },
    );
    line("token", info.token.to_string());
    line("created", time(info.created_at));
    line("updated", time(info.updated_at));
    line("expires", time(info.expires_at));
    if let (Some(asked), Some(next)) = (info.inquiries, info.lease_until) {
        let due = if next < SystemTime::now() {
            " (due)"
        } else {
            ""
        };
        line("asked", asked.to_string());
        line("next", format!("{}{due}", time(next)));
        if let Some(since) = info.inquiring_since {
            line("since", time(since));
        }
    } else if let Some(lease) = info.lease_until {
        let lapsed = if lease < SystemTime::now() {
            " (lapsed)"
        } else {
            ""
        };
        line("lease", format!("{}{lapsed}", time(lease)));
    }
    if let (Some(status), Some(bytes)) = (info.status, info.body_bytes) {
        line("response", format!("{status}, {bytes} bytes"));
    }
    if let Some(id) = &info.sealed_with {
        let why = match info.open_error {
            None => String::new(),
            Some("unknown_key") => {
                ", which does not open: [store] encryption_keys does not list that id".into()
            }
            Some("unauthentic") => ", which does not open: it was sealed for another record, \
                                     altered, or under other material"
                .into(),
            Some(other) => format!(", which does not open ({other})"),
        };
        line("sealed", format!("with key id {id:?}{why}"));
    }
    out
}

/// The records as a table; on a scoped route with a SCOPE column (the
/// first 12 hex digits of the scope's digest), so one key used by two
/// tenants shows as two tenants' records.
fn table(found: &[RecordInfo]) -> String {
    let scoped = found.iter().any(|info| !info.scope.is_empty());
    let scope = |info: &RecordInfo| match info.scope.get(..12) {
        _ if !scoped => String::new(),
        Some(digits) => format!("sha256:{digits}… "),
        None => format!("{:<20} ", "-"),
    };
    let head = if scoped { "SCOPE                " } else { "" };
    let mut out = format!(
        "{:<10} {:>8} {:<22} {head}KEY\n",
        "STATE", "TOKEN", "UPDATED"
    );
    for info in found {
        let _ = writeln!(
            out,
            "{:<10} {:>8} {:<22} {}{}",
            info.state.as_str(),
            info.token,
            time(info.updated_at),
            scope(info),
            info.key
        );
    }
    let _ = writeln!(
        out,
        "({} record{})",
        found.len(),
        if found.len() == 1 { "" } else { "s" }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::erase::parse_digest;
    use super::*;

    fn record(state: RecordState, lease_until: Option<SystemTime>) -> RecordInfo {
        let now = SystemTime::now();
        RecordInfo {
            route: "r".into(),
            scope: String::new(),
            key: "k".into(),
            state,
            held_reason: None,
            token: 1,
            created_at: now,
            updated_at: now,
            expires_at: now,
            lease_until,
            inquiries: None,
            inquiring_since: None,
            status: None,
            body_bytes: None,
            sealed_with: None,
            opened: None,
            open_error: None,
        }
    }

    fn key() -> RecordKey {
        RecordKey {
            route: "r".into(),
            scope: Vec::new(),
            key: "k".into(),
        }
    }

    #[test]
    fn a_failed_removal_is_explained_by_the_record_as_it_is_now() {
        let later = SystemTime::now() + std::time::Duration::from_secs(60);
        let earlier = SystemTime::now() - std::time::Duration::from_secs(60);
        let why = |state, lease, removal| why_not(Some(record(state, lease)), key(), removal);
        assert!(matches!(
            why(RecordState::InFlight, Some(later), Removal::Delete),
            KeysError::LiveLease { .. }
        ));
        assert!(matches!(
            why(RecordState::Completed, None, Removal::Release),
            KeysError::Completed(_)
        ));
        // It turned held (or its lease lapsed) after the attempt: never
        // reported as completed.
        for removal in [Removal::Release, Removal::Delete] {
            assert!(matches!(
                why(RecordState::Held, None, removal),
                KeysError::Changed { state: "held", .. }
            ));
            assert!(matches!(
                why(RecordState::InFlight, Some(earlier), removal),
                KeysError::Changed {
                    state: "in_flight",
                    ..
                }
            ));
        }
        assert!(matches!(
            why(RecordState::Completed, None, Removal::Delete),
            KeysError::Changed {
                state: "completed",
                ..
            }
        ));
        assert!(matches!(
            why_not(None, key(), Removal::Delete),
            KeysError::NotFound { .. }
        ));
    }

    #[test]
    fn an_erasure_names_its_scope_by_values_or_by_digest() {
        let hex = "ab".repeat(32);
        assert_eq!(
            parse_digest(&format!("sha256:{hex}")).unwrap(),
            vec![0xab; 32]
        );
        assert_eq!(parse_digest(&hex).unwrap(), vec![0xab; 32]);
        // What SCOPE_DIGEST_PATTERN admits besides: either case, blanks.
        let upper = format!(" sha256:{} ", hex.to_uppercase());
        assert_eq!(parse_digest(&upper).unwrap(), vec![0xab; 32]);
        for bad in ["sha256:abc", "", &"zz".repeat(32), &"ab".repeat(33)] {
            let error = parse_digest(bad).expect_err(bad);
            assert!(matches!(error, KeysError::BadDigest), "{bad}");
            assert!(
                bad.is_empty() || !error.to_string().contains(bad),
                "the input is never echoed: {error}"
            );
        }
        let erase: KeyCommand =
            serde_json::from_str(r#"{"erase": {"scope": "Bearer a", "force": true}}"#).unwrap();
        assert_eq!(
            erase,
            KeyCommand::Erase(EraseTarget {
                scope: vec!["Bearer a".into()],
                scope_digest: None,
                force: true,
            })
        );
        assert!(!erase.wants_json());
        assert!(
            serde_json::from_str::<KeyCommand>(r#"{"erase": {"route": "r", "scope": "a"}}"#)
                .is_err(),
            "erasure applies to every route"
        );
    }

    #[test]
    fn the_wire_format_is_stable() {
        let show: KeyCommand = serde_json::from_str(
            r#"{"show": {"route": "payments", "scope": null, "key": "k1", "json": true, "force": false}}"#,
        )
        .unwrap();
        assert_eq!(
            show,
            KeyCommand::Show(KeyTarget {
                route: "payments".into(),
                scope: Vec::new(),
                key: Some("k1".into()),
                parts: Vec::new(),
                json: true,
                force: false,
            })
        );
        // One scope value is a string on the wire, as before composite
        // scopes; several are a list.
        let one = KeyTarget {
            route: "r".into(),
            scope: vec!["Bearer a".into()],
            key: Some("k".into()),
            parts: Vec::new(),
            json: false,
            force: false,
        };
        let wire = serde_json::to_string(&one).unwrap();
        assert_eq!(
            wire,
            r#"{"route":"r","scope":"Bearer a","key":"k","json":false,"force":false}"#
        );
        assert_eq!(serde_json::from_str::<KeyTarget>(&wire).unwrap(), one);
        let two: KeyTarget =
            serde_json::from_str(r#"{"route":"r","scope":["a","b"],"parts":["x","y"]}"#).unwrap();
        assert_eq!(two.scope, ["a", "b"]);
        let list: KeyCommand = serde_json::from_str(
            r#"{"list": {"route": "payments", "state": "in_flight", "limit": 5, "json": false}}"#,
        )
        .unwrap();
        assert!(matches!(
            list,
            KeyCommand::List(ListQuery {
                limit: 5,
                state: RecordState::InFlight,
                ..
            })
        ));
        assert!(
            serde_json::from_str::<KeyCommand>(
                r#"{"delete": {"route": "r", "key": "k", "forse": true}}"#
            )
            .is_err()
        );
    }
}
