//! `[store] encryption_keys`: the keys that seal recorded responses, each
//! `"<id>:<base64 of 32 bytes>"`. The first seals every new record; every
//! one opens the records sealed under its id (rotation). Key material is
//! never printed: the `Debug` of a [`Keyring`] shows the ids only, and a
//! malformed entry is named by its position and id, never its value.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use ring::hkdf;

/// Bytes of key material one entry carries (AES-256).
pub const KEY_BYTES: usize = 32;

/// Longest key id: it is stored with every sealed record.
pub const MAX_ID_LEN: usize = 32;

/// One configured key: its id and its material, as an HKDF secret from
/// which each record's own key is derived ([`super::envelope`]).
pub(super) struct SealKey {
    pub(super) id: String,
    pub(super) secret: hkdf::Prk,
    /// A digest of the material, so that two keyrings compare equal only
    /// when they hold the same keys (a reload's change detection).
    fingerprint: [u8; 32],
}

/// The configured keys, in order: the first seals, every one opens.
pub struct Keyring {
    keys: Vec<SealKey>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Keyring")
            .field("ids", &ids)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Keyring {
    fn eq(&self, other: &Self) -> bool {
        self.keys.len() == other.keys.len()
            && self
                .keys
                .iter()
                .zip(&other.keys)
                .all(|(a, b)| a.id == b.id && a.fingerprint == b.fingerprint)
    }
}

/// Why an entry of `encryption_keys` was refused. Never carries the
/// material, only where the entry is and its id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    /// The list is empty: leave the key out instead.
    #[error("lists no key; leave encryption_keys out to store responses as they are")]
    Empty,
    /// No `:` between an id and the material (an unset variable gives `""`).
    #[error("entry {position} is not \"<id>:<base64 of 32 bytes>\" (is its variable set?)")]
    Shape {
        /// 0-based index in the list.
        position: usize,
    },
    /// The id is empty, too long, or has characters other than letters,
    /// digits, `-`, `_` and `.`.
    #[error(
        "entry {position}: the key id must be 1 to {MAX_ID_LEN} letters, digits, '-', '_' or '.'"
    )]
    BadId {
        /// 0-based index in the list.
        position: usize,
    },
    /// Two entries have the same id.
    #[error("entry {position}: key id {id:?} is listed twice")]
    Duplicate {
        /// 0-based index of the second one.
        position: usize,
        /// The id.
        id: String,
    },
    /// The material is not base64.
    #[error("entry {position} (key id {id:?}): the key is not valid base64")]
    Base64 {
        /// 0-based index in the list.
        position: usize,
        /// The id.
        id: String,
    },
    /// The material is not 32 bytes.
    #[error(
        "entry {position} (key id {id:?}): the key is {bytes} bytes, not {KEY_BYTES} (none: is its variable set?); make one with `openssl rand -base64 32`"
    )]
    Length {
        /// 0-based index in the list.
        position: usize,
        /// The id.
        id: String,
        /// How many bytes it decoded to.
        bytes: usize,
    },
}

impl KeyringError {
    /// The 0-based index of the entry at fault, if one is.
    pub fn position(&self) -> Option<usize> {
        match self {
            KeyringError::Empty => None,
            KeyringError::Shape { position }
            | KeyringError::BadId { position }
            | KeyringError::Duplicate { position, .. }
            | KeyringError::Base64 { position, .. }
            | KeyringError::Length { position, .. } => Some(*position),
        }
    }
}

impl Keyring {
    /// Parse `encryption_keys` entries, each `"<id>:<base64 of 32 bytes>"`
    /// (standard alphabet, padded or not; surrounding spaces ignored).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, KeyringError> {
        if entries.is_empty() {
            return Err(KeyringError::Empty);
        }
        let mut keys: Vec<SealKey> = Vec::with_capacity(entries.len());
        for (position, entry) in entries.iter().enumerate() {
            let (id, material) = entry
                .as_ref()
                .split_once(':')
                .ok_or(KeyringError::Shape { position })?;
            let id = id.trim();
            if !valid_id(id) {
                return Err(KeyringError::BadId { position });
            }
            let id = id.to_string();
            if keys.iter().any(|k| k.id == id) {
                return Err(KeyringError::Duplicate { position, id });
            }
            let material = material.trim();
            let bytes = STANDARD
                .decode(material)
                .or_else(|_| STANDARD_NO_PAD.decode(material))
                .map_err(|_| KeyringError::Base64 {
                    position,
                    id: id.clone(),
                })?;
            if bytes.len() != KEY_BYTES {
                let bytes = bytes.len();
                return Err(KeyringError::Length {
                    position,
                    id,
                    bytes,
                });
            }
            keys.push(SealKey::new(id, &bytes));
        }
        Ok(Self { keys })
    }

    /// The key new records are sealed with.
    pub(super) fn sealing(&self) -> &SealKey {
        &self.keys[0]
    }

    /// The key with id `id`, if configured.
    pub(super) fn opening(&self, id: &str) -> Option<&SealKey> {
        self.keys.iter().find(|k| k.id == id)
    }

    /// The ids, in order (the first seals).
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.id.as_str())
    }
}

impl SealKey {
    fn new(id: String, material: &[u8]) -> Self {
        // The material is used as HKDF's input key; no salt at this step
        // (each record's random salt goes into the expansion).
        let secret =
            hkdf::Salt::new(hkdf::HKDF_SHA256, b"idemgate sealed records").extract(material);
        let fingerprint = ring::digest::digest(&ring::digest::SHA256, material);
        let mut print = [0u8; 32];
        print.copy_from_slice(fingerprint.as_ref());
        Self {
            id,
            secret,
            fingerprint: print,
        }
    }
}

/// A key id as stored beside each record: letters, digits, `-`, `_`, `.`.
pub(super) fn valid_id(id: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 32 bytes, base64: a key the tests may print.
    pub(crate) const K1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    #[test]
    fn good_entries_parse_in_order() {
        let ring = Keyring::parse(&[format!("k2:{K1}"), format!(" k1 : {K1}")]).unwrap();
        assert_eq!(ring.ids().collect::<Vec<_>>(), ["k2", "k1"]);
        assert_eq!(ring.sealing().id, "k2");
        assert!(ring.opening("k1").is_some() && ring.opening("k3").is_none());
        let unpadded = K1.trim_end_matches('=');
        assert!(Keyring::parse(&[format!("a.b-c_1:{unpadded}")]).is_ok());
    }

    #[test]
    fn malformed_entries_are_named_never_shown() {
        let short = STANDARD.encode([7u8; 16]);
        let cases: Vec<(Vec<String>, KeyringError)> = vec![
            (vec![], KeyringError::Empty),
            (vec![String::new()], KeyringError::Shape { position: 0 }),
            (vec![format!(":{K1}")], KeyringError::BadId { position: 0 }),
            (
                vec![format!("a b:{K1}")],
                KeyringError::BadId { position: 0 },
            ),
            (
                vec![format!("k1:{K1}"), format!("k1:{K1}")],
                KeyringError::Duplicate {
                    position: 1,
                    id: "k1".into(),
                },
            ),
            (
                vec![format!("k1:{K1}"), format!("k2:{short}")],
                KeyringError::Length {
                    position: 1,
                    id: "k2".into(),
                    bytes: 16,
                },
            ),
            (
                vec!["k1:not*base64".to_string()],
                KeyringError::Base64 {
                    position: 0,
                    id: "k1".into(),
                },
            ),
        ];
        for (entries, expected) in cases {
            let error = Keyring::parse(&entries).unwrap_err();
            assert_eq!(error, expected, "{entries:?}");
            let shown = format!("{error} {error:?}");
            for secret in [K1, &short, "not*base64"] {
                assert!(!shown.contains(secret), "{shown}");
            }
        }
    }

    #[test]
    fn debug_shows_ids_only() {
        let ring = Keyring::parse(&[format!("k1:{K1}")]).unwrap();
        let shown = format!("{ring:?}");
        assert!(shown.contains("k1") && !shown.contains(K1), "{shown}");
    }

    #[test]
    fn keyrings_compare_by_ids_and_material() {
        let other = STANDARD.encode([9u8; 32]);
        let a = Keyring::parse(&[format!("k1:{K1}")]).unwrap();
        assert_eq!(a, Keyring::parse(&[format!("k1:{K1}")]).unwrap());
        assert_ne!(a, Keyring::parse(&[format!("k1:{other}")]).unwrap());
        assert_ne!(a, Keyring::parse(&[format!("k2:{K1}")]).unwrap());
    }
}
