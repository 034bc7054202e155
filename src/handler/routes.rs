//! The routes in force and what is built from them: each route's metric
//! handles and the upstream pools. A configuration reload builds a new
//! [`RouteTable`] and swaps it in whole ([`super::Gateway::set_routes`]):
//! a request matches its route in the table it started with and keeps
//! that route to its end; new requests see the new table.
//!
//! Nothing a request may still need is dropped by a swap: metric handles
//! are kept for every route ever served (a series never vanishes from
//! `/metrics` mid-life), and the upstream pools keep the clients of roots
//! the new routes no longer name ([`Upstream::reconfigured`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::Outcome;
use super::passthrough::connect_timeout;
use crate::config::Route;
use crate::metrics::{Metrics, RouteMetrics};
use crate::upstream::Upstream;

/// The routes in force, their metric handles and the upstream pools.
pub(super) struct RouteTable {
    routes: Vec<Arc<Route>>,
    /// Each route's metric handles, by route name: every route served
    /// since start, so a request of a route a reload removed still counts.
    metrics: HashMap<String, RouteMetrics>,
    /// One upstream pool per serving thread (`server_threads`), and a last
    /// one for every other thread: [`super::Gateway::upstream`].
    pub(super) upstreams: Vec<Arc<Upstream>>,
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
            .map(|_| Arc::new(Upstream::new(timeout, https(routes))))
            .collect();
        Self::with(routes, HashMap::new(), upstreams, metrics)
    }

    /// The table for reloaded `routes`: this one's metric handles and
    /// pooled connections carried over.
    pub(super) fn next(&self, routes: &[Route], metrics: &Metrics) -> Self {
        let timeout = connect_timeout(routes);
        let upstreams = self
            .upstreams
            .iter()
            .map(|pool| Arc::new(pool.reconfigured(timeout, https(routes))))
            .collect();
        Self::with(routes, self.metrics.clone(), upstreams, metrics)
    }

    fn with(
        routes: &[Route],
        mut handles: HashMap<String, RouteMetrics>,
        upstreams: Vec<Arc<Upstream>>,
        metrics: &Metrics,
    ) -> Self {
        let outcomes = Outcome::ALL.map(Outcome::as_str);
        for route in routes {
            handles
                .entry(route.name.clone())
                .or_insert_with(|| metrics.for_route(&route.name, &outcomes));
        }
        Self {
            routes: routes.iter().cloned().map(Arc::new).collect(),
            metrics: handles,
            upstreams,
        }
    }

    /// The route whose `match` fits `path` best.
    pub(super) fn route_for(&self, path: &str) -> Option<&Arc<Route>> {
        self.routes
            .iter()
            .filter_map(|r| r.path.matches(path).map(|score| (score, r)))
            .max_by_key(|(score, _)| *score)
            .map(|(_, r)| r)
    }

    /// A route's metric handles (`None` when no such route was ever served).
    pub(super) fn metrics_of(&self, route: &str) -> Option<&RouteMetrics> {
        self.metrics.get(route)
    }

    /// How many routes are in force.
    pub(super) fn len(&self) -> usize {
        self.routes.len()
    }
}
