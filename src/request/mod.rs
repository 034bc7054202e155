//! What a protected request carries, read and digested before the claim:
//! its body ([`body`]), its idempotency key ([`key`]) and where a route
//! reads it and the scope from ([`key_source`]), the JSON body a key part
//! or the canonical fingerprint may need ([`json_body`]), and the
//! fingerprint that tells a retry from a different request ([`fingerprint`]),
//! and the verified client certificate's identity ([`client_cert`]).

pub mod body;
pub mod client_cert;
pub mod fingerprint;
pub mod json_body;
pub mod key;
pub mod key_source;
