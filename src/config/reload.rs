//! What a reload may change while the gateway serves, and what only a
//! restart applies (docs/src/operations/reload.md).
//!
//! A reload applies the routes (with `[defaults]`, which are folded into
//! them) and nothing else. Every other setting is fixed at start: the
//! listeners and their limits, the store, thread counts, buffers. Which is
//! which is each setting's reload class in the settings table
//! (`settings`). A reloaded file that changes a restart-only setting is not
//! refused; the change is reported by its key and ignored until the next
//! start, never half-applied.
//!
//! The new routes must also fit what stays: a route body larger than the
//! running `max_buffered_request_bytes`, or a lease longer than the store
//! front's fences were sized for at start, or a scope that reads the client
//! certificate while the listener in force asks for none, refuses the
//! reload as a whole.

use super::validate::{buffers_fit, store::fence_life, tls::cert_parts_fit};
use super::{Config, ConfigError, Route, invalid, settings};
use crate::store::{FrontConfig, StoreConfig};

/// A reloaded file, checked against the configuration in force.
#[derive(Debug)]
pub struct Reload {
    /// The configuration in force from now on: the running one with the
    /// new routes.
    pub config: Config,
    /// Keys the file changes that only a restart applies, in file order.
    pub restart_required: Vec<&'static str>,
    /// Changes that are applied but change which record a request finds,
    /// one sentence each: a key in flight or recorded before the reload
    /// is not found after it, so its retry executes again.
    pub key_changes: Vec<String>,
}

impl Config {
    /// Check `next` (the file read again) against this configuration,
    /// which is in force: the configuration to apply and what it leaves for
    /// a restart, or why it cannot be applied at all.
    pub fn reload(&self, next: Config) -> Result<Reload, ConfigError> {
        buffers_fit(self.max_buffered_request_bytes, &next.routes)?;
        // The listener in force decides whether a client certificate is asked.
        cert_parts_fit(self.tls.as_ref(), &next.routes)?;
        if let Some(front) = &self.store.front {
            let too_long = next
                .routes
                .iter()
                .enumerate()
                .find(|(_, r)| fence_life(r.lease) > front.fence_life);
            if let Some((i, route)) = too_long {
                return Err(invalid(
                    format!("routes[{i}].lease"),
                    format!(
                        "{:?} is longer than the store front's fences were sized for at start \
                         ({:?}, a minute more than the longest lease then); restart to apply it",
                        route.lease, front.fence_life
                    ),
                ));
            }
        }
        let restart_required = restart_only(self, &next);
        let key_changes = key_changes(&self.routes, &next.routes);
        let mut config = self.clone();
        config.routes = next.routes;
        config.source = next.source;
        // What the file now read writes to no effect (logged by the reload).
        config.unused = next.unused;
        Ok(Reload {
            config,
            restart_required,
            key_changes,
        })
    }
}

/// What changes which record a request finds: a route that is gone (its
/// paths may now match another route, whose records are its own), or the
/// same route reading its key or scope from elsewhere, or fingerprinting
/// differently (a retry of an earlier request would not match its own).
fn key_changes(running: &[Route], next: &[Route]) -> Vec<String> {
    let mut changes = Vec::new();
    for old in running {
        let Some(new) = next.iter().find(|r| r.name == old.name) else {
            changes.push(format!(
                "route {:?} is gone: its keys' records are no longer found, and a retry that \
                 now matches another route is forwarded again",
                old.name
            ));
            continue;
        };
        for (what, same) in [
            ("key_from", old.key_from == new.key_from),
            ("scope_from", old.scope_from == new.scope_from),
            ("fingerprint", old.fingerprint == new.fingerprint),
        ] {
            if !same {
                changes.push(format!(
                    "route {:?}: {what} changed: a retry of a request made before the reload \
                     may not find its record (forwarded again) or may not match it (422)",
                    old.name
                ));
            }
        }
    }
    changes
}

/// The `(key, same)` pairs of `$running`'s fields (a `$ty`, destructured
/// whole, so a field added to it must be listed here, as compared or as
/// `$skip`): each field named `$prefix` + field, and whether `$next` holds
/// the same value.
macro_rules! compare_fields {
    ($ty:ident { $($field:ident),* $(,)? } skip { $($skip:ident),* $(,)? }
     $running:expr, $next:expr, $prefix:literal) => {{
        let $ty { $($field,)* $($skip: _,)* } = $running;
        [$((concat!($prefix, stringify!($field)), *$field == $next.$field)),*]
    }};
}

/// The keys whose values differ between `running` and `next` and which
/// the settings table marks as applied only by a restart (`settings`):
/// everything but the routes.
fn restart_only(running: &Config, next: &Config) -> Vec<&'static str> {
    restart_only_by(running, next, settings::restart_only)
}

/// The changed keys for which `waits` (the table's reload class) says a
/// restart is needed.
fn restart_only_by(
    running: &Config,
    next: &Config,
    waits: impl Fn(&str) -> bool,
) -> Vec<&'static str> {
    comparisons(running, next)
        .into_iter()
        .filter(|&(key, same)| !same && waits(key))
        .map(|(key, _)| key)
        .collect()
}

/// Every setting outside the routes, compared: its key (a row of the
/// settings table, or a table whose rows share a reload class: `tls`,
/// `telemetry`, `store.front`), and whether `next` holds the same value.
fn comparisons(running: &Config, next: &Config) -> Vec<(&'static str, bool)> {
    let mut compared = compare_fields!(Config {
        listen,
        tls,
        admin_listen,
        admin_token,
        max_connections,
        server_threads,
        header_read_timeout,
        idle_timeout,
        body_read_timeout,
        http2_keep_alive_interval,
        http2_keep_alive_timeout,
        http2_max_concurrent_streams,
        http2_stream_window,
        http2_connection_window,
        max_buffered_request_bytes,
        max_forwards_in_flight,
        max_waiting,
        admin_max_connections,
        max_header_bytes,
        shutdown_timeout,
        watch_config,
        docs_url,
        log_format,
        telemetry,
    } skip {
        // Applied by a reload; compared below; where both came from;
        // warnings about the file, which a reload logs.
        routes,
        store,
        source,
        unused,
    } running, next, "")
    .to_vec();
    compared.extend(store_comparisons(&running.store, &next.store));
    compared
}

/// The `[store]` and `[store.front]` keys, compared.
fn store_comparisons(running: &StoreConfig, next: &StoreConfig) -> Vec<(&'static str, bool)> {
    let mut compared = compare_fields!(StoreConfig {
        url,
        migrate,
        pool_size,
        timeout,
        batches_in_flight,
        claim_queue_budget,
        prefix,
        cluster,
        replicas,
        replica_timeout,
        max_records,
        sweep_interval,
        sweep_batch,
        generation,
        replay_cache_ttl,
        replay_cache_size,
        encryption_keys,
        compress,
        compression,
        accept_plain_records,
    } skip {
        // Taken from the routes: follows them on a reload; compared below.
        wait_routes,
        front,
    } running, next, "store.")
    .to_vec();
    match (&running.front, &next.front) {
        (None, None) => compared.push(("store.front", true)),
        (Some(running), Some(next)) => compared.extend(compare_fields!(FrontConfig {
            url,
            timeout,
            mark_after,
        } skip {
            // Taken from the routes' leases (checked by `Config::reload`).
            fence_life,
        } running, next, "store.front.")),
        _ => compared.push(("store.front", false)),
    }
    compared
}

#[cfg(test)]
mod tests {
    use super::{comparisons, restart_only_by};
    use crate::config::settings::{self, Reload, Section};
    use crate::config::tests::{MINIMAL, parse};

    /// What the reload compares and the settings table agree: every key
    /// compared is a row (or a table of rows sharing a class), and every
    /// restart-only row is compared, itself or as part of its table.
    #[test]
    fn the_reload_compares_every_restart_only_setting() {
        let with_front = parse(&format!(
            "{MINIMAL}\n[store]\nurl = \"postgres://h/db\"\n[store.front]\nurl = \"redis://h\"\n"
        ))
        .unwrap();
        let mut keys: Vec<&str> = comparisons(&with_front, &with_front)
            .into_iter()
            .map(|(key, same)| {
                assert!(same, "{key}");
                key
            })
            .collect();
        let plain = parse(MINIMAL).unwrap();
        keys.extend(comparisons(&plain, &plain).into_iter().map(|(k, _)| k));
        for key in &keys {
            assert!(settings::class(key).is_some(), "{key} is not in the table");
        }
        for row in settings::all().filter(|s| s.reload == Reload::Restart) {
            let path = row.path();
            let covered = keys
                .iter()
                .any(|k| path == *k || path.starts_with(&format!("{k}.")));
            assert!(
                covered,
                "{path} is restart-only but the reload never compares it"
            );
        }
        assert!(
            settings::all()
                .filter(|s| s.reload == Reload::Applies)
                .all(|s| s.section == Section::Route),
            "a reload applies the routes alone"
        );
    }

    /// Negative control: the report follows the table's class, so a table
    /// that called `max_waiting` reloadable would stop reporting it.
    #[test]
    fn the_report_follows_the_reload_class() {
        let running = parse(MINIMAL).unwrap();
        let next = parse(&format!("max_waiting = 7\n{MINIMAL}")).unwrap();
        assert_eq!(
            restart_only_by(&running, &next, settings::restart_only),
            ["max_waiting"]
        );
        let wrong = |key: &str| key != "max_waiting" && settings::restart_only(key);
        assert!(restart_only_by(&running, &next, wrong).is_empty());
    }

    /// A file that only changes routes leaves nothing for a restart, and
    /// the routes it brings are the ones in force.
    #[test]
    fn routes_apply_and_nothing_waits_for_a_restart() {
        let running = parse(MINIMAL).unwrap();
        let next = parse(&MINIMAL.replace("name = \"payments\"", "name = \"orders\"")).unwrap();
        let reload = running.reload(next).unwrap();
        assert_eq!(reload.restart_required, Vec::<&str>::new());
        assert_eq!(reload.config.routes[0].name, "orders");
        assert_eq!(reload.config.listen, running.listen);
    }

    /// A listener, a limit and a store setting changed: each is named,
    /// none is applied.
    #[test]
    fn restart_only_changes_are_named_and_not_applied() {
        let running = parse(MINIMAL).unwrap();
        let text = format!(
            "listen = \"127.0.0.1:9999\"\nmax_waiting = 7\n{MINIMAL}\n[store]\npool_size = 3\n"
        );
        let reload = running.reload(parse(&text).unwrap()).unwrap();
        assert_eq!(
            reload.restart_required,
            ["listen", "max_waiting", "store.pool_size"]
        );
        assert_eq!(reload.config.listen, running.listen);
        assert_eq!(reload.config.max_waiting, running.max_waiting);
        assert_eq!(reload.config.store.pool_size, running.store.pool_size);
    }

    /// A renamed route and a changed key source are applied, and reported
    /// as changing which record a retry finds.
    #[test]
    fn changes_of_key_identity_are_reported() {
        let running = parse(MINIMAL).unwrap();
        let same = running.reload(parse(MINIMAL).unwrap()).unwrap();
        assert_eq!(same.key_changes, Vec::<String>::new());
        let renamed = parse(&MINIMAL.replace("name = \"payments\"", "name = \"orders\"")).unwrap();
        let reload = running.reload(renamed).unwrap();
        assert_eq!(reload.key_changes.len(), 1);
        assert!(
            reload.key_changes[0].contains("\"payments\" is gone"),
            "{:?}",
            reload.key_changes
        );
        let keyed = parse(&MINIMAL.replace(
            "name = \"payments\"",
            "name = \"payments\"\nkey_header = \"X-Request-Id\"",
        ))
        .unwrap();
        let reload = running.reload(keyed).unwrap();
        assert!(
            reload.key_changes[0].contains("key_from changed"),
            "{:?}",
            reload.key_changes
        );
    }

    /// The front's own settings are named one by one; adding or removing
    /// it is `store.front`; its fence life, taken from the routes, is not
    /// a setting.
    #[test]
    fn front_changes_are_named() {
        let with_front = |front: &str| {
            parse(&format!(
                "{MINIMAL}\n[store]\nurl = \"postgres://h/db\"\n{front}"
            ))
            .unwrap()
        };
        let running = with_front("[store.front]\nurl = \"redis://h:6379\"\n");
        let moved = with_front("[store.front]\nurl = \"redis://other:6379\"\n");
        let reload = running.reload(moved).unwrap();
        assert_eq!(reload.restart_required, ["store.front.url"]);
        let reload = running.reload(with_front("")).unwrap();
        assert_eq!(reload.restart_required, ["store.front"]);
        let same = with_front("[store.front]\nurl = \"redis://h:6379\"\n");
        assert!(running.reload(same).unwrap().restart_required.is_empty());
    }

    /// A route body larger than the buffers in force refuses the reload,
    /// naming the key that is fixed until restart.
    #[test]
    fn a_route_that_does_not_fit_the_running_buffers_is_refused() {
        let running = parse(&format!("max_buffered_request_bytes = \"2MiB\"\n{MINIMAL}")).unwrap();
        let text = format!(
            "max_buffered_request_bytes = \"64MiB\"\n{}",
            MINIMAL.replace(
                "name = \"payments\"",
                "name = \"payments\"\nmax_request_body = \"32MiB\""
            )
        );
        let error = running.reload(parse(&text).unwrap()).unwrap_err();
        assert!(
            error.to_string().contains("max_buffered_request_bytes"),
            "{error}"
        );
    }
    /// A route scoped by the client certificate needs the listener in
    /// force to ask for one: without `client_ca` at start, it is refused.
    #[test]
    fn a_cert_scope_needs_the_running_listener_to_ask_for_certificates() {
        use crate::request::key_source::{CertPart, KeyPart};
        let running = parse(MINIMAL).unwrap();
        let mut next = running.clone();
        next.routes[0].scope_from = vec![KeyPart::Cert(CertPart::SanUri)];
        let error = running.reload(next).unwrap_err().to_string();
        assert!(
            error.contains("routes[0].scope_from") && error.contains("client_ca"),
            "{error}"
        );
        // The control: the same routes without the part apply.
        assert!(running.reload(running.clone()).is_ok());
    }
}
