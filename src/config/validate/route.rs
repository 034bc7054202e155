//! One route (already merged with `[defaults]`) into a [`Route`]: each group
//! of settings is checked by its own file, in the order that decides which
//! error a route with several bad values reports; the policies with no other
//! home (`concurrent`, `on_*`, `max_request_body`) are checked here.

use super::{fingerprint, inquiry, keys, record, target, timing, tls};
use crate::config::defaults::{
    DEFAULT_CONCURRENT, DEFAULT_EXPIRES_HEADER, DEFAULT_FORWARD_ATTEMPT, DEFAULT_KEY_REQUIRED,
    DEFAULT_MAX_REQUEST_BODY, DEFAULT_MODE, DEFAULT_ON_STORE_ERROR, DEFAULT_ON_UNKNOWN_OUTCOME,
    DEFAULT_RECORD_BODY, DEFAULT_WAIT_TIMEOUT,
};
use crate::config::raw::RawRoute;
use crate::config::settings as S;
use crate::config::values::{duration, size};
use crate::config::{Concurrent, ConfigError, Route, RouteMode, invalid};
use std::time::Duration;

/// The route at dotted key `at` (`routes[0]`).
pub(super) fn route(at: &str, r: &RawRoute) -> Result<Route, ConfigError> {
    let name = target::name(at, r)?;
    let path = target::path(at, r)?;
    let upstream = target::upstream(at, r)?;
    let upstream_ca = tls::upstream_ca(at, &name, r)?;
    let methods = target::methods(at, r)?;
    let (key_from, scope_from) = keys::sources(at, r)?;
    let timing = timing::timing(at, r)?;
    let (concurrent, wait_timeout) = concurrent(at, r, &timing)?;
    let record = record::statuses(at, r)?;
    let replay_headers_deny = record::replay_headers_deny(at, r)?;
    let fingerprint = fingerprint::fingerprint(at, r)?;
    let max_recorded_response = record::max_recorded_response(at, r)?;
    let on_unknown_outcome = r.on_unknown_outcome.unwrap_or(DEFAULT_ON_UNKNOWN_OUTCOME);
    let scoped = !scope_from.is_empty();
    let inquiry = inquiry::inquiry(at, r, on_unknown_outcome, &timing, scoped)?;
    // A route that inquires sends the token by default: its questions
    // carry one too, the fence a lookup answers `404` behind.
    let forward_attempt = r
        .forward_attempt
        .unwrap_or(DEFAULT_FORWARD_ATTEMPT || inquiry.is_some());
    // A shadow route answers as if idemgate were absent: no header of its
    // own unless asked for.
    let mode = r.mode.unwrap_or(DEFAULT_MODE);
    let expires_header = r
        .expires_header
        .unwrap_or(DEFAULT_EXPIRES_HEADER && mode == RouteMode::Enforce);
    Ok(Route {
        name,
        path,
        upstream,
        upstream_ca,
        methods,
        key_from,
        key_required: r.key_required.unwrap_or(DEFAULT_KEY_REQUIRED),
        scope_from,
        retention: timing.retention,
        lease: timing.lease,
        upstream_timeout: timing.upstream_timeout,
        max_request_body: size(
            &S::MAX_REQUEST_BODY.at(at),
            r.max_request_body.as_deref(),
            DEFAULT_MAX_REQUEST_BODY,
        )?,
        max_recorded_response,
        on_unknown_outcome,
        on_store_error: r.on_store_error.unwrap_or(DEFAULT_ON_STORE_ERROR),
        concurrent,
        wait_timeout,
        mode,
        record,
        replay_headers_deny,
        fingerprint,
        inquiry,
        forward_attempt,
        expires_header,
        record_body: r.record_body.unwrap_or(DEFAULT_RECORD_BODY),
    })
}

/// `concurrent`, and `wait_timeout`, which only `"wait"` uses: more than
/// zero, and at most `upstream_timeout` + `lease` (by then the first attempt
/// has answered or its lease has lapsed; waiting longer only holds a
/// client).
fn concurrent(
    at: &str,
    r: &RawRoute,
    timing: &timing::Timing,
) -> Result<(Concurrent, Duration), ConfigError> {
    let concurrent = r.concurrent.unwrap_or(DEFAULT_CONCURRENT);
    if concurrent != Concurrent::Wait {
        if r.wait_timeout.is_some() {
            return Err(invalid(
                S::WAIT_TIMEOUT.at(at),
                "only applies to concurrent = \"wait\"",
            ));
        }
        return Ok((concurrent, DEFAULT_WAIT_TIMEOUT));
    }
    let at_key = S::WAIT_TIMEOUT.at(at);
    let bound = timing.upstream_timeout + timing.lease;
    // Unset: the default, or the bound if that is shorter.
    let wait = duration(
        &at_key,
        r.wait_timeout.as_deref(),
        DEFAULT_WAIT_TIMEOUT.min(bound),
    )?;
    if wait.is_zero() || wait > bound {
        return Err(invalid(
            at_key,
            format!(
                "{wait:?} must be more than zero and at most upstream_timeout + lease ({bound:?}): by then the first attempt has answered or lost its lease"
            ),
        ));
    }
    Ok((concurrent, wait))
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{MINIMAL, parse, route_error};
    use crate::config::{DEFAULT_CONCURRENT, UnknownOutcome};

    #[test]
    fn policies_are_closed_enums() {
        let err = route_error("on_unknown_outcome = \"retry\"");
        assert!(err.contains("on_unknown_outcome"), "{err}");
        let c = parse(&format!("{MINIMAL}\non_unknown_outcome = \"release\"\n")).unwrap();
        assert_eq!(c.routes[0].on_unknown_outcome, UnknownOutcome::Release);
        let err = route_error("concurrent = \"queue\"");
        assert!(err.contains("concurrent"), "{err}");
    }

    #[test]
    fn wait_timeout_is_refused_without_wait() {
        assert_eq!(
            parse(MINIMAL).unwrap().routes[0].concurrent,
            DEFAULT_CONCURRENT
        );
        let err = route_error("wait_timeout = \"1s\"");
        assert!(err.contains("routes[0].wait_timeout"), "{err}");
    }

    #[test]
    fn wait_timeout_is_bounded_by_the_first_attempt() {
        let c = parse(&format!("{MINIMAL}\nconcurrent = \"wait\"\n")).unwrap();
        assert_eq!(c.routes[0].concurrent, crate::config::Concurrent::Wait);
        assert_eq!(
            c.routes[0].wait_timeout,
            crate::config::DEFAULT_WAIT_TIMEOUT
        );
        for line in [
            "concurrent = \"wait\"\nwait_timeout = \"0s\"",
            "concurrent = \"wait\"\nlease = \"2s\"\nupstream_timeout = \"1s\"\nwait_timeout = \"4s\"",
        ] {
            let err = route_error(line);
            assert!(err.contains("routes[0].wait_timeout"), "{line}: {err}");
        }
        let ok = "concurrent = \"wait\"\nlease = \"2s\"\nupstream_timeout = \"1s\"\nwait_timeout = \"3s\"";
        assert!(parse(&format!("{MINIMAL}\n{ok}\n")).is_ok());
        // Unset, the default shrinks to the bound.
        let short = "concurrent = \"wait\"\nlease = \"2s\"\nupstream_timeout = \"1s\"";
        let c = parse(&format!("{MINIMAL}\n{short}\n")).unwrap();
        assert_eq!(c.routes[0].wait_timeout, std::time::Duration::from_secs(3));
        // A wait_timeout in [defaults] does not reach a route that rejects.
        let text = format!(
            "[defaults]\nconcurrent = \"wait\"\nwait_timeout = \"5s\"\n{MINIMAL}\nconcurrent = \"reject\"\n"
        );
        assert!(parse(&text).is_ok(), "{:?}", parse(&text).err());
    }

    #[test]
    fn key_required_can_be_turned_off() {
        let c = parse(&format!("{MINIMAL}\nkey_required = false\n")).unwrap();
        assert!(!c.routes[0].key_required);
    }
}
