//! The official MCP conformance suite (`@modelcontextprotocol/conformance`,
//! pinned below) against `toolfleet serve`'s `/mcp`, with the expense pack
//! and tests/mcp/conformance.toml, the tools its scenarios call by name.
//!
//! Two releases of the suite run: 0.1.16, every server scenario (its active
//! ones and its pending ones), and 0.2.0-alpha.12, the scenarios the
//! 2026-07-28 revision requires, frozen at its release (with the tasks
//! extension's and the pending ones it runs beside them). Each has its list
//! of expected failures, tests/mcp/EXPECTED_FAILURES.md and
//! tests/mcp/EXPECTED_FAILURES_2026.md. A test fails when a scenario fails
//! that its list does not name, when one it names passes (so the list stays
//! true) or is not in the suite, and when the suite leaves no result for a
//! scenario it ran.
//!
//! The suite cannot send an `Authorization` header, so it talks to a small
//! proxy here that adds the bearer token to each request it forwards and
//! changes nothing else (Host and Origin reach the server as the suite sent
//! them): the server keeps requiring its token, as in production.
//!
//! The suite needs Node.js 22: `.ci/run` installs the npm packages
//! `node@NODE_VERSION` and each release of the suite into a directory of its
//! own, /var/tmp/toolfleet-node (or `TOOLFLEET_NODE_DIR`) and
//! /var/tmp/toolfleet-node-2026 (or `TOOLFLEET_NODE_2026_DIR`). Without them
//! a test is skipped, except under CI (`CI` set), where it fails.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Server, TOKEN, TempDir, sha};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The Node.js the suites run on (the npm package `node`).
const NODE_VERSION: &str = "22.23.3";
/// A whole suite takes a few seconds; this is far beyond it.
const SUITE_TIMEOUT: Duration = Duration::from_secs(300);

/// One release of the suite, how it is run and what it is expected to fail.
struct Suite {
    /// The suite's version, as `.ci/run` installs it.
    version: &'static str,
    /// The variable naming where `.ci/run` installs it, and its default.
    dir_var: &'static str,
    default_dir: &'static str,
    /// The arguments choosing its scenarios.
    select: &'static [&'static str],
    /// Its expected failures, in tests/mcp.
    expected: &'static str,
}

/// Every server scenario of 0.1.16: the active ones and the pending ones
/// (json-schema-2020-12, server-sse-polling), which pass here too.
const SUITE_2025: Suite = Suite {
    version: "0.1.16",
    dir_var: "TOOLFLEET_NODE_DIR",
    default_dir: "/var/tmp/toolfleet-node",
    select: &["--suite", "all"],
    expected: "EXPECTED_FAILURES.md",
};

/// What the 2026-07-28 revision requires, frozen at its release, at its
/// wire; the suite runs the tasks extension's scenarios and the pending ones
/// beside them, unscored by it, and they count here as the others do.
const SUITE_2026: Suite = Suite {
    version: "0.2.0-alpha.12",
    dir_var: "TOOLFLEET_NODE_2026_DIR",
    default_dir: "/var/tmp/toolfleet-node-2026",
    select: &["--requirements", "2026-07-28"],
    expected: "EXPECTED_FAILURES_2026.md",
};

impl Suite {
    /// Where `.ci/run` installs Node.js and the suite.
    fn node_dir(&self) -> PathBuf {
        std::env::var_os(self.dir_var)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(self.default_dir))
    }
}

/// The node binary and the suite's entry point, when both are the pinned versions.
fn installed(suite: &Suite) -> Option<(PathBuf, PathBuf)> {
    let dir = suite.node_dir().join("node_modules");
    let node = dir.join(".bin/node");
    let package = dir.join("@modelcontextprotocol/conformance");
    let output = std::process::Command::new(&node)
        .arg("--version")
        .output()
        .ok()?;
    let version = String::from_utf8_lossy(&output.stdout);
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(package.join("package.json")).ok()?).ok()?;
    (version.trim() == format!("v{NODE_VERSION}") && manifest["version"] == suite.version)
        .then(|| (node, package.join("dist/index.js")))
}

/// The scenarios expected to fail, each with its reason: the lines of
/// `file` (in tests/mcp) of the form ``- `scenario`: reason``.
fn expected_failures(file: &str) -> BTreeMap<String, String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("- `")?;
            let (name, reason) = rest.split_once('`')?;
            let reason = reason.trim_start_matches(':').trim();
            assert!(!reason.is_empty(), "`{name}` is listed without a reason");
            Some((name.to_owned(), reason.to_owned()))
        })
        .collect()
}

/// Serves on 127.0.0.1 and forwards every request to `upstream` with
/// `Authorization: Bearer <token>` added (unless it has one) and the
/// connection closed after the answer; nothing else is changed.
async fn bearer_proxy(upstream: String, token: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
    let address = listener.local_addr().expect("proxy address");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let _ = forward(client, &upstream, token).await;
            });
        }
    });
    address.to_string()
}

async fn forward(mut client: TcpStream, upstream: &str, token: &str) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        if buf.len() > 64 * 1024 {
            return Ok(());
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut out = format!("{}\r\n", lines.next().unwrap_or_default());
    let mut authorized = false;
    for line in lines {
        let name = line.split(':').next().unwrap_or_default().trim();
        if name.eq_ignore_ascii_case("connection") {
            continue;
        }
        authorized |= name.eq_ignore_ascii_case("authorization");
        out.push_str(line);
        out.push_str("\r\n");
    }
    if !authorized {
        out.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut server = TcpStream::connect(upstream).await?;
    server.write_all(out.as_bytes()).await?;
    server.write_all(&buf[end + 4..]).await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}

/// What one scenario's checks came to.
#[derive(Default)]
struct Outcome {
    /// `id: message` of each check that is a FAILURE.
    failures: Vec<String>,
    /// How many checks ended in each status (SUCCESS, FAILURE, WARNING, INFO...).
    statuses: BTreeMap<String, usize>,
}

/// Each scenario's outcome, from the suite's `checks.json` files under `dir`
/// (one directory per scenario, named `server-<scenario>-<time>`): a
/// scenario fails when any of its checks is a FAILURE.
fn outcomes(dir: &Path, scenarios: &BTreeSet<String>) -> BTreeMap<String, Outcome> {
    let mut out: BTreeMap<String, Outcome> = BTreeMap::new();
    let entries = std::fs::read_dir(dir).expect("the suite wrote its results");
    for entry in entries.map_while(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        // The longest name that matches: `tools-call` must not take `tools-call-error`.
        let Some(scenario) = scenarios
            .iter()
            .filter(|s| {
                name.strip_prefix("server-")
                    .and_then(|rest| rest.strip_prefix(s.as_str()))
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|time| time.starts_with(|c: char| c.is_ascii_digit()))
            })
            .max_by_key(|s| s.len())
        else {
            continue;
        };
        let checks = std::fs::read_to_string(entry.path().join("checks.json"))
            .unwrap_or_else(|e| panic!("{name}/checks.json: {e}"));
        let checks: Vec<Value> =
            serde_json::from_str(&checks).unwrap_or_else(|e| panic!("{name}/checks.json: {e}"));
        let outcome = out.entry(scenario.clone()).or_default();
        for check in checks {
            let status = check["status"].as_str().unwrap_or("?");
            *outcome.statuses.entry(status.to_owned()).or_default() += 1;
            if status == "FAILURE" {
                outcome.failures.push(format!(
                    "{}: {}",
                    check["id"].as_str().unwrap_or("?"),
                    check["errorMessage"].as_str().unwrap_or("failed")
                ));
            }
        }
    }
    out
}

/// The scenarios the suite ran, from its report: a line
/// `Running <what> (<n> scenarios) ...`, then one
/// `=== Running scenario: <name> ===` each.
fn scenarios_run(report: &str) -> BTreeSet<String> {
    let announced: usize = report
        .lines()
        .find_map(|l| {
            l.strip_prefix("Running ")?
                .split_once(" (")?
                .1
                .split_once(" scenarios)")?
                .0
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("the suite did not say how many scenarios it runs:\n{report}"));
    let run: BTreeSet<String> = report
        .lines()
        .filter_map(|l| {
            l.strip_prefix("=== Running scenario: ")?
                .strip_suffix(" ===")
        })
        .map(str::to_owned)
        .collect();
    assert_eq!(run.len(), announced, "scenarios run: {run:?}\n{report}");
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_conformance_suite() {
    run(&SUITE_2025).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_2026_07_28_requirements() {
    run(&SUITE_2026).await;
}

async fn run(pinned: &Suite) {
    let version = pinned.version;
    let Some((node, suite)) = installed(pinned) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "node {NODE_VERSION} and @modelcontextprotocol/conformance {version} are required \
             under CI in {} (.ci/run installs them)",
            pinned.node_dir().display()
        );
        eprintln!(
            "skipped: node {NODE_VERSION} and the conformance suite {version} are not in {}",
            pinned.node_dir().display()
        );
        return;
    };
    let dir = TempDir::new("mcp-conformance");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = format!(
        r#"
listen = "127.0.0.1:0"
data_dir = "{data}"
include = ["{expenses}", "{conformance}"]

[[auth.tokens]]
sha256 = "{alice}"
tenant = "acme"
user = "alice"
scopes = ["expenses:read", "expenses:submit"]
"#,
        data = dir.0.join("data").display(),
        expenses = manifest
            .join("../../examples/expenses/toolfleet.toml")
            .display(),
        conformance = manifest.join("tests/mcp/conformance.toml").display(),
        alice = sha(TOKEN),
    );
    let server = Server::start(&dir.0, &config);
    let upstream = server.base.trim_start_matches("http://").to_owned();
    let proxy = bearer_proxy(upstream, TOKEN).await;

    let expected = expected_failures(pinned.expected);
    let results = dir.0.join("results");
    let started = Instant::now();
    let run = tokio::process::Command::new(&node)
        .arg(&suite)
        .args(["server", "--url", &format!("http://{proxy}/mcp")])
        .args(pinned.select)
        .arg("-o")
        .arg(&results)
        .current_dir(&dir.0)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(SUITE_TIMEOUT, run)
        .await
        .expect("the suite finishes in time")
        .expect("the suite runs");
    let took = started.elapsed();
    let report = String::from_utf8_lossy(&output.stdout);
    let scenarios = scenarios_run(&report);
    let outcomes = outcomes(&results, &scenarios);
    for (scenario, outcome) in &outcomes {
        let verdict = if outcome.failures.is_empty() {
            "pass"
        } else {
            "FAIL"
        };
        eprintln!("{verdict} {scenario} {:?}", outcome.statuses);
        for failure in &outcome.failures {
            eprintln!("    {failure}");
        }
    }

    let mut problems = Vec::new();
    for scenario in &scenarios {
        match (outcomes.get(scenario), expected.get(scenario)) {
            (None, _) => problems.push(format!("{scenario}: the suite left no result")),
            (Some(outcome), None) if !outcome.failures.is_empty() => problems.push(format!(
                "{scenario} failed and is not an expected failure:\n    {}",
                outcome.failures.join("\n    ")
            )),
            (Some(outcome), Some(_)) if outcome.failures.is_empty() => problems.push(format!(
                "{scenario} passes now: remove it from tests/mcp/{}",
                pinned.expected
            )),
            _ => {}
        }
    }
    for name in expected.keys().filter(|n| !scenarios.contains(*n)) {
        problems.push(format!(
            "{name} is listed in {} but the suite has no such scenario",
            pinned.expected
        ));
    }
    let passed = outcomes.values().filter(|o| o.failures.is_empty()).count();
    eprintln!(
        "conformance {version}: {passed} of {} scenarios passed, {} expected failures, in {:.1} s",
        scenarios.len(),
        expected.len(),
        took.as_secs_f64()
    );
    assert!(
        problems.is_empty(),
        "{}\n\nthe suite said:\n{report}\n{}",
        problems.join("\n"),
        String::from_utf8_lossy(&output.stderr)
    );
}
