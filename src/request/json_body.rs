//! A JSON request body, parsed once per request for everything that reads
//! it: key parts (`json:/pointer`, docs/src/guide/webhooks.md) and the canonical JSON
//! fingerprint (`fingerprint.body = "json"`).
//!
//! Numbers keep their exact text (`0.10000000000000001` and `0.1` differ,
//! and so do `1` and `1.0`): nothing is rounded through `f64`. Each value is
//! first taken as a [`RawValue`] (its exact text) and containers are then
//! read one level further, so no object key has a special meaning (serde_json's
//! `arbitrary_precision` reads an object whose first key is
//! `$serde_json::private::Number` as a number, which made key order change a
//! fingerprint; found by fuzzing).
//!
//! Reading a container re-reads its text, so a body costs one pass per level
//! of nesting. Past [`MAX_DEPTH`] levels, or past [`PASSES`] passes over the
//! body in all, the body is treated as not JSON (its fingerprint is then
//! byte-exact, and a `json:` key part is invalid).

use std::collections::BTreeMap;

use serde_json::value::RawValue;

/// Deepest nesting read.
pub const MAX_DEPTH: usize = 64;
/// Bytes read in all, as a multiple of the body's length.
pub const PASSES: usize = 16;

/// A parsed JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonBody<'a> {
    root: Node<'a>,
}

/// One JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node<'a> {
    /// An object; keys unescaped, sorted (a repeated key: the last wins).
    Object(BTreeMap<String, Node<'a>>),
    /// An array.
    Array(Vec<Node<'a>>),
    /// A string, unescaped.
    String(String),
    /// A number, `true`, `false` or `null`, exactly as sent.
    Literal(&'a str),
}

impl<'a> JsonBody<'a> {
    /// Parse `body`; `None` if it is not JSON (or too deep or costly to read).
    pub fn parse(body: &'a [u8]) -> Option<Self> {
        let raw: &RawValue = serde_json::from_slice(body).ok()?;
        let mut budget = body.len().saturating_mul(PASSES).max(64 * 1024);
        Some(Self {
            root: node(raw, 0, &mut budget)?,
        })
    }

    /// The whole body's value.
    pub fn root(&self) -> &Node<'a> {
        &self.root
    }

    /// The value at an RFC 6901 pointer (`""` is the whole body).
    pub fn pointer(&self, pointer: &str) -> Option<&Node<'a>> {
        if pointer.is_empty() {
            return Some(&self.root);
        }
        let mut at = &self.root;
        for token in pointer.strip_prefix('/')?.split('/') {
            let token = unescape(token);
            at = match at {
                Node::Object(map) => map.get(&token)?,
                Node::Array(items) => items.get(parse_index(&token)?)?,
                _ => return None,
            };
        }
        Some(at)
    }

    /// Remove the value at `pointer`, if there is one (an array element
    /// shifts the ones after it).
    pub fn remove(&mut self, pointer: &str) {
        let Some((parent, last)) = pointer.rsplit_once('/') else {
            return;
        };
        let last = unescape(last);
        match self.pointer_mut(parent) {
            Some(Node::Object(map)) => {
                map.remove(&last);
            }
            Some(Node::Array(items)) => {
                if let Ok(i) = last.parse::<usize>()
                    && i < items.len()
                {
                    items.remove(i);
                }
            }
            _ => {}
        }
    }

    fn pointer_mut(&mut self, pointer: &str) -> Option<&mut Node<'a>> {
        if pointer.is_empty() {
            return Some(&mut self.root);
        }
        let mut at = &mut self.root;
        for token in pointer.strip_prefix('/')?.split('/') {
            let token = unescape(token);
            at = match at {
                Node::Object(map) => map.get_mut(&token)?,
                Node::Array(items) => items.get_mut(parse_index(&token)?)?,
                _ => return None,
            };
        }
        Some(at)
    }

    /// The canonical form: object keys sorted, no insignificant whitespace,
    /// strings escaped as serde_json writes them, literals as sent.
    pub fn canonical(&self) -> Vec<u8> {
        let mut out = Vec::new();
        write(&self.root, &mut out);
        out
    }
}

impl Node<'_> {
    /// What kind of value this is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Object(_) => "an object",
            Self::Array(_) => "an array",
            Self::String(_) => "a string",
            Self::Literal("null") => "null",
            Self::Literal("true" | "false") => "a boolean",
            Self::Literal(n) if is_integer(n) => "an integer",
            Self::Literal(_) => "a number with a fraction or exponent",
        }
    }

    /// The text of a string or an integer; `None` for anything else.
    pub fn as_key_text(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            Self::Literal(n) if is_integer(n) => Some(n),
            _ => None,
        }
    }
}

fn node<'a>(raw: &'a RawValue, depth: usize, budget: &mut usize) -> Option<Node<'a>> {
    let text = raw.get();
    match text.as_bytes().first()? {
        b'{' | b'[' => {
            if depth >= MAX_DEPTH {
                return None;
            }
            *budget = budget.checked_sub(text.len())?;
            if text.starts_with('{') {
                let map: BTreeMap<String, &'a RawValue> = serde_json::from_str(text).ok()?;
                let mut out = BTreeMap::new();
                for (key, value) in map {
                    out.insert(key, node(value, depth + 1, budget)?);
                }
                Some(Node::Object(out))
            } else {
                let items: Vec<&'a RawValue> = serde_json::from_str(text).ok()?;
                let out = items
                    .into_iter()
                    .map(|value| node(value, depth + 1, budget))
                    .collect::<Option<_>>()?;
                Some(Node::Array(out))
            }
        }
        b'"' => serde_json::from_str(text).ok().map(Node::String),
        _ => Some(Node::Literal(text)),
    }
}

fn write(node: &Node<'_>, out: &mut Vec<u8>) {
    match node {
        Node::Object(map) => {
            out.push(b'{');
            for (i, (key, value)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key).expect("writing to a Vec never fails");
                out.push(b':');
                write(value, out);
            }
            out.push(b'}');
        }
        Node::Array(items) => {
            out.push(b'[');
            for (i, value) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(value, out);
            }
            out.push(b']');
        }
        Node::String(s) => {
            serde_json::to_writer(&mut *out, s).expect("writing to a Vec never fails");
        }
        Node::Literal(text) => out.extend_from_slice(text.as_bytes()),
    }
}

/// RFC 6901 §4: `~1` is `/`, `~0` is `~`.
fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// An array index: digits, no leading zero (RFC 6901 §4).
fn parse_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

/// `-?(0|[1-9][0-9]*)`: a JSON integer.
fn is_integer(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(body: &str) -> Option<String> {
        JsonBody::parse(body.as_bytes()).map(|j| String::from_utf8(j.canonical()).unwrap())
    }

    #[test]
    fn canonical_sorts_keys_drops_whitespace_and_keeps_literals() {
        assert_eq!(
            canonical(r#" { "b" : [1, 2.50, -0, 1E5], "a": {"y": null, "x": true} } "#).unwrap(),
            r#"{"a":{"x":true,"y":null},"b":[1,2.50,-0,1E5]}"#
        );
        assert_eq!(canonical(r#""\u0041\n""#).unwrap(), r#""A\n""#);
        assert_eq!(canonical(r#"{"a":1,"a":2}"#).unwrap(), r#"{"a":2}"#);
        assert_eq!(canonical("x"), None);
        assert_eq!(canonical(""), None);
        assert_eq!(canonical("{} {}"), None);
    }

    /// The same bytes serde_json's `Value` (with `arbitrary_precision`,
    /// which kept number text as sent) wrote, so JSON fingerprints recorded
    /// before this parser still match.
    #[test]
    fn canonical_matches_serde_json_for_ordinary_bodies() {
        assert_eq!(
            canonical(r#"[{"z":0.10000000000000001},{"é":"\u00e9\t"}, 18446744073709551617]"#)
                .unwrap(),
            r#"[{"z":0.10000000000000001},{"é":"é\t"},18446744073709551617]"#
        );
        for body in [
            r#"{"amount":1000,"currency":"eur","meta":{"ts":"2026-11-23T10:00:00Z","tags":["a","b"]}}"#,
            r#"[{"z":0.5},{"é":"\u00e9\t"}, 18446744073709551615]"#,
            r#"{"nested":{"deeper":{"deepest":[null,false,true,-1.5]}}}"#,
        ] {
            let value: serde_json::Value = serde_json::from_str(body).unwrap();
            let expected = serde_json::to_string(&value).unwrap();
            assert_eq!(canonical(body).unwrap(), expected, "{body}");
        }
    }

    #[test]
    fn no_object_key_is_special() {
        let a = canonical(r#"{"":1,"$serde_json::private::Number":"1"}"#).unwrap();
        let b = canonical(r#"{"$serde_json::private::Number":"1","":1}"#).unwrap();
        assert_eq!(a, b);
        assert_ne!(
            canonical(r#"{"$serde_json::private::Number":"1"}"#).unwrap(),
            canonical("1").unwrap()
        );
    }

    #[test]
    fn pointers_follow_rfc_6901() {
        let body = br#"{"message":{"messageId":"42","n":7,"a/b":{"~":"t"}},"list":[10,11]}"#;
        let j = JsonBody::parse(body).unwrap();
        assert_eq!(
            j.pointer("/message/messageId"),
            Some(&Node::String("42".into()))
        );
        assert_eq!(j.pointer("/message/n").unwrap().as_key_text(), Some("7"));
        assert_eq!(
            j.pointer("/message/a~1b/~0"),
            Some(&Node::String("t".into()))
        );
        assert_eq!(j.pointer("/list/1"), Some(&Node::Literal("11")));
        assert_eq!(j.pointer("/list/01"), None);
        assert_eq!(j.pointer("/list/2"), None);
        assert_eq!(j.pointer("/missing"), None);
        assert_eq!(j.pointer("nope"), None);
        assert_eq!(j.pointer("").unwrap().kind(), "an object");
    }

    #[test]
    fn key_text_is_a_string_or_an_integer() {
        let j = JsonBody::parse(br#"[1, -20, 1.0, 1e3, null, true, {}, [], "s", 01]"#);
        assert_eq!(j, None, "01 is not JSON");
        let j = JsonBody::parse(br#"[1, -20, 1.0, 1e3, null, true, {}, [], "s"]"#).unwrap();
        let texts: Vec<_> = (0..9)
            .map(|i| j.pointer(&format!("/{i}")).unwrap().as_key_text())
            .collect();
        assert_eq!(
            texts,
            [
                Some("1"),
                Some("-20"),
                None,
                None,
                None,
                None,
                None,
                None,
                Some("s")
            ]
        );
    }

    #[test]
    fn remove_takes_object_members_and_array_elements() {
        let mut j = JsonBody::parse(br#"{"a":{"b":1,"c":2},"l":[1,2,3]}"#).unwrap();
        j.remove("/a/b");
        j.remove("/l/0");
        j.remove("/missing/x");
        j.remove("/l/9");
        assert_eq!(j.canonical(), br#"{"a":{"c":2},"l":[2,3]}"#);
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(JsonBody::parse(deep.as_bytes()), None);
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(JsonBody::parse(ok.as_bytes()).is_some());
        // A large value under many levels costs a pass per level: past
        // PASSES passes in all, the body is not read as JSON.
        let levels = PASSES + 2;
        let big = format!(
            "{}\"{}\"{}",
            "[".repeat(levels),
            "x".repeat(100_000),
            "]".repeat(levels)
        );
        assert_eq!(JsonBody::parse(big.as_bytes()), None);
    }
}
