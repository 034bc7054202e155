//! TLS on every side of the gateway, against real TLS peers with throwaway
//! certificates ([`crate::support::pki`]): `https://` upstreams
//! ([`upstream`]), the TLS proxy listener with its deadline and certificate
//! reload ([`listener`]), and PostgreSQL over TLS ([`postgres`]).

mod listener;
mod postgres;
mod upstream;
