//! The TypeScript client (`clients/typescript`) against this build of
//! toolfleet: its `node --test` suite, which starts a real `toolfleet serve`
//! of its own from the binary named by `TOOLFLEET_BIN`, checks that
//! `src/openapi.d.ts` is what `scripts/gen-types.mjs` makes of this build's
//! OpenAPI document, type-checks the declarations with TypeScript and runs
//! the AI SDK adapter's tools in the `ai` package's tool loop.
//!
//! The package runs from its source: no build step, no install state in
//! the tree. TypeScript and `ai` come from `TOOLFLEET_TS_DIR` (default
//! /var/tmp/toolfleet-ts), where .ci/run installs them. Without Node.js 20
//! or later the test is skipped, and so are the suite's tests that need
//! those packages, except under CI, where they fail.

mod common;

use std::process::{Command, Stdio};

/// Whether `node` (20 or later, for its test runner and `AbortSignal.any`)
/// runs; under CI it must.
fn node_ready() -> bool {
    let version = Command::new("node")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let major = version
        .as_deref()
        .and_then(|v| v.strip_prefix('v'))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    let ready = major.is_some_and(|m| m >= 20);
    if !ready {
        common::missing(&format!(
            "Node.js 20 or later is not installed (node --version: {version:?})"
        ));
    }
    ready
}

#[test]
fn the_typescript_clients_tests_pass_against_a_real_serve() {
    if !node_ready() {
        return;
    }
    let mut command = Command::new("node");
    command
        .args(["--test", "clients/typescript/test/"])
        .current_dir(common::repo())
        .env("TOOLFLEET_BIN", env!("CARGO_BIN_EXE_toolfleet"))
        .env_remove("TOOLFLEET_TOKEN")
        .env_remove("TOOLFLEET_CONFIG")
        .env_remove("TOOLFLEET_URL")
        .env_remove("NODE_OPTIONS")
        .stdin(Stdio::null());
    if common::under_ci() {
        // The suite fails, rather than skips, a test whose packages are missing.
        command.env("CI", "1");
    }
    let output = command.output().expect("node runs");
    assert!(
        output.status.success(),
        "node --test failed: {}",
        common::said(&output)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("\n# pass ") && stdout.contains("\n# fail 0"),
        "node --test ran the suite: {}",
        common::said(&output)
    );
    if common::under_ci() {
        assert!(
            stdout.contains("\n# skipped 0"),
            "under CI no test is skipped: {}",
            common::said(&output)
        );
    }
}
