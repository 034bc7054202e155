//! What a route records and replays: `record` (which statuses),
//! `replay_headers` (the headers never stored) and `max_recorded_response`.

use http::HeaderName;

use crate::config::defaults::DEFAULT_MAX_RECORDED_RESPONSE;
use crate::config::raw::RawRoute;
use crate::config::settings::{MAX_RECORDED_RESPONSE, RECORD, REPLAY_HEADERS};
use crate::config::values::{header_name, size};
use crate::config::{ConfigError, RecordPolicy, invalid};

/// `record`: statuses, classes, ranges and exclusions.
pub(super) fn statuses(at: &str, r: &RawRoute) -> Result<RecordPolicy, ConfigError> {
    let items: Vec<String> = r.record.clone().unwrap_or_else(|| RECORD.strings());
    RecordPolicy::parse(&items).map_err(|m| invalid(RECORD.at(at), m))
}

/// `replay_headers`: the deny list, as header names.
pub(super) fn replay_headers_deny(at: &str, r: &RawRoute) -> Result<Vec<HeaderName>, ConfigError> {
    let list = r
        .replay_headers
        .clone()
        .unwrap_or_else(|| REPLAY_HEADERS.strings());
    list.iter()
        .map(|h| header_name(&REPLAY_HEADERS.at(at), h))
        .collect()
}

/// `max_recorded_response`: at least one byte.
pub(super) fn max_recorded_response(at: &str, r: &RawRoute) -> Result<usize, ConfigError> {
    let max = size(
        &MAX_RECORDED_RESPONSE.at(at),
        r.max_recorded_response.as_deref(),
        DEFAULT_MAX_RECORDED_RESPONSE,
    )?;
    if max == 0 {
        return Err(invalid(
            MAX_RECORDED_RESPONSE.at(at),
            "must be at least 1 byte (0 would hold every key)",
        ));
    }
    Ok(max)
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{MINIMAL, parse, route_error};

    #[test]
    fn zero_max_recorded_response_is_rejected() {
        let line = "max_recorded_response = \"0\"";
        let err = route_error(line);
        assert!(
            err.contains("routes[0].max_recorded_response"),
            "{line}: {err}"
        );
    }

    #[test]
    fn replay_headers_replace_the_default_list() {
        let text = format!("{MINIMAL}\nreplay_headers = [\"X-Trace\"]\n");
        let r = &parse(&text).unwrap().routes[0];
        assert_eq!(r.replay_headers_deny, vec!["x-trace"]);
        let err = route_error("replay_headers = [\"a b\"]");
        assert!(err.contains("routes[0].replay_headers"), "{err}");
    }
}
