//! A Redis claim that reaches the server after its caller gave up writes
//! nothing. Redis cannot cancel a script it has been sent: one queued
//! behind other scripts' `WAIT`s on its connection, or sent to a paused
//! server, runs whenever the server reaches it. Had it created its record
//! after the lost-claims worker stopped looking, the key would stay in
//! flight, then `held`, without ever being forwarded (the chaos failover
//! run found this). The claim carries the instant it must run by
//! (`transitions::claim_write_limit`).

use std::sync::Arc;
use std::time::Duration;

use idemgate::config::{StoreConfig, UnknownOutcome};
use idemgate::store::{Backend, Claim, ClaimRequest, RecordKey, StoreError, transitions};

use crate::support::servers::{PrivateRedis, try_redis_cli};
use crate::support::{Backend as TestBackend, TestStore};

const TIMEOUT: Duration = Duration::from_millis(200);
const LEASE: Duration = Duration::from_secs(1);

fn key(k: &str) -> RecordKey {
    RecordKey {
        route: "r".into(),
        scope: Vec::new(),
        key: k.into(),
    }
}

async fn claim(s: Arc<dyn Backend>, k: &'static str) -> Result<Claim, StoreError> {
    s.claim(&ClaimRequest {
        key: &key(k),
        fingerprint: &[1; 32],
        attempt: idemgate::store::new_attempt_id(),
        lease: LEASE,
        retention: Duration::from_secs(3600),
        on_unknown_outcome: UnknownOutcome::Hold,
        inquire_after: Duration::ZERO,
    })
    .await
}

/// The server stopped (SIGSTOP) while a claim is sent, and resumed after
/// the claim's limit: the claim's caller got a store error, and the
/// record never appears. The same claim resumed within its limit does
/// write (the control: the pause itself does not lose the script).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_server_reaches_after_its_limit_writes_nothing() {
    let redis = PrivateRedis::start();
    // The test suite's Redis settings, on the private server, with one
    // connection: each claim below goes out on the one the warm-up opened
    // (a claim on a lane still to be opened would wait in its handshake
    // and never be sent).
    let shared = TestStore::new(TestBackend::Redis).await;
    let s = idemgate::store::open(&StoreConfig {
        url: redis.url(),
        timeout: TIMEOUT,
        pool_size: 1,
        ..shared.store_config()
    })
    .await
    .unwrap();
    let limit = transitions::claim_write_limit(LEASE, TIMEOUT);
    let window = transitions::lost_claim_window(LEASE, TIMEOUT);

    for (k, warm, paused, writes) in [
        ("within", "warm-within", limit / 3, true),
        (
            "past",
            "warm-past",
            limit + Duration::from_millis(300),
            false,
        ),
    ] {
        // A connection opened and used first (the timeout before closed
        // the last one): the claim below is written to it at once, and
        // waits in the stopped server's socket.
        let warmed = claim(s.clone(), warm).await;
        assert!(matches!(warmed, Ok(Claim::Claimed { .. })), "{warmed:?}");
        let scripts_before = scripts_run(&redis);
        redis.signal("-STOP");
        let sent = claim(s.clone(), k).await;
        assert!(
            matches!(sent, Err(StoreError::Unavailable(_))),
            "{k}: the caller gives up after [store] timeout: {sent:?}"
        );
        tokio::time::sleep(paused.saturating_sub(TIMEOUT)).await;
        redis.signal("-CONT");
        // Long enough for the script to have run; still inside the window
        // the lost-claims worker would watch for "past".
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            scripts_run(&redis) > scripts_before,
            "{k}: the claim never reached the server, so this proves nothing"
        );
        let found = eventually_inspect(&s, k).await;
        assert_eq!(
            found,
            writes,
            "{k} (paused {paused:?}, limit {limit:?}, worker's window {window:?}): the record {}",
            if writes {
                "of a claim resumed within its limit is missing"
            } else {
                "appeared after its caller gave up, past the claim's limit"
            }
        );
    }
}

/// Scripts the server has run so far (`INFO commandstats`: EVALSHA and
/// EVAL calls).
pub(crate) fn scripts_run(redis: &PrivateRedis) -> u64 {
    let stats = try_redis_cli(redis.port(), &["INFO", "commandstats"]).expect("INFO answers");
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Whether `k` has a record, asked until the store answers.
async fn eventually_inspect(s: &Arc<dyn Backend>, k: &str) -> bool {
    for _ in 0..50 {
        if let Ok(found) = s.inspect(&key(k)).await {
            return found.is_some();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the store never answered after SIGCONT");
}
