//! `[store] encryption_keys`: the keys recorded responses are sealed with
//! (crates/store/src/seal/). Like `admin_token` they are never printed:
//! the raw list's `Debug` is redacted, and a malformed entry is named by
//! its position and key id, never its value.

use std::sync::Arc;

use serde::Deserialize;

use super::settings as S;
use super::{ConfigError, invalid};
use crate::store::seal::Keyring;

/// The list as written (after `${VAR}` expansion): key material.
#[derive(Deserialize)]
#[serde(transparent)]
pub(super) struct RawKeys(Vec<String>);

impl std::fmt::Debug for RawKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawKeys({} entries, ***)", self.0.len())
    }
}

/// `encryption_keys`, parsed: absent is none (responses stored as they
/// are); present, every entry must be a well-formed key.
pub(super) fn encryption_keys(raw: Option<RawKeys>) -> Result<Option<Arc<Keyring>>, ConfigError> {
    let Some(RawKeys(entries)) = raw else {
        return Ok(None);
    };
    Keyring::parse(&entries)
        .map(|keys| Some(Arc::new(keys)))
        .map_err(|error| {
            let key = match error.position() {
                Some(i) => format!("{}[{i}]", S::STORE_ENCRYPTION_KEYS.path()),
                None => S::STORE_ENCRYPTION_KEYS.path(),
            };
            invalid(key, error.to_string())
        })
}

#[cfg(test)]
mod tests {
    use crate::config::tests::{MINIMAL, error, parse};

    const K1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    fn with_keys(keys: &str) -> String {
        format!("[store]\nurl = \"memory://\"\nencryption_keys = {keys}\n{MINIMAL}")
    }

    #[test]
    fn absent_is_off_present_is_parsed() {
        assert!(parse(MINIMAL).unwrap().store.encryption_keys.is_none());
        let c = parse(&with_keys(&format!("[\"k2:{K1}\", \"k1:{K1}\"]"))).unwrap();
        let keys = c.store.encryption_keys.unwrap();
        assert_eq!(keys.ids().collect::<Vec<_>>(), ["k2", "k1"]);
        assert!(c.store.compress);
    }

    #[test]
    fn a_malformed_key_is_named_by_position_and_id_never_shown() {
        let short = &K1[..20];
        for (keys, named) in [
            (
                format!("[\"k1:{K1}\", \"k2:{short}\"]"),
                "store.encryption_keys[1]",
            ),
            (
                format!("[\"k1:{K1}\", \"k1:{K1}\"]"),
                "\"k1\" is listed twice",
            ),
            (format!("[\"{K1}\"]"), "store.encryption_keys[0]"),
            ("[]".to_string(), "store.encryption_keys"),
        ] {
            let shown = error(&with_keys(&keys));
            assert!(shown.contains(named), "{shown}");
            assert!(!shown.contains(short), "{shown}");
        }
    }

    #[test]
    fn refusing_plain_records_needs_keys() {
        let strict = "accept_plain_records = false";
        let no_keys = format!("[store]\nurl = \"memory://\"\n{strict}\n{MINIMAL}");
        assert!(error(&no_keys).contains("store.accept_plain_records"));
        let keys = with_keys(&format!("[\"k1:{K1}\"]\n{strict}"));
        assert!(!parse(&keys).unwrap().store.accept_plain_records);
    }

    #[test]
    fn the_parsed_config_never_prints_a_key() {
        let c = parse(&with_keys(&format!("[\"k1:{K1}\"]"))).unwrap();
        let shown = format!("{c:?}");
        assert!(shown.contains("k1") && !shown.contains(K1), "{shown}");
    }
}
