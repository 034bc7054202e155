//! Private PostgreSQL and Redis servers ([`PgCluster`], [`PrivateRedis`],
//! and a three-primary [`RedisCluster`]) on free ports, so tests can stop,
//! freeze, kill and restart a store without touching the shared servers
//! other tests use. A PostgreSQL cluster can also serve TLS only
//! ([`PgCluster::with_ssl`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::process::free_port;
use super::serial;

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
    /// Serving TLS (`ssl = on`) and refusing cleartext connections.
    ssl: bool,
    _turn: serial::Shared,
}

impl PgCluster {
    /// initdb a new cluster and start it on a free port.
    pub async fn new() -> Self {
        Self::init(serial::shared(), None).await
    }

    /// A cluster for the whole test binary: it takes no turn, and outlives
    /// the binary by at most a second ([`Self::stop_at_exit`]).
    pub async fn for_the_binary() -> Self {
        Self::init(serial::none(), None).await
    }

    /// [`PgCluster::new`], with `ssl = on` and this certificate and key,
    /// and a `pg_hba.conf` that accepts TCP connections over TLS only (a
    /// cleartext connection is refused, so a client that connects at all
    /// spoke TLS).
    pub async fn with_ssl(cert: &Path, key: &Path) -> Self {
        Self::init(serial::shared(), Some((cert, key))).await
    }

    async fn init(turn: serial::Shared, ssl: Option<(&Path, &Path)>) -> Self {
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
            ssl: ssl.is_some(),
            _turn: turn,
        };
        if let Some((cert, key)) = ssl {
            // PostgreSQL wants a key only its owner can read.
            let (server_cert, server_key) = cluster.ssl_files();
            std::fs::copy(cert, server_cert).unwrap();
            std::fs::copy(key, &server_key).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&server_key, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
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
        if cluster.ssl {
            // Rewritten in place: the file keeps its owner (the cluster's).
            std::fs::write(
                cluster.data_dir().join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
            )
            .unwrap();
        }
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

    /// A streaming standby of `primary` (`pg_basebackup -R`) on a port of
    /// its own, read-only until [`Self::promote`]. `synchronous`: the
    /// primary waits for it on every commit (`synchronous_standby_names`,
    /// `synchronous_commit = on`), so a commit the primary acknowledged is
    /// on the standby too.
    pub async fn standby_of(primary: &PgCluster, synchronous: bool) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("idemgate-pg-standby-")
            .tempdir()
            .unwrap();
        let mut standby = Self {
            bin: primary.bin.clone(),
            dir,
            port: 0,
            as_root: primary.as_root,
            running: false,
            ssl: false,
            _turn: serial::none(),
        };
        if standby.as_root {
            let mut chown = Command::new("chown");
            chown
                .arg("-R")
                .arg("postgres:postgres")
                .arg(standby.dir.path());
            let out = run(chown).await;
            assert!(out.status.success(), "chown failed: {}", text(&out));
        }
        standby.follow(primary, synchronous).await;
        standby
    }

    /// Make this stopped cluster a streaming standby of `primary`, on its
    /// own port: its data is replaced by a fresh `pg_basebackup -R` (as a
    /// failed primary is rebuilt after a failover), then it starts and
    /// streams ([`Self::standby_of`]).
    pub async fn rejoin_as_standby_of(&mut self, primary: &PgCluster, synchronous: bool) {
        assert!(!self.running, "stop the cluster before it rejoins");
        std::fs::remove_dir_all(self.data_dir()).unwrap();
        self.follow(primary, synchronous).await;
    }

    /// Base-backup `primary` into this cluster's empty data directory,
    /// start it (on a free port the first time, on its own port after),
    /// and wait until `primary` sees it streaming, synchronously if asked.
    async fn follow(&mut self, primary: &PgCluster, synchronous: bool) {
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres application_name=standby",
            primary.port
        );
        let out = run(self.command(&[
            self.tool("pg_basebackup"),
            "-d".into(),
            conninfo.clone(),
            "-D".into(),
            self.path(&self.data_dir()),
            "-R".into(),
            "-X".into(),
            "stream".into(),
            "--no-sync".into(),
        ]))
        .await;
        assert!(out.status.success(), "pg_basebackup failed: {}", text(&out));
        // -R wrote standby.signal and a primary_conninfo; this one names
        // the standby, which synchronous_standby_names refers to.
        let auto = self.data_dir().join("postgresql.auto.conf");
        let mut settings = std::fs::read_to_string(&auto).unwrap();
        settings.push_str(&format!("primary_conninfo = '{conninfo}'\n"));
        std::fs::write(&auto, settings).unwrap();
        if self.port != 0 {
            self.start().await;
        } else {
            let mut last = String::new();
            for _ in 0..3 {
                self.port = free_port();
                match self.try_start().await {
                    Ok(()) => break,
                    Err(error) => last = error,
                }
            }
            assert!(self.running, "the standby did not start: {last}");
        }
        let wanted = if synchronous { "'standby'" } else { "''" };
        // (Two statements: ALTER SYSTEM cannot run in a transaction block.)
        primary
            .sql(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = {wanted}"
            ))
            .await;
        primary.sql("SELECT pg_reload_conf()").await;
        // Streaming (and, when asked, synchronous) before it counts.
        let state = if synchronous { "sync" } else { "async" };
        let check = format!(
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby' AND state = 'streaming' AND sync_state = '{state}'"
        );
        for _ in 0..300 {
            if primary.sql(&check).await.trim() == "1" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the standby never streamed as {state}:\n{}", self.log());
    }

    /// `pg_ctl promote`: the standby leaves recovery and takes writes;
    /// returns once it does.
    pub async fn promote(&self) {
        let out = run(self.command(&[
            self.tool("pg_ctl"),
            "-D".into(),
            self.path(&self.data_dir()),
            "-w".into(),
            "promote".into(),
        ]))
        .await;
        assert!(
            out.status.success(),
            "pg_ctl promote failed: {}",
            text(&out)
        );
    }

    /// Run `sql` with psql on the `postgres` database; its unaligned,
    /// tuples-only output.
    pub async fn sql(&self, sql: &str) -> String {
        let out = run(self.command(&[
            self.tool("psql"),
            "-h".into(),
            "127.0.0.1".into(),
            "-p".into(),
            self.port.to_string(),
            "-U".into(),
            "postgres".into(),
            "-d".into(),
            "postgres".into(),
            "-XAtq".into(),
            "-v".into(),
            "ON_ERROR_STOP=1".into(),
            "-c".into(),
            sql.into(),
        ]))
        .await;
        assert!(out.status.success(), "psql failed: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The host and port, as a multi-host URL lists them.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
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

    fn ssl_files(&self) -> (PathBuf, PathBuf) {
        let dir = self.dir.path();
        (dir.join("server.crt"), dir.join("server.key"))
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
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        if self.ssl {
            let (cert, key) = self.ssl_files();
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                cert.display(),
                key.display()
            ));
        }
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

    /// Send a signal (`-STOP`, `-CONT`, …) to every process of the
    /// cluster: the postmaster and its children (backends, background
    /// workers), as a frozen host would be.
    pub fn signal(&self, signal: &str) {
        let pidfile = std::fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .expect("the cluster is running");
        let pid = pidfile.lines().next().expect("a pid").trim().to_string();
        // Children first on STOP (nothing runs once the parent stops), the
        // parent first on CONT.
        let children = || {
            let _ = Command::new("pkill")
                .args([signal, "-P", &pid])
                .status()
                .expect("pkill runs");
        };
        let parent = || kill(signal, &pid);
        if signal == "-CONT" {
            parent();
            children();
        } else {
            children();
            parent();
        }
    }

    /// Leave the cluster running until this process exits, then stop it
    /// and remove its files (a watcher process does, since no destructor
    /// runs at a test binary's exit).
    pub fn stop_at_exit(self) {
        let stop = shell_line(&self.stop_command());
        let dir = self.dir.path().display().to_string();
        let cleanup = format!("cd /; {stop}; rm -rf {}", quote(&dir));
        watch_exit(&cleanup);
        // Its files now belong to the watcher.
        std::mem::forget(self);
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

/// A command line as one shell line.
fn shell_line(command: &Command) -> String {
    let mut words = vec![quote(&command.get_program().to_string_lossy())];
    words.extend(command.get_args().map(|a| quote(&a.to_string_lossy())));
    match command.get_current_dir() {
        Some(dir) => format!(
            "cd {} && {}",
            quote(&dir.to_string_lossy()),
            words.join(" ")
        ),
        None => words.join(" "),
    }
}

fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// Run `cleanup` (a shell line) once this process has exited: a detached
/// watcher polls for it twice a second.
fn watch_exit(cleanup: &str) {
    let script = format!(
        "while kill -0 {} 2>/dev/null; do sleep 0.5; done; {cleanup}",
        std::process::id()
    );
    let watcher = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sh runs");
    // It outlives this process by design: nobody here waits for it.
    std::mem::forget(watcher);
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
/// /usr/lib/postgresql (Debian's layout), else the directory of the
/// `initdb` on `PATH`; `IDEMGATE_TEST_PG_BIN` overrides both.
pub fn postgres_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("IDEMGATE_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let root = Path::new("/usr/lib/postgresql");
    let on_path = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).find(|dir| dir.join("initdb").is_file()));
    if let (false, Some(dir)) = (root.is_dir(), on_path) {
        return dir;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("PostgreSQL server binaries are not installed at {root:?} ({e}): install the `postgresql` package (apt-get install postgresql), or point IDEMGATE_TEST_PG at a server"))
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
        .unwrap_or_else(|| panic!("no PostgreSQL with initdb under {root:?}: install the `postgresql` package (apt-get install postgresql), or point IDEMGATE_TEST_PG at a server"))
}

/// A private `redis-server` child process on a free loopback port, so tests
/// can stop, freeze and restart Redis without touching the shared server.
/// Dropping it kills it (after a SIGCONT, in case it was frozen).
pub struct PrivateRedis {
    port: u16,
    child: Option<Child>,
    /// Its working directory (`--dir`): the append-only file, and the
    /// snapshot a full sync writes on a replica. Never the test's own
    /// directory, where another server would load that snapshot at start.
    dir: tempfile::TempDir,
    /// With an append-only file fsynced on every write (the recommended
    /// durability of docs/src/stores/redis.md), kept across restarts.
    durable: bool,
    /// A replica of the server on this port (`--replicaof`).
    replica_of: Option<u16>,
    _turn: serial::Shared,
}

impl PrivateRedis {
    /// A replica of `primary` (`--replicaof`), once its link is up and
    /// its first sync done.
    pub fn replica_of(primary: &PrivateRedis) -> Self {
        let mut replica = Self {
            port: free_port(),
            child: None,
            dir: working_dir(),
            durable: false,
            replica_of: Some(primary.port),
            _turn: serial::none(),
        };
        replica.restart();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the replica never synced"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        replica
    }

    /// Run a command with `redis-cli`; its output.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    /// Without persistence: a restart loses everything.
    pub fn start() -> Self {
        Self::launch(false)
    }

    /// With `appendonly yes` and `appendfsync always`: a restart, even after
    /// SIGKILL, keeps every acknowledged write.
    pub fn start_durable() -> Self {
        Self::launch(true)
    }

    /// A server for the whole test binary: it takes no turn, and outlives
    /// the binary by at most a second ([`Self::stop_at_exit`]).
    pub fn for_the_binary() -> Self {
        Self::launch_with(false, serial::none())
    }

    fn launch(durable: bool) -> Self {
        Self::launch_with(durable, serial::shared())
    }

    fn launch_with(durable: bool, turn: serial::Shared) -> Self {
        let mut redis = Self {
            port: free_port(),
            child: None,
            dir: working_dir(),
            durable,
            replica_of: None,
            _turn: turn,
        };
        redis.restart();
        redis
    }

    /// Start the (stopped or killed) server again on the same port.
    pub fn restart(&mut self) {
        let port = self.port.to_string();
        let mut command = Command::new("redis-server");
        command.args(["--port", &port, "--bind", "127.0.0.1", "--save", ""]);
        command.arg("--dir").arg(self.dir.path());
        // Appended to across restarts: [`Self::log`].
        command
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"));
        if let Some(primary) = self.replica_of {
            command.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
        }
        if self.durable {
            command.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            command.args(["--appendonly", "no"]);
            // Without persistence a restart starts empty, even after a
            // full sync as a replica left a snapshot behind.
            let _ = std::fs::remove_file(self.dir.path().join("dump.rdb"));
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-server ({e}): install the `redis-server` package (apt-get install redis-server), or point IDEMGATE_TEST_REDIS at a server"));
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

    /// Its log, every start's, for a failed test's output.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
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
        kill(signal, &pid);
    }

    /// Leave the server running until this process exits, then kill it (a
    /// watcher process does, since no destructor runs at a test binary's exit).
    pub fn stop_at_exit(mut self) {
        let child = self.child.take().expect("redis is running");
        watch_exit(&format!("kill -9 {}", child.id()));
        // Not reaped by us: the watcher's kill ends it, init reaps it.
        std::mem::forget(child);
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Its port on the loopback interface.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// `redis-cli` on the loopback server at `port`; its output, or `None` if
/// it failed (a server restarting, or changing roles, may close the
/// connection).
pub fn try_redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `redis-cli` on the loopback server at `port`; its output.
fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    assert!(out.status.success(), "redis-cli {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A private server's working directory.
fn working_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("idemgate-redis-")
        .tempdir()
        .unwrap()
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal("-CONT");
        }
        self.kill();
    }
}

/// `kill SIGNAL PID`, which must succeed.
pub fn kill(signal: &str, pid: &str) {
    let status = Command::new("kill").args([signal, pid]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}: {status}");
}

/// A Redis Sentinel on a free loopback port, watching a primary as
/// `mymaster` (quorum 2: run three) and failing it over once it has not
/// answered for two seconds. Not one: Sentinel pings once a second, and a
/// primary it has just switched to gets its first ping about a second
/// after the switch. With `down-after-milliseconds 1000` all three
/// sentinels judged the new primary down just before its first answer and
/// failed it over again, to the killed server restarted empty, which wiped
/// every key (once in about 40 runs). Dropping it kills it.
pub struct PrivateSentinel {
    port: u16,
    child: Child,
    /// Its config file, which Sentinel rewrites as it learns, and its log.
    dir: tempfile::TempDir,
}

impl PrivateSentinel {
    /// The name the sentinels know the primary by.
    pub const PRIMARY: &'static str = "mymaster";

    /// A sentinel watching `primary`.
    pub fn watching(primary: &PrivateRedis) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("idemgate-sentinel-")
            .tempdir()
            .unwrap();
        let port = free_port();
        let config = dir.path().join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {name} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {name} 2000\n\
                 sentinel failover-timeout {name} 5000\n",
                dir = dir.path().display(),
                name = Self::PRIMARY,
                primary = primary.port,
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&config)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the sentinel did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { port, child, dir }
    }

    /// Wait until this sentinel knows `replicas` replicas and `sentinels`
    /// sentinels (itself included), so that a failover can be agreed.
    pub fn wait_for(&self, replicas: usize, sentinels: usize) {
        let wanted = format!("slaves={replicas},sentinels={sentinels}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let info = self.cli(&["INFO", "sentinel"]);
            if info.contains("status=ok") && info.contains(&wanted) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the sentinel never saw {wanted}: {info}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Run a command with `redis-cli`; its output.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args)
    }

    /// Its log (what it saw and did: `+sdown`, `+switch-master`…), for a
    /// failed test's output.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default()
    }

    /// Its port on the loopback interface.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `host:port`, as a `redis+sentinel://` URL lists it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Redis Cluster of three primaries (no replicas) on free loopback ports,
/// each `redis-server --cluster-enabled yes` in a directory of its own,
/// joined by `redis-cli --cluster create` and ready (`cluster_state:ok` on
/// every node) when [`Self::start`] returns. A dead node takes only its own
/// slots down (`cluster-require-full-coverage no`). Dropping it kills every
/// node.
pub struct RedisCluster {
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
    dir: Option<tempfile::TempDir>,
    _turn: serial::Shared,
}

impl RedisCluster {
    /// A cluster of three primaries for one test (it may kill nodes).
    pub fn start() -> Self {
        Self::launch(serial::shared(), 0)
    }

    /// Three primaries with a replica each, for one test: nodes 0–2 are
    /// the primaries, node `i + 3` is node `i`'s replica.
    pub fn with_replicas() -> Self {
        Self::launch(serial::shared(), 1)
    }

    /// A cluster for the whole test binary: it takes no turn, and outlives
    /// the binary by at most a second ([`Self::stop_at_exit`]).
    pub fn for_the_binary() -> Self {
        Self::launch(serial::none(), 0)
    }

    fn launch(turn: serial::Shared, replicas: usize) -> Self {
        // A free port can be taken by another test's server between
        // free_port() and redis-server's bind: then start over elsewhere.
        let mut attempt = 1;
        loop {
            match Self::try_launch(replicas) {
                Ok(mut cluster) => {
                    cluster._turn = turn;
                    return cluster;
                }
                Err(why) if attempt < 5 => {
                    eprintln!("redis cluster: {why}; starting again on other ports");
                    attempt += 1;
                }
                Err(why) => panic!("{why}"),
            }
        }
    }

    /// Whether the server on `port` is the process `pid` (`INFO server`).
    fn serves(port: u16, pid: u32) -> bool {
        Command::new("redis-cli")
            .args(["-p", &port.to_string(), "info", "server"])
            .stdin(Stdio::null())
            .output()
            .map(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .any(|line| line.trim() == format!("process_id:{pid}"))
            })
            .unwrap_or(false)
    }

    /// Start the cluster node on `port`, in its directory under `dir`
    /// (which keeps its `nodes.conf` across a restart, not its data).
    fn spawn_node(dir: &Path, port: u16) -> Child {
        let node_dir = dir.join(port.to_string());
        std::fs::create_dir_all(&node_dir).unwrap();
        // Without persistence a restart starts empty, even after a full
        // sync as a replica left a snapshot behind.
        let _ = std::fs::remove_file(node_dir.join("dump.rdb"));
        let port = port.to_string();
        Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--cluster-enabled", "yes"])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", "2000"])
            // The slots of the live nodes stay served when one dies.
            .args(["--cluster-require-full-coverage", "no"])
            // A replica may take over however long its link was down.
            .args(["--cluster-replica-validity-factor", "0"])
            .arg("--dir")
            .arg(&node_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-server ({e}): install the `redis-server` package (apt-get install redis-server)"))
    }

    fn try_launch(replicas: usize) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("idemgate-redis-cluster-")
            .tempdir()
            .unwrap();
        let ports: Vec<u16> = (0..3 * (1 + replicas)).map(|_| free_port()).collect();
        let children = ports
            .iter()
            .map(|port| Some(Self::spawn_node(dir.path(), *port)))
            .collect();
        let cluster = Self {
            ports,
            children,
            dir: Some(dir),
            _turn: serial::none(),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        for (port, child) in cluster.ports.iter().zip(&cluster.children) {
            let pid = child.as_ref().map_or(0, Child::id);
            while !Self::serves(*port, pid) {
                if std::time::Instant::now() >= deadline {
                    return Err(format!(
                        "cluster node {port} did not start (or another server has its port)"
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        create.args(cluster.ports[..3].iter().map(|p| format!("127.0.0.1:{p}")));
        create.arg("--cluster-yes");
        let out = create
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli runs");
        if !out.status.success() {
            return Err(format!("cluster create: {}", text(&out)));
        }
        // Each replica is attached to its primary by hand: `--cluster-replicas`
        // would pair them as it likes.
        for (i, port) in cluster.ports.iter().enumerate().skip(3) {
            let primary = cluster.ports[i % 3];
            let out = Command::new("redis-cli")
                .args(["--cluster", "add-node"])
                .arg(format!("127.0.0.1:{port}"))
                .arg(format!("127.0.0.1:{primary}"))
                .args(["--cluster-slave", "--cluster-master-id"])
                .arg(cluster.node_id(primary))
                .stdin(Stdio::null())
                .output()
                .expect("redis-cli runs");
            if !out.status.success() {
                return Err(format!("cluster add-node: {}", text(&out)));
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for port in cluster.ports.clone() {
            while !cluster.info(port).contains("cluster_state:ok") {
                assert!(
                    std::time::Instant::now() < deadline,
                    "node {port}: {}",
                    cluster.info(port)
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for i in 3..cluster.ports.len() {
            while !cluster.replication(i).contains("master_link_status:up") {
                assert!(
                    std::time::Instant::now() < deadline,
                    "replica {i} never synced: {}",
                    cluster.replication(i)
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(cluster)
    }

    /// The id of the node on `port` (`CLUSTER MYID`).
    fn node_id(&self, port: u16) -> String {
        redis_cli(port, &["CLUSTER", "MYID"]).trim().to_string()
    }

    /// `INFO replication` of node `i` (empty if it does not answer).
    pub fn replication(&self, i: usize) -> String {
        redis_cli(self.ports[i], &["INFO", "replication"])
    }

    /// Whether node `i` answers as a primary.
    pub fn is_primary(&self, i: usize) -> bool {
        self.replication(i).contains("role:master")
    }

    /// Send `signal` (`-STOP`, `-CONT`) to node `i`.
    pub fn signal(&self, i: usize, signal: &str) {
        let child = self.children[i].as_ref().expect("node i runs");
        kill(signal, &child.id().to_string());
    }

    /// Start node `i` again after [`Self::kill`]: empty, with its cluster
    /// configuration, so it rejoins (as a replica, once it was failed over).
    pub fn restart(&mut self, i: usize) {
        let dir = self.dir.as_ref().expect("the cluster has its directory");
        self.children[i] = Some(Self::spawn_node(dir.path(), self.ports[i]));
    }

    /// `CLUSTER INFO` of the node on `port` (empty if it does not answer).
    pub fn info(&self, port: u16) -> String {
        Command::new("redis-cli")
            .args(["-p", &port.to_string(), "cluster", "info"])
            .stdin(Stdio::null())
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The seed node's (the first node's) `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.ports[0])
    }

    /// The `redis://` URL of every node.
    pub fn node_urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect()
    }

    /// SIGKILL node `i`, then reap it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Leave the cluster running until this process exits, then kill it and
    /// remove its directory (a watcher process does).
    pub fn stop_at_exit(mut self) {
        let pids: Vec<String> = self
            .children
            .iter_mut()
            .filter_map(|c| c.take())
            .map(|child| {
                let pid = child.id().to_string();
                // Not reaped by us: the watcher's kill ends it, init reaps it.
                std::mem::forget(child);
                pid
            })
            .collect();
        let dir = self
            .dir
            .take()
            .expect("the cluster has its directory")
            .keep();
        watch_exit(&format!(
            "kill -9 {}; rm -rf {}",
            pids.join(" "),
            quote(&dir.to_string_lossy())
        ));
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}
