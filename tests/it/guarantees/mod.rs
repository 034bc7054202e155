//! The guarantees of docs/src/guide/guarantees.md, a module each, named for
//! it: G1 `g1_one_at_a_time`, G2 `g2_replay`, G3 `g3_mismatch`, G4
//! `g4_in_flight`, G5 `g5_durable_before_sent`, G6 `g6_disconnects`, G7
//! `g7_leases_and_fencing`, G8 `g8_store_outages`. Run one with a filter,
//! e.g. `cargo test --test it guarantees::g4`. The chaos harness (`chaos/`)
//! checks them all at once under faults; the store contract they rest on is
//! in `stores/conformance.rs`.
//!
//! What the modules share, below: gateway processes on one fresh PostgreSQL
//! database (killed with SIGKILL or stopped with SIGTERM mid-forward), and a
//! frozen store thawed after a while.

mod g1_one_at_a_time;
mod g2_replay;
mod g3_mismatch;
mod g4_in_flight;
mod g5_durable_before_sent;
mod g6_disconnects;
mod g7_leases_and_fencing;
mod g8_store_outages;

use std::time::Duration;

use http::StatusCode;

use crate::support::process::READY_LIMIT;
use crate::support::{
    HttpClient, Reply, Set, TestConfig, TestDb, Upstream, eventually, post, record_state,
};

/// Config for gateway processes on `db`, with these `lease` and
/// `upstream_timeout` on the route. The store timeout is raised from the
/// harness's 1 s: the machine is small and shared, and a slow store answer
/// is not what these tests are about.
pub(crate) fn process_config(
    db: &TestDb,
    upstream: &Upstream,
    lease: &str,
    timeout: &str,
) -> TestConfig {
    TestConfig::new(&db.url, &upstream.url())
        .store(|s| {
            s.set("timeout", "5s");
        })
        .route(|r| {
            r.set("lease", lease).set("upstream_timeout", timeout);
        })
}

/// Wait until the upstream has received `n` requests carrying `key`.
pub(crate) async fn upstream_saw(upstream: &Upstream, key: &str, n: u64) {
    let seen = eventually(READY_LIMIT, || async move {
        (upstream.count(key) >= n).then_some(())
    })
    .await;
    assert!(
        seen.is_some(),
        "the upstream never received request #{n} with key {key} (count {})",
        upstream.count(key)
    );
}

/// The Retry-After of a reply, in seconds (it must be present and numeric).
fn retry_after(reply: &Reply) -> u64 {
    reply
        .header("retry-after")
        .unwrap_or_else(|| panic!("no Retry-After: {reply:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After is not delay-seconds: {reply:?}"))
}

/// POST until the answer is not a 409 (every answer before must be a proper
/// in-flight 409), for at most `limit`; returns the first other answer.
async fn post_until_not_409(
    http: &HttpClient,
    url: &str,
    key: &str,
    body: &str,
    limit: Duration,
) -> Reply {
    let reply = eventually(limit, || async move {
        let reply = post(http, url, key, body).await;
        if reply.status == StatusCode::CONFLICT {
            assert_eq!(reply.problem_type(), "urn:idemgate:problem:in-flight");
            retry_after(&reply);
            None
        } else {
            Some(reply)
        }
    })
    .await;
    reply.unwrap_or_else(|| panic!("key {key} was still in flight after {limit:?}"))
}

async fn db_state(db: &TestDb, key: &str) -> Option<String> {
    record_state(&db.url, key).await
}

async fn thaw_after(wait: Duration, thaw: &impl Fn()) {
    tokio::time::sleep(wait).await;
    thaw();
}
