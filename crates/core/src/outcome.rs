//! The two verdicts the rules hand back to a caller: what a lapsed lease
//! turns into ([`UnknownOutcome`], a route's policy), and whether a
//! compare-and-set on a fencing token took effect ([`Cas`]).

use serde::Deserialize;

/// What happens to a key whose attempt's outcome became unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownOutcome {
    /// The key turns `held`: never forwarded again until released or expired.
    Hold,
    /// The next request takes the key over with a higher fencing token.
    Release,
    /// The key turns `inquiring`: the gateway asks the upstream's status
    /// endpoint whether it acted (`[routes.inquiry]`), and records the
    /// answer, releases the key, or holds it once it gives up.
    Inquire,
}

/// Whether a compare-and-set on a token took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cas {
    /// It did.
    Applied,
    /// The record's token or state is no longer this attempt's: nothing changed.
    Fenced,
}
