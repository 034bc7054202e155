//! Private records (docs/src/operations/protecting-stored-responses.md):
//! recorded responses sealed under `[store] encryption_keys` before any
//! store sees them, and opened again on replay. One wrapper serves every
//! backend; the stores keep the sealed value in the fields they already
//! have, so none of them changes.

mod codec;
mod envelope;
#[cfg(any(test, feature = "test-hooks"))]
pub mod fixture;
mod keyring;
mod shown;
mod store;

pub use codec::Codec;
pub use envelope::{COMPRESS_ABOVE, OpenError, SEALED_HEADER, open, seal, sealed_with};
pub use keyring::{KEY_BYTES, Keyring, KeyringError, MAX_ID_LEN};
pub use store::{OnOpen, SealedStore};
