//! The routes in force and what serving them takes: each route's metric
//! handles and the upstream pools. A configuration reload builds a new
//! [`RouteTable`] and swaps it in whole ([`super::Gateway::set_routes`]):
//! a request matches a [`Routed`] in the table it started with and keeps
//! it, handles and pools included, to its end; new requests see the new
//! table.
//!
//! Nothing a request may still need is dropped by a swap: it holds its
//! route's handles itself (and a series, once created, never leaves
//! `/metrics`), and the upstream pools keep the clients of roots the new
//! routes no longer name ([`Upstream::reconfigured`]).

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use super::Outcome;
use crate::config::Route;
use crate::metrics::{Metrics, RouteMetrics};
use crate::upstream::Upstream;

/// The routes in force, their metric handles and the upstream pools.
pub(super) struct RouteTable {
    routes: Vec<Arc<Routed>>,
    /// One upstream pool per serving thread (`server_threads`), and a last
    /// one for every other thread: [`Routed::upstream`].
    upstreams: Arc<[Upstream]>,
}

/// A route in force, as a request carries it from its match to its end:
/// the route, its metric handles and the upstream pools of its table.
pub(super) struct Routed {
    route: Route,
    /// Its `route` label's handles.
    pub(super) metrics: RouteMetrics,
    upstreams: Arc<[Upstream]>,
}

impl Deref for Routed {
    type Target = Route;

    fn deref(&self) -> &Route {
        &self.route
    }
}

impl Routed {
    /// The upstream pool of the serving thread this runs on: a request's
    /// upstream connections stay on the thread that serves its client.
    /// Work on any other thread (the shared runtime) has a pool of its
    /// own, so it never uses connections a serving thread's runtime drives
    /// (and drops when that thread ends).
    pub(super) fn upstream(&self) -> &Upstream {
        let last = self.upstreams.len() - 1;
        let pool = crate::serving_threads::current().map_or(last, |t| t.min(last));
        &self.upstreams[pool]
    }
}

/// At most 5 s, and half of the shortest `upstream_timeout`: connecting must
/// fail (nothing sent) before the exchange times out (outcome unknown).
pub(crate) fn connect_timeout(routes: &[Route]) -> Duration {
    let shortest = routes.iter().map(|r| r.upstream_timeout).min();
    shortest.map_or(Duration::from_secs(5), |t| {
        (t / 2).min(Duration::from_secs(5))
    })
}

/// The `https://` routes' roots.
fn https(routes: &[Route]) -> impl Iterator<Item = Option<&crate::config::UpstreamCa>> {
    routes
        .iter()
        .filter(|r| r.upstream.scheme_str() == Some("https"))
        .map(|r| r.upstream_ca.as_ref())
}

impl RouteTable {
    /// The first table: `pools` upstream pools (one per serving thread,
    /// and one more).
    pub(super) fn new(routes: &[Route], pools: usize, metrics: &Metrics) -> Self {
        let timeout = connect_timeout(routes);
        let upstreams = (0..pools)
            .map(|_| Upstream::new(timeout, https(routes)))
            .collect();
        Self::with(routes, upstreams, metrics)
    }

    /// The table for reloaded `routes`: this one's pooled connections
    /// carried over.
    pub(super) fn next(&self, routes: &[Route], metrics: &Metrics) -> Self {
        let timeout = connect_timeout(routes);
        let upstreams = self
            .upstreams
            .iter()
            .map(|pool| pool.reconfigured(timeout, https(routes)))
            .collect();
        Self::with(routes, upstreams, metrics)
    }

    fn with(routes: &[Route], upstreams: Arc<[Upstream]>, metrics: &Metrics) -> Self {
        let outcomes = Outcome::ALL.map(Outcome::as_str);
        let routes = routes
            .iter()
            .map(|route| {
                Arc::new(Routed {
                    route: route.clone(),
                    metrics: metrics.for_route(&route.name, &outcomes),
                    upstreams: upstreams.clone(),
                })
            })
            .collect();
        Self { routes, upstreams }
    }

    /// The route whose `match` fits `path` best.
    pub(super) fn route_for(&self, path: &str) -> Option<&Arc<Routed>> {
        self.routes
            .iter()
            .filter_map(|r| r.path.matches(path).map(|score| (score, r)))
            .max_by_key(|(score, _)| *score)
            .map(|(_, r)| r)
    }

    /// How many routes are in force.
    pub(super) fn len(&self) -> usize {
        self.routes.len()
    }

    /// The upstream pools (one per serving thread, and one more).
    #[cfg(test)]
    pub(super) fn upstreams(&self) -> &[Upstream] {
        &self.upstreams
    }
}
