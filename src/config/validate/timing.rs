//! How long things last on a route: `retention`, `lease` and
//! `upstream_timeout`, and the bounds between them.

use crate::config::settings as S;
use std::time::Duration;

use crate::config::defaults::{
    DEFAULT_LEASE, DEFAULT_RETENTION, DEFAULT_UPSTREAM_TIMEOUT, MAX_RETENTION, MAX_RETENTION_DAYS,
    MIN_LEASE,
};
use crate::config::raw::RawRoute;
use crate::config::values::duration;
use crate::config::{ConfigError, invalid};

/// A route's validated durations.
pub(super) struct Timing {
    pub(super) retention: Duration,
    pub(super) lease: Duration,
    pub(super) upstream_timeout: Duration,
}

/// `retention` (at most [`MAX_RETENTION`], at least `lease`), `lease` (at
/// least [`MIN_LEASE`]) and `upstream_timeout` (not zero).
pub(super) fn timing(at: &str, r: &RawRoute) -> Result<Timing, ConfigError> {
    let retention = duration(
        &S::RETENTION.at(at),
        r.retention.as_deref(),
        DEFAULT_RETENTION,
    )?;
    if retention > MAX_RETENTION {
        return Err(invalid(
            S::RETENTION.at(at),
            format!("must be at most {MAX_RETENTION_DAYS} days"),
        ));
    }
    let lease = duration(&S::LEASE.at(at), r.lease.as_deref(), DEFAULT_LEASE)?;
    if lease < MIN_LEASE {
        return Err(invalid(
            S::LEASE.at(at),
            format!("must be at least {}", humantime::format_duration(MIN_LEASE)),
        ));
    }
    if retention < lease {
        return Err(invalid(
            S::RETENTION.at(at),
            "must be at least as long as `lease`",
        ));
    }
    let upstream_timeout = duration(
        &S::UPSTREAM_TIMEOUT.at(at),
        r.upstream_timeout.as_deref(),
        DEFAULT_UPSTREAM_TIMEOUT,
    )?;
    if upstream_timeout.is_zero() {
        return Err(invalid(
            S::UPSTREAM_TIMEOUT.at(at),
            "must be greater than zero",
        ));
    }
    Ok(Timing {
        retention,
        lease,
        upstream_timeout,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{MINIMAL, parse, route_error};

    #[test]
    fn lease_and_retention_bounds() {
        assert!(parse(&format!("{MINIMAL}\nlease = \"500ms\"\n")).is_err());
        assert!(parse(&format!("{MINIMAL}\nretention = \"10s\"\n")).is_err());
    }

    #[test]
    fn retention_has_a_ceiling() {
        let line = "retention = \"300000y\"";
        let err = route_error(line);
        assert!(err.contains("routes[0].retention"), "{line}: {err}");
        assert!(err.contains("must be at most 3650 days"), "{err}");
    }

    #[test]
    fn bounds_name_their_key() {
        let err = route_error("lease = \"500ms\"");
        assert!(
            err.contains("`routes[0].lease`: must be at least 1s"),
            "{err}"
        );
        let err = route_error("retention = \"10s\"");
        assert!(err.contains("`routes[0].retention`"), "{err}");
        let err = route_error("upstream_timeout = \"0s\"");
        assert!(err.contains("`routes[0].upstream_timeout`"), "{err}");
    }
}
