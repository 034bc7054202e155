//! The byte encoding of recorded response headers, shared by every store:
//! for each header, a u16 name length, the name, a u32 value length, the
//! value (big-endian lengths). Values are bytes, not strings: a proxy replays
//! exactly what the upstream sent.

use http::{HeaderMap, HeaderName, HeaderValue};

/// Encode headers in order (repeated names stay repeated).
pub fn encode_headers(headers: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::with_capacity(headers.len() * 32);
    for (name, value) in headers {
        let n = name.as_str().as_bytes();
        out.extend_from_slice(&(n.len() as u16).to_be_bytes());
        out.extend_from_slice(n);
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// Decode what [`encode_headers`] wrote; `None` if the bytes are not such an encoding.
pub fn decode_headers(mut bytes: &[u8]) -> Option<HeaderMap> {
    let mut headers = HeaderMap::new();
    while !bytes.is_empty() {
        let (n, rest) = take(bytes, 2)?;
        let (name, rest) = take(rest, u16::from_be_bytes([n[0], n[1]]) as usize)?;
        let (v, rest) = take(rest, 4)?;
        let (value, rest) = take(rest, u32::from_be_bytes([v[0], v[1], v[2], v[3]]) as usize)?;
        headers.append(
            HeaderName::from_bytes(name).ok()?,
            HeaderValue::from_bytes(value).ok()?,
        );
        bytes = rest;
    }
    Some(headers)
}

fn take(bytes: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
    (bytes.len() >= n).then(|| bytes.split_at(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_order_repeats_and_opaque_bytes() {
        let mut h = HeaderMap::new();
        h.append("location", HeaderValue::from_static("/v1/x/1"));
        h.append("x-multi", HeaderValue::from_static("a"));
        h.append("x-multi", HeaderValue::from_static("b"));
        h.append("x-bytes", HeaderValue::from_bytes(b"\xff\xfe ok").unwrap());
        let decoded = decode_headers(&encode_headers(&h)).unwrap();
        assert_eq!(decoded, h);
        let multi: Vec<_> = decoded.get_all("x-multi").iter().collect();
        assert_eq!(multi, vec!["a", "b"]);
    }

    #[test]
    fn truncated_input_is_rejected() {
        let mut h = HeaderMap::new();
        h.append("etag", HeaderValue::from_static("\"v1\""));
        let bytes = encode_headers(&h);
        assert!(decode_headers(&bytes[..bytes.len() - 1]).is_none());
        assert_eq!(decode_headers(&[]).unwrap(), HeaderMap::new());
    }
}
