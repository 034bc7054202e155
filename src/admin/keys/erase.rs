//! `keys erase`: every record of one scope, on every route that reads a
//! scope, removed step by step through the store's index
//! ([`StoreAdmin::erase`]), each step resuming where the last stopped,
//! each removed key forgotten by the replay cache; and the scope's digest
//! as an operator gives it.

use std::fmt::Write as _;

use super::{EraseTarget, KeysError};
use crate::config::Config;
use crate::request::key_source;
use crate::store::{EraseStep, EraseStepFailed, RecordKey, Store, StoreAdmin};

/// How many records one erasure step removes: each step is one bounded
/// statement (or script), and its keys are forgotten by the replay cache.
const ERASE_STEP: usize = 1000;

/// The routes an erasure applies to, each with the scope's digest as that
/// route computes it (route, digest).
type Scopes = Vec<(String, Vec<u8>)>;

/// The [`Scopes`] of an erasure, and the scoped routes it does not apply
/// to (they read their scope from another number of parts).
fn erase_scopes(config: &Config, target: &EraseTarget) -> Result<(Scopes, Vec<String>), KeysError> {
    let digest = match (&target.scope_digest, target.scope.is_empty()) {
        (Some(hex), true) => Some(parse_digest(hex)?),
        (None, false) => None,
        _ => return Err(KeysError::EraseTarget),
    };
    let (mut scopes, mut skipped) = (Vec::new(), Vec::new());
    for route in config.routes.iter().filter(|r| !r.scope_from.is_empty()) {
        match &digest {
            Some(digest) => scopes.push((route.name.clone(), digest.clone())),
            None if route.scope_from.len() == target.scope.len() => {
                let scope = key_source::scope_of_values(&route.scope_from, &target.scope)?;
                scopes.push((route.name.clone(), scope));
            }
            None => skipped.push(route.name.clone()),
        }
    }
    if scopes.is_empty() {
        let what = if skipped.is_empty() {
            "no route has scope_from or scope_header".to_string()
        } else {
            format!(
                "the scoped routes ({}) read another number",
                skipped.join(", ")
            )
        };
        return Err(KeysError::NoScopedRoute(target.scope.len(), what));
    }
    Ok((scopes, skipped))
}

/// What [`parse_digest`] accepts, as a regular expression: the `pattern`
/// of `scope_digest` in the admin API's document
/// (docs/src/reference/openapi.json).
pub const SCOPE_DIGEST_PATTERN: &str = r"^\s*(sha256:)?[0-9a-fA-F]{64}\s*$";

/// A scope digest as `keys show` prints it (`sha256:` and 64 hex digits),
/// or the digits alone, either case, blanks around it ignored.
pub(super) fn parse_digest(text: &str) -> Result<Vec<u8>, KeysError> {
    let digits = text.trim();
    let digits = digits.strip_prefix("sha256:").unwrap_or(digits);
    match hex::decode(digits) {
        Ok(digest) if digest.len() == 32 => Ok(digest),
        _ => Err(KeysError::BadDigest),
    }
}

/// `keys erase`: every record of the scope on every route that reads it,
/// step by step, each removed key forgotten by the replay cache; a
/// sentence per route.
pub(super) async fn erase(
    config: &Config,
    records: &dyn StoreAdmin,
    path: &dyn Store,
    target: &EraseTarget,
) -> Result<String, KeysError> {
    let (scopes, skipped) = erase_scopes(config, target)?;
    let mut out = String::new();
    let (mut removed, mut left) = (0_u64, 0_u64);
    for (route, scope) in scopes {
        let mut key = RecordKey {
            route,
            scope,
            key: String::new(),
        };
        let (mut here, mut after) = (0_u64, None::<String>);
        loop {
            let step = records
                .erase(&EraseStep {
                    route: &key.route,
                    scope: &key.scope,
                    force: target.force,
                    limit: ERASE_STEP,
                    after: after.as_deref(),
                })
                .await;
            let step = match step {
                Ok(step) => step,
                // What the failed step had removed stays removed: forgotten
                // and counted like a step's.
                Err(EraseStepFailed {
                    removed: gone,
                    source,
                }) => {
                    forget(path, &mut key, &gone);
                    return Err(KeysError::EraseFailed {
                        removed: removed + here + gone.len() as u64,
                        route: key.route,
                        source,
                    });
                }
            };
            forget(path, &mut key, &step.keys);
            here += step.keys.len() as u64;
            // Each step resumes where the last stopped (crates/store/src/erased.rs).
            if step.last.is_some() {
                after.clone_from(&step.last);
            }
            if !step.more(ERASE_STEP) {
                left += step.left;
                let _ = write!(
                    out,
                    "route {:?}: removed {here} record{}",
                    key.route,
                    plural(here)
                );
                if step.left > 0 {
                    let _ = write!(out, ", left {} (in flight or claimed meanwhile)", step.left);
                }
                out.push('\n');
                break;
            }
        }
        removed += here;
    }
    for route in skipped {
        let _ = writeln!(
            out,
            "route {route:?}: skipped, it reads its scope from another number of parts"
        );
    }
    let _ = write!(out, "erased: {removed} record{} removed", plural(removed));
    if left > 0 && target.force {
        let _ = write!(out, "; {left} left: claimed while the erasure ran");
    } else if left > 0 {
        let _ = write!(
            out,
            "; {left} left: the upstream may still be working on them (a live lease, or an \
             inquiry inside its route's after); wait, or add --force"
        );
    }
    out.push('\n');
    Ok(out)
}

/// Drop the records of `key`'s route and scope under `keys` from the
/// replay cache of `path`.
fn forget(path: &dyn Store, key: &mut RecordKey, keys: &[String]) {
    for removed in keys {
        key.key.clone_from(removed);
        path.forget(key);
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
