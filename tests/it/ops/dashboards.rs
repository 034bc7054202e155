//! The Grafana dashboard (deploy/grafana/idemgate.json) and the Prometheus
//! alerts (deploy/prometheus/alerts.yml) query only metrics the gateway
//! really exports: a real gateway is scraped, the sample names its
//! `/metrics` can carry are derived from its `# TYPE` lines (and from its
//! registry's, for families written only after a rare event), and every
//! metric an expression selects must be one of them (or an external name,
//! such as Prometheus's own `up`). A renamed metric fails here rather than
//! leaving an empty panel or an alert that can never fire.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

use idemgate::metrics::{LostClaimLabels, Metrics, RenewalLabels, ShadowLabels, WakeupLabels};
use idemgate::store::FrontStats;

use crate::support::{Backend, Setup, post, send};

/// Names an expression may select that idemgate does not export.
const EXTERNAL: &[&str] = &["up"];

/// Metrics the dashboard must show (each in at least one expression).
const DASHBOARD_MUST_SHOW: &[&str] = &[
    "idemgate_requests_total",
    "idemgate_upstream_duration_seconds_bucket",
    "idemgate_store_duration_seconds_bucket",
    "idemgate_store_duration_seconds_count",
    "idemgate_store_pool_connections",
    "idemgate_forwards_in_flight",
    "idemgate_waiting",
    "idemgate_lease_takeovers_total",
    "idemgate_orphaned_claims_total",
    "idemgate_replay_cache_hits_total",
    "idemgate_log_lines_dropped_total",
    "idemgate_front_up",
];

/// PromQL words that are not metrics: operators, modifiers, and the
/// aggregations (which may be followed by `by (…)` rather than by `(`).
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// Words followed by a list of label names, not by an expression.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_file(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The sample names a metrics text can carry, from its `# TYPE` lines
/// (counters `_total`, histograms `_bucket`/`_sum`/`_count`, the rest bare),
/// so that a family with no sample yet (no label set seen) still counts.
fn exported_names(metrics: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            panic!("malformed TYPE line: {line}");
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            "summary" => &["", "_sum", "_count"],
            _ => &[""],
        };
        for suffix in suffixes {
            if kind == "counter" && name.ends_with("_total") {
                names.insert(name.to_string());
            } else {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// The names of the samples actually present in a metrics text.
fn sample_names(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect()
}

/// Every `idemgate_…` identifier in `expr`, wherever it appears (a quoted
/// label value included: a metric name there is a mistake too).
fn idemgate_identifiers(expr: &str) -> Vec<String> {
    let bytes = expr.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut out = Vec::new();
    let mut k = 0;
    while let Some(at) = expr[k..].find("idemgate_") {
        let start = k + at;
        let mut end = start + "idemgate_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        if start == 0 || !ident(bytes[start - 1]) {
            out.push(expr[start..end].to_string());
        }
        k = end;
    }
    out
}

/// The metric names a PromQL expression selects: identifiers outside
/// strings, label matchers (`{…}`), ranges (`[…]`) and label lists (`by
/// (…)`), that are not functions (followed by `(`), keywords, numbers or
/// Grafana variables (`$route`, `$__rate_interval`).
fn selected_metrics(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let is_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let is_part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = Vec::new();
    let mut k = 0;
    while k < chars.len() {
        let c = chars[k];
        match c {
            '"' | '\'' | '`' => k = skip_string(&chars, k),
            '{' => k = skip_group(&chars, k, '{', '}'),
            '[' => k = skip_group(&chars, k, '[', ']'),
            '$' => {
                k += 1;
                while k < chars.len() && is_part(chars[k]) {
                    k += 1;
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                while k < chars.len() && (is_part(chars[k]) || chars[k] == '.') {
                    k += 1;
                }
            }
            c if is_start(c) => {
                let start = k;
                while k < chars.len() && is_part(chars[k]) {
                    k += 1;
                }
                let word: String = chars[start..k].iter().collect();
                let mut next = k;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                let call = chars.get(next) == Some(&'(');
                if word == "label_values" && call {
                    // Grafana's `label_values(selector, label)`: the last
                    // argument names a label.
                    let end = skip_group(&chars, next, '(', ')');
                    let inner: String = chars[next + 1..end.max(next + 2) - 1].iter().collect();
                    let selector = inner.rsplit_once(',').map_or("", |(s, _)| s);
                    out.extend(selected_metrics(selector));
                    k = end;
                } else if LABEL_LISTS.contains(&word.as_str()) {
                    if call {
                        k = skip_group(&chars, next, '(', ')');
                    }
                } else if !call && !KEYWORDS.contains(&word.to_ascii_lowercase().as_str()) {
                    out.push(word);
                }
            }
            _ => k += 1,
        }
    }
    out
}

/// The index just past the string opened at `open`.
fn skip_string(chars: &[char], open: usize) -> usize {
    let quote = chars[open];
    let mut k = open + 1;
    while k < chars.len() {
        match chars[k] {
            '\\' if quote != '`' => k += 2,
            c if c == quote => return k + 1,
            _ => k += 1,
        }
    }
    k
}

/// The index just past the group opened at `open` (strings inside skipped).
fn skip_group(chars: &[char], open: usize, left: char, right: char) -> usize {
    let mut depth = 0;
    let mut k = open;
    while k < chars.len() {
        match chars[k] {
            '"' | '\'' | '`' => {
                k = skip_string(chars, k);
                continue;
            }
            c if c == left => depth += 1,
            c if c == right => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
        k += 1;
    }
    k
}

/// What is wrong with the metrics `expr` names, given the `exported`
/// sample names: each unknown name once.
fn unknown_metrics(expr: &str, exported: &BTreeSet<String>) -> Vec<String> {
    let mut unknown = BTreeSet::new();
    for name in idemgate_identifiers(expr) {
        if !exported.contains(&name) {
            unknown.insert(name);
        }
    }
    for name in selected_metrics(expr) {
        if !exported.contains(&name) && !EXTERNAL.contains(&name.as_str()) {
            unknown.insert(name);
        }
    }
    unknown.into_iter().collect()
}

/// Every panel of a dashboard, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn visit<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
        if let Some(list) = v.get("panels").and_then(Value::as_array) {
            for panel in list {
                out.push(panel);
                visit(panel, out);
            }
        }
    }
    let mut out = Vec::new();
    visit(dashboard, &mut out);
    out
}

/// Every PromQL expression of the dashboard: its panels' `targets[].expr`
/// and its templating variables' queries, as `(where, expr)`.
fn dashboard_exprs(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("panel {title:?}: a target without expr"));
            out.push((format!("panel {title:?}"), expr.to_string()));
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] != "query" {
            continue;
        }
        let query = match &var["query"] {
            Value::String(s) => s.as_str(),
            q => q["query"].as_str().unwrap_or(""),
        };
        out.push((format!("variable {}", var["name"]), query.to_string()));
    }
    out
}

/// The rules of an alerts file, after checking each has what an alert
/// needs: `(alert, expr)`.
fn alert_rules(doc: &Yaml) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let groups = doc["groups"].as_vec().expect("a `groups:` list");
    assert!(!groups.is_empty(), "no rule groups");
    for group in groups {
        let name = group["name"].as_str().expect("every group has a name");
        for rule in group["rules"].as_vec().expect("every group has rules") {
            let alert = rule["alert"]
                .as_str()
                .unwrap_or_else(|| panic!("group {name}: a rule without `alert`"));
            let expr = rule["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{alert}: no `expr`"));
            assert!(rule["for"].as_str().is_some(), "{alert}: no `for`");
            let severity = rule["labels"]["severity"].as_str();
            assert!(
                matches!(severity, Some("critical" | "warning" | "info")),
                "{alert}: labels.severity is {severity:?}"
            );
            for key in ["summary", "description"] {
                assert!(
                    rule["annotations"][key]
                        .as_str()
                        .is_some_and(|s| !s.trim().is_empty()),
                    "{alert}: no annotations.{key}"
                );
            }
            out.push((alert.to_string(), expr.to_string()));
        }
    }
    out
}

/// A real gateway's metric names, after a forward, a replay, a mismatch, a
/// request without a key and an unrouted one, so that labelled families
/// have samples too.
async fn live_names() -> BTreeSet<String> {
    let s = Setup::start(Backend::Memory).await;
    let (gateway, c) = (&s.gateway, &s.client);
    let url = gateway.url("/v1/payments");
    post(c, &url, "d1", "{}").await;
    post(c, &url, "d1", "{}").await;
    post(c, &url, "d1", "{\"other\":1}").await;
    send(c, "POST", &url, &[], "{}").await;
    send(c, "GET", &gateway.url("/nowhere"), &[], "").await;
    let metrics = gateway.metrics().await;
    let names = exported_names(&metrics);
    // The naming rule above agrees with what the gateway really writes.
    let present = sample_names(&metrics);
    assert!(
        present.is_subset(&names),
        "samples not derived from a TYPE line: {:?}\n{metrics}",
        present.difference(&names).collect::<Vec<_>>()
    );
    for name in [
        "idemgate_requests_total",
        "idemgate_upstream_duration_seconds_bucket",
        "idemgate_store_duration_seconds_count",
        "idemgate_replay_cache_hits_total",
        "idemgate_log_lines_dropped_total",
    ] {
        assert!(present.contains(name), "{name} has no sample\n{metrics}");
    }
    names
}

/// Every name the gateway's registry ([`Metrics`]) can write. A family
/// with no label set yet is not written at all, not even its `# TYPE`, and
/// some get one only on a rare event (a lost claim, a fenced renewal, a
/// shadow route, a Redis front, a status inquiry, a sealed replay or one
/// that did not open): here each labelled
/// family is given one.
fn registry_names() -> BTreeSet<String> {
    let m = Metrics::new();
    m.for_route("api", &["forwarded"]).request(0);
    m.store_op("claim", "ok", Duration::ZERO);
    m.wait_wakeups
        .get_or_create(&WakeupLabels { cause: "poll" })
        .inc();
    m.lease_renewals
        .get_or_create(&RenewalLabels {
            route: "api".into(),
            result: "fenced",
        })
        .inc();
    m.orphaned_claims
        .get_or_create(&LostClaimLabels {
            route: "api".into(),
            result: "gave_up",
        })
        .inc();
    m.shadow
        .get_or_create(&ShadowLabels {
            route: "api".into(),
            would: "replay",
        })
        .inc();
    m.front.scrape(&FrontStats::default());
    m.inquiries.count("api", "gave_up");
    let record = idemgate::store::RecordKey {
        route: "api".into(),
        scope: Vec::new(),
        key: "k".into(),
    };
    m.sealing.opened(&record, Ok(Some("k1")));
    let unknown = idemgate::store::seal::OpenError::UnknownKey("k0".into());
    m.sealing.opened(&record, Err(&unknown));
    exported_names(&m.encode())
}

#[tokio::test]
async fn dashboard_and_alerts_query_only_exported_metrics() {
    let live = live_names().await;
    let every = registry_names();
    // One registry: the live gateway wrote no family it does not hold.
    assert!(
        live.is_subset(&every),
        "not in the registry: {:?}",
        live.difference(&every).collect::<Vec<_>>()
    );
    let exported: BTreeSet<String> = live.union(&every).cloned().collect();

    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/idemgate.json"))
        .expect("deploy/grafana/idemgate.json is JSON");
    let mut checked = dashboard_exprs(&dashboard);
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating variables")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(
        variables.contains(&"datasource") && variables.contains(&"route"),
        "{variables:?}"
    );
    let ids: Vec<_> = panels(&dashboard).iter().map(|p| p["id"].clone()).collect();
    let unique: BTreeSet<String> = ids.iter().map(Value::to_string).collect();
    assert_eq!(unique.len(), ids.len(), "panel ids repeat: {ids:?}");
    let shown: BTreeSet<String> = checked
        .iter()
        .flat_map(|(_, e)| idemgate_identifiers(e))
        .collect();
    for name in DASHBOARD_MUST_SHOW {
        assert!(shown.contains(*name), "the dashboard does not show {name}");
    }
    assert!(checked.len() >= 20, "{} expressions", checked.len());

    let alerts = YamlLoader::load_from_str(&read("deploy/prometheus/alerts.yml"))
        .expect("deploy/prometheus/alerts.yml is YAML");
    assert_eq!(alerts.len(), 1, "one YAML document");
    let rules = alert_rules(&alerts[0]);
    let names: Vec<&str> = rules.iter().map(|(a, _)| a.as_str()).collect();
    for needed in [
        "IdemgateDown",
        "IdemgateStoreUnavailable",
        "IdemgateHeldKeys",
        "IdemgateHighErrorRatio",
        "IdemgateLogLinesDropped",
    ] {
        assert!(names.contains(&needed), "no {needed} alert in {names:?}");
    }
    checked.extend(rules.into_iter().map(|(a, e)| (format!("alert {a}"), e)));

    let wrong: Vec<String> = checked
        .iter()
        .filter_map(|(place, expr)| {
            let unknown = unknown_metrics(expr, &exported);
            (!unknown.is_empty()).then(|| format!("{place}: {unknown:?} in {expr}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "metrics the gateway does not export:\n{}",
        wrong.join("\n")
    );
}

/// Negative controls: the checks flag what they must, on fabricated input.
mod controls {
    use super::*;

    const METRICS: &str = "\
# HELP idemgate_requests Requests by route and outcome.
# TYPE idemgate_requests counter
idemgate_requests_total{route=\"api\",outcome=\"forwarded\"} 1
# TYPE idemgate_store_duration_seconds histogram
idemgate_store_duration_seconds_count{op=\"claim\",result=\"ok\"} 1
# TYPE idemgate_waiting gauge
idemgate_waiting 0
# EOF
";

    fn exported() -> BTreeSet<String> {
        exported_names(METRICS)
    }

    #[test]
    fn names_follow_the_kind() {
        let names = exported();
        for name in [
            "idemgate_requests_total",
            "idemgate_store_duration_seconds_bucket",
            "idemgate_store_duration_seconds_sum",
            "idemgate_store_duration_seconds_count",
            "idemgate_waiting",
        ] {
            assert!(names.contains(name), "{name} in {names:?}");
        }
        assert!(!names.contains("idemgate_requests"));
        assert!(!names.contains("idemgate_store_duration_seconds"));
    }

    #[test]
    fn a_misspelt_metric_is_flagged() {
        let expr =
            r#"sum by (outcome) (rate(idemgate_request_total{route=~"$route"}[$__rate_interval]))"#;
        assert_eq!(
            unknown_metrics(expr, &exported()),
            ["idemgate_request_total"]
        );
        // A bare histogram name selects nothing: its samples are suffixed.
        let expr = "rate(idemgate_store_duration_seconds[5m])";
        assert_eq!(
            unknown_metrics(expr, &exported()),
            ["idemgate_store_duration_seconds"]
        );
        // A metric of another exporter, not declared external.
        assert_eq!(
            unknown_metrics("process_resident_memory_bytes > 1e9", &exported()),
            ["process_resident_memory_bytes"]
        );
    }

    #[test]
    fn a_correct_expression_passes() {
        let exprs = [
            r#"histogram_quantile(0.99, sum by (le, op) (rate(idemgate_store_duration_seconds_bucket{result="ok"}[$__rate_interval])))"#,
            r#"sum without (instance) (rate(idemgate_requests_total{outcome=~"store_error|held"}[5m])) / ignoring (outcome) group_left sum(rate(idemgate_requests_total[5m])) > 0.05"#,
            r#"up{job=~".*idemgate.*"} == 0 or idemgate_waiting offset 5m > bool 1e3"#,
            "label_values(idemgate_requests_total, route)",
        ];
        for expr in exprs {
            assert!(
                unknown_metrics(expr, &exported()).is_empty(),
                "{expr}: {:?}",
                unknown_metrics(expr, &exported())
            );
        }
    }

    #[test]
    fn label_values_and_lists_are_not_metrics() {
        let expr = r#"sum by (idemgate_x) (idemgate_waiting{a="b}c", d='e'}) and on (f) vector(1)"#;
        assert_eq!(selected_metrics(expr), ["idemgate_waiting"]);
        // …but a metric name quoted as a label value is still caught.
        assert_eq!(
            idemgate_identifiers(r#"x{name="idemgate_nope"}"#),
            ["idemgate_nope"]
        );
    }
}
