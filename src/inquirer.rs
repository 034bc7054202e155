//! The status inquiry (docs/src/guide/status-inquiry.md): a background task
//! that asks upstreams what happened to attempts whose outcome is unknown,
//! and settles each key by the answer.
//!
//! Every [`TICK`], the task takes the due questions of the routes that
//! inquire from the store ([`StoreAdmin::take_inquiries`]): each taken key
//! has a new fencing token and a lease, so exactly one instance asks about
//! it, and a stale inquirer's late answer is fenced. Then, per key:
//!
//! - too early (less than `after` since the outcome became unknown): the
//!   question is put off until then, not asked;
//! - `GET url` with `Idempotency-Attempt: <token>` (the fence): **2xx**
//!   (not `202`) the upstream acted, its answer is recorded and replayed
//!   from now on (with the status of [`ORIGINAL_STATUS`] when it sends
//!   one; a status the route does not record releases the key, as that
//!   answer did); **404/410** it never acted, the key is released;
//!   anything else (or no answer within the route's `upstream_timeout`):
//!   asked again after `every` (the last time when `give_up_after` is
//!   reached), then held (`inquiry_gave_up`).
//!
//! Bounds: at most one batch of questions at a time per instance (32, or
//! on a Redis Cluster 32 plus one share per bucket asked at once), each
//! within its route's `upstream_timeout`, each reading a body only for a
//! 2xx answer and only up to the route's `max_recorded_response`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use tokio::time::Instant;

use http::{Method, Request, StatusCode, header};
use tokio::task::JoinSet;

use crate::config::{INQUIRY_LEASE_MARGIN, Inquiry as InquirySpec, Route};
use crate::metrics::Metrics;
use crate::request::body::{Collected, empty};
use crate::request::key::digest as key_digest;
use crate::store::{
    Cas, HeldReason, InquiringRoute, Inquiry, Store, StoreAdmin, StoreError, StoredResponse,
};
use crate::upstream::{ExchangeError, IDEMPOTENCY_ATTEMPT, Upstream, read_up_to, recorded};

/// How often due questions are looked for.
pub const TICK: Duration = Duration::from_secs(1);
/// The most questions one instance asks at once.
const BATCH: usize = 32;

/// What one question did to its key (`idemgate_inquiries_total{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 2xx: the upstream acted; its answer is the key's record.
    Acted,
    /// 404 or 410: the upstream never acted; the key is released.
    NotActed,
    /// Anything else: asked again later.
    Unknown,
    /// `give_up_after` passed: the key is held.
    GaveUp,
}

impl Answer {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acted => "acted",
            Self::NotActed => "not_acted",
            Self::Unknown => "unknown",
            Self::GaveUp => "gave_up",
        }
    }
}

/// The routes that inquire, and the clients that ask their upstreams.
struct Asking {
    routes: HashMap<String, Arc<Route>>,
    upstream: Upstream,
}

impl Asking {
    fn new(routes: &[Route], connect_timeout: Duration) -> Self {
        let routes: HashMap<String, Arc<Route>> = routes
            .iter()
            .filter(|r| r.inquiry.is_some())
            .map(|r| (r.name.clone(), Arc::new(r.clone())))
            .collect();
        let https = routes
            .values()
            .filter(|r| {
                r.inquiry
                    .as_ref()
                    .is_some_and(|q| q.url.starts_with("https:"))
            })
            .map(|r| r.upstream_ca.as_ref());
        let upstream = Upstream::new(connect_timeout, https);
        Self { routes, upstream }
    }
}

/// The status inquiry of one instance: the routes that inquire (replaced
/// by a reload, [`Inquirer::set_routes`]), and where answers are settled.
pub struct Inquirer {
    asking: ArcSwap<Asking>,
    records: Arc<dyn StoreAdmin>,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Inquirer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inquirer")
            .field("routes", &self.asking.load().routes.len())
            .finish_non_exhaustive()
    }
}

impl Inquirer {
    /// An inquirer for the routes of `routes` that inquire (it idles while
    /// none does). Questions are settled through `store` (the request
    /// path's, so caches and metrics see them) and taken from `records`.
    pub fn new(
        routes: &[Route],
        records: Arc<dyn StoreAdmin>,
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            asking: ArcSwap::from_pointee(Asking::new(routes, connect_timeout)),
            records,
            store,
            metrics,
        }
    }

    /// Ask for `routes` from the next tick on; questions already being
    /// asked finish under the routes they were taken for.
    pub fn set_routes(&self, routes: &[Route], connect_timeout: Duration) {
        self.asking
            .store(Arc::new(Asking::new(routes, connect_timeout)));
    }

    /// Ask about due keys every [`TICK`], forever.
    pub async fn run(self: Arc<Self>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let asking = self.asking.load_full();
            if asking.routes.is_empty() {
                self.metrics.inquiries.pending.set(0);
                continue;
            }
            let names: Vec<InquiringRoute> = asking
                .routes
                .values()
                .map(|r| InquiringRoute {
                    name: r.name.clone(),
                    retention: r.retention,
                    after: r.inquiry.as_ref().map_or(Duration::ZERO, |i| i.after),
                })
                .collect();
            // Every tick, before taking: the keys waiting for an answer,
            // during `after` and between questions too.
            match self.records.count_inquiring(&names).await {
                Ok(n) => {
                    let n = i64::try_from(n).unwrap_or(i64::MAX);
                    self.metrics.inquiries.pending.set(n);
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot count the keys waiting for a status inquiry; will retry");
                }
            }
            let lease = asking
                .routes
                .values()
                .map(|r| r.upstream_timeout)
                .max()
                .unwrap_or_default()
                + INQUIRY_LEASE_MARGIN;
            let taken = match self.records.take_inquiries(&names, lease, BATCH).await {
                Ok(taken) => taken,
                Err(error) => {
                    tracing::warn!(%error, "cannot look for due status inquiries; will retry");
                    continue;
                }
            };
            let mut questions = JoinSet::new();
            for inquiry in taken {
                let (this, asking) = (self.clone(), asking.clone());
                this.metrics.inquiries.asking.inc();
                questions.spawn(async move {
                    this.settle(&asking, inquiry).await;
                    this.metrics.inquiries.asking.dec();
                });
            }
            // One batch at a time: at most BATCH questions in flight.
            while questions.join_next().await.is_some() {}
        }
    }

    /// Ask about one taken key (or put the question off) and settle it.
    async fn settle(&self, asking: &Asking, inquiry: Inquiry) {
        let Some(route) = asking.routes.get(&inquiry.key.route) else {
            return;
        };
        let Some(spec) = &route.inquiry else {
            return;
        };
        let (key, token) = (&inquiry.key, inquiry.token);
        let digest = key_digest(&key.key);
        if inquiry.asked == 0 && inquiry.inquiring_for < spec.after {
            // Not yet: the upstream may still be working on the request.
            let wait = spec.after - inquiry.inquiring_for;
            let put_off = self.store.inquire(key, token, wait, false, route.retention);
            self.write("put off", route, put_off.await);
            return;
        }
        let started = Instant::now();
        let asked = ask(&asking.upstream, route, spec, &inquiry).await;
        // How long the outcome has been unknown, now that this answer is in.
        let unknown_for = inquiry.inquiring_for + started.elapsed();
        let (answer, written) = match asked {
            Ok(Asked::Acted(response)) => (
                Answer::Acted,
                self.store
                    .complete(key, token, &response, route.retention)
                    .await,
            ),
            Ok(Asked::TooLarge) => {
                let reason = HeldReason::ResponseTooLarge;
                let held = self.store.hold(key, token, reason, route.retention).await;
                (Answer::Acted, held)
            }
            Ok(Asked::NotActed) => (Answer::NotActed, self.store.release(key, token).await),
            Ok(Asked::NotRecorded(status)) => {
                tracing::info!(route = %route.name, key = %digest, token, %status, "status inquiry: the original was answered with a status the route does not record; releasing the key as that answer did");
                (Answer::Acted, self.store.release(key, token).await)
            }
            Err(Unsettled(why)) if unknown_for < spec.give_up_after => {
                tracing::info!(route = %route.name, key = %digest, token, asked = inquiry.asked + 1, %why, "status inquiry unanswered; asking again later");
                // The last question is asked when give_up_after is reached.
                let next = spec.every.min(spec.give_up_after - unknown_for);
                let next = self.store.inquire(key, token, next, true, route.retention);
                (Answer::Unknown, next.await)
            }
            Err(Unsettled(why)) => {
                tracing::info!(route = %route.name, key = %digest, token, %why, "status inquiry unanswered at give_up_after");
                let reason = HeldReason::InquiryGaveUp;
                (
                    Answer::GaveUp,
                    self.store.hold(key, token, reason, route.retention).await,
                )
            }
        };
        if self.write(answer.as_str(), route, written) {
            self.metrics.inquiries.count(&route.name, answer.as_str());
            match answer {
                Answer::Acted | Answer::NotActed => {
                    tracing::info!(route = %route.name, key = %digest, token, answer = answer.as_str(), "unknown outcome resolved by a status inquiry");
                }
                Answer::GaveUp => {
                    tracing::warn!(route = %route.name, key = %digest, token, asked = inquiry.asked, "status inquiry gave up; the key is held");
                }
                Answer::Unknown => {}
            }
        }
    }

    /// Log a write that did not apply; `true` if it did.
    fn write(&self, what: &str, route: &Route, written: Result<Cas, StoreError>) -> bool {
        match written {
            Ok(Cas::Applied) => true,
            Ok(Cas::Fenced) => {
                tracing::debug!(route = %route.name, what, "status inquiry fenced: the key was settled meanwhile");
                false
            }
            Err(error) => {
                tracing::warn!(route = %route.name, what, %error, "status inquiry could not settle its key; its lease will lapse and it is asked again");
                false
            }
        }
    }
}

/// The header by which a lookup conveys the status the original request
/// was answered with, when that is not the lookup's own `2xx`: e.g. a
/// `200` lookup answer with `Idempotency-Original-Status: 422` and the
/// original `422`'s headers and body.
pub const ORIGINAL_STATUS: http::HeaderName =
    http::HeaderName::from_static("idempotency-original-status");

/// Headers that describe the lookup's own answer (its cache validators,
/// its location, its cookies), never the original request's: they are not
/// recorded, whatever the route's `replay_headers`.
const LOOKUP_METADATA: [http::HeaderName; 9] = [
    header::AGE,
    header::CACHE_CONTROL,
    header::CONTENT_LOCATION,
    header::ETAG,
    header::EXPIRES,
    header::LAST_MODIFIED,
    header::SET_COOKIE,
    header::VARY,
    ORIGINAL_STATUS,
];

/// `GET` the route's inquiry URL for the key, within `upstream_timeout`,
/// carrying the question's token as `Idempotency-Attempt` (the fence: it is
/// at least every token an attempt for the key was forwarded with).
async fn ask(
    upstream: &Upstream,
    route: &Route,
    spec: &InquirySpec,
    inquiry: &Inquiry,
) -> Result<Asked, Unsettled> {
    let uri = spec
        .url_for(&inquiry.key.key, &inquiry.key.scope)
        .map_err(|e| Unsettled(format!("the inquiry URL is invalid for this key: {e}")))?;
    let mut request = Request::builder().method(Method::GET).uri(uri);
    for (name, value) in &spec.headers {
        request = request.header(name, value);
    }
    let request = request
        .header(header::ACCEPT, "*/*")
        .header(IDEMPOTENCY_ATTEMPT, inquiry.token)
        .body(empty())
        .map_err(|e| Unsettled(e.to_string()))?;
    let cap = route.max_recorded_response;
    // Only an answer to record is read; any other is dropped.
    let read = |head: &http::response::Parts, body| {
        let wanted = final_answer(head.status);
        async move {
            if wanted {
                read_up_to(body, cap).await.map(Some)
            } else {
                Ok(None)
            }
        }
    };
    let exchanged = upstream
        .exchange(
            route.upstream_ca.as_ref(),
            request,
            route.upstream_timeout,
            read,
        )
        .await;
    let (parts, body) = exchanged.map_err(|e| match e {
        ExchangeError::TimedOut => {
            Unsettled(format!("no answer within {:?}", route.upstream_timeout))
        }
        ExchangeError::Upstream(e) => Unsettled(e.to_string()),
    })?;
    Ok(match (parts.status, body) {
        (StatusCode::NOT_FOUND | StatusCode::GONE, _) => Asked::NotActed,
        (status, Some(collected)) => {
            let status = original_status(&parts.headers)?.unwrap_or(status);
            // The original's answer as the route records it, without what
            // describes the lookup's own answer.
            let answer = |body| {
                let expires = route.announced_expiry();
                let mut response = recorded(status, &parts.headers, body, route, expires);
                for name in &LOOKUP_METADATA {
                    response.headers.remove(name);
                }
                response
            };
            match collected {
                _ if !route.record.records(status) => Asked::NotRecorded(status),
                Collected::Complete(body) => Asked::Acted(answer(body)),
                // Too large to record, unless no body is recorded anyway.
                Collected::Over { .. } if !route.record_body => Asked::Acted(answer(Bytes::new())),
                Collected::Over { .. } => Asked::TooLarge,
            }
        }
        (status, None) => return Err(Unsettled(format!("the upstream answered {status}"))),
    })
}

/// Whether a lookup's answer settles the key as acted: a `2xx`, but not
/// `202 Accepted` (the upstream is still working on it: ask again).
fn final_answer(status: StatusCode) -> bool {
    status.is_success() && status != StatusCode::ACCEPTED
}

/// The original's status from [`ORIGINAL_STATUS`], if the lookup sent one:
/// a final status (200–599, not `202`), or the answer settles nothing.
fn original_status(headers: &http::HeaderMap) -> Result<Option<StatusCode>, Unsettled> {
    let Some(value) = headers.get(&ORIGINAL_STATUS) else {
        return Ok(None);
    };
    let status = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u16>().ok())
        .and_then(|v| StatusCode::from_u16(v).ok())
        .filter(|s| s.as_u16() >= 200 && *s != StatusCode::ACCEPTED);
    match status {
        Some(status) => Ok(Some(status)),
        None => Err(Unsettled(format!(
            "{ORIGINAL_STATUS}: {value:?} is not a final status (200-599, not 202)"
        ))),
    }
}

/// What a question found out.
enum Asked {
    /// 2xx within `max_recorded_response`: the key's record.
    Acted(StoredResponse),
    /// The original was answered with a status the route does not record:
    /// as for that answer itself, the key is released.
    NotRecorded(StatusCode),
    /// 2xx over `max_recorded_response`: acted, but nothing to replay.
    TooLarge,
    /// 404 or 410.
    NotActed,
}

/// Why a question settled nothing.
struct Unsettled(String);

/// Start the inquirer's task.
pub fn start(inquirer: Arc<Inquirer>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(inquirer.run())
}
