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
//! The dashboards are also checked for Grafana's JSON model: the schema
//! version of the Grafana of `docker-compose.yml`, a `datasource` template
//! variable that every panel, target and query variable uses, resolving to
//! the provisioned Prometheus, unique uids and panel ids.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
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

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

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

// ---------------------------------------------------------------- PromQL

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    /// A number or a duration.
    Number,
    /// A string literal, or a Grafana variable (`$x`, `${x}`, `[[x]]`).
    Opaque,
    Open(char),
    Close(char),
    /// An operator or a comma.
    Punct,
}

fn tokenize(expr: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            // A comment runs to the end of the line.
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if matches!(c, '"' | '\'' | '`') {
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(format!("unterminated string in `{expr}`")),
                    Some('\\') if c != '`' => i += 2,
                    Some(&q) if q == c => break,
                    Some(_) => i += 1,
                }
            }
            i += 1;
            tokens.push(Token::Opaque);
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
            }
            tokens.push(Token::Opaque);
        } else if c == '[' && chars.get(i + 1) == Some(&'[') {
            // Grafana's old variable syntax, `[[name]]`.
            let close = (i + 2..chars.len().saturating_sub(1))
                .find(|&j| chars[j] == ']' && chars[j + 1] == ']')
                .ok_or_else(|| format!("unterminated [[variable]] in `{expr}`"))?;
            i = close + 2;
            tokens.push(Token::Opaque);
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // Numbers, durations (5m, 1h30m), exponents (1e3, 2e-3), hex.
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric()
                    || chars[i] == '.'
                    || chars[i] == '_'
                    || (matches!(chars[i], '+' | '-') && matches!(chars[i - 1], 'e' | 'E')))
            {
                i += 1;
            }
            tokens.push(Token::Number);
        } else if ident_start(c) {
            let begin = i;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            tokens.push(Token::Ident(chars[begin..i].iter().collect()));
        } else if matches!(c, '(' | '{' | '[') {
            tokens.push(Token::Open(c));
            i += 1;
        } else if matches!(c, ')' | '}' | ']') {
            tokens.push(Token::Close(c));
            i += 1;
        } else if "+-*/%^=!<>,@~|".contains(c) {
            tokens.push(Token::Punct);
            i += 1;
        } else {
            return Err(format!("unexpected `{c}` in `{expr}`"));
        }
    }
    Ok(tokens)
}

/// Keywords that are never metric names.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
    "Inf",
    "NaN",
    "group_left",
    "group_right",
];
/// Keywords followed by a list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// PromQL's aggregations and functions.
const FUNCTIONS: &[&str] = &[
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
    "abs",
    "absent",
    "absent_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "delta",
    "deriv",
    "exp",
    "floor",
    "histogram_avg",
    "histogram_count",
    "histogram_fraction",
    "histogram_quantile",
    "histogram_stddev",
    "histogram_stdvar",
    "histogram_sum",
    "holt_winters",
    "double_exponential_smoothing",
    "hour",
    "idelta",
    "increase",
    "irate",
    "label_join",
    "label_replace",
    "ln",
    "log2",
    "log10",
    "minute",
    "month",
    "predict_linear",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sort_by_label",
    "sort_by_label_desc",
    "sqrt",
    "time",
    "timestamp",
    "vector",
    "year",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "quantile_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "last_over_time",
    "present_over_time",
    "mad_over_time",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "cos",
    "cosh",
    "sin",
    "sinh",
    "tan",
    "tanh",
    "deg",
    "pi",
    "rad",
    "start",
    "end",
];

/// The metric names of a PromQL expression; label names, functions,
/// keywords, strings, numbers, durations and Grafana variables are not.
fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    if expr.contains("__name__") {
        return Err(format!(
            "`{expr}` selects by __name__; name the metric instead"
        ));
    }
    let tokens = tokenize(expr)?;
    let mut names = BTreeSet::new();
    // Open brackets; a label matcher `{`, a range `[` or a label list `(`
    // hides everything inside.
    let mut stack: Vec<(char, bool)> = Vec::new();
    let hidden = |stack: &[(char, bool)]| stack.iter().any(|&(_, hides)| hides);
    let mut after_label_keyword = false;
    for (i, token) in tokens.iter().enumerate() {
        let next_opens_paren = matches!(tokens.get(i + 1), Some(Token::Open('(')));
        // An aggregation may name its grouping first: `sum by (x) (...)`.
        let next_groups = matches!(
            tokens.get(i + 1),
            Some(Token::Ident(w)) if w == "by" || w == "without"
        );
        match token {
            Token::Open(c) => {
                let hides = *c != '(' || after_label_keyword;
                stack.push((*c, hides));
                after_label_keyword = false;
                continue;
            }
            Token::Close(c) => {
                let want = match c {
                    ')' => '(',
                    '}' => '{',
                    _ => '[',
                };
                match stack.pop() {
                    Some((open, _)) if open == want => {}
                    _ => return Err(format!("unbalanced `{c}` in `{expr}`")),
                }
            }
            Token::Ident(word) if !hidden(&stack) => {
                if LABEL_LISTS.contains(&word.as_str()) && next_opens_paren {
                    after_label_keyword = true;
                    continue;
                }
                if next_opens_paren || next_groups {
                    if !FUNCTIONS.contains(&word.as_str()) {
                        return Err(format!("`{word}(` in `{expr}` is no PromQL function"));
                    }
                } else if !KEYWORDS.contains(&word.as_str()) {
                    names.insert(word.clone());
                }
            }
            _ => {}
        }
        after_label_keyword = false;
    }
    if let Some((open, _)) = stack.last() {
        return Err(format!("unclosed `{open}` in `{expr}`"));
    }
    Ok(names)
}

/// The metric names of a Grafana template variable query for Prometheus:
/// `label_values(selector, label)`, `label_values(label)`,
/// `query_result(expr)`, or a plain expression.
fn variable_metric_names(query: &str) -> Result<BTreeSet<String>, String> {
    let query = query.trim();
    let inner = |prefix: &str| {
        query
            .strip_prefix(prefix)
            .and_then(|rest| rest.trim_start().strip_prefix('('))
            .and_then(|rest| rest.trim_end().strip_suffix(')'))
    };
    if let Some(args) = inner("label_values") {
        return match args.rsplit_once(',') {
            Some((selector, label)) => {
                let label = label.trim();
                if label.is_empty() || !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    return Err(format!("`{query}`: `{label}` is no label name"));
                }
                metric_names(selector)
            }
            None => Ok(BTreeSet::new()),
        };
    }
    if let Some(expr) = inner("query_result") {
        return metric_names(expr);
    }
    if query.starts_with("metrics(") || query.starts_with("label_names(") {
        return Err(format!("`{query}` does not name its metrics"));
    }
    metric_names(query)
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

// ---------------------------------------------------------------- exporters

/// The series names of a Prometheus or OpenMetrics text exposition: those
/// of its samples, and those each `# TYPE` line's family gives (a family
/// with no sample yet shows only its TYPE line).
fn exposition_names(text: &str, openmetrics: bool) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(family), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match (openmetrics, kind) {
                // OpenMetrics names a counter's family without `_total`.
                (true, "counter") => &["_total"],
                (true, "info") => &["_info"],
                (true, "gaugehistogram") => &["_bucket", "_gsum", "_gcount"],
                (_, "histogram") => &["_bucket", "_sum", "_count"],
                (_, "summary") => &["", "_sum", "_count"],
                _ => &[""],
            };
            for suffix in suffixes {
                names.insert(format!("{family}{suffix}"));
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

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

/// The metric names a real `toolfleet serve` exports, after a call and a
/// settled job so that every family has had its chance to show.
async fn toolfleet_names() -> BTreeSet<String> {
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
    names
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_and_alerts_ask_only_for_exported_metrics() {
    let http = toolfleet_executors::http_client().expect("a client");
    let toolfleet = toolfleet_names().await;
    let rabbitmq = rabbitmq_names(&http).await;

    let mut unknown: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut checked = 0;
    for query in queries() {
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
