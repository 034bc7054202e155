//! A recorded response sealed, and opened again: the status, headers and
//! body serialized, compressed (LZ4 or zstd, [`Codec`]) when that saves
//! bytes, then encrypted with AES-256-GCM under a key of its own.
//!
//! Each record's key is derived (HKDF-SHA256) from the configured key and
//! a random 16-byte salt stored with it, so no two records share an AES
//! key and the nonce can stay fixed: random 96-bit nonces under one key
//! would bound a key to about 2³² records, which a busy gateway reaches
//! within its retention. The associated data names the record (route,
//! scope digest, key) and the key id, so a sealed value copied onto
//! another record, or relabelled with another id, does not open.
//!
//! The sealed value takes the place of the response in every store's
//! existing fields, so no store changes: status `200`, one header
//! [`SEALED_HEADER`] whose value is the key id, and as body
//! `version ‖ salt ‖ ciphertext ‖ tag`. Inside, the plaintext is
//! `flags ‖ [u32 length before compression] ‖ payload`, the payload
//! `u16 status ‖ u32 headers' length ‖ headers ‖ body`; the flags are `0`
//! (not compressed) or the codec's ([`Codec::flag`]: zstd `1`, LZ4 `2`),
//! and the length follows only a compressed payload.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use super::codec::Codec;
use super::keyring::{Keyring, SealKey};
use crate::{RecordKey, StoredResponse, decode_headers, encode_headers};

/// The one header of a sealed record; its value is the key id.
pub const SEALED_HEADER: &str = "idemgate-sealed";

/// The envelope's version, first byte of the sealed body.
const VERSION: u8 = 1;
/// Bytes of each record's random salt.
const SALT_LEN: usize = 16;
/// The plaintext's flag of a payload that is not compressed.
const UNCOMPRESSED: u8 = 0;
/// Payloads shorter than this are never compressed: a codec's framing and
/// the length prefix eat what little it would save.
pub const COMPRESS_ABOVE: usize = 128;
/// The most a sealed payload may claim to expand to (it was sealed by an
/// idemgate, so this only bounds a bug).
const MAX_PAYLOAD: usize = 1 << 30;

/// Why a sealed record did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Its key id is not in `[store] encryption_keys` any more.
    #[error(
        "the recorded response was sealed with key id {0:?}, which [store] encryption_keys does not list"
    )]
    UnknownKey(String),
    /// It does not authenticate: sealed for another record (copied), or
    /// altered, or sealed under other material with the same id.
    #[error(
        "the recorded response does not open under key id {0:?}: it was sealed for another record, altered, or under other material"
    )]
    Unauthentic(String),
    /// It is not sealed, and `[store] accept_plain_records = false`.
    #[error(
        "the recorded response is not sealed, and [store] accept_plain_records = false refuses plain records"
    )]
    Plain,
}

impl OpenError {
    /// The key id the record names (`plain`: none).
    pub fn key_id(&self) -> &str {
        match self {
            OpenError::UnknownKey(id) | OpenError::Unauthentic(id) => id,
            OpenError::Plain => "plain",
        }
    }

    /// A short name for metrics and logs: `unknown_key`, `unauthentic` or
    /// `plain`.
    pub fn reason(&self) -> &'static str {
        match self {
            OpenError::UnknownKey(_) => "unknown_key",
            OpenError::Unauthentic(_) => "unauthentic",
            OpenError::Plain => "plain",
        }
    }
}

/// Seal `response` for the record `key` under `keys`' first key;
/// `compression`: the codec tried on payloads of [`COMPRESS_ABOVE`] bytes
/// or more (none: never compressed).
pub fn seal(
    keys: &Keyring,
    key: &RecordKey,
    response: &StoredResponse,
    compression: Option<Codec>,
) -> StoredResponse {
    seal_plaintext(keys, key, plaintext(response, compression))
}

/// Seal `plaintext` (flags, payload) for the record `key`.
fn seal_plaintext(keys: &Keyring, key: &RecordKey, mut plaintext: Vec<u8>) -> StoredResponse {
    let seal_key = keys.sealing();
    let mut salt = [0u8; SALT_LEN];
    SystemRandom::new()
        .fill(&mut salt)
        .expect("the system's random source failed");
    let aead = record_key(seal_key, &salt);
    aead.seal_in_place_append_tag(nonce(), Aad::from(aad(&seal_key.id, key)), &mut plaintext)
        .expect("AES-GCM sealing fails only past 64 GiB");
    let mut body = Vec::with_capacity(1 + SALT_LEN + plaintext.len());
    body.push(VERSION);
    body.extend_from_slice(&salt);
    body.extend_from_slice(&plaintext);
    let mut headers = HeaderMap::with_capacity(1);
    headers.insert(
        SEALED_HEADER,
        HeaderValue::from_str(&seal_key.id).expect("key ids are header-safe"),
    );
    StoredResponse {
        status: StatusCode::OK,
        headers,
        body: Bytes::from(body),
    }
}

/// How a stored response is marked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Marking {
    /// No seal: recorded before keys were configured.
    Plain,
    /// Sealed under this key id.
    Sealed(String),
    /// The seal's header, but not as idemgate writes it (beside other
    /// headers, or an id no keyring accepts): altered in the store, so
    /// never read as plain nor its id trusted (a metric label, a detail).
    Malformed,
}

/// The key id shown for a [`Marking::Malformed`] record.
pub(super) const MALFORMED_ID: &str = "invalid";

/// How `stored` is marked: any response with the seal's header is sealed,
/// and one with anything else beside it is malformed.
pub(super) fn marking(stored: &StoredResponse) -> Marking {
    let Some(value) = stored.headers.get(SEALED_HEADER) else {
        return Marking::Plain;
    };
    match value.to_str() {
        Ok(id) if stored.headers.len() == 1 && super::keyring::valid_id(id) => {
            Marking::Sealed(id.to_string())
        }
        _ => Marking::Malformed,
    }
}

/// The key id a stored response was sealed under; `None`: it is plain,
/// or malformed ([`marking`]).
pub fn sealed_with(stored: &StoredResponse) -> Option<String> {
    match marking(stored) {
        Marking::Sealed(id) => Some(id),
        Marking::Plain | Marking::Malformed => None,
    }
}

/// Open what [`seal`] made for the record `key`; a plain response is
/// returned as it is.
pub fn open(
    keys: &Keyring,
    key: &RecordKey,
    stored: StoredResponse,
) -> Result<StoredResponse, OpenError> {
    let id = match marking(&stored) {
        Marking::Plain => return Ok(stored),
        Marking::Malformed => return Err(OpenError::Unauthentic(MALFORMED_ID.into())),
        Marking::Sealed(id) => id,
    };
    let id = id.as_str();
    let seal_key = keys
        .opening(id)
        .ok_or_else(|| OpenError::UnknownKey(id.to_string()))?;
    let unauthentic = || OpenError::Unauthentic(id.to_string());
    let body = &stored.body[..];
    if body.len() < 1 + SALT_LEN || body[0] != VERSION {
        return Err(unauthentic());
    }
    let (salt, sealed) = body[1..].split_at(SALT_LEN);
    let mut in_out = sealed.to_vec();
    let opened = record_key(seal_key, salt)
        .open_in_place(nonce(), Aad::from(aad(id, key)), &mut in_out)
        .map_err(|_| unauthentic())?;
    // Authenticated: only an idemgate holding the key wrote it, so what
    // follows fails only on a bug; it is answered the same way.
    response(opened).ok_or_else(unauthentic)
}

/// The plaintext of `response`: flags, then the payload, compressed with
/// `compression` if that makes it smaller.
fn plaintext(response: &StoredResponse, compression: Option<Codec>) -> Vec<u8> {
    let headers = encode_headers(&response.headers);
    let mut payload = Vec::with_capacity(6 + headers.len() + response.body.len() + 16);
    payload.extend_from_slice(&response.status.as_u16().to_be_bytes());
    payload.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    payload.extend_from_slice(&headers);
    payload.extend_from_slice(&response.body);
    let worth_trying = (COMPRESS_ABOVE..=MAX_PAYLOAD).contains(&payload.len());
    if let Some(codec) = compression.filter(|_| worth_trying)
        && let Some(compressed) = codec.compress(&payload)
        && compressed.len() + 4 < payload.len()
    {
        let mut out = Vec::with_capacity(5 + compressed.len() + 16);
        out.push(codec.flag());
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&compressed);
        return out;
    }
    let mut out = Vec::with_capacity(1 + payload.len() + 16);
    out.push(UNCOMPRESSED);
    out.extend_from_slice(&payload);
    out
}

/// The response inside an opened plaintext.
fn response(plaintext: &[u8]) -> Option<StoredResponse> {
    let (&flags, rest) = plaintext.split_first()?;
    let expanded;
    let payload = match flags {
        UNCOMPRESSED => rest,
        flag => {
            let codec = Codec::from_flag(flag)?;
            let (len, compressed) = rest.split_at_checked(4)?;
            let len = u32::from_be_bytes(len.try_into().ok()?) as usize;
            if len > MAX_PAYLOAD {
                return None;
            }
            expanded = codec.decompress(compressed, len)?;
            &expanded[..]
        }
    };
    let (status, rest) = payload.split_at_checked(2)?;
    let (len, rest) = rest.split_at_checked(4)?;
    let len = u32::from_be_bytes(len.try_into().ok()?) as usize;
    let (headers, body) = rest.split_at_checked(len)?;
    Some(StoredResponse {
        status: StatusCode::from_u16(u16::from_be_bytes([status[0], status[1]])).ok()?,
        headers: decode_headers(headers)?,
        body: Bytes::copy_from_slice(body),
    })
}

/// The AES-256-GCM key of one record: HKDF-expanded from the configured
/// key with the record's salt.
fn record_key(seal_key: &SealKey, salt: &[u8]) -> LessSafeKey {
    let info = [b"idemgate record v1".as_slice(), salt];
    let okm = seal_key
        .secret
        .expand(&info, &AES_256_GCM)
        .expect("32 bytes is within HKDF-SHA256's limit");
    LessSafeKey::new(UnboundKey::from(okm))
}

/// The fixed nonce: every record has a key of its own.
fn nonce() -> Nonce {
    Nonce::assume_unique_for_key([0u8; NONCE_LEN])
}

/// The associated data: the envelope's version, the key id and the
/// record's identity, each length-prefixed so no two differ only in
/// where one part ends.
fn aad(id: &str, key: &RecordKey) -> Vec<u8> {
    let mut aad =
        Vec::with_capacity(16 + id.len() + key.route.len() + key.scope.len() + key.key.len());
    aad.push(VERSION);
    for part in [
        id.as_bytes(),
        key.route.as_bytes(),
        &key.scope,
        key.key.as_bytes(),
    ] {
        aad.extend_from_slice(&(part.len() as u32).to_be_bytes());
        aad.extend_from_slice(part);
    }
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(entries: &[(&str, u8)]) -> Keyring {
        use base64::Engine;
        let entries: Vec<String> = entries
            .iter()
            .map(|(id, byte)| {
                let material = base64::engine::general_purpose::STANDARD.encode([*byte; 32]);
                format!("{id}:{material}")
            })
            .collect();
        Keyring::parse(&entries).unwrap()
    }

    fn record(key: &str) -> RecordKey {
        RecordKey {
            route: "payments".into(),
            scope: vec![7; 32],
            key: key.into(),
        }
    }

    fn response(body: &str) -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        StoredResponse {
            status: StatusCode::PAYMENT_REQUIRED,
            headers,
            body: Bytes::from(body.to_string()),
        }
    }

    const ZSTD: Option<Codec> = Some(Codec::Zstd);
    const LZ4: Option<Codec> = Some(Codec::Lz4);
    /// Each way a payload may be sealed: each codec, and none.
    const EVERY: [Option<Codec>; 3] = [LZ4, ZSTD, None];

    /// The flags byte inside a sealed value: what it was sealed with.
    fn flags_of(ring: &Keyring, key: &RecordKey, sealed: &StoredResponse) -> u8 {
        let (salt, ciphertext) = sealed.body[1..].split_at(SALT_LEN);
        let mut in_out = ciphertext.to_vec();
        let id = sealed_with(sealed).unwrap();
        let opened = record_key(ring.opening(&id).unwrap(), salt)
            .open_in_place(nonce(), Aad::from(aad(&id, key)), &mut in_out)
            .unwrap();
        opened[0]
    }

    #[test]
    fn sealed_opens_byte_identical_small_and_compressed() {
        let ring = keys(&[("k1", 1)]);
        let long = format!("{{\"card\":\"MARKER\",\"pad\":\"{}\"}}", "ab".repeat(500));
        for body in ["", "MARKER", long.as_str()] {
            for compression in EVERY {
                let plain = response(body);
                let sealed = seal(&ring, &record("a"), &plain, compression);
                assert_eq!(sealed_with(&sealed).as_deref(), Some("k1"));
                let raw = format!("{:?}", sealed.body);
                assert!(!raw.contains("MARKER") && !raw.contains("x-multi"));
                assert_eq!(open(&ring, &record("a"), sealed).unwrap(), plain);
            }
        }
        // Compression pays on the long body, and only when asked.
        let off = seal(&ring, &record("a"), &response(&long), None).body.len();
        for codec in [LZ4, ZSTD] {
            let on = seal(&ring, &record("a"), &response(&long), codec)
                .body
                .len();
            assert!(on * 4 < off, "{codec:?}: {on} vs {off}");
        }
    }

    /// Each codec seals a payment object compressed, under its own flag,
    /// and any instance opens it byte-identical whatever it seals with
    /// (opening takes no setting); a short response is not compressed.
    #[test]
    fn each_codec_marks_its_payload_and_opens() {
        let ring = keys(&[("k1", 1)]);
        let id = record("a");
        let payment = response(&crate::seal::fixture::payment_intent("customer-1842"));
        for (compression, flag) in [(LZ4, 2), (ZSTD, 1), (None, 0)] {
            let sealed = seal(&ring, &id, &payment, compression);
            assert_eq!(flags_of(&ring, &id, &sealed), flag, "{compression:?}");
            assert_eq!(open(&ring, &id, sealed).unwrap(), payment);
            let short = seal(&ring, &id, &response("x"), compression);
            assert_eq!(flags_of(&ring, &id, &short), 0, "{compression:?}");
        }
        // The control: the flags really are read from what was sealed.
        let lz4 = seal(&ring, &id, &payment, LZ4);
        let zstd = seal(&ring, &id, &payment, ZSTD);
        assert_ne!(flags_of(&ring, &id, &lz4), flags_of(&ring, &id, &zstd));
    }

    /// A plaintext as [`plaintext`] lays a compressed one out: `flag`,
    /// then `len`, then `bytes`.
    fn compressed_plaintext(flag: u8, len: usize, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.extend_from_slice(bytes);
        out
    }

    /// The payload of the fixture's response, serialized as [`plaintext`]
    /// does before compressing it.
    fn serialized(response: &StoredResponse) -> Vec<u8> {
        plaintext(response, None)[1..].to_vec()
    }

    /// A plaintext that authenticates but whose LZ4 payload is broken —
    /// cut short, bytes flipped, a match reaching back before the start,
    /// a length it does not expand to, a length past [`MAX_PAYLOAD`] —
    /// does not open, and never panics; only the bug of an idemgate
    /// holding the key could seal one.
    #[test]
    fn a_corrupted_lz4_payload_is_an_error_not_a_panic() {
        let ring = keys(&[("k1", 1)]);
        let id = record("a");
        let payload = serialized(&response(&crate::seal::fixture::payment_intent("c-1")));
        let good = Codec::Lz4.compress(&payload).unwrap();
        let unauthentic = Err(OpenError::Unauthentic("k1".into()));
        let opens = |plaintext: Vec<u8>| open(&ring, &id, seal_plaintext(&ring, &id, plaintext));
        // The control: the well-formed one opens.
        assert!(opens(compressed_plaintext(2, payload.len(), &good)).is_ok());
        let mut broken: Vec<(String, Vec<u8>)> = vec![
            ("cut short".into(), good[..good.len() / 2].to_vec()),
            ("empty".into(), Vec::new()),
            // A token of 4 literals then a match 0xffff bytes back.
            (
                "far match".into(),
                vec![0x40, b'a', b'b', b'c', b'd', 0xff, 0xff],
            ),
            ("all ones".into(), vec![0xff; 64]),
        ];
        for at in (0..good.len()).step_by(7) {
            let mut flipped = good.clone();
            flipped[at] ^= 0xa5;
            broken.push((format!("byte {at} flipped"), flipped));
        }
        for (what, bytes) in broken {
            match opens(compressed_plaintext(2, payload.len(), &bytes)) {
                // A flip in a literal may expand to other bytes of the same
                // length: then the payload is still parsed, and differs.
                Ok(opened) => assert_ne!(serialized(&opened), payload, "{what}"),
                Err(e) => assert_eq!(Err(e), unauthentic, "{what}"),
            }
        }
        for len in [payload.len() - 1, payload.len() + 1, MAX_PAYLOAD + 1] {
            let plaintext = compressed_plaintext(2, len, &good);
            assert_eq!(opens(plaintext), unauthentic, "length {len}");
        }
        // No length at all, and a flag no codec has.
        assert_eq!(opens(vec![2, 0, 0]), unauthentic);
        assert_eq!(
            opens(compressed_plaintext(3, payload.len(), &good)),
            unauthentic
        );
    }

    /// Each codec's flag is what opening trusts: zstd bytes under LZ4's
    /// flag, or LZ4 bytes under zstd's, do not open, while each under its
    /// own flag does (the control).
    #[test]
    fn a_payload_under_the_other_codecs_flag_does_not_open() {
        let ring = keys(&[("k1", 1)]);
        let id = record("a");
        let payment = response(&crate::seal::fixture::payment_intent("c-1"));
        let payload = serialized(&payment);
        let opens = |plaintext: Vec<u8>| open(&ring, &id, seal_plaintext(&ring, &id, plaintext));
        for codec in Codec::ALL {
            let bytes = codec.compress(&payload).unwrap();
            let own = compressed_plaintext(codec.flag(), payload.len(), &bytes);
            assert_eq!(opens(own).unwrap(), payment, "{codec:?}");
            let other = Codec::ALL.into_iter().find(|c| *c != codec).unwrap();
            let claimed = compressed_plaintext(other.flag(), payload.len(), &bytes);
            assert_eq!(
                opens(claimed),
                Err(OpenError::Unauthentic("k1".into())),
                "{codec:?} bytes under {other:?}'s flag"
            );
        }
    }

    /// CPU per record, sealing and opening a ~2 KiB payment object, and a
    /// short, repetitive body (`bench/record_bytes.py`'s `pad` answer), with
    /// each codec and none (the book's cost and codec sections). Timing, so
    /// ignored by default; run it in a release build: `cargo test -p
    /// idemgate-store --release --no-default-features --lib cost_per_record
    /// -- --ignored --nocapture`. One line per payload and codec, in
    /// nanoseconds: `cost_per_record payment lz4 seal_ns=… open_ns=…`.
    #[test]
    #[ignore = "a measurement: run it in a release build"]
    fn cost_per_record() {
        let ring = keys(&[("k1", 1)]);
        let short = format!(
            "{{\"id\": \"pay_0000000000\", \"status\": \"succeeded\", \"pad\": \"{}\"}}",
            "y".repeat(450)
        );
        let payloads = [
            (
                "payment",
                crate::seal::fixture::payment_intent("customer-1842"),
            ),
            ("short", short),
        ];
        let (n, id) = (5_000u32, record("cost"));
        for (name, body) in payloads {
            let mut plain = response(&body);
            plain.status = StatusCode::OK;
            for compression in EVERY {
                let started = tokio::time::Instant::now();
                let sealed: Vec<_> = (0..n)
                    .map(|_| seal(&ring, &id, &plain, compression))
                    .collect();
                let sealing = started.elapsed() / n;
                let started = tokio::time::Instant::now();
                for one in sealed {
                    assert_eq!(open(&ring, &id, one).unwrap().body.len(), plain.body.len());
                }
                let opening = started.elapsed() / n;
                let codec = compression.map_or("none", |c| c.name());
                eprintln!(
                    "cost_per_record {name} {codec} seal_ns={} open_ns={}",
                    sealing.as_nanos(),
                    opening.as_nanos()
                );
            }
        }
    }

    #[test]
    fn each_seal_is_fresh() {
        let ring = keys(&[("k1", 1)]);
        let a = seal(&ring, &record("a"), &response("x"), ZSTD);
        let b = seal(&ring, &record("a"), &response("x"), ZSTD);
        assert_ne!(a.body, b.body);
        // Past the version and salt too: each record has its own key.
        assert_ne!(a.body[1 + SALT_LEN..], b.body[1 + SALT_LEN..]);
    }

    /// A seal's header that idemgate did not write as it stands — beside
    /// another header, or with an id no keyring takes — is never read as
    /// plain, and its id is never trusted.
    #[test]
    fn a_malformed_seal_is_unauthentic_never_plain() {
        let ring = keys(&[("k1", 1)]);
        let sealed = seal(&ring, &record("a"), &response("x"), ZSTD);
        let invalid = Err(OpenError::Unauthentic(MALFORMED_ID.into()));
        let mut beside = sealed.clone();
        beside
            .headers
            .insert("x-extra", HeaderValue::from_static("1"));
        assert_eq!(marking(&beside), Marking::Malformed);
        assert_eq!(open(&ring, &record("a"), beside), invalid);
        for id in ["", "k 1", "k1\u{7f}", &"k".repeat(200)] {
            let mut odd = sealed.clone();
            if let Ok(value) = HeaderValue::from_str(id) {
                odd.headers.insert(SEALED_HEADER, value);
                assert_eq!(open(&ring, &record("a"), odd), invalid, "{id:?}");
            }
        }
    }

    #[test]
    fn plain_records_pass_through() {
        let ring = keys(&[("k1", 1)]);
        let plain = response("plain");
        assert_eq!(sealed_with(&plain), None);
        assert_eq!(open(&ring, &record("a"), plain.clone()).unwrap(), plain);
    }

    #[test]
    fn rotation_opens_old_records_and_seals_under_the_first() {
        let old = keys(&[("k1", 1)]);
        let sealed = seal(&old, &record("a"), &response("x"), ZSTD);
        let rotated = keys(&[("k2", 2), ("k1", 1)]);
        assert_eq!(
            open(&rotated, &record("a"), sealed.clone()).unwrap(),
            response("x")
        );
        let resealed = seal(&rotated, &record("a"), &response("x"), ZSTD);
        assert_eq!(sealed_with(&resealed).as_deref(), Some("k2"));
        let dropped = keys(&[("k2", 2)]);
        assert_eq!(
            open(&dropped, &record("a"), sealed),
            Err(OpenError::UnknownKey("k1".into()))
        );
    }

    #[test]
    fn a_copied_altered_or_relabelled_value_never_opens() {
        let ring = keys(&[("k1", 1), ("k2", 2)]);
        let sealed = seal(&ring, &record("a"), &response("secret"), ZSTD);
        let unauthentic = Err(OpenError::Unauthentic("k1".into()));
        // Another key, another route, another scope.
        assert_eq!(open(&ring, &record("b"), sealed.clone()), unauthentic);
        let mut other_route = record("a");
        other_route.route = "refunds".into();
        assert_eq!(open(&ring, &other_route, sealed.clone()), unauthentic);
        let mut other_scope = record("a");
        other_scope.scope = vec![8; 32];
        assert_eq!(open(&ring, &other_scope, sealed.clone()), unauthentic);
        // A flipped bit, a truncation.
        let mut flipped = sealed.clone();
        let mut body = flipped.body.to_vec();
        let last = body.len() - 1;
        body[last] ^= 1;
        flipped.body = Bytes::from(body);
        assert_eq!(open(&ring, &record("a"), flipped), unauthentic);
        let mut short = sealed.clone();
        short.body = sealed.body.slice(..10);
        assert_eq!(open(&ring, &record("a"), short), unauthentic);
        // The same material under another id: the id is bound too.
        let mut relabelled = sealed;
        relabelled
            .headers
            .insert(SEALED_HEADER, HeaderValue::from_static("k2"));
        assert_eq!(
            open(&ring, &record("a"), relabelled),
            Err(OpenError::Unauthentic("k2".into()))
        );
        // Other material under the same id.
        let same_id = keys(&[("k1", 9)]);
        let sealed = seal(&ring, &record("a"), &response("secret"), ZSTD);
        assert_eq!(open(&same_id, &record("a"), sealed), unauthentic);
    }
}
