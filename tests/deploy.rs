//! The Kubernetes manifests under deploy/kubernetes/, kept true to the
//! gateway they run (docs/src/operations/kubernetes.md).
//!
//! - Every `*.yaml` there parses (several documents per file allowed).
//! - The ConfigMap's `gateway.toml` passes the real `idemgate check` with the
//!   variables it references set to plausible values (`check` loads and
//!   validates the file only: it never connects to the store, so the
//!   unresolvable host `db` is fine), names a PostgreSQL store, and fails
//!   without `DATABASE_URL` rather than falling back to a SQLite file.
//! - Read from that file (`listen`, `admin_listen`, `shutdown_timeout`,
//!   `[store] timeout`, defaults from `idemgate::config::defaults`) and from
//!   the Dockerfile's `USER`, the Deployment, Service, PodDisruptionBudget
//!   and ServiceMonitor agree with it: container ports, probes on the admin
//!   port (`/readyz`, `/healthz`), the Service's target ports, the scraped
//!   port name and path, a grace period longer than preStop sleep + drain +
//!   store close, the non-root read-only security context, the config file
//!   mounted where `IDEMGATE_CONFIG` points, secrets from `secretKeyRef`
//!   (and no Secret committed), selectors that select the pods.
//!
//! The checks are functions over parsed documents; `controls` feeds them
//! mutated copies (a probe path typo, a short grace period, a wrong port, …)
//! and asserts each one is flagged. No cluster and no network: `kubectl` is
//! not used.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use idemgate::config::defaults;
use yaml_rust2::{Yaml, YamlLoader};

/// The manifests' directory, relative to the repository root.
const MANIFESTS: &str = "deploy/kubernetes";
/// The ConfigMap key holding the gateway's configuration.
const CONFIG_KEY: &str = "gateway.toml";
/// Variables the config may reference, with the plausible values the test
/// gives them; each must come from a Secret in the Deployment.
const SECRET_VARS: &[(&str, &str)] = &[
    ("DATABASE_URL", "postgres://u:p@db:5432/idemgate"),
    (
        "IDEMGATE_ADMIN_TOKEN",
        "0123456789abcdef0123456789abcdef0123456789abcdef",
    ),
];

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

/// One parsed document and the file it came from.
#[derive(Clone)]
struct Doc {
    file: String,
    yaml: Yaml,
}

/// The `(file name, text)` of every `*.yaml` / `*.yml` under `dir`, sorted.
fn read_manifests(dir: &Path) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("cannot list the manifests").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .map(|p| {
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            (name, text)
        })
        .collect();
    out.sort();
    out
}

/// Parse every file; empty documents (a trailing `---`) are dropped.
fn parse_all(files: &[(String, String)]) -> Result<Vec<Doc>, String> {
    let mut docs = Vec::new();
    for (file, text) in files {
        let parsed =
            YamlLoader::load_from_str(text).map_err(|e| format!("{file}: YAML error: {e}"))?;
        docs.extend(parsed.into_iter().filter(|y| !y.is_null()).map(|yaml| Doc {
            file: file.clone(),
            yaml,
        }));
    }
    Ok(docs)
}

/// The one document of `kind`.
fn one<'a>(docs: &'a [Doc], kind: &str) -> Result<&'a Yaml, String> {
    let found: Vec<&Doc> = docs
        .iter()
        .filter(|d| d.yaml["kind"].as_str() == Some(kind))
        .collect();
    match found.as_slice() {
        [doc] => Ok(&doc.yaml),
        [] => Err(format!("no {kind} in {MANIFESTS}")),
        many => Err(format!(
            "{} {kind}s in {MANIFESTS} ({}): expected one",
            many.len(),
            many.iter()
                .map(|d| d.file.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The ConfigMap's gateway.toml.
fn gateway_toml(docs: &[Doc]) -> Result<String, String> {
    one(docs, "ConfigMap")?["data"][CONFIG_KEY]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("the ConfigMap has no data.\"{CONFIG_KEY}\""))
}

/// The Dockerfile's `USER` uid.
fn image_uid(dockerfile: &str) -> i64 {
    let user = dockerfile
        .lines()
        .filter_map(|l| l.trim().strip_prefix("USER "))
        .next_back()
        .expect("the Dockerfile has no USER line");
    let uid = user.trim().split(':').next().unwrap_or_default();
    uid.parse()
        .unwrap_or_else(|_| panic!("the Dockerfile's USER {user:?} is not a numeric uid"))
}

// ---------------------------------------------------------------------------
// The gateway's side: what the config says
// ---------------------------------------------------------------------------

/// What the manifests must agree with, read from the gateway.toml.
#[derive(Clone, Debug)]
struct Gateway {
    listen: SocketAddr,
    admin_listen: SocketAddr,
    shutdown_timeout: Duration,
    store_timeout: Duration,
    /// The raw `[store] url`, before expansion.
    store_url: String,
    /// `${VAR}` references without a default, anywhere in the file.
    required_vars: BTreeSet<String>,
}

fn gateway_of(text: &str) -> Result<Gateway, String> {
    let table: toml::Table = text
        .parse()
        .map_err(|e| format!("{CONFIG_KEY} is not TOML: {e}"))?;
    let addr = |key: &str, default: SocketAddr| -> Result<SocketAddr, String> {
        table.get(key).map_or(Ok(default), |v| {
            let s = v.as_str().ok_or(format!("{key} is not a string"))?;
            s.parse()
                .map_err(|e| format!("{key} = {s:?} is not a literal address ({e})"))
        })
    };
    let duration = |t: &toml::Table, key: &str, default: Duration| -> Result<Duration, String> {
        t.get(key).map_or(Ok(default), |v| {
            let s = v.as_str().ok_or(format!("{key} is not a string"))?;
            humantime::parse_duration(s).map_err(|e| format!("{key} = {s:?}: {e}"))
        })
    };
    let empty = toml::Table::new();
    let store = table
        .get("store")
        .and_then(toml::Value::as_table)
        .unwrap_or(&empty);
    let mut required_vars = BTreeSet::new();
    collect_vars(&toml::Value::Table(table.clone()), &mut required_vars);
    Ok(Gateway {
        listen: addr("listen", defaults::DEFAULT_LISTEN)?,
        admin_listen: addr("admin_listen", defaults::DEFAULT_ADMIN_LISTEN)?,
        shutdown_timeout: duration(
            &table,
            "shutdown_timeout",
            defaults::DEFAULT_SHUTDOWN_TIMEOUT,
        )?,
        store_timeout: duration(store, "timeout", defaults::DEFAULT_STORE_TIMEOUT)?,
        store_url: store
            .get("url")
            .and_then(toml::Value::as_str)
            .unwrap_or(defaults::DEFAULT_STORE_URL)
            .to_owned(),
        required_vars,
    })
}

/// The `${VAR}` references (without `:-default`) in every string of `value`.
fn collect_vars(value: &toml::Value, out: &mut BTreeSet<String>) {
    match value {
        toml::Value::String(s) => {
            let mut rest = s.as_str();
            while let Some(i) = rest.find('$') {
                let after = &rest[i + 1..];
                if let Some(tail) = after.strip_prefix('$') {
                    rest = tail;
                } else if let Some(body) = after.strip_prefix('{') {
                    let end = body.find('}').unwrap_or(body.len());
                    if !body[..end].contains(":-") {
                        out.insert(body[..end].to_owned());
                    }
                    rest = &body[end..];
                } else {
                    rest = after;
                }
            }
        }
        toml::Value::Array(items) => items.iter().for_each(|v| collect_vars(v, out)),
        toml::Value::Table(t) => t.values().for_each(|v| collect_vars(v, out)),
        _ => {}
    }
}

// ---------------------------------------------------------------------------
// The checks: each returns what it found wrong
// ---------------------------------------------------------------------------

/// One check: it adds what it finds wrong to the list, or fails outright
/// when a document it needs is missing.
type Check = fn(&[Doc], &Gateway, i64, &mut Vec<String>) -> Result<(), String>;

/// Everything wrong with `docs` for a gateway configured as `gw`, run as `uid`.
fn problems(docs: &[Doc], gw: &Gateway, uid: i64) -> Vec<String> {
    let mut out = Vec::new();
    let checks: [Check; 8] = [
        check_store,
        check_ports_and_probes,
        check_service_and_monitor,
        check_shutdown,
        check_security,
        check_config_mount,
        check_secrets,
        check_replicas_and_selectors,
    ];
    for check in checks {
        if let Err(e) = check(docs, gw, uid, &mut out) {
            out.push(e);
        }
    }
    out
}

/// The gateway's container in the Deployment's pod template.
fn container(docs: &[Doc]) -> Result<&Yaml, String> {
    let pod = &one(docs, "Deployment")?["spec"]["template"]["spec"];
    pod["containers"]
        .as_vec()
        .and_then(|cs| {
            cs.iter()
                .find(|c| c["image"].as_str().is_some_and(|i| i.contains("idemgate")))
        })
        .ok_or_else(|| "the Deployment has no idemgate container".to_owned())
}

/// A container port given by number or by name, as its number.
fn resolve_port(container: &Yaml, port: &Yaml) -> Option<i64> {
    if let Some(n) = port.as_i64() {
        return Some(n);
    }
    let name = port.as_str()?;
    container["ports"]
        .as_vec()?
        .iter()
        .find(|p| p["name"].as_str() == Some(name))?["containerPort"]
        .as_i64()
}

fn check_store(_: &[Doc], gw: &Gateway, _: i64, out: &mut Vec<String>) -> Result<(), String> {
    // Several replicas share one store, and the root filesystem is read-only.
    let url = gw.store_url.as_str();
    if url.contains("sqlite") || url.starts_with("memory") || url.contains(":-") {
        out.push(format!(
            "[store] url = {url:?}: use a PostgreSQL URL with no fallback (a SQLite file \
             cannot be written on a read-only root filesystem, memory:// is per replica)"
        ));
    }
    Ok(())
}

fn check_ports_and_probes(
    docs: &[Doc],
    gw: &Gateway,
    _: i64,
    out: &mut Vec<String>,
) -> Result<(), String> {
    let c = container(docs)?;
    let ports: Vec<i64> = c["ports"]
        .as_vec()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p["containerPort"].as_i64())
                .collect()
        })
        .unwrap_or_default();
    for (key, addr) in [("listen", gw.listen), ("admin_listen", gw.admin_listen)] {
        if !ports.contains(&i64::from(addr.port())) {
            out.push(format!(
                "{key} port {} is not among the containerPorts {ports:?}",
                addr.port()
            ));
        }
        if !addr.ip().is_unspecified() {
            out.push(format!(
                "{key} = {addr}: the kubelet and the Service reach the pod IP, not {}",
                addr.ip()
            ));
        }
    }
    let admin = i64::from(gw.admin_listen.port());
    let expected = [
        ("readinessProbe", Some("/readyz")),
        ("livenessProbe", Some("/healthz")),
        ("startupProbe", None),
    ];
    for (probe, path) in expected {
        let get = &c[probe]["httpGet"];
        if get.is_badvalue() {
            if path.is_some() {
                out.push(format!("no {probe}.httpGet"));
            }
            continue;
        }
        let actual = get["path"].as_str().unwrap_or("/");
        let ok_path = match path {
            Some(p) => actual == p,
            None => actual == "/healthz" || actual == "/readyz",
        };
        if !ok_path {
            out.push(format!(
                "{probe} path {actual:?}: expected {}",
                path.unwrap_or("/healthz or /readyz")
            ));
        }
        if resolve_port(c, &get["port"]) != Some(admin) {
            out.push(format!(
                "{probe} port {:?} is not the admin port {admin}",
                get["port"]
            ));
        }
    }
    Ok(())
}

fn check_service_and_monitor(
    docs: &[Doc],
    gw: &Gateway,
    _: i64,
    out: &mut Vec<String>,
) -> Result<(), String> {
    let c = container(docs)?;
    let service = one(docs, "Service")?;
    let ports = service["spec"]["ports"]
        .as_vec()
        .cloned()
        .unwrap_or_default();
    let target = |p: &Yaml| {
        let t = &p["targetPort"];
        resolve_port(c, if t.is_badvalue() { &p["port"] } else { t })
    };
    let proxy = i64::from(gw.listen.port());
    let admin = i64::from(gw.admin_listen.port());
    if !ports.iter().any(|p| target(p) == Some(proxy)) {
        out.push(format!("no Service port targets the proxy port {proxy}"));
    }
    let admin_names: Vec<&str> = ports
        .iter()
        .filter(|p| target(p) == Some(admin))
        .filter_map(|p| p["name"].as_str())
        .collect();
    if admin_names.is_empty() {
        out.push(format!(
            "no named Service port targets the admin port {admin}"
        ));
    }
    let monitor = one(docs, "ServiceMonitor")?;
    if !labels_match(
        &monitor["spec"]["selector"]["matchLabels"],
        &service["metadata"]["labels"],
    ) {
        out.push("the ServiceMonitor's selector does not select the Service".to_owned());
    }
    let scraped = monitor["spec"]["endpoints"].as_vec().is_some_and(|es| {
        es.iter().any(|e| {
            e["port"].as_str().is_some_and(|n| admin_names.contains(&n))
                && e["path"].as_str().unwrap_or("/metrics") == "/metrics"
        })
    });
    if !scraped {
        out.push(format!(
            "no ServiceMonitor endpoint scrapes /metrics on the admin port (named {admin_names:?})"
        ));
    }
    Ok(())
}

/// The preStop sleep: `exec: ["…sleep", "N"]` or the `sleep: {seconds: N}` action.
fn pre_stop_sleep(c: &Yaml) -> Result<i64, String> {
    let pre_stop = &c["lifecycle"]["preStop"];
    if pre_stop.is_badvalue() {
        return Ok(0);
    }
    if let Some(n) = pre_stop["sleep"]["seconds"].as_i64() {
        return Ok(n);
    }
    let command: Vec<&str> = pre_stop["exec"]["command"]
        .as_vec()
        .map(|v| v.iter().filter_map(Yaml::as_str).collect())
        .unwrap_or_default();
    match command.as_slice() {
        [sleep, n] if sleep.ends_with("sleep") => n
            .parse()
            .map_err(|_| format!("preStop sleep {n:?} is not whole seconds")),
        _ => Err(format!("preStop {command:?} is not a sleep")),
    }
}

fn check_shutdown(docs: &[Doc], gw: &Gateway, _: i64, out: &mut Vec<String>) -> Result<(), String> {
    let pod = &one(docs, "Deployment")?["spec"]["template"]["spec"];
    // Kubernetes' default grace period.
    let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap_or(30);
    let sleep = pre_stop_sleep(container(docs)?)?;
    let needed = Duration::from_secs(u64::try_from(sleep).unwrap_or(0))
        + gw.shutdown_timeout
        + gw.store_timeout;
    if Duration::from_secs(u64::try_from(grace).unwrap_or(0)) <= needed {
        out.push(format!(
            "terminationGracePeriodSeconds {grace} does not exceed preStop sleep {sleep}s + \
             shutdown_timeout {:?} + [store] timeout {:?}",
            gw.shutdown_timeout, gw.store_timeout
        ));
    }
    Ok(())
}

fn check_security(
    docs: &[Doc],
    _: &Gateway,
    uid: i64,
    out: &mut Vec<String>,
) -> Result<(), String> {
    let pod = &one(docs, "Deployment")?["spec"]["template"]["spec"]["securityContext"];
    let own = &container(docs)?["securityContext"];
    // The container's setting wins over the pod's.
    let effective = |key: &str| {
        if own[key].is_badvalue() {
            pod[key].clone()
        } else {
            own[key].clone()
        }
    };
    if effective("runAsNonRoot").as_bool() != Some(true) {
        out.push("securityContext runAsNonRoot is not true".to_owned());
    }
    if effective("runAsUser").as_i64() != Some(uid) {
        out.push(format!(
            "securityContext runAsUser {:?} is not the image's uid {uid}",
            effective("runAsUser")
        ));
    }
    if own["readOnlyRootFilesystem"].as_bool() != Some(true) {
        out.push("container readOnlyRootFilesystem is not true".to_owned());
    }
    if own["allowPrivilegeEscalation"].as_bool() != Some(false) {
        out.push("container allowPrivilegeEscalation is not false".to_owned());
    }
    let drops_all = own["capabilities"]["drop"]
        .as_vec()
        .is_some_and(|d| d.iter().any(|c| c.as_str() == Some("ALL")));
    if !drops_all {
        out.push("container capabilities do not drop ALL".to_owned());
    }
    Ok(())
}

/// The container's `env` entry named `name`.
fn env_value<'a>(c: &'a Yaml, name: &str) -> Option<&'a Yaml> {
    c["env"]
        .as_vec()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
}

fn check_config_mount(
    docs: &[Doc],
    _: &Gateway,
    _: i64,
    out: &mut Vec<String>,
) -> Result<(), String> {
    let c = container(docs)?;
    let pod = &one(docs, "Deployment")?["spec"]["template"]["spec"];
    let config_map = one(docs, "ConfigMap")?["metadata"]["name"].as_str();
    let wanted = env_value(c, "IDEMGATE_CONFIG")
        .and_then(|e| e["value"].as_str())
        .ok_or("the container sets no IDEMGATE_CONFIG value")?;
    let volume = pod["volumes"]
        .as_vec()
        .and_then(|vs| {
            vs.iter()
                .find(|v| v["configMap"]["name"].as_str() == config_map)
        })
        .ok_or("no volume holds the ConfigMap")?;
    // The file's name in the volume: its `items` path, else the key itself.
    let file = volume["configMap"]["items"]
        .as_vec()
        .map_or(Some(CONFIG_KEY), |items| {
            items
                .iter()
                .find(|i| i["key"].as_str() == Some(CONFIG_KEY))
                .and_then(|i| i["path"].as_str())
        })
        .ok_or(format!(
            "the ConfigMap volume does not project {CONFIG_KEY}"
        ))?;
    let mounts = c["volumeMounts"].as_vec().cloned().unwrap_or_default();
    let mounted: Vec<String> = mounts
        .iter()
        .filter(|m| m["name"] == volume["name"])
        .filter_map(|m| {
            let at = m["mountPath"].as_str()?;
            match m["subPath"].as_str() {
                Some(sub) if sub == file => Some(at.to_owned()),
                Some(_) => None,
                None => Some(format!("{}/{file}", at.trim_end_matches('/'))),
            }
        })
        .collect();
    if !mounted.iter().any(|m| m == wanted) {
        out.push(format!(
            "IDEMGATE_CONFIG = {wanted:?}, but the ConfigMap's {CONFIG_KEY} is mounted at {mounted:?}"
        ));
    }
    Ok(())
}

fn check_secrets(docs: &[Doc], gw: &Gateway, _: i64, out: &mut Vec<String>) -> Result<(), String> {
    if docs
        .iter()
        .any(|d| d.yaml["kind"].as_str() == Some("Secret"))
    {
        out.push("a Secret is committed under deploy/kubernetes: create it by hand".to_owned());
    }
    let c = container(docs)?;
    for var in &gw.required_vars {
        let Some(entry) = env_value(c, var) else {
            out.push(format!(
                "{CONFIG_KEY} references ${{{var}}}, which the container does not set"
            ));
            continue;
        };
        let secret = SECRET_VARS.iter().any(|(name, _)| name == var);
        if secret
            && entry["valueFrom"]["secretKeyRef"]["name"]
                .as_str()
                .is_none()
        {
            out.push(format!("{var} does not come from a secretKeyRef"));
        }
    }
    Ok(())
}

/// Whether every label of `selector` is in `labels` (and there is one).
fn labels_match(selector: &Yaml, labels: &Yaml) -> bool {
    selector.as_hash().is_some_and(|s| {
        !s.is_empty()
            && s.iter()
                .all(|(k, v)| &labels[k.as_str().unwrap_or_default()] == v)
    })
}

fn check_replicas_and_selectors(
    docs: &[Doc],
    _: &Gateway,
    _: i64,
    out: &mut Vec<String>,
) -> Result<(), String> {
    let deployment = one(docs, "Deployment")?;
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let replicas = deployment["spec"]["replicas"].as_i64().unwrap_or(1);
    if replicas < 2 {
        out.push(format!("replicas {replicas}: run at least 2"));
    }
    let pdb = one(docs, "PodDisruptionBudget")?;
    let min = pdb["spec"]["minAvailable"].as_i64();
    if !min.is_some_and(|m| m >= 1 && m < replicas) {
        out.push(format!(
            "PodDisruptionBudget minAvailable {min:?}: at least 1 and below replicas {replicas}"
        ));
    }
    let selectors = [
        ("Deployment", &deployment["spec"]["selector"]["matchLabels"]),
        ("Service", &one(docs, "Service")?["spec"]["selector"]),
        (
            "PodDisruptionBudget",
            &pdb["spec"]["selector"]["matchLabels"],
        ),
    ];
    for (kind, selector) in selectors {
        if !labels_match(selector, pod_labels) {
            out.push(format!("the {kind}'s selector does not select the pods"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

fn dockerfile_uid() -> i64 {
    let path = repo_root().join("Dockerfile");
    image_uid(&std::fs::read_to_string(&path).expect("cannot read the Dockerfile"))
}

/// The value, or a panic naming the error.
fn ok<T>(result: Result<T, String>) -> T {
    result.unwrap_or_else(|e| panic!("{e}"))
}

fn shipped() -> Vec<(String, String)> {
    let files = read_manifests(&repo_root().join(MANIFESTS));
    assert!(!files.is_empty(), "no *.yaml under {MANIFESTS}");
    files
}

#[test]
fn manifests_agree_with_the_gateway() {
    let docs = parse_all(&shipped()).unwrap_or_else(|e| panic!("{e}"));
    let gw = gateway_of(&gateway_toml(&docs).unwrap()).unwrap();
    let found = problems(&docs, &gw, dockerfile_uid());
    assert!(found.is_empty(), "{MANIFESTS}:\n  {}", found.join("\n  "));
}

/// Run `idemgate check` on `toml` with `env` as its only `${VAR}` values.
fn idemgate_check(toml: &str, env: &[(&str, &str)]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("no temporary directory");
    let path = dir.path().join(CONFIG_KEY);
    std::fs::write(&path, toml).expect("cannot write the config");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idemgate"));
    cmd.arg("check").arg("--config").arg(&path);
    for (name, _) in SECRET_VARS {
        cmd.env_remove(name);
    }
    cmd.env_remove("IDEMGATE_CONFIG")
        .env_remove("IDEMGATE_LOG_FORMAT")
        .envs(env.iter().copied());
    cmd.output().expect("cannot run idemgate")
}

#[test]
fn the_configmap_passes_idemgate_check() {
    let docs = parse_all(&shipped()).unwrap_or_else(|e| panic!("{e}"));
    let toml = gateway_toml(&docs).unwrap();
    let gw = gateway_of(&toml).unwrap();
    for var in &gw.required_vars {
        assert!(
            SECRET_VARS.iter().any(|(name, _)| name == var),
            "{CONFIG_KEY} references ${{{var}}}: give this test a plausible value for it"
        );
    }
    // `db` does not resolve here: a `check` that connected would fail.
    let ok = idemgate_check(&toml, SECRET_VARS);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "idemgate check failed: {stdout}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        stdout.contains("store postgres://"),
        "not PostgreSQL: {stdout}"
    );
    // Without DATABASE_URL the config is refused, not run on a SQLite file.
    let without: Vec<(&str, &str)> = SECRET_VARS
        .iter()
        .copied()
        .filter(|(name, _)| *name != "DATABASE_URL")
        .collect();
    let refused = idemgate_check(&toml, &without);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[test]
fn the_image_uid_is_read_from_the_dockerfile() {
    assert_eq!(image_uid("FROM x\nUSER 10001:10001\n"), 10001);
    assert_eq!(image_uid("USER 0\nRUN x\nUSER 42\n"), 42);
}

mod controls {
    //! Negative controls: each mutation of the shipped manifests (or of the
    //! config read from them) must be flagged.

    use super::*;

    /// The shipped manifests with `from` replaced by `to` in `file`.
    fn mutated(file: &str, from: &str, to: &str) -> Vec<(String, String)> {
        let mut files = shipped();
        let (_, text) = files
            .iter_mut()
            .find(|(name, _)| name == file)
            .unwrap_or_else(|| panic!("no {file}"));
        assert!(
            text.contains(from),
            "{file} has no {from:?}: update the control"
        );
        *text = text.replace(from, to);
        files
    }

    fn flagged(files: &[(String, String)], gw: Option<Gateway>, expect: &str) {
        let docs = ok(parse_all(files));
        let gw = gw.unwrap_or_else(|| ok(gateway_toml(&docs).and_then(|t| gateway_of(&t))));
        let found = problems(&docs, &gw, dockerfile_uid());
        assert!(
            found.iter().any(|p| p.contains(expect)),
            "expected a problem mentioning {expect:?}, got {found:?}"
        );
    }

    fn shipped_gateway() -> Gateway {
        let docs = ok(parse_all(&shipped()));
        ok(gateway_toml(&docs).and_then(|t| gateway_of(&t)))
    }

    #[test]
    fn each_mutation_is_flagged() {
        let d = "deployment.yaml";
        let cases = [
            (
                d,
                "path: /readyz",
                "path: /healthz-typo",
                "readinessProbe path",
            ),
            (
                d,
                "path: /healthz\n              port: admin\n            periodSeconds: 10",
                "path: /readyz\n              port: admin\n            periodSeconds: 10",
                "livenessProbe path",
            ),
            (
                d,
                "terminationGracePeriodSeconds: 45",
                "terminationGracePeriodSeconds: 36",
                "terminationGracePeriodSeconds 36",
            ),
            (d, "seconds: 5", "seconds: 15", "preStop sleep 15s"),
            (
                d,
                "containerPort: 9090",
                "containerPort: 9091",
                "admin_listen port 9090",
            ),
            (
                d,
                "containerPort: 8080",
                "containerPort: 80",
                "listen port 8080",
            ),
            (d, "runAsUser: 10001", "runAsUser: 1000", "runAsUser"),
            (
                d,
                "runAsNonRoot: true",
                "runAsNonRoot: false",
                "runAsNonRoot",
            ),
            (
                d,
                "readOnlyRootFilesystem: true",
                "readOnlyRootFilesystem: false",
                "readOnlyRootFilesystem",
            ),
            (
                d,
                "allowPrivilegeEscalation: false",
                "allowPrivilegeEscalation: true",
                "allowPrivilegeEscalation",
            ),
            (d, "drop: [\"ALL\"]", "drop: [\"NET_RAW\"]", "drop ALL"),
            (
                d,
                "value: /etc/idemgate/gateway.toml",
                "value: /etc/idemgate/config.toml",
                "IDEMGATE_CONFIG",
            ),
            (
                d,
                "path: gateway.toml",
                "path: idemgate.toml",
                "IDEMGATE_CONFIG",
            ),
            (
                d,
                "- name: DATABASE_URL",
                "- name: DATABASE_URI",
                "${DATABASE_URL}",
            ),
            (
                d,
                "secretKeyRef:\n                  name: idemgate\n                  key: database-url",
                "configMapKeyRef:\n                  name: idemgate\n                  key: database-url",
                "DATABASE_URL does not come from a secretKeyRef",
            ),
            (d, "replicas: 2", "replicas: 1", "replicas 1"),
            (
                "service.yaml",
                "targetPort: admin",
                "targetPort: 9091",
                "admin port 9090",
            ),
            (
                "service.yaml",
                "targetPort: http",
                "targetPort: admin",
                "proxy port 8080",
            ),
            (
                "service.yaml",
                "app.kubernetes.io/component: gateway\n  ports",
                "app.kubernetes.io/component: worker\n  ports",
                "Service's selector",
            ),
            (
                "servicemonitor.yaml",
                "port: admin",
                "port: metrics",
                "scrapes /metrics",
            ),
            (
                "servicemonitor.yaml",
                "path: /metrics",
                "path: /stats",
                "scrapes /metrics",
            ),
            (
                "pdb.yaml",
                "minAvailable: 1",
                "minAvailable: 2",
                "minAvailable",
            ),
            (
                "configmap.yaml",
                "url = \"${DATABASE_URL}\"",
                "url = \"${DATABASE_URL:-sqlite://idemgate.db}\"",
                "[store] url",
            ),
            (
                "configmap.yaml",
                "admin_listen = \"0.0.0.0:9090\"",
                "admin_listen = \"127.0.0.1:9090\"",
                "pod IP",
            ),
        ];
        for (file, from, to, expect) in cases {
            flagged(&mutated(file, from, to), None, expect);
        }
    }

    #[test]
    fn a_longer_drain_needs_a_longer_grace_period() {
        let gw = Gateway {
            shutdown_timeout: defaults::DEFAULT_SHUTDOWN_TIMEOUT,
            ..shipped_gateway()
        };
        flagged(&shipped(), Some(gw), "terminationGracePeriodSeconds");
    }

    #[test]
    fn a_committed_secret_is_flagged() {
        let mut files = shipped();
        files.push((
            "secret.yaml".to_owned(),
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: idemgate\nstringData:\n  admin-token: x\n"
                .to_owned(),
        ));
        flagged(&files, None, "Secret is committed");
    }

    #[test]
    fn a_variable_the_container_does_not_set_is_flagged() {
        let gw = Gateway {
            required_vars: BTreeSet::from(["UPSTREAM_URL".to_owned()]),
            ..shipped_gateway()
        };
        flagged(&shipped(), Some(gw), "${UPSTREAM_URL}");
    }

    #[test]
    fn a_parse_error_is_an_error() {
        let files = mutated("service.yaml", "ports:", "ports: [");
        let err = parse_all(&files).err().expect("broken YAML parsed");
        assert!(err.starts_with("service.yaml:"), "{err}");
    }

    #[test]
    fn absent_keys_take_the_gateway_defaults() {
        let gw = gateway_of("[store]\nurl = \"${DATABASE_URL}\"\n").unwrap();
        assert_eq!(gw.listen, defaults::DEFAULT_LISTEN);
        assert_eq!(gw.admin_listen, defaults::DEFAULT_ADMIN_LISTEN);
        assert_eq!(gw.shutdown_timeout, defaults::DEFAULT_SHUTDOWN_TIMEOUT);
        assert_eq!(gw.store_timeout, defaults::DEFAULT_STORE_TIMEOUT);
        assert_eq!(
            gw.required_vars,
            BTreeSet::from(["DATABASE_URL".to_owned()])
        );
    }
}

/// The `cargo build` commands of `text` that build the binary together
/// with an example (or every target): resolver 2 then gives the binary
/// the dev-dependencies' features, the test-only failpoints among them,
/// and a `FAILPOINTS` variable could abort the shipped gateway.
fn binaries_built_with_test_features(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| line.contains("cargo build"))
        .filter(|line| {
            let with_dev = ["--example", "--examples", "--all-targets", "--tests"]
                .iter()
                .any(|flag| line.contains(flag));
            let binary = line.contains("--bin idemgate") || !line.contains("--example");
            with_dev && binary
        })
        .map(str::to_string)
        .collect()
}

/// The image and the benchmarks build the shipped binary on its own.
#[test]
fn release_binaries_are_built_without_test_features() {
    let root = repo_root();
    let mut found = Vec::new();
    for file in [
        "Dockerfile",
        "bench/run.sh",
        "bench/memory.sh",
        "docker/smoke.sh",
    ] {
        let Ok(text) = std::fs::read_to_string(root.join(file)) else {
            continue;
        };
        for line in binaries_built_with_test_features(&text) {
            found.push(format!("{file}: {}", line.trim()));
        }
    }
    assert!(found.is_empty(), "{found:#?}");
    // Negative control: the command this test was written after is flagged.
    let mixed = "cargo build --release --locked --bin idemgate --example demo_upstream";
    assert_eq!(binaries_built_with_test_features(mixed).len(), 1);
    let alone = "cargo build --release --locked --example demo_upstream";
    assert!(binaries_built_with_test_features(alone).is_empty());
}
