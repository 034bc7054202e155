//! Pipeline steps 3–4: everything read from a protected request before its
//! claim. The key (from the head, or from the JSON body once it is read),
//! the scope, and the body within the route's limit, paid for from the
//! shared body budget and fingerprinted as it streams. A request without a
//! usable key gets a problem, or is forwarded without idempotency where
//! the route says so ([`super::shadow::Instead`]).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http::request::Parts;

use super::claim::Claiming;
use super::shadow::{Instead, Would};
use super::{Answered, Gateway, Routed, Trace};
use crate::config::Route;
use crate::problem::GatewayError;
use crate::request::body::{
    self, Budgeted, BudgetedError, Collected, RequestBody, Reservation, collect_up_to,
};
use crate::request::fingerprint::Fingerprinter;
use crate::request::json_body::JsonBody;
use crate::request::key::{KeyError, digest as key_digest};
use crate::request::key_source::{self, Found, PartError};
use crate::store::RecordKey;

/// What the intake of a request comes to. Built once per request and
/// taken apart at once, so the size of its larger variant costs nothing a
/// box would save.
#[allow(clippy::large_enum_variant)]
pub(super) enum Intake {
    /// Everything the claim needs.
    Claim(Claiming),
    /// Answered already: forwarded without idempotency.
    Answered(Answered),
}

impl Gateway {
    /// Steps 3–4: the key, the body and the fingerprint; or the answer
    /// when the request is not claimed.
    pub(super) async fn intake(
        &self,
        route: Arc<Routed>,
        request: Request<RequestBody>,
        client: SocketAddr,
        trace: &mut Trace,
    ) -> Result<Intake, GatewayError> {
        let (parts, incoming) = request.into_parts();

        // 3. The key, when the head carries it (a part in the body is read
        // after the body).
        let head_key = if route.key_reads_body() {
            None
        } else {
            let found = key_source::key(&route.key_from, &parts, None);
            match self.key_or_forward(&route, found) {
                Ok(key) => Some(key),
                Err(instead) => {
                    let request = Request::from_parts(parts, body::boxed(incoming));
                    return self
                        .instead_of_claim(&route, instead, request, client)
                        .await;
                }
            }
        };
        if let Some(key) = &head_key {
            trace.key_digest = Some(key_digest(key));
        }

        // 4. The body, fingerprinted as it streams, within the limit. Its
        // bytes are paid for from the shared budget as they arrive, and the
        // payment is held until its forward ends: a body the budget cannot
        // cover gets 503 before anything is claimed.
        let mut reservation = Reservation::default();
        let mut fingerprinter = Fingerprinter::new(&route.fingerprint, &parts);
        let body = match self
            .read_body(
                &route,
                &parts,
                incoming,
                &mut reservation,
                &mut fingerprinter,
            )
            .await?
        {
            Ok(body) => body,
            Err(oversized) => {
                let request = Request::from_parts(parts, oversized);
                return Ok(Intake::Answered(
                    self.oversized(&route, request, client).await?,
                ));
            }
        };

        // 4b. The key and scope parts in the body (parsed once, for them and
        // for the fingerprint).
        let json = route
            .parses_json()
            .then(|| JsonBody::parse(&body))
            .flatten();
        let (key, scope) = match self.key_and_scope(&route, &parts, json.as_ref(), head_key, trace)
        {
            Ok(found) => found,
            Err(instead) => {
                let request = Request::from_parts(parts, body::full(body));
                return self
                    .instead_of_claim(&route, instead, request, client)
                    .await;
            }
        };
        let fingerprint = fingerprinter.finish(&body, json);
        Ok(Intake::Claim(Claiming {
            record_key: RecordKey {
                route: route.name.clone(),
                scope,
                key,
            },
            route,
            fingerprint,
            parts,
            body,
            client,
            // The body's bytes stay paid for until the last task using them ends.
            reservation: Arc::new(reservation),
            after_waiting: false,
        }))
    }

    /// The key (read from the body unless the head had it) and the scope.
    fn key_and_scope(
        &self,
        route: &Route,
        parts: &Parts,
        json: Option<&JsonBody>,
        head_key: Option<String>,
        trace: &mut Trace,
    ) -> Result<(String, Vec<u8>), Instead> {
        let key = match head_key {
            Some(key) => key,
            None => {
                let found = key_source::key(&route.key_from, parts, json);
                let key = self.key_or_forward(route, found)?;
                trace.key_digest = Some(key_digest(&key));
                key
            }
        };
        let scope = key_source::scope(&route.scope_from, parts, json)
            .map_err(|error| self.instead_of_invalid(route, error))?;
        Ok((key, scope))
    }

    /// Read the body up to the route's limit, paying into `reservation`
    /// and feeding `fingerprinter`. `Ok(Err(body))`: over the limit, with
    /// the body as it arrives (what was read, then the rest).
    async fn read_body(
        &self,
        route: &Route,
        parts: &Parts,
        incoming: RequestBody,
        reservation: &mut Reservation,
        fingerprinter: &mut Fingerprinter<'_>,
    ) -> Result<Result<Bytes, body::Body>, GatewayError> {
        let limit = route.max_request_body;
        let declared = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Ok(Err(body::boxed(incoming)));
        }
        let timeout = self.body_read_timeout;
        let budgeted = Budgeted::new(incoming, &self.body_budget, reservation);
        let read = collect_up_to(budgeted, limit, |chunk| fingerprinter.update(chunk));
        match tokio::time::timeout(timeout, read).await {
            Ok(Ok(Collected::Complete(bytes))) => Ok(Ok(bytes)),
            Ok(Ok(Collected::Over { prefix, rest })) => Ok(Err(body::boxed(body::Prefixed::new(
                prefix,
                rest.into_inner(),
            )))),
            Ok(Err(BudgetedError::Spent)) => Err(GatewayError::Overloaded(
                "budget for buffered request bodies (max_buffered_request_bytes)",
            )),
            Ok(Err(BudgetedError::Body(e))) => Err(GatewayError::BodyRead(e.to_string())),
            Err(_elapsed) => Err(GatewayError::BodyTimeout { timeout }),
        }
    }

    /// The key, or what to do instead: a problem (enforce), or a forward
    /// without idempotency (no key on a route that does not require one; in
    /// shadow mode, any key problem, counted as what enforcing would do).
    fn key_or_forward(
        &self,
        route: &Route,
        found: Result<Found, PartError>,
    ) -> Result<String, Instead> {
        match found {
            Ok(Found::Key(key)) => {
                let refused = route.inquiry.as_ref().is_some_and(|q| q.refuses_key(&key));
                match route.key_from.first() {
                    // Named by the first part (a composite key is refused whole).
                    Some(part) if refused => Err(self.instead_of_invalid(
                        route,
                        PartError {
                            part: part.clone(),
                            reason: KeyError::DotSegment,
                        },
                    )),
                    _ => Ok(key),
                }
            }
            Ok(Found::Missing(_)) if !route.key_required => Err(Instead::Forward),
            Ok(Found::Missing(part)) => {
                Err(
                    self.instead(route, Would::MissingKey, || GatewayError::MissingKey {
                        part,
                    }),
                )
            }
            Err(error) => Err(self.instead_of_invalid(route, error)),
        }
    }

    /// What a key or scope part that is present but unusable gets.
    fn instead_of_invalid(&self, route: &Route, error: PartError) -> Instead {
        self.instead(route, Would::InvalidKey, || GatewayError::InvalidKey {
            part: error.part,
            reason: error.reason,
        })
    }

    /// Carry out an [`Instead`].
    async fn instead_of_claim(
        &self,
        route: &Routed,
        instead: Instead,
        request: Request<body::Body>,
        client: SocketAddr,
    ) -> Result<Intake, GatewayError> {
        match instead {
            Instead::Problem(error) => Err(error),
            Instead::Forward => Ok(Intake::Answered(
                self.pass_through(route, request, client).await?,
            )),
        }
    }
}
