//! What the nemesis breaks: two real idemgate processes sharing one store
//! (a private PostgreSQL cluster or a private, durable Redis), each of which
//! can be killed and restarted while clients keep sending.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use http::StatusCode;
use toml::{Table, Value};

use crate::support::http::get_status;
use crate::support::process::GatewayProcess;
use crate::support::servers::{PgCluster, PrivateRedis, kill};
use crate::support::store::Backend;
use crate::support::{Set, TestConfig, client, eventually};

/// A private store the nemesis may stop, freeze and restart.
pub enum ChaosStore {
    Postgres(PgCluster),
    Redis(PrivateRedis),
}

impl ChaosStore {
    /// A private store of `kind`. Redis is durable (the README's
    /// recommended settings: a restart loses nothing that was
    /// acknowledged) unless `durable` is false, for the negative control.
    pub async fn start(kind: Backend, durable: bool) -> Self {
        match kind {
            Backend::Postgres => ChaosStore::Postgres(PgCluster::new().await),
            Backend::Redis if durable => ChaosStore::Redis(PrivateRedis::start_durable()),
            Backend::Redis => ChaosStore::Redis(PrivateRedis::start()),
            Backend::Memory => unreachable!("gateway processes cannot share memory://"),
        }
    }

    pub fn url(&self) -> String {
        match self {
            ChaosStore::Postgres(pg) => pg.url(),
            ChaosStore::Redis(redis) => redis.url(),
        }
    }

    /// Where the store listens.
    pub fn addr(&self) -> SocketAddr {
        let url = url::Url::parse(&self.url()).expect("a store URL");
        let host = url.host_str().expect("a host");
        format!("{host}:{}", url.port().expect("a port"))
            .parse()
            .expect("an IP address")
    }

    /// The store's URL, reached through `proxy` (a [`super::proxy::FaultProxy`]).
    pub fn url_through(&self, proxy: SocketAddr) -> String {
        self.url()
            .replacen(&self.addr().to_string(), &proxy.to_string(), 1)
    }
}

/// The gateway's configuration for a chaos run: two routes to the same
/// upstream (through the fault proxy), one per `on_unknown_outcome`.
pub fn gateway_config(store_url: &str, upstream: &str, lease: Duration) -> TestConfig {
    TestConfig::new(store_url, upstream)
        .top(|t| {
            t.set("header_read_timeout", "5s")
                .set("shutdown_timeout", "5s");
        })
        .store(|s| {
            s.set("pool_size", 8)
                .set("timeout", "1s")
                .set("prefix", "chaos:")
                .set("sweep_interval", "1h");
        })
        .defaults(|d| {
            d.set("lease", format!("{}ms", lease.as_millis()))
                .set("upstream_timeout", "1s")
                .set("retention", "1h");
        })
        .routes(|routes| {
            *routes = ["hold", "release"]
                .into_iter()
                .map(|policy| {
                    let mut route = Table::new();
                    route
                        .set("name", policy)
                        .set("match", format!("/{policy}/*"))
                        .set("upstream", upstream)
                        .set("on_unknown_outcome", policy);
                    Value::Table(route)
                })
                .collect();
        })
}

/// Gateway processes sharing one store. Clients look up an instance's
/// current proxy port for every request; a restarted instance gets new
/// ports.
pub struct Gateways {
    config: TestConfig,
    ports: Vec<AtomicU16>,
    processes: Vec<tokio::sync::Mutex<Option<GatewayProcess>>>,
}

impl Gateways {
    pub async fn start(config: TestConfig, count: usize) -> Self {
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

    /// Send a signal (`-STOP`, `-CONT`) to a running instance.
    pub async fn signal(&self, instance: usize, signal: &str) {
        if let Some(process) = self.processes[instance].lock().await.as_ref() {
            kill(signal, &process.pid().to_string());
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

    /// Stop every instance gracefully (SIGTERM: its forwards settle first)
    /// and start it again, so that what follows is answered from the store,
    /// not from an instance's replay cache.
    pub async fn restart_all(&self) {
        for instance in 0..self.len() {
            let stopped = self.processes[instance].lock().await.take();
            if let Some(mut process) = stopped {
                process.terminate();
                let _ = process.wait(Duration::from_secs(15)).await;
            }
            self.restart(instance).await;
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
