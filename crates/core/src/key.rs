//! The key space of the state machine, `(route, scope, key)`, and the values
//! a record is identified and fenced by: the scope's digest, the request's
//! fingerprint, the attempt's fencing token and id, and the id under which
//! a key's settling is announced to waiters.

use sha2::{Digest, Sha256};

/// The key space of docs/src/design/state-machine.md: `(route, scope, key)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecordKey {
    /// The route's name.
    pub route: String,
    /// [`scope_digest`] of the route's scope parts; empty for unscoped routes.
    pub scope: Vec<u8>,
    /// The client's idempotency key.
    pub key: String,
}

impl RecordKey {
    /// The id under which this key's settling is announced to waiters.
    pub fn wake_id(&self) -> WakeId {
        wake_id(&self.route, &self.scope, &self.key)
    }
}

/// An attempt's fencing token.
pub type Token = i64;

/// An attempt's own id, chosen by the gateway before the claim and written
/// with it. The store's token is unknown to a gateway whose claim's answer
/// was lost; the attempt id is not, so that gateway can still remove the
/// record it may have created.
pub type AttemptId = i64;

/// A request's SHA-256 fingerprint: a key that comes back with another one
/// is another request under the same key.
pub type Fingerprint = [u8; 32];

/// A record key's announcement id.
pub type WakeId = [u8; 32];

/// A record key's announcement id: SHA-256 over the route (its length
/// first, as a big-endian `u32`), the scope (likewise) and the key.
pub fn wake_id(route: &str, scope: &[u8], key: &str) -> WakeId {
    let mut hasher = Sha256::new();
    hasher.update((route.len() as u32).to_be_bytes());
    hasher.update(route.as_bytes());
    hasher.update((scope.len() as u32).to_be_bytes());
    hasher.update(scope);
    hasher.update(key.as_bytes());
    hasher.finalize().into()
}

/// The scope of one part's values (a `scope_header`'s, say): the SHA-256
/// of each value preceded by its length as 8 bytes big-endian (none: the
/// anonymous scope). Only this digest is ever stored.
pub fn scope_digest<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut hasher = Sha256::new();
    for value in values {
        hasher.update((value.len() as u64).to_be_bytes());
        hasher.update(value);
    }
    hasher.finalize().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_ids_are_framed() {
        assert_ne!(wake_id("ab", b"", "c"), wake_id("a", b"", "bc"));
        assert_ne!(wake_id("a", b"x", "c"), wake_id("a", b"", "xc"));
    }

    #[test]
    fn scope_digests_are_framed() {
        assert_ne!(
            scope_digest([b"ab".as_slice(), b"c"]),
            scope_digest([b"a".as_slice(), b"bc"])
        );
        assert_ne!(scope_digest([b"".as_slice()]), scope_digest([]));
    }
}
