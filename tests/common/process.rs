//! Test support for tests that run the idemgate binary as a child process
//! ([`GatewayProcess`]) and stop or restart PostgreSQL ([`PgCluster`]).
//!
//! Every child is killed when its guard is dropped, panics included.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use super::{HttpClient, Reply, binary, client, eventually};

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

/// `config` with its top-level `listen` and `admin_listen` set to these
/// ports (replaced where present, added at the top otherwise).
pub fn with_ports(config: &str, port: u16, admin_port: u16) -> String {
    let mut out =
        format!("listen = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\n");
    // Only top-level keys: stop rewriting at the first table header.
    let mut top_level = true;
    for line in config.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            top_level = false;
        }
        let key = trimmed.split('=').next().unwrap_or("").trim();
        if top_level && (key == "listen" || key == "admin_listen") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
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
}

impl GatewayProcess {
    /// Spawn `idemgate serve --config FILE` for `config` on free ports,
    /// without waiting for it.
    pub fn spawn(name: &str, config: &str) -> Self {
        Self::spawn_command(name, "serve", config)
    }

    /// Spawn `idemgate SUBCOMMAND --config FILE` (free ports filled in).
    pub fn spawn_command(name: &str, subcommand: &str, config: &str) -> Self {
        let (port, admin_port) = (free_port(), free_port());
        let dir = tempfile::Builder::new()
            .prefix(&format!("idemgate-{name}-"))
            .tempdir()
            .unwrap();
        let config_path = dir.path().join("gateway.toml");
        std::fs::write(&config_path, with_ports(config, port, admin_port)).unwrap();
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
        }
    }

    /// Spawn `idemgate serve` and wait until its admin listener answers
    /// `/healthz` (the proxy listener is bound before it). Retries with other
    /// ports if a port was taken in the meantime.
    pub async fn start(name: &str, config: &str) -> Self {
        let mut last_error = String::new();
        for _ in 0..3 {
            let mut gateway = Self::spawn(name, config);
            match gateway.wait_ready(READY_LIMIT).await {
                Ok(()) => return gateway,
                Err(error) => {
                    let stderr = gateway.stderr();
                    if stderr.contains("cannot listen") || stderr.contains("Address in use") {
                        last_error = format!("{error}\n{stderr}");
                        continue; // a port race: try other ports
                    }
                    panic!(
                        "gateway {name} did not become ready: {error}\n--- stderr ---\n{stderr}"
                    );
                }
            }
        }
        panic!("gateway {name} could not bind free ports: {last_error}");
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

    /// SIGTERM (graceful shutdown); does not wait.
    pub fn terminate(&mut self) {
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill(1) runs");
        assert!(status.success(), "kill -TERM {pid} failed");
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

/// GET `url`; the status, or `None` if nothing answered.
pub async fn get_status(http: &HttpClient, url: &str) -> Option<StatusCode> {
    let request = Request::get(url).body(Full::new(Bytes::new())).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), http.request(request))
        .await
        .ok()?
        .ok()?;
    Some(response.status())
}

/// POST with an `Idempotency-Key`, like [`super::post`], but an error
/// instead of a panic when the gateway never answers (it was killed).
pub async fn try_post(
    http: &HttpClient,
    url: &str,
    key: &str,
    body: &str,
) -> Result<Reply, String> {
    use http_body_util::BodyExt;
    let request = Request::post(url)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = http.request(request).await.map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// Run a one-shot `idemgate SUBCOMMAND --config FILE` to completion, killing
/// it if it runs longer than `limit`. Returns (status, stdout, stderr).
pub async fn run_command(
    subcommand: &str,
    config: &str,
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

// ---------------------------------------------------------------------------
// A private PostgreSQL cluster.

/// A throwaway PostgreSQL cluster of its own (initdb in a temporary
/// directory, its own port), so tests can stop and restart PostgreSQL without
/// touching the shared server other tests use. Dropping it stops it
/// (immediately) and removes its files.
pub struct PgCluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    as_root: bool,
    running: bool,
}

impl PgCluster {
    /// initdb a new cluster and start it on a free port.
    pub async fn new() -> Self {
        let bin = postgres_bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("idemgate-pg-")
            .tempdir()
            .unwrap();
        let as_root = is_root();
        let mut cluster = Self {
            bin,
            dir,
            port: 0,
            as_root,
            running: false,
        };
        if as_root {
            // initdb refuses to run as root: the postgres user owns the cluster.
            let mut chown = Command::new("chown");
            chown
                .arg("-R")
                .arg("postgres:postgres")
                .arg(cluster.dir.path());
            let out = run(chown).await;
            assert!(out.status.success(), "chown failed: {}", text(&out));
        }
        let out = run(cluster.command(&[
            cluster.tool("initdb"),
            "-D".into(),
            cluster.path(&cluster.data_dir()),
            "-A".into(),
            "trust".into(),
            "-U".into(),
            "postgres".into(),
            "--no-sync".into(),
            "--no-instructions".into(),
        ]))
        .await;
        assert!(out.status.success(), "initdb failed: {}", text(&out));
        let mut last = String::new();
        for _ in 0..3 {
            cluster.port = free_port();
            match cluster.try_start().await {
                Ok(()) => return cluster,
                Err(error) => last = error, // most likely a port race: another port
            }
        }
        panic!("the private PostgreSQL cluster did not start: {last}");
    }

    fn tool(&self, name: &str) -> String {
        self.path(&self.bin.join(name))
    }

    fn path(&self, path: &Path) -> String {
        path.to_str().expect("UTF-8 path").to_string()
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    /// A command line run as the cluster's owner (`runuser`, else `su`, when
    /// we are root).
    fn command(&self, args: &[String]) -> Command {
        let mut command = if !self.as_root {
            let mut c = Command::new(&args[0]);
            c.args(&args[1..]);
            c
        } else if which("runuser") {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).args(args);
            c
        } else {
            let line = args
                .iter()
                .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
                .collect::<Vec<_>>()
                .join(" ");
            let mut c = Command::new("su");
            c.args(["postgres", "-c", &line]);
            c
        };
        // The postgres user may not be allowed into the test's directory.
        command.current_dir(self.dir.path()).stdin(Stdio::null());
        command
    }

    async fn try_start(&mut self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let out = run(self.command(&[
            self.tool("pg_ctl"),
            "-D".into(),
            self.path(&self.data_dir()),
            "-l".into(),
            self.path(&self.log_file()),
            "-o".into(),
            options,
            "-w".into(),
            "-t".into(),
            "60".into(),
            "start".into(),
        ]))
        .await;
        if out.status.success() {
            self.running = true;
            Ok(())
        } else {
            Err(format!("{}\n--- log ---\n{}", text(&out), self.log()))
        }
    }

    /// Start the stopped cluster again, on the same port.
    pub async fn start(&mut self) {
        if let Err(error) = self.try_start().await {
            panic!("the private PostgreSQL cluster did not restart: {error}");
        }
    }

    /// `pg_ctl stop -m immediate`: every backend dies at once, no checkpoint.
    pub async fn stop_immediate(&mut self) {
        let out = run(self.stop_command()).await;
        assert!(out.status.success(), "pg_ctl stop failed: {}", text(&out));
        self.running = false;
    }

    fn stop_command(&self) -> Command {
        self.command(&[
            self.tool("pg_ctl"),
            "-D".into(),
            self.path(&self.data_dir()),
            "-m".into(),
            "immediate".into(),
            "-w".into(),
            "stop".into(),
        ])
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection URL for its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.running {
            let _ = self
                .stop_command()
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if std::thread::panicking() {
            eprintln!("--- private PostgreSQL log ---\n{}", self.log());
        }
        // The TempDir removes the files (root may remove the postgres user's).
    }
}

async fn run(command: Command) -> Output {
    tokio::process::Command::from(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .expect("the command runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
        || Path::new("/usr/sbin").join(program).is_file()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The newest PostgreSQL installation's `bin` directory under
/// /usr/lib/postgresql (`IDEMGATE_TEST_PG_BIN` overrides it).
pub fn postgres_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("IDEMGATE_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("PostgreSQL server binaries are not installed at {root:?}: {e}"))
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .unwrap_or_else(|| panic!("no PostgreSQL with initdb under {root:?}"))
}

// ---------------------------------------------------------------------------
// A private Redis server.

/// A private `redis-server` child process on a free loopback port, so tests
/// can stop, freeze and restart Redis without touching the shared server.
/// Dropping it kills it (after a SIGCONT, in case it was frozen).
pub struct PrivateRedis {
    port: u16,
    child: Option<Child>,
    /// With an append-only file fsynced on every write (the README's
    /// recommended durability), kept in this directory across restarts.
    durable: Option<tempfile::TempDir>,
}

impl PrivateRedis {
    /// Without persistence: a restart loses everything.
    pub fn start() -> Self {
        Self::launch(None)
    }

    /// With `appendonly yes` and `appendfsync always`: a restart, even after
    /// SIGKILL, keeps every acknowledged write.
    pub fn start_durable() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("idemgate-redis-")
            .tempdir()
            .unwrap();
        Self::launch(Some(dir))
    }

    fn launch(durable: Option<tempfile::TempDir>) -> Self {
        let mut redis = Self {
            port: free_port(),
            child: None,
            durable,
        };
        redis.restart();
        redis
    }

    /// Start the (stopped or killed) server again on the same port.
    pub fn restart(&mut self) {
        let port = self.port.to_string();
        let mut command = Command::new("redis-server");
        command.args(["--port", &port, "--bind", "127.0.0.1", "--save", ""]);
        match &self.durable {
            Some(dir) => {
                command.args(["--appendonly", "yes", "--appendfsync", "always", "--dir"]);
                command.arg(dir.path());
            }
            None => {
                command.args(["--appendonly", "no"]);
            }
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (.ci/run installs it)");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "private redis did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Send a signal (`-STOP`, `-CONT`, …) to the running server.
    pub fn signal(&self, signal: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("redis is running")
            .id()
            .to_string();
        assert!(
            Command::new("kill")
                .args([signal, &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal("-CONT");
        }
        self.kill();
    }
}
