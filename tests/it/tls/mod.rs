//! TLS on every side of the gateway, against real TLS peers with throwaway
//! certificates ([`crate::support::pki`]): `https://` upstreams
//! ([`upstream`]), and the TLS proxy listener with its deadline and
//! certificate reload ([`listener`]).

mod listener;
mod upstream;
