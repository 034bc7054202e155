//! TLS on every side of the gateway, against real TLS peers with throwaway
//! certificates ([`crate::support::pki`]): `https://` upstreams
//! ([`upstream`]).

mod upstream;
