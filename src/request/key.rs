//! The idempotency key: parsing the header (docs/src/design/pipeline.md, step 3).
//!
//! The IETF draft defines the header as an RFC 8941 sf-string (`"abc"`, with
//! `\"` and `\\` escapes). For compatibility with clients that send Stripe-style
//! keys, a bare value of visible ASCII is accepted too; `"abc"` and `abc` are
//! the same key.

use http::HeaderValue;

/// Longest key accepted, in characters (after unescaping).
pub const MAX_KEY_LEN: usize = 255;

/// Why a key header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The header is present but empty.
    #[error("the key is empty")]
    Empty,
    /// Longer than [`MAX_KEY_LEN`].
    #[error("the key is longer than {MAX_KEY_LEN} characters")]
    TooLong,
    /// Contains a control character, a non-ASCII byte or (bare form) a space.
    #[error("the key may contain only visible ASCII characters")]
    BadCharacter,
    /// A bare value with a comma: a structured-field list, not one key.
    #[error(
        "the key is a list (it contains ','); send one key, as a quoted string if it must contain a comma"
    )]
    List,
    /// Starts with `"` but is not a valid RFC 8941 sf-string.
    #[error("the key is not a valid structured-field string (RFC 8941 §3.3.3)")]
    BadString,
    /// A key that is, or holds between `/` or `\`, `.` or `..`, on a route
    /// whose status inquiry names the key in its URL's path, where it would
    /// be a dot-segment (a normaliser that decodes first resolves it, even
    /// percent-encoded, to another resource).
    #[error(
        "the key is or holds a `.` or `..` path segment, which this route's status inquiry would send in its URL"
    )]
    DotSegment,
    /// The header (or query parameter) appears more than once.
    #[error("it appears more than once")]
    Repeated,
    /// A `json:` part, and the body is not JSON.
    #[error("the request body is not JSON")]
    NotJson,
    /// A `json:` part names a value that is not a string or an integer.
    #[error("the value there is {0}, not a string or an integer")]
    NotKeyValue(&'static str),
    /// A `cert:` part with no value: the connection has no verified
    /// client certificate, or the certificate has no such name (an
    /// anonymous caller must not share one scope).
    #[error("{0}")]
    NoCertValue(&'static str),
}

/// A key as logs and traces show it: the first 12 hex digits of its
/// SHA-256 (never the key itself).
pub fn digest(key: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(key.as_bytes())[..6])
}

/// Parse one key header value into the key it names.
pub fn parse(value: &HeaderValue) -> Result<String, KeyError> {
    let bytes = trim_ows(value.as_bytes());
    let key = match bytes.first() {
        None => return Err(KeyError::Empty),
        Some(b'"') => parse_sf_string(bytes)?,
        Some(_) => {
            if !bytes.iter().all(|b| (0x21..=0x7e).contains(b)) {
                return Err(KeyError::BadCharacter);
            }
            // `a,b` is an RFC 8941 list of two items, never one key.
            if bytes.contains(&b',') {
                return Err(KeyError::List);
            }
            // Checked visible ASCII above, so this is valid UTF-8.
            String::from_utf8_lossy(bytes).into_owned()
        }
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong);
    }
    Ok(key)
}

/// Check a key taken from a query parameter or a JSON value: 1 to
/// [`MAX_KEY_LEN`] printable ASCII characters (spaces and commas allowed:
/// there is no header syntax to respect).
pub fn plain(text: &str) -> Result<String, KeyError> {
    if text.is_empty() {
        return Err(KeyError::Empty);
    }
    if !text.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(KeyError::BadCharacter);
    }
    if text.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong);
    }
    Ok(text.to_string())
}

fn trim_ows(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = b {
        b = rest;
    }
    b
}

/// RFC 8941 §4.2.5: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE, the
/// whole value and nothing after it.
fn parse_sf_string(bytes: &[u8]) -> Result<String, KeyError> {
    let mut out = String::with_capacity(bytes.len());
    let mut iter = bytes[1..].iter();
    loop {
        match iter.next() {
            None => return Err(KeyError::BadString),
            Some(b'"') => break,
            Some(b'\\') => match iter.next() {
                Some(c @ (b'"' | b'\\')) => out.push(*c as char),
                _ => return Err(KeyError::BadString),
            },
            Some(c) if (0x20..=0x7e).contains(c) => out.push(*c as char),
            Some(_) => return Err(KeyError::BadCharacter),
        }
    }
    if iter.next().is_some() {
        return Err(KeyError::BadString);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &[u8]) -> Result<String, KeyError> {
        parse(&HeaderValue::from_bytes(s).unwrap())
    }

    #[test]
    fn quoted_and_bare_forms_are_the_same_key() {
        assert_eq!(p(b"\"abc-123\"").unwrap(), "abc-123");
        assert_eq!(p(b"abc-123").unwrap(), "abc-123");
        assert_eq!(p(b"  abc-123 ").unwrap(), "abc-123");
    }

    #[test]
    fn a_bare_list_is_not_a_key_but_a_quoted_comma_is() {
        assert_eq!(p(b"a,b"), Err(KeyError::List));
        assert_eq!(p(b"a, b"), Err(KeyError::BadCharacter));
        assert_eq!(p(b","), Err(KeyError::List));
        assert_eq!(p(b"\"a,b\"").unwrap(), "a,b");
    }

    #[test]
    fn sf_string_escapes_and_spaces() {
        assert_eq!(p(br#""a \"b\" \\c""#).unwrap(), r#"a "b" \c"#);
        assert_eq!(p(br#""a\nb""#), Err(KeyError::BadString));
        assert_eq!(p(br#""abc"#), Err(KeyError::BadString));
        assert_eq!(p(br#""abc"x"#), Err(KeyError::BadString));
        assert_eq!(p(br#""ab\"#), Err(KeyError::BadString));
    }

    #[test]
    fn empty_long_and_control_characters_are_invalid() {
        assert_eq!(p(b""), Err(KeyError::Empty));
        assert_eq!(p(b"\"\""), Err(KeyError::Empty));
        assert_eq!(p(b"a b"), Err(KeyError::BadCharacter));
        assert_eq!(p(b"a\tb"), Err(KeyError::BadCharacter));
        assert_eq!(p(b"\"a\tb\""), Err(KeyError::BadCharacter));
        assert_eq!(p("é".as_bytes()), Err(KeyError::BadCharacter));
        assert_eq!(p(&[b'k'; 255]).unwrap().len(), 255);
        assert_eq!(p(&[b'k'; 256]), Err(KeyError::TooLong));
    }

    #[test]
    fn plain_keys_allow_spaces_and_commas_but_not_controls() {
        assert_eq!(plain("a b,c").unwrap(), "a b,c");
        assert_eq!(plain(""), Err(KeyError::Empty));
        assert_eq!(plain("a\nb"), Err(KeyError::BadCharacter));
        assert_eq!(plain("a\tb"), Err(KeyError::BadCharacter));
        assert_eq!(plain("é"), Err(KeyError::BadCharacter));
        assert_eq!(plain(&"k".repeat(256)), Err(KeyError::TooLong));
    }
}
