//! What the nemesis breaks: two real idemgate processes sharing one store
//! (a private PostgreSQL cluster or a private, durable Redis), each of which
//! can be killed and restarted while clients keep sending.

use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use http::StatusCode;

use crate::common::process::{GatewayProcess, PgCluster, PrivateRedis, get_status};
use crate::common::{client, eventually};

/// The store under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Postgres,
    Redis,
}

impl StoreKind {
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Postgres => "postgres",
            StoreKind::Redis => "redis",
        }
    }
}

/// A private store the nemesis may stop, freeze and restart.
pub enum ChaosStore {
    Postgres(PgCluster),
    Redis(PrivateRedis),
}

impl ChaosStore {
    pub async fn start(kind: StoreKind) -> Self {
        match kind {
            StoreKind::Postgres => ChaosStore::Postgres(PgCluster::new().await),
            // The README's recommended settings: a restart loses nothing
            // that was acknowledged.
            StoreKind::Redis => ChaosStore::Redis(PrivateRedis::start_durable()),
        }
    }

    pub fn url(&self) -> String {
        match self {
            ChaosStore::Postgres(pg) => pg.url(),
            ChaosStore::Redis(redis) => redis.url(),
        }
    }
}

/// The gateway's configuration for a chaos run: two routes to the same
/// upstream (through the fault proxy), one per `on_unknown_outcome`.
pub fn gateway_config(store_url: &str, upstream: &str, lease: Duration) -> String {
    let lease = lease.as_millis();
    format!(
        r#"header_read_timeout = "5s"
shutdown_timeout = "5s"

[store]
url = "{store_url}"
pool_size = 8
timeout = "1s"
prefix = "chaos:"
sweep_interval = "1h"

[defaults]
lease = "{lease}ms"
upstream_timeout = "1s"
retention = "1h"

[[routes]]
name = "hold"
match = "/hold/*"
upstream = "{upstream}"
on_unknown_outcome = "hold"

[[routes]]
name = "release"
match = "/release/*"
upstream = "{upstream}"
on_unknown_outcome = "release"
"#
    )
}

/// Gateway processes sharing one store. Clients look up an instance's
/// current proxy port for every request; a restarted instance gets new
/// ports.
pub struct Gateways {
    config: String,
    ports: Vec<AtomicU16>,
    processes: Vec<tokio::sync::Mutex<Option<GatewayProcess>>>,
}

impl Gateways {
    pub async fn start(config: String, count: usize) -> Self {
        let mut ports = Vec::new();
        let mut processes = Vec::new();
        for i in 0..count {
            let process = GatewayProcess::start(&format!("chaos-{i}"), &config).await;
            ports.push(AtomicU16::new(process.port));
            processes.push(tokio::sync::Mutex::new(Some(process)));
        }
        Self {
            config,
            ports,
            processes,
        }
    }

    pub fn len(&self) -> usize {
        self.ports.len()
    }

    /// The instance's proxy port (stale while it is down: connections are
    /// refused).
    pub fn port(&self, instance: usize) -> u16 {
        self.ports[instance].load(Ordering::SeqCst)
    }

    /// SIGKILL one instance.
    pub async fn kill(&self, instance: usize) {
        if let Some(mut process) = self.processes[instance].lock().await.take() {
            process.kill9();
        }
    }

    /// Start a killed instance again (on new ports) and wait until it is
    /// live.
    pub async fn restart(&self, instance: usize) {
        let mut slot = self.processes[instance].lock().await;
        if slot.is_none() {
            let process = GatewayProcess::start(&format!("chaos-{instance}"), &self.config).await;
            self.ports[instance].store(process.port, Ordering::SeqCst);
            *slot = Some(process);
        }
    }

    /// Wait until every instance answers `/readyz` 200 (its store is back).
    pub async fn ready(&self, limit: Duration) -> bool {
        let http = client();
        for slot in &self.processes {
            let url = match slot.lock().await.as_ref() {
                Some(process) => process.admin_url("/readyz"),
                None => return false,
            };
            let ready = eventually(limit, || async {
                (get_status(&http, &url).await == Some(StatusCode::OK)).then_some(())
            })
            .await;
            if ready.is_none() {
                return false;
            }
        }
        true
    }

    /// Every instance's stderr, for a failure report.
    pub async fn logs(&self) -> String {
        let mut out = String::new();
        for (i, slot) in self.processes.iter().enumerate() {
            if let Some(process) = slot.lock().await.as_ref() {
                let stderr = process.stderr();
                let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
                out.push_str(&format!("--- gateway {i} (last lines) ---\n"));
                for line in tail.into_iter().rev() {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }
}
