//! `fingerprint::Fingerprinter` on arbitrary requests and bodies.
//!
//! Input layout: byte 0 is `n` (taken mod 64), bytes `1..1+n` drive the spec,
//! the request head, the chunking and the re-serialisation; the rest is the
//! body. (So a seed is `\0` followed by a body.)
//!
//! Properties: never panics; the fingerprint does not depend on how the body
//! is split into chunks (whole, one byte at a time, input-driven sizes, empty
//! chunks between); with
//! `body = "json"`, a body that is valid JSON and a re-serialisation of the same
//! value (as `json_body` parsed it) with different whitespace and object key
//! order get the same fingerprint.
#![no_main]

use arbitrary::Unstructured;
use http::request::Parts;
use idemgate::request::fingerprint::{BodyMode, Fingerprint, FingerprintSpec, Fingerprinter};
use idemgate::request::json_body::{JsonBody, Node};
use libfuzzer_sys::fuzz_target;

const HEADERS: &[&str] = &["content-type", "x-tenant", "authorization", "x-request-id"];
const METHODS: &[&str] = &["POST", "PUT", "PATCH", "DELETE", "GET", "X-CUSTOM"];
const POINTERS: &[&str] = &[
    "",
    "/",
    "/a",
    "/meta/ts",
    "/a/0",
    "/a/1",
    "/items/0/id",
    "/~0/~1",
    "/a/-",
    "/a/01",
    "meta",
    "/0",
];

fn fingerprint(
    spec: &FingerprintSpec,
    parts: &Parts,
    chunks: &[&[u8]],
    body: &[u8],
) -> Fingerprint {
    let mut f = Fingerprinter::new(spec, parts);
    for c in chunks {
        f.update(c);
    }
    f.finish(body, idemgate::request::json_body::JsonBody::parse(body))
}

/// Split `body` at input-driven sizes (1..=256, cycling).
fn split<'b>(body: &'b [u8], sizes: &[u8]) -> Vec<&'b [u8]> {
    let mut out = Vec::new();
    let mut rest = body;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes
            .get(i % sizes.len().max(1))
            .map_or(7, |&s| s as usize + 1);
        let n = n.min(rest.len());
        out.push(&rest[..n]);
        rest = &rest[n..];
        i += 1;
    }
    out
}

/// Writes a JSON value with input-driven whitespace and key order.
struct Writer<'l> {
    layout: &'l [u8],
    i: usize,
    out: String,
}

impl Writer<'_> {
    fn next(&mut self) -> u8 {
        let b = if self.layout.is_empty() {
            0
        } else {
            self.layout[self.i % self.layout.len()]
        };
        self.i += 1;
        b
    }

    fn ws(&mut self) {
        let ws = match self.next() % 6 {
            0 => "",
            1 => " ",
            2 => "\n",
            3 => "\t",
            4 => "\r\n  ",
            _ => "  ",
        };
        self.out.push_str(ws);
    }

    fn value(&mut self, v: &Node<'_>) {
        self.ws();
        match v {
            Node::String(s) => self.out.push_str(&serde_json::to_string(s).unwrap()),
            // Numbers, true, false and null exactly as parsed.
            Node::Literal(text) => self.out.push_str(text),
            Node::Array(items) => {
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.value(item);
                }
                self.ws();
                self.out.push(']');
            }
            Node::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                // Not the sorted order the parsed object iterates in.
                match self.next() % 3 {
                    0 => entries.reverse(),
                    1 if !entries.is_empty() => {
                        let k = self.next() as usize % entries.len();
                        entries.rotate_left(k);
                    }
                    _ => {}
                }
                self.out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.ws();
                    self.out.push_str(&serde_json::to_string(k).unwrap());
                    self.ws();
                    self.out.push(':');
                    self.value(item);
                }
                self.ws();
                self.out.push('}');
            }
        }
        self.ws();
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = (n as usize % 64).min(rest.len());
    let (control, body) = rest.split_at(n);
    let mut u = Unstructured::new(control);

    let body_mode = match u.arbitrary::<u8>().unwrap_or(0) % 3 {
        0 => BodyMode::Json,
        1 => BodyMode::Raw,
        _ => BodyMode::Ignore,
    };
    let flags = u.arbitrary::<u8>().unwrap_or(0);
    let mut headers = Vec::new();
    for (i, name) in HEADERS.iter().enumerate() {
        if flags & (8 << i) != 0 {
            headers.push(http::HeaderName::from_static(name));
        }
    }
    let mut exclude = Vec::new();
    for _ in 0..u.int_in_range(0..=3u8).unwrap_or(0) {
        if u.arbitrary::<bool>().unwrap_or(false) {
            exclude.push(u.arbitrary::<String>().unwrap_or_default());
        } else {
            let i = u.choose_index(POINTERS.len()).unwrap_or(0);
            exclude.push(POINTERS[i].to_string());
        }
    }
    let spec = FingerprintSpec {
        method: flags & 1 != 0,
        path: flags & 2 != 0,
        query: flags & 4 != 0,
        headers,
        body: body_mode,
        exclude,
    };

    let method = METHODS[u.choose_index(METHODS.len()).unwrap_or(0)];
    let uri: String = u.arbitrary().unwrap_or_default();
    let mut builder = http::Request::builder().method(method);
    if uri.starts_with('/') {
        builder = builder.uri(uri.as_str());
    }
    for _ in 0..u.int_in_range(0..=3u8).unwrap_or(0) {
        let name = HEADERS[u.choose_index(HEADERS.len()).unwrap_or(0)];
        let value: &[u8] = u.arbitrary().unwrap_or_default();
        if let Ok(value) = http::HeaderValue::from_bytes(value) {
            builder = builder.header(name, value);
        }
    }
    let Ok(request) = builder.body(()) else {
        return;
    };
    let (parts, ()) = request.into_parts();
    let sizes: &[u8] = u.arbitrary().unwrap_or_default();
    let layout = u.take_rest();

    let whole = fingerprint(&spec, &parts, &[body], body);
    let bytewise: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(
        whole,
        fingerprint(&spec, &parts, &bytewise, body),
        "one-byte chunks change the fingerprint"
    );
    assert_eq!(
        whole,
        fingerprint(&spec, &parts, &split(body, sizes), body),
        "chunking at {sizes:?} changes the fingerprint"
    );
    let with_empty: Vec<&[u8]> = split(body, sizes)
        .into_iter()
        .flat_map(|c| [&[][..], c])
        .chain([&[][..]])
        .collect();
    assert_eq!(
        whole,
        fingerprint(&spec, &parts, &with_empty, body),
        "empty chunks change the fingerprint"
    );

    if spec.body == BodyMode::Json
        && let Some(json) = JsonBody::parse(body)
    {
        let mut w = Writer {
            layout,
            i: 0,
            out: String::new(),
        };
        w.value(json.root());
        let other = w.out.into_bytes();
        assert!(
            serde_json::from_slice::<serde::de::IgnoredAny>(&other).is_ok(),
            "the re-serialisation is not JSON: {:?}",
            String::from_utf8_lossy(&other)
        );
        // Past its nesting cost limit a body counts as not JSON; more
        // whitespace can move a body across it.
        if JsonBody::parse(&other).is_none() {
            return;
        }
        assert_eq!(
            whole,
            fingerprint(&spec, &parts, &[&other], &other),
            "same JSON value, different fingerprint:\n  {:?}\n  {:?}",
            String::from_utf8_lossy(body),
            String::from_utf8_lossy(&other)
        );
    }
});
