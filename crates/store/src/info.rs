//! What key administration sees of a record (`idemgate keys …`): its state,
//! token, timestamps and response size, never its body.

use std::time::SystemTime;

use serde::Serialize;

use super::{HeldReason, RecordKey, RecordState};

/// One record, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordInfo {
    /// The route's name.
    pub route: String,
    /// Hex SHA-256 of the scope header, or empty for unscoped routes.
    pub scope: String,
    /// The client's key.
    pub key: String,
    /// The state.
    pub state: RecordState,
    /// Why it is held.
    pub held_reason: Option<&'static str>,
    /// The current attempt's fencing token.
    pub token: i64,
    /// When the key was (last) claimed.
    #[serde(serialize_with = "rfc3339")]
    pub created_at: SystemTime,
    /// When the record last changed.
    #[serde(serialize_with = "rfc3339")]
    pub updated_at: SystemTime,
    /// When retention ends.
    #[serde(serialize_with = "rfc3339")]
    pub expires_at: SystemTime,
    /// When the current lease ends (in flight), or when the next question
    /// is due (inquiring).
    #[serde(serialize_with = "rfc3339_opt")]
    pub lease_until: Option<SystemTime>,
    /// Questions asked about the outcome so far (inquiring only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inquiries: Option<u32>,
    /// Since when the outcome has been asked about (inquiring only).
    #[serde(
        serialize_with = "rfc3339_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub inquiring_since: Option<SystemTime>,
    /// The recorded status (completed only; of a sealed record, the
    /// opened response's, none if it does not open).
    pub status: Option<u16>,
    /// The recorded body's size in bytes (completed only; of a sealed
    /// record, the opened body's, none if it does not open).
    pub body_bytes: Option<u64>,
    /// The key id the recorded response was sealed under (`[store]
    /// encryption_keys`): the key a rotation must keep until the record
    /// expires. None: plain. Filled by [`RecordInfo::with_recorded`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sealed_with: Option<String>,
    /// Whether the configured keys open it (sealed only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opened: Option<bool>,
    /// Why it does not open ([`OpenError::reason`]: `unknown_key`,
    /// `unauthentic`), when it does not.
    ///
    /// [`OpenError::reason`]: crate::seal::OpenError::reason
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_error: Option<&'static str>,
}

impl RecordInfo {
    /// The [`RecordKey`] this record is stored under.
    pub fn record_key(&self) -> Option<RecordKey> {
        Some(RecordKey {
            route: self.route.clone(),
            scope: hex::decode(&self.scope).ok()?,
            key: self.key.clone(),
        })
    }

    /// Build from store fields (shared by the backends).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        key: &RecordKey,
        state: &str,
        held_reason: Option<&str>,
        token: i64,
        times: [SystemTime; 3],
        lease_until: Option<SystemTime>,
        status: Option<u16>,
        body_bytes: Option<u64>,
    ) -> Option<Self> {
        let [created_at, updated_at, expires_at] = times;
        Some(Self {
            route: key.route.clone(),
            scope: hex::encode(&key.scope),
            key: key.key.clone(),
            state: RecordState::parse(state)?,
            held_reason: held_reason
                .and_then(HeldReason::parse)
                .map(HeldReason::as_str),
            token,
            created_at,
            updated_at,
            expires_at,
            lease_until,
            inquiries: None,
            inquiring_since: None,
            status,
            body_bytes,
            sealed_with: None,
            opened: None,
            open_error: None,
        })
    }

    /// With the inquiry's count and start, for an inquiring record.
    pub(crate) fn with_inquiry(mut self, asked: u32, since: Option<SystemTime>) -> Self {
        if self.state == RecordState::Inquiring {
            self.inquiries = Some(asked);
            self.inquiring_since = since;
        }
        self
    }
}

fn rfc3339<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

fn rfc3339_opt<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => rfc3339(t, s),
        None => s.serialize_none(),
    }
}

/// Milliseconds since the epoch (as stores keep them) to a `SystemTime`.
pub(crate) fn from_epoch_millis(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64)
}
