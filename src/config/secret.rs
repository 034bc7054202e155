//! `admin_token`: the bearer token that key administration over HTTP
//! (`POST /keys` on the admin listener) requires. Never printed (its
//! `Debug` is redacted) and compared by SHA-256 digest, so the comparison
//! takes the same time whatever the presented value shares with it.

use sha2::{Digest, Sha256};

use super::defaults::MIN_ADMIN_TOKEN_LEN;
use super::{ConfigError, invalid};

/// A validated admin token.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(***)")
    }
}

impl AdminToken {
    /// The token as sent: `Authorization: Bearer <token>`.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether an `Authorization` header value carries this token.
    pub fn authorizes(&self, authorization: Option<&[u8]>) -> bool {
        let Some(presented) = authorization.and_then(|v| bearer(v)) else {
            return false;
        };
        Sha256::digest(presented) == Sha256::digest(self.0.as_bytes())
    }
}

/// The credentials of a `Bearer` authorization value (scheme case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
}

/// `admin_token`: absent or empty (an unset `${VAR:-}`) is none, which
/// turns key administration over HTTP off; otherwise at least
/// [`MIN_ADMIN_TOKEN_LEN`] visible ASCII characters.
pub(super) fn admin_token(value: Option<String>) -> Result<Option<AdminToken>, ConfigError> {
    let Some(token) = value.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            "admin_token",
            "must be visible ASCII without spaces (it travels in an Authorization header)",
        ));
    }
    if token.len() < MIN_ADMIN_TOKEN_LEN {
        return Err(invalid(
            "admin_token",
            format!(
                "must be at least {MIN_ADMIN_TOKEN_LEN} characters; make one with `openssl rand -hex 32`"
            ),
        ));
    }
    Ok(Some(AdminToken(token)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123";

    fn token() -> AdminToken {
        admin_token(Some(TOKEN.into())).unwrap().unwrap()
    }

    #[test]
    fn absent_or_empty_is_off_short_or_odd_is_an_error() {
        assert_eq!(admin_token(None).unwrap(), None);
        assert_eq!(admin_token(Some(String::new())).unwrap(), None);
        let short = "x".repeat(MIN_ADMIN_TOKEN_LEN - 1);
        assert!(admin_token(Some(short)).is_err());
        assert!(admin_token(Some(format!("{TOKEN} x"))).is_err());
        assert!(admin_token(Some(format!("{TOKEN}é"))).is_err());
    }

    #[test]
    fn only_the_bearer_token_authorizes() {
        let t = token();
        assert!(t.authorizes(Some(format!("Bearer {TOKEN}").as_bytes())));
        assert!(t.authorizes(Some(format!("bearer  {TOKEN} ").as_bytes())));
        assert!(!t.authorizes(None));
        assert!(!t.authorizes(Some(TOKEN.as_bytes())));
        assert!(!t.authorizes(Some(format!("Basic {TOKEN}").as_bytes())));
        assert!(!t.authorizes(Some(format!("Bearer {TOKEN}x").as_bytes())));
        assert!(!t.authorizes(Some(b"Bearer ")));
    }

    #[test]
    fn never_printed() {
        assert!(!format!("{:?}", token()).contains(TOKEN));
    }
}
