//! Parsers for the human strings of the file: durations (`"30s"`, `"1m 30s"`),
//! sizes (`"1MiB"`, `"64 KiB"`), socket addresses and header names. Each
//! takes the dotted key it parses for, so its error names that key; a value
//! left out takes the default the caller passes.

use std::net::SocketAddr;
use std::time::Duration;

use http::HeaderName;

use super::{ConfigError, invalid};

/// A duration like `"30s"` or `"24h"`; `default` if the key is absent.
pub(super) fn duration(
    key: &str,
    value: Option<&str>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    value.map_or(Ok(default), |text| {
        humantime::parse_duration(text).map_err(|e| {
            invalid(
                key,
                format!("{text:?} is not a duration like \"30s\" or \"24h\" ({e})"),
            )
        })
    })
}

/// A size in bytes like `"1MiB"`; `default` if the key is absent.
pub(super) fn size(key: &str, value: Option<&str>, default: usize) -> Result<usize, ConfigError> {
    value.map_or(Ok(default), |text| {
        let bytes: bytesize::ByteSize = text
            .parse()
            .map_err(|e| invalid(key, format!("{text:?} is not a size like \"1MiB\" ({e})")))?;
        usize::try_from(bytes.as_u64()).map_err(|_| invalid(key, "size too large"))
    })
}

/// An address like `"0.0.0.0:8080"`; `default` if the key is absent.
pub(super) fn socket_addr(
    key: &str,
    value: Option<&str>,
    default: SocketAddr,
) -> Result<SocketAddr, ConfigError> {
    value.map_or(Ok(default), |text| {
        text.parse().map_err(|_| {
            invalid(
                key,
                format!("{text:?} is not an address like \"0.0.0.0:8080\""),
            )
        })
    })
}

/// A header name (any case; stored lowercase).
pub(super) fn header_name(key: &str, text: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(text.as_bytes())
        .map_err(|_| invalid(key, format!("{text:?} is not a valid header name")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{MINIMAL, parse, route_error};

    #[test]
    fn durations_and_sizes_are_human_strings() {
        let text = format!("{MINIMAL}\nlease = \"1m 30s\"\nmax_request_body = \"64 KiB\"\n");
        let r = &parse(&text).unwrap().routes[0];
        assert_eq!(r.lease, Duration::from_secs(90));
        assert_eq!(r.max_request_body, 64 * 1024);
        let err = route_error("lease = \"soon\"");
        assert!(err.contains("routes[0].lease"), "{err}");
        let err = route_error("max_request_body = \"big\"");
        assert!(err.contains("routes[0].max_request_body"), "{err}");
    }

    #[test]
    fn absent_values_take_the_default() {
        let d = Duration::from_millis(7);
        assert_eq!(duration("k", None, d).unwrap(), d);
        assert_eq!(
            duration("k", Some("250ms"), d).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(size("k", None, 7).unwrap(), 7);
        assert_eq!(size("k", Some("2KiB"), 7).unwrap(), 2048);
        let addr: SocketAddr = "10.0.0.1:1".parse().unwrap();
        assert_eq!(socket_addr("k", None, addr).unwrap(), addr);
        let other = socket_addr("k", Some("[::1]:2"), addr).unwrap();
        assert_eq!(other, "[::1]:2".parse().unwrap());
    }

    #[test]
    fn errors_name_the_key_and_the_value() {
        let err = duration("a.b", Some("soon"), Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`a.b`") && err.contains("\"soon\""), "{err}");
        let err = size("a.b", Some("big"), 0).unwrap_err().to_string();
        assert!(err.contains("`a.b`") && err.contains("\"big\""), "{err}");
        let addr: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let err = socket_addr("a.b", Some("host"), addr)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`a.b`") && err.contains("\"host\""), "{err}");
    }

    #[test]
    fn header_names_are_lowercased_and_checked() {
        assert_eq!(header_name("k", "X-Tenant").unwrap(), "x-tenant");
        let err = header_name("k", "bad header").unwrap_err().to_string();
        assert!(err.contains("not a valid header name"), "{err}");
    }
}
