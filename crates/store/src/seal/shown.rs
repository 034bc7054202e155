//! What `keys show` tells of a sealed record: which key id sealed it (the
//! key a rotation must keep until the record expires) and, since whoever
//! runs `keys show` holds the gateway's keys, the recorded status and
//! body size once opened, not the envelope's; or why it does not open.

use super::envelope::{self, MALFORMED_ID, Marking, OpenError};
use super::keyring::Keyring;
use crate::{RecordInfo, RecordKey, StoredResponse};

impl RecordInfo {
    /// This record as it shows with `stored`, its recorded response as the
    /// store keeps it, opened under `keys` (none: no keys configured) for
    /// the record `key`. A plain response leaves it as it is.
    pub fn with_recorded(
        mut self,
        keys: Option<&Keyring>,
        key: &RecordKey,
        stored: StoredResponse,
    ) -> Self {
        let id = match envelope::marking(&stored) {
            Marking::Plain => return self,
            Marking::Sealed(id) => id,
            Marking::Malformed => MALFORMED_ID.to_string(),
        };
        let opened = match keys {
            Some(keys) => envelope::open(keys, key, stored),
            None if id == MALFORMED_ID => Err(OpenError::Unauthentic(id.clone())),
            None => Err(OpenError::UnknownKey(id.clone())),
        };
        self.sealed_with = Some(id);
        self.opened = Some(opened.is_ok());
        match opened {
            Ok(response) => {
                self.status = Some(response.status.as_u16());
                self.body_bytes = Some(response.body.len() as u64);
            }
            Err(error) => {
                self.status = None;
                self.body_bytes = None;
                self.open_error = Some(error.reason());
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue, StatusCode};

    use super::*;
    use crate::RecordState;
    use crate::seal::Codec;

    /// A keyring of `ids`, each with its own material.
    fn keyring(ids: &[&str]) -> Keyring {
        use base64::Engine as _;
        let entries: Vec<String> = (1u8..)
            .zip(ids)
            .map(|(i, id)| {
                let material = base64::engine::general_purpose::STANDARD.encode([i; 32]);
                format!("{id}:{material}")
            })
            .collect();
        Keyring::parse(&entries).unwrap()
    }

    fn key(k: &str) -> RecordKey {
        RecordKey {
            route: "payments".into(),
            scope: vec![1; 32],
            key: k.into(),
        }
    }

    fn response() -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        StoredResponse {
            status: StatusCode::CREATED,
            headers,
            body: Bytes::from_static(b"{\"id\":\"pi_1\",\"amount\":1200}"),
        }
    }

    fn info(stored: &StoredResponse) -> RecordInfo {
        let now = SystemTime::now();
        RecordInfo::from_parts(
            &key("k"),
            RecordState::Completed.as_str(),
            None,
            1,
            [now; 3],
            None,
            Some(stored.status.as_u16()),
            Some(stored.body.len() as u64),
        )
        .unwrap()
    }

    #[test]
    fn a_sealed_record_shows_its_key_id_and_its_real_response() {
        let keys = keyring(&["k2", "k1"]);
        let sealed = envelope::seal(&keys, &key("k"), &response(), Some(Codec::Lz4));
        let shown = info(&sealed).with_recorded(Some(&keys), &key("k"), sealed.clone());
        assert_eq!(shown.sealed_with.as_deref(), Some("k2"));
        assert_eq!(shown.opened, Some(true));
        assert_eq!(shown.status, Some(201));
        assert_eq!(shown.body_bytes, Some(response().body.len() as u64));
        assert_eq!(shown.open_error, None);
        // The envelope alone says 200 and another size.
        assert_eq!(info(&sealed).status, Some(200));
        assert_ne!(info(&sealed).body_bytes, shown.body_bytes);
    }

    #[test]
    fn a_record_that_does_not_open_says_why() {
        let old = keyring(&["k0"]);
        let sealed = envelope::seal(&old, &key("k"), &response(), Some(Codec::Zstd));
        for keys in [Some(keyring(&["k1"])), None] {
            let shown = info(&sealed).with_recorded(keys.as_ref(), &key("k"), sealed.clone());
            assert_eq!(shown.sealed_with.as_deref(), Some("k0"));
            assert_eq!(shown.opened, Some(false));
            assert_eq!(shown.open_error, Some("unknown_key"));
            assert_eq!((shown.status, shown.body_bytes), (None, None));
        }
        // Sealed for another record: the id is named, the value refused.
        let copied = info(&sealed).with_recorded(Some(&old), &key("other"), sealed.clone());
        assert_eq!(copied.sealed_with.as_deref(), Some("k0"));
        assert_eq!(copied.open_error, Some("unauthentic"));
    }

    #[test]
    fn a_plain_record_is_left_as_it_is() {
        let plain = response();
        let before = info(&plain);
        let shown = before
            .clone()
            .with_recorded(Some(&keyring(&["k1"])), &key("k"), plain);
        assert_eq!(shown, before);
        assert_eq!(shown.sealed_with, None);
    }
}
