//! Load for the store failover tests: workers sending new keys one at a
//! time while a test kills and promotes store servers, and what the
//! failover kept and lost once the load stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::StatusCode;
use tokio::task::JoinHandle;

use super::http::try_post;
use super::{Upstream, client, not_replayed};

/// The body of every key the load sends.
pub const BODY: &str = r#"{"amount":1}"#;

/// What a failover under load kept and lost.
#[derive(Debug)]
pub struct Failover {
    /// Keys answered `201` (not a replay) while the load ran.
    pub acknowledged: Vec<String>,
    /// Of those, the ones that did not replay afterwards or reached the
    /// upstream twice.
    pub lost: Vec<String>,
    /// Answered `502 lease-lost`: their claim was lost in the failover.
    pub superseded: usize,
    /// From the kill to the replica's promotion.
    pub promoted_in: Duration,
    /// From the kill to new keys served again.
    pub recovered_in: Duration,
}

impl Failover {
    /// What the failover kept and lost, for the test's output.
    pub fn report(&self, setup: &str) {
        eprintln!(
            "{setup}: {} keys acknowledged, {} lost (first: {:?}), {} claims lost (502); \
             promoted {:?} and new keys served {:?} after the kill",
            self.acknowledged.len(),
            self.lost.len(),
            &self.lost[..self.lost.len().min(5)],
            self.superseded,
            self.promoted_in,
            self.recovered_in
        );
    }

    /// Fail unless the failover acknowledged a fair number of keys (so the
    /// test cannot pass on an idle run), lost none and lost no claim.
    pub fn assert_kept_everything(&self) {
        assert!(self.acknowledged.len() >= 10, "{self:?}");
        assert!(self.lost.is_empty(), "{self:?}");
        assert_eq!(self.superseded, 0, "a claim was lost: {self:?}");
    }
}

/// Workers sending new keys (`load-W-N`) through one URL until stopped.
pub struct Load {
    url: String,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<(Vec<String>, usize)>>,
}

impl Load {
    /// Start `workers` of them on `url`.
    pub fn start(url: &str, workers: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..workers)
            .map(|w| tokio::spawn(worker(url.to_string(), w, stop.clone())))
            .collect();
        Self {
            url: url.to_string(),
            stop,
            workers,
        }
    }

    /// Stop the workers, then retry every key they saw acknowledged: what
    /// was kept and lost. `promoted_in` and `recovered_in` are the test's.
    pub async fn finish(
        self,
        upstream: &Upstream,
        promoted_in: Duration,
        recovered_in: Duration,
    ) -> Failover {
        self.stop.store(true, Ordering::Relaxed);
        let (mut acknowledged, mut superseded) = (Vec::new(), 0);
        for worker in self.workers {
            let (acked, lost_claims) = worker.await.expect("the load ran");
            acknowledged.extend(acked);
            superseded += lost_claims;
        }
        let lost = not_replayed(&client(), &self.url, upstream, &acknowledged, BODY).await;
        Failover {
            acknowledged,
            lost,
            superseded,
            promoted_in,
            recovered_in,
        }
    }
}

/// Send new keys, one at a time, until `stop`: the acknowledged ones, and
/// how many were answered `502 lease-lost` (forwarded under a claim the
/// new primary never had, so their record could not be written).
async fn worker(url: String, worker: usize, stop: Arc<AtomicBool>) -> (Vec<String>, usize) {
    let http = client();
    let mut acknowledged = Vec::new();
    let mut superseded = 0;
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("load-{worker}-{i}");
        i += 1;
        match try_post(&http, &url, &key, BODY).await {
            Ok(reply) if reply.status == StatusCode::CREATED && !reply.is_replay() => {
                acknowledged.push(key);
            }
            Ok(reply) if reply.status == StatusCode::SERVICE_UNAVAILABLE => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(reply) if reply.is_replay() => {}
            Ok(reply) if reply.problem_type() == "urn:idemgate:problem:lease-lost" => {
                superseded += 1;
            }
            Ok(reply) => panic!("{key}: unexpected answer during the failover: {reply:?}"),
            Err(e) => panic!("{key}: {e}"),
        }
    }
    (acknowledged, superseded)
}
