//! Shadow mode: a route with `mode = "shadow"` forwards every request as
//! if idemgate were absent, while keyed requests are still claimed and
//! recorded; what enforcing would have done is counted
//! (`idemgate_shadow_total{route, would}`) and, for every would-be
//! intervention, logged with the key's digest. Every point where a shadow
//! route is handled differently from an enforced one is in this file.

use std::net::SocketAddr;
use std::sync::Arc;

use http::Request;

use super::{Answered, Gateway, Outcome, Routed};
use crate::config::{Route, RouteMode};
use crate::metrics::{Metrics, ShadowLabels};
use crate::problem::GatewayError;
use crate::request::body::Body;
use crate::request::key::digest as key_digest;
use crate::store::{Claim, HeldReason, RecordKey, StoreError, StoredResponse, Token};

/// What a request without a usable key gets instead of a claim.
pub(super) enum Instead {
    /// This problem.
    Problem(GatewayError),
    /// Forwarded without idempotency.
    Forward,
}

impl Gateway {
    /// A key problem: `problem` when enforcing; a counted forward in
    /// shadow mode.
    pub(super) fn instead(
        &self,
        route: &Route,
        would: Would,
        problem: impl FnOnce() -> GatewayError,
    ) -> Instead {
        if route.mode == RouteMode::Shadow {
            report(&self.metrics, &route.name, would, None);
            Instead::Forward
        } else {
            Instead::Problem(problem())
        }
    }

    /// A body over the route's limit: `413` when enforcing; in shadow mode
    /// forwarded as it streams (what was read, then the rest).
    pub(super) async fn oversized(
        &self,
        route: &Routed,
        request: Request<Body>,
        client: SocketAddr,
    ) -> Result<Answered, GatewayError> {
        if route.mode == RouteMode::Shadow {
            return self.pass_through(route, request, client).await;
        }
        Err(GatewayError::BodyTooLarge {
            limit: route.max_request_body,
        })
    }

    /// The store failed on a shadow route's claim: it never blocks one.
    pub(super) async fn shadow_store_error(
        &self,
        route: &Routed,
        request: Request<Body>,
        client: SocketAddr,
        error: StoreError,
    ) -> Result<Answered, GatewayError> {
        tracing::warn!(route = %route.name, error = %error, "store error on a shadow route: forwarded");
        let response = self.forward_plain(route, request, client).await?;
        Ok(Answered::new(response, Outcome::FailOpen))
    }

    /// A shadow route's claim: count what enforcing would do; `true` when
    /// that is a forward under the claim (a new key), `false` when the
    /// request is to be passed through instead.
    pub(super) fn shadow_claims(&self, route: &Route, key: &RecordKey, claimed: &Claim) -> bool {
        let would = match claimed {
            Claim::Claimed { .. } => Would::Forward,
            Claim::Replay(_) => Would::Replay,
            Claim::InFlight { .. } | Claim::Inquiring { .. } => Would::Conflict,
            Claim::Mismatch { .. } => Would::Mismatch,
            Claim::Held { .. } => Would::Held,
        };
        report(
            &self.metrics,
            &route.name,
            would,
            Some(&key_digest(&key.key)),
        );
        would == Would::Forward
    }

    /// A shadow route settles its record (`Some`) or holds a response too
    /// large to record (`None`) before the answer, as under enforce (so a
    /// quick retry is counted as the replay enforcing would give), but
    /// tries once: if the store fails, the upstream's answer goes out and
    /// the write is retried beside it.
    pub(super) async fn shadow_settle(
        self: &Arc<Self>,
        route: &Route,
        key: &RecordKey,
        token: Token,
        stored: Option<StoredResponse>,
    ) {
        let once = match &stored {
            Some(stored) => {
                self.store
                    .complete(key, token, stored, route.retention)
                    .await
            }
            None => {
                let reason = HeldReason::ResponseTooLarge;
                self.store.hold(key, token, reason, route.retention).await
            }
        };
        if once.is_err() {
            self.record_beside(route, key, token, stored);
        }
    }

    /// Shadow mode, after a first write failed: record the response
    /// (`Some`) or hold the key (`None`: too large to record) in a task of
    /// its own, retrying as a settling write does, while the answer is
    /// sent; a failure is logged, never answered.
    fn record_beside(
        self: &Arc<Self>,
        route: &Route,
        key: &RecordKey,
        token: Token,
        stored: Option<StoredResponse>,
    ) {
        let (gateway, route, key) = (self.clone(), route.clone(), key.clone());
        self.tasks.spawn(async move {
            let retention = route.retention;
            let written = match &stored {
                Some(stored) => {
                    let write = || gateway.store.complete(&key, token, stored, retention);
                    gateway.settled(&route, write).await
                }
                None => {
                    let reason = HeldReason::ResponseTooLarge;
                    let write = || gateway.store.hold(&key, token, reason, retention);
                    gateway.settled(&route, write).await
                }
            };
            if let Err(error) = written {
                tracing::warn!(route = %route.name, %error, "shadow route: the answer was sent, but not recorded");
            }
        });
    }
}

/// What enforcing the route would have done with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Would {
    /// Forward it (a new key): not an intervention.
    Forward,
    /// Replay the recorded response instead of forwarding.
    Replay,
    /// `409`: the key is in flight.
    Conflict,
    /// `422`: the key was used with another request.
    Mismatch,
    /// Answer from a `held` record.
    Held,
    /// `400`: no key.
    MissingKey,
    /// `400`: a malformed key.
    InvalidKey,
}

impl Would {
    /// The `would` label.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Forward => "forward",
            Self::Replay => "replay",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::Held => "held",
            Self::MissingKey => "missing_key",
            Self::InvalidKey => "invalid_key",
        }
    }
}

/// Count what a shadow route would have done, and log an intervention.
fn report(metrics: &Metrics, route: &str, would: Would, key_digest: Option<&str>) {
    metrics
        .shadow
        .get_or_create(&ShadowLabels {
            route: route.to_string(),
            would: would.as_str(),
        })
        .inc();
    if would != Would::Forward {
        tracing::info!(
            target: "idemgate::shadow",
            route,
            would = would.as_str(),
            key = key_digest.unwrap_or("-"),
            "shadow: enforcing would have answered this request itself; it was forwarded"
        );
    }
}
