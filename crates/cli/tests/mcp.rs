//! MCP end to end with a real client, the official Python SDK (`mcp`, pinned
//! and installed by `.ci/run`): over Streamable HTTP against `toolfleet serve`
//! (bearer token, 401 and its challenge without one, a foreign Origin refused,
//! each revision's handshake) and over stdio against `toolfleet mcp`, in the
//! SDK's `auto` mode (server/discover, 2026-07-28) and `legacy` mode (the
//! initialize handshake). tests/mcp/client.py lists every page of tools,
//! checks find_expenses' annotations, calls it, gets `isError` for bad
//! arguments, and runs start_receipt_ocr to its end through get_job; then
//! as a task (the 2026-07-28 extension in `auto` mode, the 2025-11-25 task
//! requests in `legacy` mode, their answers checked against the SDK's
//! models of that revision), with progress, and elicitation.
//!
//! Without python3 or the package the test is skipped, except under CI
//! (`CI` set), where it fails.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{OTHER_TOKEN, Server, TOKEN, TempDir, config_with};
use serde_json::Value;

/// Whether the client can run here; under CI it must.
fn python_ready() -> bool {
    let ready = Command::new("python3")
        .args(["-c", "import mcp, httpx2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 with the `mcp` package is required under CI (.ci/run installs it)"
        );
        eprintln!("skipped: python3 with the `mcp` package is not installed");
    }
    ready
}

fn client_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp/client.py")
        .display()
        .to_string()
}

/// Runs the client with `args`; its last line is what it saw.
fn run_client(args: &[&str]) -> Value {
    let output = Command::new("python3")
        .arg(client_script())
        .args(args)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the MCP client failed ({args:?}):\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// Three tools a page, so the client must follow `nextCursor`.
fn mcp_config(dir: &Path) -> String {
    config_with(dir, "", "\n[mcp]\npage_size = 3\n")
}

fn check_seen(seen: &Value, version: &str) {
    assert_eq!(seen["protocol_version"], version, "{seen}");
    assert!(seen["pages"].as_u64().unwrap_or(0) >= 2, "{seen}");
    assert!(seen["lines"].as_u64().unwrap_or(0) > 0, "{seen}");
    assert!(seen["job_result"]["receipts"].is_array(), "{seen}");
}

/// The rich client of 2026-07-28: a job ran as a task to its result, a
/// second was cancelled, and ask_user's question was answered "travel".
/// A 2025-11-25 client: a job ran as a task of that revision to its
/// result (tasks/get, tasks/result, tasks/list, tasks/cancel), job tools
/// say they may run as tasks, a query says nothing; and a job call that
/// asked for progress was followed to its end with news.
fn check_core_tasks_and_progress(seen: &Value) {
    let core = &seen["rich"]["core_tasks"];
    assert!(core["task_result"]["receipts"].is_array(), "{seen}");
    assert_eq!(
        core["task_support"]["start_receipt_ocr"], "optional",
        "{seen}"
    );
    assert!(core["task_support"]["find_expenses"].is_null(), "{seen}");
    assert!(
        ["cancelled", "completed"].contains(&core["cancelled_status"].as_str().unwrap_or("")),
        "{seen}"
    );
    assert!(
        seen["rich"]["progress"].as_u64().unwrap_or(0) >= 1,
        "{seen}"
    );
}

fn check_tasks_and_elicitation(seen: &Value) {
    let rich = &seen["rich"];
    assert!(rich["task_result"]["receipts"].is_array(), "{seen}");
    assert!(
        rich["task_id"].as_str().is_some_and(|id| id.len() == 36),
        "{seen}"
    );
    assert!(
        matches!(
            rich["cancelled_status"].as_str(),
            Some("cancelled" | "completed")
        ),
        "{seen}"
    );
    assert!(rich["elicited"].to_string().contains("travel"), "{seen}");
}

#[test]
fn a_real_client_over_streamable_http() {
    if !python_ready() {
        return;
    }
    let dir = TempDir::new("mcp-http");
    let server = Server::start(&dir.0, &mcp_config(&dir.0));
    let url = format!("{}/mcp", server.base);
    let modern = run_client(&["http", &url, TOKEN, "auto", OTHER_TOKEN]);
    check_seen(&modern, "2026-07-28");
    assert_eq!(modern["handshakes"]["2025-06-18"], "2025-06-18");
    assert_eq!(modern["handshakes"]["2025-11-25"], "2025-11-25");
    check_tasks_and_elicitation(&modern);
    assert_eq!(modern["foreign_refused"], true, "{modern}");
    let legacy = run_client(&["http", &url, TOKEN, "legacy"]);
    check_seen(&legacy, "2025-11-25");
    check_core_tasks_and_progress(&legacy);
    // The handshake opened a session, in which the server asks with
    // elicitation/create (tests/mcp_sessions.rs: without one, it cannot).
    assert!(
        legacy["rich"]["elicited"].to_string().contains("travel"),
        "{legacy}"
    );
}

#[test]
fn a_real_client_over_stdio() {
    if !python_ready() {
        return;
    }
    let dir = TempDir::new("mcp-stdio");
    let config = dir.0.join("toolfleet.toml");
    std::fs::write(&config, mcp_config(&dir.0)).expect("config written");
    let binary = env!("CARGO_BIN_EXE_toolfleet");
    let config = config.display().to_string();
    let modern = run_client(&["stdio", binary, &config, TOKEN, "auto"]);
    check_seen(&modern, "2026-07-28");
    check_tasks_and_elicitation(&modern);
    let legacy = run_client(&["stdio", binary, &config, TOKEN, "legacy"]);
    check_seen(&legacy, "2025-11-25");
    check_core_tasks_and_progress(&legacy);
    // Over stdio the session asks with elicitation/create.
    assert!(
        legacy["rich"]["elicited"].to_string().contains("travel"),
        "{legacy}"
    );
}

#[test]
fn stdio_refuses_to_start_without_a_known_token() {
    let dir = TempDir::new("mcp-token");
    let config = dir.0.join("toolfleet.toml");
    std::fs::write(&config, mcp_config(&dir.0)).expect("config written");
    for token in [None, Some(""), Some("tf_not_known")] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolfleet"));
        command
            .arg("--config")
            .arg(&config)
            .arg("mcp")
            .env_remove("TOOLFLEET_TOKEN")
            .stdin(Stdio::null());
        if let Some(token) = token {
            command.env("TOOLFLEET_TOKEN", token);
        }
        let output = command.output().expect("toolfleet runs");
        assert!(!output.status.success(), "{token:?} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("TOOLFLEET_TOKEN"), "{token:?}: {stderr}");
        assert!(output.stdout.is_empty(), "stdout carries only the protocol");
    }
}
