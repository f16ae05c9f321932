//! The Python client (`clients/python`) against this build of toolfleet:
//! its pytest suite, which starts a real `toolfleet serve` of its own from
//! the binary named by `TOOLFLEET_BIN`, and each example of
//! `examples/python` (the OpenAI Agents SDK agent, the LangChain tools, the
//! plain loop on the Chat Completions and on the Anthropic Messages wire)
//! driving its model loop on the scripted model against a real `serve`: the
//! example prints the scripted answer, the model read toolfleet's
//! envelopes (a job's outcome, waited for), and toolfleet ran the job.
//!
//! The package is used from its source (`PYTHONPATH`), so no install state
//! matters. Without python3 or the packages the tests use (httpx, pytest,
//! openai-agents, langchain-core) the tests are skipped, except under CI,
//! where they fail (.ci/run installs them).

mod common;

use std::process::{Command, Output, Stdio};

use common::month::{MONTH, Month, calls, usage};
use common::{Server, TOKEN, TempDir, config_with};
use serde_json::{Value, json};
use toolfleet_agent::testing::{Scripted, ScriptedModel};

const ANSWER: &str = "September has 62 lines; the receipts are read.";

/// Whether python3 can import every module of `modules`; under CI it must.
fn python_ready(modules: &str) -> bool {
    let ready = Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        common::missing(&format!(
            "python3 with the Python packages `{modules}` is not installed"
        ));
    }
    ready
}

/// `python3 <args>` in the repository's root, the client's source on
/// `PYTHONPATH`, writing no bytecode or cache into the tree.
fn python(args: &[&str]) -> Output {
    let source = common::repo().join("clients/python/src");
    Command::new("python3")
        .args(args)
        .current_dir(common::repo())
        .env("PYTHONPATH", &source)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .env("TOOLFLEET_BIN", env!("CARGO_BIN_EXE_toolfleet"))
        .env_remove("TOOLFLEET_TOKEN")
        .env_remove("TOOLFLEET_CONFIG")
        .env_remove("TOOLFLEET_URL")
        .stdin(Stdio::null())
        .output()
        .expect("python3 runs")
}

#[test]
fn the_python_clients_tests_pass_against_a_real_serve() {
    if !python_ready("httpx, pytest, agents, langchain_core") {
        return;
    }
    let output = python(&[
        "-m",
        "pytest",
        "clients/python/tests",
        "-q",
        "-p",
        "no:cacheprovider",
    ]);
    assert!(
        output.status.success(),
        "pytest failed: {}",
        common::said(&output)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(" passed") && !stdout.contains(" skipped"),
        "pytest ran every test: {}",
        common::said(&output)
    );
}

/// The envelopes the model saw in `request`'s tool results, in order:
/// Chat Completions' `tool` messages, or Anthropic's `tool_result` blocks.
fn tool_results(request: &Value) -> Vec<Value> {
    let parse = |content: &Value| -> Value {
        let content = content.as_str().expect("a tool result's content");
        serde_json::from_str(content)
            .unwrap_or_else(|e| panic!("a tool result is not JSON ({e}): {content}"))
    };
    let mut results = Vec::new();
    for message in request["messages"].as_array().expect("messages") {
        if message["role"] == "tool" {
            results.push(parse(&message["content"]));
        }
        for block in message["content"].as_array().into_iter().flatten() {
            if block["type"] == "tool_result" {
                results.push(parse(&block["content"]));
            }
        }
    }
    results
}

/// Runs the example `script` (with `args` after the common ones) as the
/// model `name` of a scripted model, against a real `serve`: the model
/// lists September's first page, starts the OCR job, then answers. The
/// example must print the answer, the model must have read toolfleet's
/// envelopes (the job's outcome, waited for), and toolfleet must have run
/// the job as the token's user.
async fn example_reaches_toolfleet(name: &str, script: &str, args: &[&str]) {
    let model = ScriptedModel::start().await;
    let dir = TempDir::new(name);
    let server = Server::start(&dir.0, &config_with(&dir.0, "", ""));
    let alice = server.client(TOKEN);
    let month = Month::read(&alice).await;
    model.script(
        name,
        vec![
            calls(vec![("find_expenses", json!({"month": MONTH}))]),
            calls(vec![(
                "start_receipt_ocr",
                json!({"receipt_ids": month.receipts}),
            )]),
            Scripted::Answer {
                text: ANSWER.into(),
                usage: usage(),
            },
        ],
    );

    let script = common::repo().join("examples/python").join(script);
    let mut command: Vec<String> = vec![
        script.to_str().expect("a UTF-8 path").to_owned(),
        "--server".into(),
        server.base.clone(),
        "--token".into(),
        TOKEN.into(),
        "--model-url".into(),
        model.base_url(),
        "--model".into(),
        name.into(),
        "--input".into(),
        "Read September's receipts.".into(),
    ];
    command.extend(args.iter().map(|a| (*a).to_owned()));
    let output = tokio::task::spawn_blocking(move || {
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        python(&command)
    })
    .await
    .expect("the example ran");
    assert!(
        output.status.success(),
        "the example failed: {}",
        common::said(&output)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        stdout.lines().last(),
        Some(format!("ANSWER: {ANSWER}").as_str()),
        "{}",
        common::said(&output)
    );

    // The model was asked three times, and read toolfleet's answers.
    let requests = model.requests(name);
    assert_eq!(requests.len(), 3, "{requests:?}");
    let first = tool_results(&requests[1]);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["status"], "ok", "{first:?}");
    let ids: Vec<&str> = first[0]["result"]["lines"]
        .as_array()
        .expect("the first page's lines")
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = month.lines[..50]
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, expected);
    // The job was waited for: the model read its result, not `running`.
    let second = tool_results(&requests[2]);
    assert_eq!(second.len(), 2, "{second:?}");
    let job = &second[1];
    assert_eq!(job["status"], "ok", "{job}");
    let read: Vec<&str> = job["result"]["receipts"]
        .as_array()
        .expect("the receipts read")
        .iter()
        .map(|r| r["receipt_id"].as_str().unwrap())
        .collect();
    assert_eq!(read, month.receipts, "{job}");

    // toolfleet ran the job, as alice.
    let jobs = alice.get("/v1/jobs?tool=start_receipt_ocr").await;
    let jobs = jobs["jobs"].as_array().expect("the job list");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["state"], "succeeded", "{jobs:?}");
    let outcome = alice
        .get(&format!(
            "/v1/jobs/{}",
            jobs[0]["job_id"].as_str().expect("a job id")
        ))
        .await;
    assert_eq!(outcome["result"], job["result"], "{outcome}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_agents_example_calls_toolfleet_from_its_agent_loop() {
    if python_ready("httpx, agents, openai") {
        example_reaches_toolfleet("python-agents", "openai_agents_example.py", &[]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_langchain_example_calls_toolfleet_through_its_tools() {
    if python_ready("httpx, langchain_core") {
        example_reaches_toolfleet("python-langchain", "langchain_example.py", &[]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_loop_example_speaks_chat_completions() {
    if python_ready("httpx") {
        example_reaches_toolfleet(
            "python-loop-openai",
            "chat_loop_example.py",
            &["--wire", "openai"],
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_loop_example_speaks_anthropic_messages() {
    if python_ready("httpx") {
        example_reaches_toolfleet(
            "python-loop-anthropic",
            "chat_loop_example.py",
            &["--wire", "anthropic"],
        )
        .await;
    }
}
