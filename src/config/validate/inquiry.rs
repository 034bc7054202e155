//! `on_unknown_outcome = "inquire"` and its `[routes.inquiry]` table: a URL
//! that names the key, and timings that end before the record does.

use std::time::Duration;

use http::{HeaderName, HeaderValue};

use super::key;
use super::timing::Timing;
use crate::config::defaults::{
    DEFAULT_INQUIRY_EVERY, DEFAULT_INQUIRY_GIVE_UP, INQUIRY_LEASE_MARGIN,
};
use crate::config::inquiry::Inquiry;
use crate::config::raw::RawRoute;
use crate::config::settings as S;
use crate::config::values::{duration, header_name};
use crate::config::{ConfigError, UnknownOutcome, invalid};

/// The route's inquiry: `Some` exactly when it inquires. `scoped`: the
/// route's keys are per scope (`scope_header` or `scope_from`), so its
/// question must name the scope too.
pub(super) fn inquiry(
    at: &str,
    r: &RawRoute,
    on_unknown: UnknownOutcome,
    timing: &Timing,
    scoped: bool,
) -> Result<Option<Inquiry>, ConfigError> {
    let at_table = key(at, "inquiry");
    let Some(raw) = &r.inquiry else {
        if on_unknown == UnknownOutcome::Inquire {
            return Err(invalid(
                at_table,
                "on_unknown_outcome = \"inquire\" needs this table, with at least the url that \
                 asks the upstream about a key (\"http://…/{key}\")",
            ));
        }
        return Ok(None);
    };
    if on_unknown != UnknownOutcome::Inquire {
        return Err(invalid(
            at_table,
            "only applies to on_unknown_outcome = \"inquire\"",
        ));
    }
    let at_url = S::INQUIRY_URL.at(at);
    let Some(url) = raw.url.clone() else {
        return Err(invalid(
            at_url,
            "is required: the URL that asks the upstream about a key",
        ));
    };
    check_url(&at_url, &url)?;
    if scoped && !url.contains("{scope}") {
        return Err(invalid(
            at_url,
            format!(
                "{url:?} lacks {{scope}}, but the route's keys are per scope (scope_header or \
                 scope_from): a question by key alone could settle one tenant's key with \
                 another's answer. Put {{scope}} (the hex SHA-256 of the scope) in the path or \
                 the query"
            ),
        ));
    }
    // By default the first question waits as long as the gateway waited
    // for the upstream's answer: it may still be working on the request.
    let after = duration(
        &S::INQUIRY_AFTER.at(at),
        raw.after.as_deref(),
        timing.upstream_timeout,
    )?;
    let at_every = S::INQUIRY_EVERY.at(at);
    let every = duration(&at_every, raw.every.as_deref(), DEFAULT_INQUIRY_EVERY)?;
    if every < Duration::from_secs(1) {
        return Err(invalid(
            at_every,
            format!("{every:?} is less than 1s: too often to ask an upstream"),
        ));
    }
    let at_give_up = S::INQUIRY_GIVE_UP_AFTER.at(at);
    let give_up_after = duration(
        &at_give_up,
        raw.give_up_after.as_deref(),
        DEFAULT_INQUIRY_GIVE_UP,
    )?;
    // The last question starts by give_up_after and ends within
    // upstream_timeout; the record must outlive it (it is kept a retention
    // from when the inquiry began).
    let last_answer = give_up_after + timing.upstream_timeout + INQUIRY_LEASE_MARGIN;
    if give_up_after <= after || last_answer >= timing.retention {
        return Err(invalid(
            at_give_up,
            format!(
                "{give_up_after:?} must be longer than after ({after:?}), and with the route's \
                 upstream_timeout ({:?}) and {INQUIRY_LEASE_MARGIN:?} more shorter than its \
                 retention ({:?}): the record must outlive the inquiry's last answer",
                timing.upstream_timeout, timing.retention
            ),
        ));
    }
    let headers = headers(&at_table, raw.headers.iter().flatten())?;
    Ok(Some(Inquiry {
        url,
        after,
        every,
        give_up_after,
        headers,
    }))
}

/// The static `headers` sent with every question: valid names and values
/// (marked sensitive: often a credential), never the fence's header.
fn headers<'a>(
    at_table: &str,
    raw: impl Iterator<Item = (&'a String, &'a String)>,
) -> Result<Vec<(HeaderName, HeaderValue)>, ConfigError> {
    let mut headers = Vec::new();
    for (name, value) in raw {
        let at_header = format!("{at_table}.headers.{name}");
        let name: HeaderName = header_name(&at_header, name)?;
        if name == "idempotency-attempt" {
            return Err(invalid(
                &at_header,
                "is the question's fence, which idemgate sets to the key's token: it cannot \
                 be a static header",
            ));
        }
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| invalid(&at_header, "is not a valid header value"))?;
        // Often a credential: never in a `Debug` print of the config.
        value.set_sensitive(true);
        headers.push((name, value));
    }
    Ok(headers)
}

/// An absolute `http`/`https` URL with `{key}` in its path or query, and
/// no placeholder but `{key}` and `{scope}`: a client's key can never
/// choose the host a question goes to. No fragment: it never reaches the
/// upstream, so a placeholder there would ask every key the same URL.
fn check_url(at: &str, url: &str) -> Result<(), ConfigError> {
    if url.contains('#') {
        return Err(invalid(
            at,
            format!(
                "{url:?} has a fragment (#…): it is never sent to the upstream; put {{key}} \
                 in the path or the query"
            ),
        ));
    }
    let authority_end = url
        .find("://")
        .and_then(|s| url[s + 3..].find(['/', '?']).map(|e| s + 3 + e))
        .unwrap_or(url.len());
    if url[..authority_end].contains('{') {
        return Err(invalid(
            at,
            format!("{url:?}: placeholders may only be in the path or the query"),
        ));
    }
    if !url.contains("{key}") {
        return Err(invalid(
            at,
            format!("{url:?} lacks {{key}}: the question must name the key"),
        ));
    }
    let rest = url.replace("{key}", "").replace("{scope}", "");
    if rest.contains(['{', '}']) {
        return Err(invalid(
            at,
            format!("{url:?}: the only placeholders are {{key}} and {{scope}}"),
        ));
    }
    let sample = url.replace("{key}", "k").replace("{scope}", "s");
    match sample.parse::<http::Uri>() {
        Ok(uri) if matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some() => {
            Ok(())
        }
        _ => Err(invalid(
            at,
            format!("{url:?} is not an absolute http:// or https:// URL"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::UnknownOutcome;
    use crate::config::tests::{MINIMAL, parse, route_error};

    const TABLE: &str = "on_unknown_outcome = \"inquire\"\n[routes.inquiry]\n";

    #[test]
    fn an_inquiring_route_names_where_to_ask() {
        let c = parse(&format!(
            "{MINIMAL}\n{TABLE}url = \"http://up/v1/idempotency/{{key}}?s={{scope}}\"\n\
             after = \"2s\"\nevery = \"10s\"\ngive_up_after = \"30m\"\n\
             headers = {{ Authorization = \"Bearer t\" }}\n"
        ))
        .unwrap();
        let r = &c.routes[0];
        assert_eq!(r.on_unknown_outcome, UnknownOutcome::Inquire);
        let q = r.inquiry.as_ref().unwrap();
        assert_eq!(q.after, Duration::from_secs(2));
        assert_eq!(q.every, Duration::from_secs(10));
        assert_eq!(q.give_up_after, Duration::from_secs(1800));
        assert_eq!(q.headers[0].0, "authorization");
        let defaults = parse(&format!("{MINIMAL}\n{TABLE}url = \"http://up/{{key}}\"\n")).unwrap();
        assert!(defaults.routes[0].inquiry.is_some());
    }

    #[test]
    fn an_inquiry_sooner_than_the_upstream_timeout_is_a_warning() {
        let text = |after: &str| {
            format!(
                "{MINIMAL}\nupstream_timeout = \"30s\"\n{TABLE}url = \"http://up/{{key}}\"\nafter = \"{after}\"\n"
            )
        };
        let warned = parse(&text("5s")).unwrap().warnings();
        assert_eq!(warned.len(), 1);
        assert!(
            warned[0].contains("\"payments\"") && warned[0].contains("after"),
            "{warned:?}"
        );
        assert!(parse(&text("40s")).unwrap().warnings().is_empty());
    }

    #[test]
    fn a_bad_inquiry_is_named() {
        for (text, named) in [
            ("on_unknown_outcome = \"inquire\"\n", "routes[0].inquiry"),
            (
                "[routes.inquiry]\nurl = \"http://up/{key}\"\n",
                "routes[0].inquiry",
            ),
            (&format!("{TABLE}after = \"1s\"\n"), "routes[0].inquiry.url"),
            (
                &format!("{TABLE}url = \"http://up/status\"\n"),
                "routes[0].inquiry.url",
            ),
            (
                &format!("{TABLE}url = \"http://up/{{key}}/{{tenant}}\"\n"),
                "routes[0].inquiry.url",
            ),
            (
                &format!("{TABLE}url = \"/relative/{{key}}\"\n"),
                "routes[0].inquiry.url",
            ),
            (
                &format!("{TABLE}url = \"http://{{key}}.up/x\"\n"),
                "routes[0].inquiry.url",
            ),
            (
                &format!("{TABLE}url = \"http://up:{{scope}}/{{key}}\"\n"),
                "routes[0].inquiry.url",
            ),
            (
                &format!("{TABLE}url = \"http://up/{{key}}\"\nevery = \"10ms\"\n"),
                "routes[0].inquiry.every",
            ),
            (
                &format!(
                    "{TABLE}url = \"http://up/{{key}}\"\ngive_up_after = \"2s\"\nafter = \"5s\"\n"
                ),
                "routes[0].inquiry.give_up_after",
            ),
            (
                &format!("{TABLE}url = \"http://up/{{key}}\"\ngive_up_after = \"48h\"\n"),
                "routes[0].inquiry.give_up_after",
            ),
            (
                &format!(
                    "retention = \"1h\"\n{TABLE}url = \"http://up/{{key}}\"\ngive_up_after = \"59m50s\"\n"
                ),
                "routes[0].inquiry.give_up_after",
            ),
            (
                &format!(
                    "{TABLE}url = \"http://up/{{key}}\"\nheaders = {{ \"bad name\" = \"x\" }}\n"
                ),
                "routes[0].inquiry.headers",
            ),
            (
                &format!("{TABLE}url = \"http://up/{{key}}\"\nurll = \"x\"\n"),
                "urll",
            ),
        ] {
            let err = route_error(text);
            assert!(err.contains(named), "{text}: {err}");
        }
    }

    #[test]
    fn the_fence_is_never_static_nor_missing_from_forwards() {
        let err = route_error(&format!(
            "{TABLE}url = \"http://up/{{key}}\"\nheaders = {{ Idempotency-Attempt = \"1\" }}\n"
        ));
        assert!(err.contains("routes[0].inquiry.headers"), "{err}");
        let c = parse(&format!(
            "{MINIMAL}\nforward_attempt = false\n{TABLE}url = \"http://up/{{key}}\"\n"
        ))
        .unwrap();
        let warned = c.warnings();
        assert!(
            warned.len() == 1 && warned[0].contains("forward_attempt = false"),
            "{warned:?}"
        );
        let c = parse(&format!("{MINIMAL}\n{TABLE}url = \"http://up/{{key}}\"\n")).unwrap();
        assert!(c.routes[0].forward_attempt);
    }

    #[test]
    fn a_fragment_never_names_the_key() {
        for url in ["http://up/x#{key}", "http://up/{key}#top"] {
            let err = route_error(&format!("{TABLE}url = \"{url}\"\n"));
            assert!(
                err.contains("routes[0].inquiry.url") && err.contains("fragment"),
                "{url}: {err}"
            );
        }
    }

    #[test]
    fn a_scoped_route_asks_by_scope() {
        for scope in [
            "scope_header = \"X-Tenant\"",
            "scope_from = [\"header:X-Tenant\"]",
        ] {
            let text = |url: &str| format!("{scope}\n{TABLE}url = \"{url}\"\n");
            let err = route_error(&text("http://up/v1/idempotency/{key}"));
            assert!(
                err.contains("routes[0].inquiry.url") && err.contains("{scope}"),
                "{scope}: {err}"
            );
            let c = parse(&format!(
                "{MINIMAL}\n{}",
                text("http://up/{key}?scope={scope}")
            ));
            assert!(c.is_ok(), "{scope}: {:?}", c.err());
        }
    }

    /// The shipped `gateway.toml` (its `transfers` route inquires) passes
    /// `check` with no warning.
    #[test]
    fn the_shipped_config_is_quiet() {
        let shipped = include_str!("../../../gateway.toml");
        let c = parse(shipped).unwrap();
        assert!(c.routes.iter().any(|r| r.inquiry.is_some()));
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    }

    /// The status inquiry chapter's example route passes `check` with no
    /// warning (its defaults included).
    #[test]
    fn the_books_example_is_valid_and_quiet() {
        let chapter = include_str!("../../../docs/src/guide/status-inquiry.md");
        let start = chapter.find("```toml\n").expect("a toml example") + 8;
        let example = &chapter[start..start + chapter[start..].find("```").unwrap()];
        let env = |name: &str| (name == "PAYMENTS_TOKEN").then(|| "t0ken".to_string());
        let c = crate::config::Config::parse_with_env(example, &env).unwrap();
        assert!(c.routes[0].inquiry.is_some());
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    }

    #[test]
    fn the_first_question_waits_the_upstream_timeout_by_default() {
        for timeout in ["25s", "3s"] {
            let c = parse(&format!(
                "{MINIMAL}\nupstream_timeout = \"{timeout}\"\n{TABLE}url = \"http://up/{{key}}\"\n"
            ))
            .unwrap();
            let r = &c.routes[0];
            assert_eq!(r.inquiry.as_ref().unwrap().after, r.upstream_timeout);
            assert!(c.warnings().is_empty(), "{:?}", c.warnings());
        }
    }
}
