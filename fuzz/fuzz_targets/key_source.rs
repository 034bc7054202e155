//! `key_source::{key, scope}` on arbitrary JSON bodies, headers and queries
//! (keys from anywhere in the request).
//!
//! Input layout: byte 0 is `n` (taken mod 64), bytes `1..1+n` choose the
//! parts, a header value and a query string; the rest is the body.
//!
//! Properties: never panics; an accepted key's parts are each 1..=255
//! printable ASCII characters; naming the same values as an operator does
//! (`key_of_values`, `idemgate keys --part`) gives the same key; the scope
//! of the same values is the same digest (`scope_of_values`); a body that
//! `json_body` reads is JSON to serde_json too.
#![no_main]

use arbitrary::Unstructured;
use idemgate::request::json_body::JsonBody;
use idemgate::request::key_source::{self, Found, KeyPart};
use libfuzzer_sys::fuzz_target;

const POINTERS: &[&str] = &[
    "",
    "/id",
    "/message/messageId",
    "/subscription",
    "/a/0",
    "/a/1",
    "/~0/~1",
    "/a/-",
    "/0",
    "/step",
];

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = (n as usize % 64).min(rest.len());
    let (control, body) = rest.split_at(n);
    let mut u = Unstructured::new(control);

    let mut parts = Vec::new();
    for _ in 0..u.int_in_range(1..=3u8).unwrap_or(1) {
        let part = match u.int_in_range(0..=3u8).unwrap_or(0) {
            0 => KeyPart::Header(http::HeaderName::from_static("x-key")),
            1 => KeyPart::Query("id".into()),
            2 => {
                let text: String = u.arbitrary().unwrap_or_default();
                match KeyPart::parse(&format!("json:{text}")) {
                    Ok(part) => part,
                    Err(_) => continue,
                }
            }
            _ => KeyPart::Json(POINTERS[u.choose_index(POINTERS.len()).unwrap_or(0)].into()),
        };
        if !parts.contains(&part) {
            parts.push(part);
        }
    }
    if parts.is_empty() {
        return;
    }
    let header: &[u8] = u.arbitrary().unwrap_or_default();
    let query: String = u.arbitrary().unwrap_or_default();
    let mut builder = http::Request::builder().method("POST");
    if let Ok(uri) = format!("/hook?{query}").parse::<http::Uri>() {
        builder = builder.uri(uri);
    }
    if let Ok(value) = http::HeaderValue::from_bytes(header) {
        builder = builder.header("x-key", value);
    }
    let Ok(request) = builder.body(()) else {
        return;
    };
    let (head, ()) = request.into_parts();

    let json = JsonBody::parse(body);
    if json.is_some() {
        assert!(
            serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok(),
            "json_body read a body serde_json refuses"
        );
    }
    if let Ok(Found::Key(key)) = key_source::key(&parts, &head, json.as_ref()) {
        // The values, as an operator would name them: read each part alone.
        let mut values = Vec::new();
        for part in &parts {
            match key_source::key(std::slice::from_ref(part), &head, json.as_ref()) {
                Ok(Found::Key(value)) => {
                    assert!(!value.is_empty() && value.len() <= 255, "{value:?}");
                    assert!(
                        value.bytes().all(|b| (0x20..=0x7e).contains(&b)),
                        "{value:?}"
                    );
                    // A header part is given as clients send it: quoted.
                    values.push(match part {
                        KeyPart::Header(_) => {
                            format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
                        }
                        _ => value,
                    });
                }
                other => panic!("{part} alone gives {other:?}, together a key"),
            }
        }
        assert_eq!(
            key_source::key_of_values(&parts, &values).as_ref(),
            Ok(&key),
            "the operator's --part values name another key"
        );
    }
    if let Ok(scope) = key_source::scope(&parts, &head, json.as_ref()) {
        assert_eq!(scope.len(), 32);
    }
});
