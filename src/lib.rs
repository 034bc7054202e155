//! idemgate: an idempotency gateway. A reverse proxy that claims each
//! `Idempotency-Key` in a shared store before forwarding, lets one request per
//! key reach the upstream, records the response, and replays it to every
//! retry. The design, its guarantees and this layout are explained in the
//! book, `docs/src/` (`docs/src/design/layout.md` for the layout).
//!
//! # Crates
//! This is the gateway, the root package of a workspace of four crates:
//! - `idemgate-core` (`crates/core/`): the record's vocabulary and the state
//!   machine, with no I/O;
//! - `idemgate-store` (`crates/store/`): the store traits, the waiters and
//!   every backend, each behind a cargo feature; this crate names it
//!   [`store`];
//! - `idemgate` (here): everything that serves HTTP, reads the
//!   configuration file, counts or traces;
//! - `idemgate-model` (`crates/model/`): the model checker over the core's
//!   transitions.
//!
//! The compiler keeps the direction: core ← store ← gateway, core ← model.
//!
//! # Modules
//! - [`app`]: wiring one gateway: store, wrappers, admin listener, sweeper, proxy.
//! - [`config`]: the TOML file → a validated [`Config`].
//! - [`server`]: accept loop, connection cap, HTTP/1.1 and h2c connections
//!   (or TLS with ALPN) and their deadlines, graceful shutdown.
//! - [`serving_threads`]: a runtime per core, which the server places
//!   connections on and the handler asks for its upstream pool.
//! - [`host`]: what the host offers (its cores).
//! - [`handler`]: the request pipeline (route, key, body, claim, forward, record).
//! - [`inquirer`]: the status inquiry: due questions asked, their keys settled.
//! - [`reload`]: live configuration (the routes) from the file again.
//! - [`request`]: what a protected request carries: its body, its key (syntax
//!   and where a route reads it), the JSON body, the fingerprint.
//! - [`upstream`]: the upstream clients (cleartext and `https://`), header
//!   hygiene, and the one exchange the forward, pass-through and inquiry use.
//! - [`tls`]: PEM files into rustls values (ring), for both sides.
//! - [`problem`]: every synthetic answer, as `application/problem+json`.
//! - [`admin`]: the admin listener (metrics, health, readiness, `POST /keys`)
//!   and key administration ([`admin::keys`]), shared with the CLI.
//! - [`metrics`]: the Prometheus metrics, and the wrapper that times every
//!   store operation ([`metrics::metered`]; the store knows nothing of it).
//! - [`telemetry`]: OpenTelemetry traces, off the request path.
//! - [`clock`]: the one clock.
//! - [`logging`]: the logger, writing off the request path.
//! - [`cli`]: the command line and its types.
//!
//! The top-level modules form a DAG (`tests/tree.rs` checks it): `cli` and
//! `app` on top, the server, handler, admin and inquirer below, and the
//! configuration, request, upstream and metrics under those.

pub mod admin;
pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod handler;
pub mod host;
pub mod inquirer;
pub mod logging;
pub mod metrics;
pub mod problem;
pub mod reload;
pub mod request;
pub mod server;
pub mod serving_threads;
pub mod telemetry;
pub mod tls;
pub mod upstream;

/// The record stores (the `idemgate-store` crate), under the name the
/// gateway's modules use.
pub use idemgate_store as store;

pub use app::{RunError, run, run_with, sweep_once};
pub use config::Config;
pub use handler::Gateway;
