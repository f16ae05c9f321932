//! The Grafana dashboards of `dashboards/` and the alerting rules of
//! `deploy/compose/alerts.yml` ask only for metrics that exist.
//!
//! Every PromQL expression (each panel target's `expr`, each template
//! variable's query, each rule's `expr`) is tokenized and its metric names
//! taken out: identifiers that are not followed by `(` (functions and
//! aggregations), that are not keywords, and that are not inside `{...}`
//! (label matchers), `[...]` (ranges) or the label lists of `by`,
//! `without`, `on`, `ignoring`, `group_left` and `group_right`. Each name
//! must be one the real exporters expose:
//!
//! - toolfleet: a real `toolfleet serve` (the embedded default), its
//!   `/metrics` after a call and a job;
//! - RabbitMQ: the RabbitMQ of this machine, its `rabbitmq_prometheus`
//!   plugin (port 15692, or `TOOLFLEET_TEST_RABBITMQ_METRICS_URL`) scraped
//!   at the paths and parameters `deploy/compose/prometheus.yml` uses.
//!   `.ci/run` enables the plugin. Without it the RabbitMQ names are left
//!   unchecked, except under CI (`CI` set), where the test fails.
//!
//! The labels a query names for a toolfleet metric, in its matchers, in
//! `by` and `without` (for the metrics whose labels the aggregation keeps)
//! and as the label a `label_values` variable lists, must be labels that
//! metric shows in the scripted run's exposition, or `instance` and `job`,
//! which Prometheus gives every series. Each fixed `queue` regex must select
//! one kind of the queues the broker names (`toolfleet_broker::rabbit`):
//! every pool queue and nothing else, or every dead-letter queue, and so on.
//!
//! The dashboards are also checked for Grafana's JSON model: the schema
//! version of the Grafana of `docker-compose.yml`, a `datasource` template
//! variable that every panel, target and query variable uses, resolving to
//! the provisioned Prometheus, `instance` variables of the dashboard's roles
//! from `toolfleet_build_info`, unique uids and panel ids.

mod common;

use common::promql::{
    MatchOp, Matcher, exposition_labels, exposition_names, metric_names, prometheus_regex,
    variable_metric_names, variable_query_parts, walk,
};
use common::{read_repo as read, repo};

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;
use toolfleet_broker::rabbit::{
    dead_letter_queue_name, delay_bucket, delay_queue_name, pool_queue_name,
};
use toolfleet_core::metrics::Role;
use yaml_rust2::{Yaml, YamlLoader};

/// The Grafana image of docker-compose.yml and the dashboard schema version
/// it writes: bump both together.
const GRAFANA_IMAGE: &str = "grafana/grafana:11.6.";
const SCHEMA_VERSION: u64 = 41;
/// The data source reference every panel, target and query variable uses.
const DATASOURCE_REF: &str = "${datasource}";
/// Where RabbitMQ's Prometheus plugin answers on this machine.
const RABBITMQ_METRICS: &str = "http://127.0.0.1:15692";
/// The compose service and port that prometheus.yml scrapes RabbitMQ on.
const RABBITMQ_TARGET: &str = "rabbitmq:15692";

fn yaml(relative: &str) -> Yaml {
    let mut docs = YamlLoader::load_from_str(&read(relative))
        .unwrap_or_else(|e| panic!("{relative} is not YAML: {e}"));
    assert_eq!(docs.len(), 1, "{relative}: one YAML document");
    docs.remove(0)
}

/// Every `dashboards/*.json`: file name and dashboard.
fn dashboards() -> Vec<(String, Value)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(repo().join("dashboards")).expect("dashboards/") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            let dashboard =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
            found.push((name, dashboard));
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!found.is_empty(), "dashboards/ holds dashboards");
    found
}

/// Every panel of a dashboard, those inside collapsed rows too.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        all.push(panel);
        for inner in panel["panels"].as_array().into_iter().flatten() {
            all.push(inner);
        }
    }
    all
}

fn variables(dashboard: &Value) -> &Vec<Value> {
    dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
}

/// The query of a template variable: its `query` string, or the `query` of
/// its query object.
fn variable_query(variable: &Value) -> Option<&str> {
    variable["query"]
        .as_str()
        .or_else(|| variable["query"]["query"].as_str())
}

/// One PromQL expression to check, and where it is.
struct Query {
    place: String,
    expr: String,
    /// Grafana's variable query functions (`label_values(...)`) are allowed.
    variable: bool,
}

/// Every query of the dashboards and of the alerting rules.
fn queries() -> Vec<Query> {
    let mut all = Vec::new();
    for (file, dashboard) in dashboards() {
        for panel in panels(&dashboard) {
            for target in panel["targets"].as_array().into_iter().flatten() {
                all.push(Query {
                    place: format!(
                        "{file}: panel {} `{}` target {}",
                        panel["id"], panel["title"], target["refId"]
                    ),
                    expr: target["expr"]
                        .as_str()
                        .unwrap_or_else(|| {
                            panic!("{file}: panel {} has a target without expr", panel["id"])
                        })
                        .to_owned(),
                    variable: false,
                });
            }
        }
        for variable in variables(&dashboard) {
            if variable["type"] == "query" {
                let query = variable_query(variable).unwrap_or_else(|| {
                    panic!("{file}: variable {} has no query", variable["name"])
                });
                all.push(Query {
                    place: format!("{file}: variable {}", variable["name"]),
                    expr: query.to_owned(),
                    variable: true,
                });
            }
        }
    }
    let rules = yaml("deploy/compose/alerts.yml");
    for group in rules["groups"].as_vec().expect("alerts.yml: groups") {
        for rule in group["rules"].as_vec().expect("alerts.yml: rules") {
            let name = rule["alert"]
                .as_str()
                .or_else(|| rule["record"].as_str())
                .expect("a rule is an alert or a record");
            all.push(Query {
                place: format!("alerts.yml: {name}"),
                expr: rule["expr"].as_str().expect("a rule's expr").to_owned(),
                variable: false,
            });
        }
    }
    all
}

#[test]
fn promql_metric_names_are_told_from_everything_else() {
    let names = |expr: &str| -> Vec<String> {
        metric_names(expr)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .collect()
    };
    assert_eq!(names("up"), ["up"]);
    assert_eq!(names("count without (a) (b) + max by (c) (d)"), ["b", "d"]);
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (le, tool) (rate(a_seconds_bucket{tool=~"$tool", instance!="x"}[$__rate_interval])))"#
        ),
        ["a_seconds_bucket"]
    );
    assert_eq!(
        names(
            "sum(rate(a_total[5m])) by (tool) / ignoring(state) group_left(version) sum without (x) (b_total offset 1h)"
        ),
        ["a_total", "b_total"]
    );
    assert_eq!(
        names(
            r#"sum by (queue) (q{queue=~".*[.]pool[.].*"}) > 0 and on (queue) sum by (queue) (c) == bool 0 unless d"#
        ),
        ["c", "d", "q"]
    );
    assert_eq!(
        names("max_over_time(g[1h:5m]) * 1e-3 + 0x1f - .5 or absent(h) or vector(1) > Inf"),
        ["g", "h"]
    );
    assert_eq!(
        names("rate(x_total[${__rate_interval}]) / on() group_right t_info @ end()"),
        ["t_info", "x_total"]
    );
    assert_eq!(
        names("a:recorded:rate5m # a comment naming b"),
        ["a:recorded:rate5m"]
    );
    assert_eq!(
        names(r#"label_replace(m, "dst", "$1", "src", "(.*)")"#),
        ["m"]
    );
    for bad in [
        "rate(x[5m]",
        "sum(x))",
        "x{a=\"b\"",
        r#"{__name__="x"}"#,
        "histogram_quantil(0.9, x)",
        "\"open",
    ] {
        assert!(metric_names(bad).is_err(), "`{bad}` is refused");
    }

    let variable = |query: &str| -> Vec<String> {
        variable_metric_names(query)
            .unwrap_or_else(|e| panic!("{e}"))
            .into_iter()
            .collect()
    };
    assert_eq!(variable("label_values(m_total, tool)"), ["m_total"]);
    assert_eq!(
        variable(r#"label_values(s{pool=~"$pool"}, instance)"#),
        ["s"]
    );
    assert!(variable("label_values(instance)").is_empty());
    assert_eq!(variable("query_result(sum by (x) (y))"), ["y"]);
    assert!(variable_metric_names("metrics(toolfleet_.*)").is_err());
}

#[test]
fn promql_matchers_and_groupings_are_found() {
    let walked = |expr: &str| walk(expr).unwrap_or_else(|e| panic!("{e}"));
    let selectors = walked(
        r#"sum by (queue) (q{queue=~".*[.]pool[.].*", instance!="a\"b", tool=~"$tool",}) and on (queue) c{job="x", state!~"ok|running"}"#,
    )
    .selectors()
    .unwrap_or_else(|e| panic!("{e}"));
    let matcher = |label: &str, op, value: Option<&str>| Matcher {
        label: label.into(),
        op,
        value: value.map(Into::into),
    };
    assert_eq!(
        selectors,
        [
            (
                "q".to_owned(),
                vec![
                    matcher("queue", MatchOp::Regex, Some(".*[.]pool[.].*")),
                    matcher("instance", MatchOp::NotEqual, Some("a\"b")),
                    matcher("tool", MatchOp::Regex, None),
                ]
            ),
            (
                "c".to_owned(),
                vec![
                    matcher("job", MatchOp::Equal, Some("x")),
                    matcher("state", MatchOp::NotRegex, Some("ok|running")),
                ]
            ),
        ]
    );
    let groupings = |expr: &str| -> Vec<(Vec<String>, Vec<String>)> {
        walked(expr)
            .groupings()
            .into_iter()
            .map(|g| (g.labels, g.metrics.into_iter().collect()))
            .collect()
    };
    let strings = |items: &[&str]| -> Vec<String> { items.iter().map(|s| s.to_string()).collect() };
    assert_eq!(
        groupings(
            "histogram_quantile(0.99, sum by (le, tool) (rate(a_bucket{tool=~\"$tool\"}[5m])))"
        ),
        [(strings(&["le", "tool"]), strings(&["a_bucket"]))]
    );
    assert_eq!(
        groupings("sum(rate(a_total[5m])) without (x) / count(b) by (instance)"),
        [
            (strings(&["x"]), strings(&["a_total"])),
            (strings(&["instance"]), strings(&["b"])),
        ]
    );
    // The right-hand operands of `and` and `unless` give no labels; `or`'s do.
    assert_eq!(
        groupings("count by (pool) (a and on (instance) b or c unless d)"),
        [(strings(&["pool"]), strings(&["a", "c"]))]
    );
    assert_eq!(
        groupings("max by (state) (abs(x and y))"),
        [(strings(&["state"]), strings(&["x"]))]
    );
    assert!(groupings("sum(x) + count(y)").is_empty());

    let parts = |query: &'static str| variable_query_parts(query).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        parts(r#"label_values(m{role=~"a|b"}, instance)"#),
        (Some(r#"m{role=~"a|b"}"#), Some("instance"))
    );
    assert_eq!(parts("label_values(tool)"), (None, Some("tool")));
    assert_eq!(parts("query_result(sum(y))"), (Some("sum(y)"), None));
}

// ---------------------------------------------------------------- exporters

#[test]
fn exposition_names_follow_the_format() {
    // prometheus-client's OpenMetrics: a counter's family has no `_total`.
    let openmetrics = "\
# HELP t_calls Calls.
# TYPE t_calls counter
t_calls_total{tool=\"a\"} 1
# TYPE t_wait_seconds histogram
# TYPE t_slots gauge
# TYPE t_build info
t_build_info{version=\"1\"} 1
# EOF
";
    let names: Vec<String> = exposition_names(openmetrics, true).into_iter().collect();
    assert_eq!(
        names,
        [
            "t_build_info",
            "t_calls_total",
            "t_slots",
            "t_wait_seconds_bucket",
            "t_wait_seconds_count",
            "t_wait_seconds_sum",
        ]
    );
    // The classic text format (RabbitMQ's): a counter's family is its series.
    let text = "\
# TYPE r_received_total counter
# TYPE r_ready gauge
r_ready{queue=\"q\"} 0
# TYPE r_scrape summary
";
    let names: Vec<String> = exposition_names(text, false).into_iter().collect();
    assert_eq!(
        names,
        [
            "r_ready",
            "r_received_total",
            "r_scrape",
            "r_scrape_count",
            "r_scrape_sum",
        ]
    );
}

#[test]
fn exposition_labels_are_read_from_the_samples() {
    let text = "\
# TYPE t_calls counter
t_calls_total{tool=\"a,b=\\\"c\\\"\",outcome=\"ok\"} 1
t_calls_total{tool=\"x\",reason=\"y\"} 1
t_wait_seconds_bucket{le=\"0.5\",tool=\"a\"} 0
t_abandoned_total 0
# EOF
";
    let labels = exposition_labels(text);
    let of = |name: &str| -> Vec<&str> { labels[name].iter().map(String::as_str).collect() };
    assert_eq!(of("t_calls_total"), ["outcome", "reason", "tool"]);
    assert_eq!(of("t_wait_seconds_bucket"), ["le", "tool"]);
    assert!(of("t_abandoned_total").is_empty());
    assert_eq!(labels.len(), 3);
}

/// GETs an exposition and answers its series names.
async fn scrape(http: &reqwest::Client, url: &str) -> Result<BTreeSet<String>, String> {
    let response = http
        .get(url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let status = response.status();
    let openmetrics = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/openmetrics-text"));
    let text = response.text().await.map_err(|e| format!("{url}: {e}"))?;
    if !status.is_success() {
        return Err(format!("{url}: HTTP {status}: {text}"));
    }
    // The OpenMetrics format ends with `# EOF`, whatever the header says.
    let openmetrics = openmetrics || text.trim_end().ends_with("# EOF");
    Ok(exposition_names(&text, openmetrics))
}

/// What a real `toolfleet serve` exports, after the scripted run so that
/// every family has had its chance to show: its metric names, and the label
/// names of each series.
async fn toolfleet_exposition() -> (BTreeSet<String>, BTreeMap<String, BTreeSet<String>>) {
    // The run that moves every metric: a family with no sample is not shown.
    let run = common::scripted::scripted_run().await;
    let http = toolfleet_executors::http_client().expect("a client");
    let names = scrape(&http, &format!("{}/metrics", run.server.base))
        .await
        .unwrap_or_else(|e| panic!("toolfleet's /metrics: {e}"));
    assert!(
        names.iter().any(|n| n.starts_with("toolfleet_")),
        "toolfleet's /metrics names no toolfleet_ metric: {names:?}"
    );
    (names, exposition_labels(&run.scrape.text))
}

/// The URLs prometheus.yml scrapes RabbitMQ at, on `base` instead of the
/// compose service.
fn rabbitmq_urls(base: &str) -> Vec<String> {
    let config = yaml("deploy/compose/prometheus.yml");
    let mut urls = Vec::new();
    for job in config["scrape_configs"].as_vec().expect("scrape_configs") {
        let targets: Vec<&str> = job["static_configs"]
            .as_vec()
            .into_iter()
            .flatten()
            .flat_map(|s| s["targets"].as_vec().into_iter().flatten())
            .filter_map(Yaml::as_str)
            .collect();
        if !targets.contains(&RABBITMQ_TARGET) {
            continue;
        }
        let path = job["metrics_path"].as_str().unwrap_or("/metrics");
        let mut query = Vec::new();
        if let Some(params) = job["params"].as_hash() {
            for (key, values) in params {
                let key = key.as_str().expect("a parameter name");
                for value in values.as_vec().expect("a list of parameter values") {
                    query.push(format!("{key}={}", value.as_str().expect("a value")));
                }
            }
        }
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        urls.push(format!("{base}{path}{query}"));
    }
    assert!(
        !urls.is_empty(),
        "prometheus.yml scrapes RabbitMQ at {RABBITMQ_TARGET}"
    );
    urls
}

/// The metric names RabbitMQ of this machine exports where Prometheus
/// scrapes it; `None` (outside CI) when its plugin does not answer.
async fn rabbitmq_names(http: &reqwest::Client) -> Option<BTreeSet<String>> {
    let base = std::env::var("TOOLFLEET_TEST_RABBITMQ_METRICS_URL")
        .unwrap_or_else(|_| RABBITMQ_METRICS.to_owned());
    let mut names = BTreeSet::new();
    for url in rabbitmq_urls(base.trim_end_matches('/')) {
        match scrape(http, &url).await {
            Ok(found) => names.extend(found),
            Err(error) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "RabbitMQ's Prometheus plugin is required under CI (.ci/run enables \
                     rabbitmq_prometheus): {error}"
                );
                eprintln!("skipped: RabbitMQ's metric names are not checked: {error}");
                return None;
            }
        }
    }
    assert!(
        names.iter().any(|n| n.starts_with("rabbitmq_")),
        "RabbitMQ's plugin names no rabbitmq_ metric: {names:?}"
    );
    Some(names)
}

/// Labels Prometheus gives every series it scrapes.
const TARGET_LABELS: &[&str] = &["instance", "job"];

/// The labels `query` names for toolfleet metrics (in its matchers, in `by`
/// and `without`, and the label a `label_values` variable lists) checked
/// against those each metric shows in `exported`: how many were checked,
/// and one line for each the metric does not show.
fn unknown_labels(
    query: &Query,
    exported: &BTreeMap<String, BTreeSet<String>>,
) -> Result<(usize, Vec<String>), String> {
    let (expr, listed) = if query.variable {
        variable_query_parts(&query.expr)?
    } else {
        (Some(query.expr.as_str()), None)
    };
    let Some(expr) = expr else {
        return Ok((0, Vec::new()));
    };
    let walked = walk(expr)?;
    // (metric, label, where the query names it)
    let mut named: Vec<(String, String, &str)> = Vec::new();
    for (metric, matchers) in walked.selectors()? {
        for matcher in matchers {
            named.push((metric.clone(), matcher.label, "a matcher"));
        }
    }
    for grouping in walked.groupings() {
        for metric in &grouping.metrics {
            for label in &grouping.labels {
                named.push((metric.clone(), label.clone(), "by/without"));
            }
        }
    }
    if let Some(label) = listed {
        for metric in walked.names() {
            named.push((metric, label.to_owned(), "label_values"));
        }
    }
    let mut checked = 0;
    let mut unknown = Vec::new();
    for (metric, label, place) in named {
        if !metric.starts_with("toolfleet_") {
            continue;
        }
        checked += 1;
        if TARGET_LABELS.contains(&label.as_str()) {
            continue;
        }
        let shown = exported.get(&metric);
        if !shown.is_some_and(|labels| labels.contains(&label)) {
            unknown.push(format!(
                "{}: `{label}` ({place}) is no label of {metric}, which shows {:?}",
                query.place,
                shown.cloned().unwrap_or_default()
            ));
        }
    }
    Ok((checked, unknown))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_and_alerts_ask_only_for_exported_metrics() {
    let http = toolfleet_executors::http_client().expect("a client");
    let (toolfleet, toolfleet_labels) = toolfleet_exposition().await;
    let rabbitmq = rabbitmq_names(&http).await;

    let mut unknown: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut checked = 0;
    let mut labels_checked = 0;
    let mut bad_labels = Vec::new();
    for query in queries() {
        match unknown_labels(&query, &toolfleet_labels) {
            Ok((checked, bad)) => {
                labels_checked += checked;
                bad_labels.extend(bad);
            }
            Err(error) => errors.push(format!("{}: {error}", query.place)),
        }
        let names = if query.variable {
            variable_metric_names(&query.expr)
        } else {
            metric_names(&query.expr)
        };
        let names = match names {
            Ok(names) => names,
            Err(error) => {
                errors.push(format!("{}: {error}", query.place));
                continue;
            }
        };
        if names.is_empty() {
            errors.push(format!("{}: `{}` names no metric", query.place, query.expr));
        }
        for name in names {
            checked += 1;
            let known = if name.starts_with("toolfleet_") {
                toolfleet.contains(&name)
            } else {
                match &rabbitmq {
                    Some(rabbitmq) => rabbitmq.contains(&name),
                    // Unchecked outside CI without the plugin.
                    None => name.starts_with("rabbitmq_"),
                }
            };
            if !known {
                unknown.entry(name).or_default().push(query.place.clone());
            }
        }
    }
    assert!(
        errors.is_empty(),
        "unreadable queries:\n{}",
        errors.join("\n")
    );
    assert!(checked > 0, "no metric name was checked");
    let report: Vec<String> = unknown
        .iter()
        .map(|(name, places)| format!("{name}\n    in {}", places.join("\n    in ")))
        .collect();
    assert!(
        unknown.is_empty(),
        "{} metric names of the dashboards and alerts.yml are exported by neither toolfleet \
         nor RabbitMQ:\n{}\n(toolfleet exports: {:?})",
        unknown.len(),
        report.join("\n"),
        toolfleet
            .iter()
            .filter(|n| n.starts_with("toolfleet_"))
            .collect::<Vec<_>>()
    );
    assert!(
        labels_checked > 0,
        "no label of a toolfleet metric was checked"
    );
    assert!(
        bad_labels.is_empty(),
        "labels the dashboards and alerts.yml name that their toolfleet metric does not show \
         (every series has {TARGET_LABELS:?}):\n{}",
        bad_labels.join("\n")
    );
}

#[test]
fn queue_regexes_select_the_queues_the_broker_names() {
    // Every kind of queue the broker declares, under the default prefix and
    // a fleet's own, for a few pools: what RabbitMQ's `queue` label holds.
    let prefixes = ["toolfleet", "tf-0192f7c2a1b4"];
    let pools = ["default", "agents", "ocr-gpu"];
    let delays = [Duration::from_millis(1), Duration::from_secs(30)]
        .map(|d| u64::try_from(delay_bucket(d).as_millis()).expect("a delay"));
    let mut pool_queues = Vec::new();
    let mut dead = Vec::new();
    let mut delayed = Vec::new();
    for prefix in prefixes {
        for pool in pools {
            pool_queues.push(pool_queue_name(prefix, pool));
            dead.push(dead_letter_queue_name(prefix, pool));
            for ms in delays {
                delayed.push(delay_queue_name(prefix, pool, ms));
            }
        }
    }
    // An events subscriber's queue is server-named.
    let subscribers = vec!["amq.gen-8kUlyQ2u4VBmj0vUtRp1Zw".to_owned()];
    let kinds = [
        ("pool queues", pool_queues),
        ("dead-letter queues", dead),
        ("delay queues", delayed),
        ("event subscriber queues", subscribers),
    ];

    let mut checked = Vec::new();
    let mut wrong = Vec::new();
    for query in queries() {
        let expr = if query.variable {
            match variable_query_parts(&query.expr) {
                Ok((Some(expr), _)) => expr.to_owned(),
                _ => continue,
            }
        } else {
            query.expr.clone()
        };
        let walked = walk(&expr).unwrap_or_else(|e| panic!("{}: {e}", query.place));
        let selectors = walked
            .selectors()
            .unwrap_or_else(|e| panic!("{}: {e}", query.place));
        for matcher in selectors.into_iter().flat_map(|(_, matchers)| matchers) {
            let (Some(value), true) = (&matcher.value, matcher.label == "queue") else {
                continue;
            };
            let regex = match matcher.op {
                MatchOp::Regex => prometheus_regex(value),
                MatchOp::Equal => prometheus_regex(&regex::escape(value)),
                MatchOp::NotEqual | MatchOp::NotRegex => continue,
            };
            checked.push(value.clone());
            let matched: Vec<&(&str, Vec<String>)> = kinds
                .iter()
                .filter(|(_, names)| names.iter().any(|n| regex.is_match(n)))
                .collect();
            match matched.as_slice() {
                [(kind, names)] => {
                    let missed: Vec<&String> =
                        names.iter().filter(|n| !regex.is_match(n)).collect();
                    if !missed.is_empty() {
                        wrong.push(format!(
                            "{}: queue {value:?} selects some {kind}, not {missed:?}",
                            query.place
                        ));
                    }
                }
                _ => wrong.push(format!(
                    "{}: queue {value:?} selects {:?}, not one kind of queue",
                    query.place,
                    matched.iter().map(|(kind, _)| kind).collect::<Vec<_>>()
                )),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "queue regexes that do not select the broker's queues ({:?}):\n{}",
        kinds
            .iter()
            .map(|(kind, names)| (kind, &names[0]))
            .collect::<Vec<_>>(),
        wrong.join("\n")
    );
    // alerts.yml's pool queues and queue-health.json's dead letters at least.
    for wanted in [".*[.]pool[.].*", ".*[.]dead[.].*"] {
        assert!(
            checked.iter().any(|c| c == wanted),
            "no query selects queue {wanted:?}; checked {checked:?}"
        );
    }
}

// ---------------------------------------------------------------- the model

/// The uid of the Prometheus data source Grafana is provisioned with.
fn provisioned_datasource_uid() -> String {
    let sources = yaml("deploy/compose/grafana/provisioning/datasources/prometheus.yml");
    let prometheus: Vec<&Yaml> = sources["datasources"]
        .as_vec()
        .expect("datasources")
        .iter()
        .filter(|d| d["type"].as_str() == Some("prometheus"))
        .collect();
    assert_eq!(prometheus.len(), 1, "one Prometheus data source");
    prometheus[0]["uid"]
        .as_str()
        .expect("the Prometheus data source has a fixed uid")
        .to_owned()
}

fn uses_the_variable(datasource: &Value) -> bool {
    datasource["type"] == "prometheus" && datasource["uid"] == DATASOURCE_REF
}

/// The paths of `datasource` fields that name a data source other than
/// through the variable (Grafana's own annotations, `{"type": "grafana"}`,
/// excepted).
fn fixed_datasources(value: &Value, path: &str, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                let here = format!("{path}.{key}");
                if key == "datasource" {
                    let ok = inner["type"] == "grafana" || uses_the_variable(inner);
                    if !ok {
                        found.push(format!("{here} = {inner}"));
                    }
                } else {
                    fixed_datasources(inner, &here, found);
                }
            }
        }
        Value::Array(items) => {
            for (i, inner) in items.iter().enumerate() {
                fixed_datasources(inner, &format!("{path}[{i}]"), found);
            }
        }
        _ => {}
    }
}

/// The roles of `toolfleet_build_info` a dashboard's processes run as.
fn dashboard_roles(file: &str) -> [&'static str; 2] {
    match file {
        "dispatchers.json" => [Role::Dispatcher.as_str(), Role::Serve.as_str()],
        "workers.json" => [Role::Worker.as_str(), Role::Serve.as_str()],
        other => panic!("{other}: an `instance` variable of which processes?"),
    }
}

/// The `role` regex of a selector of `toolfleet_build_info` in `expr`.
fn build_info_roles(expr: &str) -> Option<String> {
    let walked = walk(expr).ok()?;
    let selectors = walked.selectors().ok()?;
    selectors
        .into_iter()
        .filter(|(metric, _)| metric == "toolfleet_build_info")
        .flat_map(|(_, matchers)| matchers)
        .find(|m| m.label == "role" && matches!(m.op, MatchOp::Regex | MatchOp::Equal))
        .and_then(|m| m.value)
}

/// The roles (of every role a process runs as) a `role` regex selects.
fn roles_selected(regex: &str) -> Vec<&'static str> {
    let regex = prometheus_regex(regex);
    Role::ALL
        .iter()
        .map(|role| role.as_str())
        .filter(|role| regex.is_match(role))
        .collect()
}

/// An `instance` variable lists the processes of the dashboard's roles from
/// `toolfleet_build_info{role=...}` (an idle dispatcher shows there, an agent
/// worker calling tools does not), its "All" stands for exactly those, and
/// the stat that counts the processes counts the same series.
fn check_instance_variable(file: &str, dashboard: &Value, variable: &Value) {
    let wanted = dashboard_roles(file);
    let query = variable_query(variable).expect("a query");
    let parts = variable_query_parts(query).unwrap_or_else(|e| panic!("{file}: {e}"));
    let (Some(selector), Some("instance")) = parts else {
        panic!("{file}: the instance variable lists instances of a selector, not `{query}`");
    };
    let roles = build_info_roles(selector).unwrap_or_else(|| {
        panic!(
            "{file}: the instance variable lists toolfleet_build_info{{role=~...}}, not `{query}`"
        )
    });
    assert_eq!(
        roles_selected(&roles),
        wanted,
        "{file}: the instance variable's roles"
    );
    assert!(
        variable["allValue"].is_null() || variable["allValue"] == "",
        "{file}: the instance variable's All stands for its own values, not {}",
        variable["allValue"]
    );
    let counts: Vec<&Value> = panels(dashboard)
        .into_iter()
        .filter(|p| p["title"] == "Dispatchers" || p["title"] == "Workers")
        .collect();
    assert_eq!(counts.len(), 1, "{file}: one stat counts the processes");
    for target in counts[0]["targets"].as_array().expect("targets") {
        let expr = target["expr"].as_str().expect("an expr");
        let roles = build_info_roles(expr)
            .unwrap_or_else(|| panic!("{file}: `{expr}` does not count toolfleet_build_info"));
        assert_eq!(roles_selected(&roles), wanted, "{file}: `{expr}`");
        assert!(expr.contains("$instance"), "{file}: `{expr}`");
    }
}

#[test]
fn dashboards_follow_grafanas_current_model_with_a_datasource_variable() {
    let compose = read("docker-compose.yml");
    assert!(
        compose.contains(&format!("image: {GRAFANA_IMAGE}")),
        "docker-compose.yml runs {GRAFANA_IMAGE}x, whose dashboard schema is {SCHEMA_VERSION}: \
         bump both together"
    );
    let provisioned = provisioned_datasource_uid();
    let mut uids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    for (file, dashboard) in dashboards() {
        let uid = dashboard["uid"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no uid"));
        assert!(
            !uid.is_empty() && uid.len() <= 40,
            "{file}: a uid of 1 to 40 characters"
        );
        assert!(uids.insert(uid.to_owned()), "{file}: uid {uid} is taken");
        let title = dashboard["title"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no title"));
        assert!(
            titles.insert(title.to_owned()),
            "{file}: title {title} is taken"
        );
        assert_eq!(
            dashboard["schemaVersion"].as_u64(),
            Some(SCHEMA_VERSION),
            "{file}: schemaVersion"
        );
        assert!(
            dashboard["id"].is_null(),
            "{file}: a provisioned dashboard leaves its id to Grafana"
        );

        // The datasource variable, resolving to the provisioned Prometheus.
        let datasource: Vec<&Value> = variables(&dashboard)
            .iter()
            .filter(|v| v["name"] == "datasource")
            .collect();
        assert_eq!(datasource.len(), 1, "{file}: one `datasource` variable");
        let datasource = datasource[0];
        assert_eq!(datasource["type"], "datasource", "{file}");
        assert_eq!(datasource["query"], "prometheus", "{file}");
        assert_eq!(
            datasource["current"]["value"].as_str(),
            Some(provisioned.as_str()),
            "{file}: the variable's default is the provisioned data source's uid"
        );
        let mut names = BTreeSet::new();
        for variable in variables(&dashboard) {
            let name = variable["name"].as_str().expect("a variable name");
            assert!(names.insert(name), "{file}: variable {name} twice");
            if variable["type"] == "query" {
                assert_eq!(
                    variable["definition"].as_str(),
                    variable_query(variable),
                    "{file}: variable {name} shows another query than it runs"
                );
                assert!(
                    uses_the_variable(&variable["datasource"]),
                    "{file}: variable {name} queries {}, not {DATASOURCE_REF}",
                    variable["datasource"]
                );
            }
            if name == "instance" {
                check_instance_variable(&file, &dashboard, variable);
            }
        }

        // Panels: unique ids, on the grid, every query through the variable.
        let mut ids = BTreeSet::new();
        let mut queried = 0;
        for panel in panels(&dashboard) {
            let id = panel["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("{file}: panel `{}` has no id", panel["title"]));
            assert!(ids.insert(id), "{file}: panel id {id} twice");
            assert!(
                panel["title"].as_str().is_some_and(|t| !t.is_empty()),
                "{file}: panel {id} has no title"
            );
            let grid = &panel["gridPos"];
            let (x, w) = (grid["x"].as_u64(), grid["w"].as_u64());
            assert!(
                matches!((x, w), (Some(x), Some(w)) if w > 0 && x + w <= 24)
                    && grid["h"].as_u64().is_some_and(|h| h > 0)
                    && grid["y"].as_u64().is_some(),
                "{file}: panel {id} is not on the 24-column grid: {grid}"
            );
            let targets = panel["targets"].as_array();
            if panel["type"] == "row" {
                assert!(
                    targets.is_none_or(Vec::is_empty),
                    "{file}: row {id} has queries"
                );
                continue;
            }
            assert!(
                uses_the_variable(&panel["datasource"]),
                "{file}: panel {id} uses {}, not {DATASOURCE_REF}",
                panel["datasource"]
            );
            let targets = targets.unwrap_or_else(|| panic!("{file}: panel {id} has no targets"));
            assert!(!targets.is_empty(), "{file}: panel {id} has no targets");
            let mut refs = BTreeSet::new();
            for target in targets {
                assert!(
                    uses_the_variable(&target["datasource"]),
                    "{file}: panel {id} target {} uses {}, not {DATASOURCE_REF}",
                    target["refId"],
                    target["datasource"]
                );
                let reference = target["refId"].as_str().expect("a refId");
                assert!(
                    refs.insert(reference),
                    "{file}: panel {id}: refId {reference} twice"
                );
                assert!(
                    target["expr"]
                        .as_str()
                        .is_some_and(|e| !e.trim().is_empty()),
                    "{file}: panel {id} target {reference} has no expr"
                );
                queried += 1;
            }
        }
        assert!(queried > 0, "{file}: no query");
        // Nowhere a fixed data source: every Prometheus reference is the
        // variable, and none is a bare name (Grafana's old form).
        let mut fixed = Vec::new();
        fixed_datasources(&dashboard, "", &mut fixed);
        assert!(
            fixed.is_empty(),
            "{file}: data sources other than {DATASOURCE_REF}: {fixed:?}"
        );
    }
    for wanted in [
        "toolfleet-queues",
        "toolfleet-jobs",
        "toolfleet-workers",
        "toolfleet-dispatchers",
    ] {
        assert!(uids.contains(wanted), "no dashboard {wanted}");
    }
}
