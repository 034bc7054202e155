//! `request::key::parse` on arbitrary header values.
//!
//! Properties: never panics; an accepted key is 1..=MAX_KEY_LEN characters of
//! printable ASCII (0x20..=0x7e); a key re-quoted as an RFC 8941 sf-string
//! parses back to the same key (asserted for every accepted key, bare or
//! quoted); a bare key is the trimmed header value itself.
#![no_main]

use http::HeaderValue;
use idemgate::request::key::{MAX_KEY_LEN, parse};
use libfuzzer_sys::fuzz_target;

fn sf_string(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 2);
    out.push('"');
    for c in key.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// RFC 9110 OWS: spaces and horizontal tabs.
fn trim_ows(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = b {
        b = rest;
    }
    b
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let Ok(key) = parse(&value) else {
        return;
    };
    let chars = key.chars().count();
    assert!(
        (1..=MAX_KEY_LEN).contains(&chars),
        "accepted a key of {chars} characters: {key:?}"
    );
    assert!(
        key.bytes().all(|b| (0x20..=0x7e).contains(&b)),
        "accepted a key that is not printable ASCII: {key:?}"
    );

    let trimmed = trim_ows(data);
    let bare = trimmed.first() != Some(&b'"');
    if bare {
        assert_eq!(
            key.as_bytes(),
            trimmed,
            "a bare key is not the trimmed header value"
        );
    }

    let quoted = sf_string(&key);
    let requoted = HeaderValue::from_str(&quoted)
        .expect("a printable-ASCII sf-string is a valid header value");
    assert_eq!(
        parse(&requoted).as_deref(),
        Ok(key.as_str()),
        "{} key {key:?} re-quoted as {quoted} does not parse back",
        if bare { "bare" } else { "quoted" }
    );
});
