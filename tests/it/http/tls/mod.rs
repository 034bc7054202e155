//! TLS on every side of the gateway, against real TLS peers with throwaway
//! certificates ([`crate::support::pki`]): `https://` upstreams
//! ([`upstream`]), the TLS proxy listener with its deadline and certificate
//! reload ([`listener`]), client certificates and the identity they give
//! ([`client_certs`]), PostgreSQL over TLS ([`postgres`]), and Redis
//! over TLS (`rediss://`, [`redis`]).

mod client_certs;
mod listener;
mod postgres;
mod redis;
mod upstream;
