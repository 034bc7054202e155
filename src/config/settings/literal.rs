//! The settings table's default values read at compile time: the few TOML
//! literal shapes the table uses (`"30s"`, `"256KiB"`, `10000`, `true`,
//! `"0.0.0.0:8080"`), so `defaults.rs` keeps typed constants without typing
//! a value twice. A default of any other shape stops the build; the tests
//! check each reader against the parser the file's values go through
//! (`humantime`, `bytesize`).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

/// Whether `a` and `b` are the same string.
pub(super) const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The contents of a TOML basic string without escapes (`"x"` is `x`).
pub(super) const fn unquote(text: &str) -> &str {
    let b = text.as_bytes();
    assert!(b.len() >= 2 && b[0] == b'"' && b[b.len() - 1] == b'"');
    let (_, rest) = b.split_at(1);
    let (inner, _) = rest.split_at(rest.len() - 1);
    let mut i = 0;
    while i < inner.len() {
        assert!(inner[i] != b'\\' && inner[i] != b'"', "no escapes");
        i += 1;
    }
    match std::str::from_utf8(inner) {
        Ok(s) => s,
        Err(_) => panic!("not UTF-8"),
    }
}

/// The decimal number at the start of `b`, and where it ends.
const fn number(b: &[u8]) -> (u64, usize) {
    let mut i = 0;
    let mut n: u64 = 0;
    while i < b.len() && b[i].is_ascii_digit() {
        n = n * 10 + (b[i] - b'0') as u64;
        i += 1;
    }
    assert!(i > 0, "a number first");
    (n, i)
}

/// A whole decimal integer.
pub(super) const fn integer(b: &[u8]) -> u64 {
    let (n, end) = number(b);
    assert!(end == b.len(), "an integer and nothing else");
    n
}

/// The text after the number at the start of `text`: its unit.
const fn unit(text: &str) -> (u64, &[u8]) {
    let b = text.as_bytes();
    let (n, end) = number(b);
    (n, b.split_at(end).1)
}

/// `<n><unit>`, with `ms`, `s`, `m`, `h` or `d`.
pub(super) const fn duration(text: &str) -> Duration {
    let (n, unit) = unit(text);
    match unit {
        b"ms" => Duration::from_millis(n),
        b"s" => Duration::from_secs(n),
        b"m" => Duration::from_secs(n * 60),
        b"h" => Duration::from_secs(n * 3600),
        b"d" => Duration::from_secs(n * 86_400),
        _ => panic!("a duration is <n>ms, <n>s, <n>m, <n>h or <n>d"),
    }
}

/// `<n><unit>`, with `B`, `KiB`, `MiB` or `GiB`.
pub(super) const fn size(text: &str) -> u64 {
    let (n, unit) = unit(text);
    match unit {
        b"B" => n,
        b"KiB" => n << 10,
        b"MiB" => n << 20,
        b"GiB" => n << 30,
        _ => panic!("a size is <n>B, <n>KiB, <n>MiB or <n>GiB"),
    }
}

/// `true` or `false`.
pub(super) const fn flag(text: &str) -> bool {
    match text.as_bytes() {
        b"true" => true,
        b"false" => false,
        _ => panic!("a bool is true or false"),
    }
}

/// `a.b.c.d:port`.
pub(super) const fn address(text: &str) -> SocketAddr {
    let mut rest = text.as_bytes();
    let mut octets = [0u8; 4];
    let mut i = 0;
    while i < 4 {
        let (n, end) = number(rest);
        assert!(n <= 255, "an octet");
        octets[i] = n as u8;
        let separator = if i == 3 { b':' } else { b'.' };
        assert!(end < rest.len() && rest[end] == separator, "a.b.c.d:port");
        rest = rest.split_at(end + 1).1;
        i += 1;
    }
    let port = integer(rest);
    assert!(port <= 65_535, "a port");
    let [a, b, c, d] = octets;
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(a, b, c, d), port as u16))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each reader agrees with the parser the file's own values go through.
    #[test]
    fn readers_agree_with_the_parsers() {
        for text in ["250ms", "30s", "1m", "24h", "3650d"] {
            assert_eq!(duration(text), humantime::parse_duration(text).unwrap());
        }
        for text in ["0B", "64KiB", "1MiB", "256MiB", "2GiB"] {
            let bytes: bytesize::ByteSize = text.parse().unwrap();
            assert_eq!(size(text), bytes.as_u64(), "{text}");
        }
        for text in ["0.0.0.0:8080", "127.0.0.1:9090"] {
            assert_eq!(address(text), text.parse::<SocketAddr>().unwrap());
        }
        assert_eq!(integer(b"10000"), 10_000);
        assert!(flag("true") && !flag("false"));
        assert_eq!(unquote("\"idemgate:\""), "idemgate:");
        assert!(same("hold", "hold") && !same("hold", "held") && !same("a", "ab"));
    }
}
