//! The real `idemgate` binary as a child process ([`GatewayProcess`]), for
//! tests that kill it, stop it with SIGTERM, read its logs or run its
//! one-shot subcommands ([`run_command`]).
//!
//! Every child is killed when its guard is dropped, panics included.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use http::StatusCode;

use super::http::get_status;
use super::{TestConfig, client, eventually, serial};

/// How long a child process gets to become ready. The machine is small and
/// shared with other builds and tests: be generous.
pub const READY_LIMIT: Duration = Duration::from_secs(45);

/// A free TCP port on 127.0.0.1 (bound, read, released). Another process may
/// take it before we use it; callers retry on a bind failure.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .unwrap()
        .port()
}

/// The path of the built `idemgate` binary.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_idemgate"))
}

/// The real `idemgate` binary as a child process, with its config file and
/// its stderr captured to files in a temporary directory. Dropping it kills
/// the process.
pub struct GatewayProcess {
    child: Option<Child>,
    /// The proxy port.
    pub port: u16,
    /// The admin port (`/healthz`, `/readyz`).
    pub admin_port: u16,
    /// How the process ended, once it has.
    status: Option<ExitStatus>,
    dir: tempfile::TempDir,
    name: String,
    _turn: serial::Shared,
}

impl GatewayProcess {
    /// Spawn `idemgate serve --config FILE` for `config` on free ports,
    /// without waiting for it.
    pub fn spawn(name: &str, config: &TestConfig) -> Self {
        Self::spawn_command(name, "serve", config)
    }

    /// Spawn `idemgate SUBCOMMAND --config FILE` (free ports filled in).
    pub fn spawn_command(name: &str, subcommand: &str, config: &TestConfig) -> Self {
        Self::spawn_with_env(name, subcommand, config, &[])
    }

    /// [`GatewayProcess::spawn_command`] with extra environment variables
    /// (`FAILPOINTS`, for the chaos harness's kill windows).
    pub fn spawn_with_env(
        name: &str,
        subcommand: &str,
        config: &TestConfig,
        env: &[(&str, &str)],
    ) -> Self {
        let turn = serial::shared();
        let (port, admin_port) = (free_port(), free_port());
        let dir = tempfile::Builder::new()
            .prefix(&format!("idemgate-{name}-"))
            .tempdir()
            .unwrap();
        let config_path = dir.path().join("gateway.toml");
        std::fs::write(
            &config_path,
            config.clone().with_ports(port, admin_port).to_string(),
        )
        .unwrap();
        let stderr = File::create(dir.path().join("stderr.log")).unwrap();
        let stdout = File::create(dir.path().join("stdout.log")).unwrap();
        let child = Command::new(binary())
            .arg(subcommand)
            .arg("--config")
            .arg(&config_path)
            .env_remove("IDEMGATE_CONFIG")
            .env_remove("IDEMGATE_LOG_FORMAT")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("FAILPOINTS")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("the idemgate binary starts");
        Self {
            child: Some(child),
            port,
            admin_port,
            status: None,
            dir,
            name: name.to_string(),
            _turn: turn,
        }
    }

    /// Spawn `idemgate serve` and wait until its admin listener answers
    /// `/healthz` (the proxy listener is bound before it). Retries with other
    /// ports if a port was taken in the meantime.
    pub async fn start(name: &str, config: &TestConfig) -> Self {
        Self::start_with_env(name, config, &[]).await
    }

    /// [`GatewayProcess::start`] with extra environment variables.
    pub async fn start_with_env(name: &str, config: &TestConfig, env: &[(&str, &str)]) -> Self {
        Self::try_start_with_env(name, config, env)
            .await
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`GatewayProcess::start_with_env`], returning why it did not start
    /// (an unreachable store, say) instead of panicking.
    pub async fn try_start_with_env(
        name: &str,
        config: &TestConfig,
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        let mut last_error = String::new();
        for _ in 0..3 {
            let mut gateway = Self::spawn_with_env(name, "serve", config, env);
            match gateway.wait_ready(READY_LIMIT).await {
                Ok(()) => return Ok(gateway),
                Err(error) => {
                    let stderr = gateway.stderr();
                    if stderr.contains("cannot listen") || stderr.contains("Address in use") {
                        last_error = format!("{error}\n{stderr}");
                        continue; // a port race: try other ports
                    }
                    return Err(format!(
                        "gateway {name} did not become ready: {error}\n--- stderr ---\n{stderr}"
                    ));
                }
            }
        }
        Err(format!(
            "gateway {name} could not bind free ports: {last_error}"
        ))
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let http = client();
        let url = format!("http://127.0.0.1:{}/healthz", self.admin_port);
        let ready = eventually(limit, || {
            let http = http.clone();
            let url = url.clone();
            let exited = self.try_status().is_some();
            async move {
                if exited {
                    return Some(false);
                }
                let status = get_status(&http, &url).await;
                (status == Some(StatusCode::OK)).then_some(true)
            }
        })
        .await;
        match ready {
            Some(true) => Ok(()),
            Some(false) => Err(format!("it exited early ({:?})", self.status)),
            None => Err(format!("/healthz did not answer 200 within {limit:?}")),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("process not yet reaped").id()
    }

    /// A URL on the proxy port.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// A URL on the admin port.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.admin_port, path)
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // std's Child::kill sends SIGKILL on Unix.
            let _ = child.kill();
            self.status = child.wait().ok();
        }
    }

    /// Replace its config file with `config` (its ports kept); nothing is
    /// reloaded until [`GatewayProcess::hangup`].
    pub fn rewrite(&self, config: &TestConfig) {
        let text = config
            .clone()
            .with_ports(self.port, self.admin_port)
            .to_string();
        let aside = self.dir.path().join("gateway.toml.next");
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, self.dir.path().join("gateway.toml")).unwrap();
    }

    /// SIGHUP; does not wait.
    pub fn hangup(&self) {
        self.signal("-HUP");
    }

    /// SIGTERM (graceful shutdown); does not wait.
    pub fn terminate(&mut self) {
        self.signal("-TERM");
    }

    /// SIGSTOP: the process stalls (no lease renewal, no inquirer) until
    /// [`Self::resume`].
    pub fn stall(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT: a stalled process goes on where it stopped.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// `kill SIGNAL pid`.
    fn signal(&self, signal: &str) {
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill(1) runs");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// The exit status if the process has ended (reaping it), else `None`.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none()
            && let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            self.status = Some(status);
            self.child = None;
        }
        self.status
    }

    /// How the process ended, if it has and was reaped.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.status
    }

    /// Wait (polling, never blocking the runtime) up to `limit` for the
    /// process to exit; `None` if it is still running.
    pub async fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.try_status() {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Wait (polling, up to 30 s) until its stderr satisfies `done`, and
    /// return it; panics with the stderr, saying `what` was awaited.
    pub async fn stderr_until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let found = eventually(Duration::from_secs(30), || {
            let stderr = self.stderr();
            let found = done(&stderr).then_some(stderr);
            async move { found }
        })
        .await;
        found.unwrap_or_else(|| panic!("{what} never logged\n{}", self.stderr()))
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    /// Everything the process wrote to stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout.log")).unwrap_or_default()
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "--- gateway {} (port {}) stderr ---\n{}",
                self.name,
                self.port,
                self.stderr()
            );
        }
    }
}

/// `idemgate serve` with `config`, which must refuse to start: it exits
/// non-zero within 60 s. Its stderr.
pub async fn refuses_to_start(name: &str, config: &TestConfig) -> String {
    let mut process = GatewayProcess::spawn(name, config);
    let status = process
        .wait(Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("gateway {name} still running\n{}", process.stderr()));
    assert!(!status.success(), "gateway {name} exited with {status}");
    process.stderr()
}

/// Run a one-shot `idemgate SUBCOMMAND --config FILE` to completion, killing
/// it if it runs longer than `limit`. Returns (status, stdout, stderr).
pub async fn run_command(
    subcommand: &str,
    config: &TestConfig,
    limit: Duration,
) -> (ExitStatus, String, String) {
    let mut process = GatewayProcess::spawn_command(subcommand, subcommand, config);
    let status = process.wait(limit).await;
    let (stdout, stderr) = (process.stdout(), process.stderr());
    let status = status.unwrap_or_else(|| {
        panic!("idemgate {subcommand} still running after {limit:?}\n--- stderr ---\n{stderr}")
    });
    (status, stdout, stderr)
}
