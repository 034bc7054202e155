//! The chaos workload: client tasks that create keys, retry them, reuse
//! them with a different body, and storm single keys with up to 64
//! concurrent copies, against either gateway instance, recording every
//! request in the [`History`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};

use super::cluster::Gateways;
use super::history::{History, Op, Outcome, Route};
use crate::support::upstream::{
    DELAY_HEADER, DENIED_HEADER, KEY_LABEL_HEADER, OP_HEADER, REPLAYED_HEADERS, TENANT_HEADER,
    digest, response_digest,
};
use crate::support::{HttpClient, client};

/// How long a client waits for an answer before it gives up (an `info`).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A key and the two requests that may carry it.
#[derive(Debug, Clone)]
pub struct KeyInfo {
    pub route: Route,
    pub key: String,
    /// Where its requests go: the route's [`Route::path`], or on the
    /// inquiring route one of [`INQUIRE_PATHS`].
    pub path: &'static str,
    /// On the inquiring route: the tenant ([`TENANT_HEADER`]; the route is
    /// scoped by it, and its lookup answers per tenant), and whether the
    /// key is sent quoted (`"k"`, the IETF draft's form: the same key).
    pub tenant: Option<&'static str>,
    pub quoted: bool,
    /// The request's body (about 512 bytes of JSON).
    pub canonical: Bytes,
    /// A different request reusing the key (a client bug: must get 422).
    pub mutant: Bytes,
}

impl KeyInfo {
    fn new(route: Route, path: &'static str, key: String) -> Self {
        let body = |amount: u32| {
            let head = format!(r#"{{"key":"{key}","amount":{amount},"pad":""#);
            let pad = "x".repeat(512usize.saturating_sub(head.len() + 2));
            Bytes::from(format!("{head}{pad}\"}}"))
        };
        Self {
            route,
            path,
            tenant: None,
            quoted: false,
            canonical: body(100),
            mutant: body(999),
            key,
        }
    }

    /// The body with this digest (canonical or mutant).
    pub fn body_with_digest(&self, wanted: &str) -> Option<Bytes> {
        [&self.canonical, &self.mutant]
            .into_iter()
            .find(|body| digest(body) == wanted)
            .cloned()
    }
}

/// The paths of the inquiring route's keys, by what the upstream does
/// (tests/it/support/upstream.rs): acts and answers 201 (or, with a delay
/// past `upstream_timeout`, acts while the gateway times out); acts, then
/// resets the connection; drops the first request with the key before
/// acting (the lookup says 404, the retry is forwarded); acts and never
/// answers (the gateway times out). Weights out of 100.
pub const INQUIRE_PATHS: [(&str, u32); 4] = [
    ("/inquire/orders", 40),
    ("/inquire/reset", 25),
    ("/inquire/drop-once", 20),
    ("/inquire/hang", 15),
];

/// How often an inquiring client sends a key before it moves on (the
/// first request and its retries), unless a 2xx settles it first.
const INQUIRE_TRIES: u32 = 8;

/// Shared state of the clients of one run.
pub struct Workload {
    pub history: History,
    pub gateways: Arc<Gateways>,
    http: HttpClient,
    epoch: Instant,
    run: String,
    next_op: AtomicU64,
    next_key: AtomicU64,
    /// Requests issued so far.
    pub issued: AtomicU64,
    /// Every key ever used, for the final check.
    keys: Mutex<Vec<KeyInfo>>,
    /// Recently used keys, for retries.
    recent: Mutex<VecDeque<KeyInfo>>,
    pub stop: AtomicBool,
    /// Largest storm.
    max_storm: usize,
}

impl Workload {
    pub fn new(gateways: Arc<Gateways>, epoch: Instant, run: &str, max_storm: usize) -> Self {
        Self {
            history: History::default(),
            gateways,
            http: client(),
            epoch,
            run: run.to_string(),
            next_op: AtomicU64::new(1),
            next_key: AtomicU64::new(1),
            issued: AtomicU64::new(0),
            keys: Mutex::new(Vec::new()),
            recent: Mutex::new(VecDeque::new()),
            stop: AtomicBool::new(false),
            max_storm,
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub fn keys(&self) -> Vec<KeyInfo> {
        self.keys.lock().unwrap().clone()
    }

    /// A key never used before.
    pub fn new_key(&self, route: Route) -> KeyInfo {
        self.new_key_at(route, route.path())
    }

    /// A new key of the inquiring route, on a path drawn from
    /// [`INQUIRE_PATHS`].
    fn new_inquiring_key(&self, rng: &mut fastrand::Rng) -> KeyInfo {
        let mut roll = rng.u32(..100);
        let path = INQUIRE_PATHS
            .into_iter()
            .find(|(_, weight)| {
                let here = roll < *weight;
                roll = roll.saturating_sub(*weight);
                here
            })
            .map_or(Route::Inquire.path(), |(path, _)| path);
        let tenant = if rng.bool() { "tenant-a" } else { "tenant-b" };
        self.new_key_with(Route::Inquire, path, |info| {
            // Two tenants, and a third of the keys quoted.
            info.tenant = Some(tenant);
            info.quoted = rng.u32(..3) == 0;
        })
    }

    fn new_key_at(&self, route: Route, path: &'static str) -> KeyInfo {
        self.new_key_with(route, path, |_| {})
    }

    fn new_key_with(
        &self,
        route: Route,
        path: &'static str,
        edit: impl FnOnce(&mut KeyInfo),
    ) -> KeyInfo {
        let n = self.next_key.fetch_add(1, Ordering::Relaxed);
        let mut info = KeyInfo::new(route, path, format!("{}-{n}", self.run));
        edit(&mut info);
        self.keys.lock().unwrap().push(info.clone());
        let mut recent = self.recent.lock().unwrap();
        recent.push_back(info.clone());
        if recent.len() > 256 {
            recent.pop_front();
        }
        info
    }

    fn recent_key(&self, rng: &mut fastrand::Rng, route: Option<Route>) -> Option<KeyInfo> {
        let recent = self.recent.lock().unwrap();
        let candidates: Vec<&KeyInfo> = recent
            .iter()
            .filter(|k| route.is_none_or(|r| k.route == r))
            .collect();
        (!candidates.is_empty()).then(|| candidates[rng.usize(..candidates.len())].clone())
    }

    /// Send one request and record it.
    pub async fn request(
        &self,
        process: usize,
        instance: usize,
        info: &KeyInfo,
        body: Bytes,
        delay_ms: u64,
        last_phase: bool,
    ) -> Op {
        let id = self.next_op.fetch_add(1, Ordering::Relaxed);
        self.issued.fetch_add(1, Ordering::Relaxed);
        let port = self.gateways.port(instance);
        let mut request = Request::post(format!("http://127.0.0.1:{port}{}", info.path));
        request = if info.route == Route::Webhook {
            // The key is in the body; each delivery is signed anew.
            request.header(KEY_LABEL_HEADER, &info.key).header(
                "x-webhook-signature",
                format!("v1,{:016x}", id.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            )
        } else if info.quoted {
            request.header("idempotency-key", format!("\"{}\"", info.key))
        } else {
            request.header("idempotency-key", &info.key)
        };
        if let Some(tenant) = info.tenant {
            request = request.header(TENANT_HEADER, tenant);
        }
        let request = request
            .header("content-type", "application/json")
            .header(OP_HEADER, id.to_string())
            .header(DELAY_HEADER, delay_ms.to_string())
            .body(Full::new(body.clone()))
            .unwrap();
        let invoke = self.elapsed();
        let outcome = self.exchange(request).await;
        let op = Op {
            id,
            process,
            route: info.route,
            key: info.key.clone(),
            body: digest(&body),
            instance,
            last_phase,
            invoke,
            complete: self.elapsed(),
            outcome,
        };
        self.history.push(op.clone());
        op
    }

    async fn exchange(&self, request: Request<Full<Bytes>>) -> Outcome {
        let response = match tokio::time::timeout(CLIENT_TIMEOUT, self.http.request(request)).await
        {
            Err(_) => {
                return Outcome::NoAnswer {
                    error: "client timeout".into(),
                    definite: false,
                };
            }
            Ok(Err(error)) => {
                return Outcome::NoAnswer {
                    definite: error.is_connect(),
                    error: format!("{error:?}"),
                };
            }
            Ok(Ok(response)) => response,
        };
        let (parts, body) = response.into_parts();
        let body = match tokio::time::timeout(CLIENT_TIMEOUT, body.collect()).await {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(error)) => {
                return Outcome::NoAnswer {
                    error: format!("body: {error}"),
                    definite: false,
                };
            }
            Err(_) => {
                return Outcome::NoAnswer {
                    error: "client timeout (body)".into(),
                    definite: false,
                };
            }
        };
        let is_problem = parts
            .headers
            .get("content-type")
            .is_some_and(|v| v == "application/problem+json");
        let problem = is_problem
            .then(|| serde_json::from_slice::<serde_json::Value>(&body).ok())
            .flatten()
            .and_then(|json| {
                json["type"]
                    .as_str()
                    .map(|t| t.trim_start_matches("urn:idemgate:problem:").to_string())
            });
        Outcome::Answer {
            status: parts.status.as_u16(),
            problem,
            replayed: parts
                .headers
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true"),
            response: response_digest(
                parts.status.as_u16(),
                REPLAYED_HEADERS.iter().flat_map(|name| {
                    parts
                        .headers
                        .get_all(*name)
                        .iter()
                        .map(move |value| (*name, value.as_bytes()))
                }),
                &body,
            ),
            denied_header: parts.headers.contains_key(DENIED_HEADER),
        }
    }

    /// How long the upstream should take: mostly fast, sometimes slow
    /// enough to overlap retries, rarely past `upstream_timeout` (1 s).
    fn delay(rng: &mut fastrand::Rng) -> u64 {
        match rng.u32(..100) {
            0..=69 => rng.u64(0..5),
            70..=97 => rng.u64(20..200),
            _ => 1_200,
        }
    }

    /// The key's own request, the upstream taking `delay_ms`.
    async fn send(&self, process: usize, instance: usize, info: &KeyInfo, delay_ms: u64) -> Op {
        let body = info.canonical.clone();
        self.request(process, instance, info, body, delay_ms, false)
            .await
    }

    /// A client of the slow routes: a new key whose upstream takes longer
    /// than the route's lease (so the lease lives by renewal), then, after
    /// the lease would have lapsed without renewal but while the first
    /// execution still runs, a retry of it on another instance. With
    /// renewals it gets `409 in-flight`; without, a `release` route lets it
    /// take over and execute beside the first (the renewal control).
    pub async fn slow_client(self: Arc<Self>, process: usize, seed: u64, routes: &[Route]) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let lease = super::SLOW_LEASE.as_millis() as u64;
        while !self.stop.load(Ordering::Relaxed) {
            let info = self.new_key(routes[rng.usize(..routes.len())]);
            let instance = rng.usize(..self.gateways.len());
            let delay = rng.u64(lease * 9 / 5..lease * 13 / 5);
            let first = self.send(process, instance, &info, delay);
            let retry = async {
                let after = lease * 13 / 10 + rng.u64(0..200);
                tokio::time::sleep(Duration::from_millis(after)).await;
                let other = (instance + 1) % self.gateways.len();
                self.send(process, other, &info, 100).await
            };
            futures_util::future::join(first, retry).await;
        }
    }

    /// A client of the inquiring route: a new key (on a path drawn from
    /// [`INQUIRE_PATHS`]), then, after an answer that settles nothing (an
    /// unknown outcome, `409 outcome-pending` while the gateway asks the
    /// upstream, `409 in-flight`), retries of it on either instance, 200–600
    /// ms apart, until one gets a 2xx or [`INQUIRE_TRIES`] were sent. The
    /// retries are what a lying lookup turns into second executions (the
    /// inquiry's negative control).
    pub async fn inquiring_client(self: Arc<Self>, process: usize, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        while !self.stop.load(Ordering::Relaxed) {
            let info = self.new_inquiring_key(&mut rng);
            for tries in 1..=INQUIRE_TRIES {
                let instance = rng.usize(..self.gateways.len());
                let op = self
                    .send(process, instance, &info, Self::delay(&mut rng))
                    .await;
                if op.is_2xx() || tries == INQUIRE_TRIES {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(rng.u64(200..600))).await;
                if self.stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
    }

    /// One client task: loop over actions until told to stop.
    pub async fn client(self: Arc<Self>, process: usize, seed: u64) {
        let mut rng = fastrand::Rng::with_seed(seed);
        while !self.stop.load(Ordering::Relaxed) {
            let instance = rng.usize(..self.gateways.len());
            let roll = rng.u32(..100);
            match roll {
                // A new key, once.
                0..=49 => {
                    let route = match rng.u32(..10) {
                        0..=5 => Route::Hold,
                        6 | 7 => Route::Release,
                        8 => Route::Webhook,
                        _ => Route::Wait,
                    };
                    let info = self.new_key(route);
                    self.send(process, instance, &info, Self::delay(&mut rng))
                        .await;
                }
                // A retry of a recent request.
                50..=74 => {
                    if let Some(info) = self.recent_key(&mut rng, None) {
                        self.send(process, instance, &info, Self::delay(&mut rng))
                            .await;
                    }
                }
                // A client bug: a recent key with another body.
                75..=79 => {
                    let route = if rng.bool() {
                        Route::Hold
                    } else {
                        Route::Webhook
                    };
                    if let Some(info) = self.recent_key(&mut rng, Some(route)) {
                        self.request(process, instance, &info, info.mutant.clone(), 0, false)
                            .await;
                    }
                }
                // A same-key storm on a new key, or on a recent one.
                _ => {
                    let info = if roll < 92 {
                        match rng.u32(..5) {
                            0 => self.new_key(Route::Hold),
                            1 => self.new_key(Route::Release),
                            2 => self.new_key(Route::Webhook),
                            3 => self.new_key(Route::Wait),
                            _ => self.new_inquiring_key(&mut rng),
                        }
                    } else {
                        match self.recent_key(&mut rng, None) {
                            Some(info) => info,
                            None => continue,
                        }
                    };
                    let size = [2, 4, 8, 16, 32, 64]
                        .into_iter()
                        .filter(|&n| n <= self.max_storm)
                        .collect::<Vec<_>>();
                    let n = size[rng.usize(..size.len())];
                    let delay = rng.u64(50..300);
                    let storm = (0..n).map(|_| {
                        let instance = rng.usize(..self.gateways.len());
                        let (this, info) = (&self, &info);
                        async move { this.send(process, instance, info, delay).await }
                    });
                    futures_util::future::join_all(storm).await;
                }
            }
        }
    }
}
