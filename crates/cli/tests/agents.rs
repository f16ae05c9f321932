//! Agent tools on a real `toolfleet serve`, their model the scripted server
//! of this test process speaking the OpenAI and Anthropic wire formats: a
//! job tool awaited, a human tool parking the agent's job (its worker
//! free) until a person answers, and a process killed mid-loop whose agent resumes from its
//! checkpoint without making its settled tool calls again.

mod common;

use std::time::Duration;

use common::{Server, TOKEN, TempDir, config_with, events, eventually, refused_at_start, settle};
use serde_json::{Value, json};
use toolfleet_agent::model::Usage;
use toolfleet_agent::testing::{Scripted, ScriptedModel};

fn usage() -> Usage {
    Usage {
        input_tokens: 50,
        output_tokens: 10,
    }
}

/// An agent tool for the expense pack's tools, on the scripted `model`.
fn agent(name: &str, provider: &str, base: &str, model: &str, tools: &[&str]) -> String {
    format!(
        r#"
[[tools]]
name = "{name}"
shape = "agent"
description = "A sub-agent of the tests."
input_schema = {{ type = "object", required = ["task"], properties = {{ task = {{ type = "string" }} }} }}
max_attempts = 3

[tools.executor]
kind = "agent"
provider = "{provider}"
base_url = "{base}"
model = "{model}"
system_prompt = "You reconcile expenses."
tools = {tools:?}
scopes = ["expenses:read"]
max_steps = 6
max_wall_s = 60
"#
    )
}

/// A job tool that takes `seconds` and counts its runs in `dir/runs`.
fn slow_job(dir: &std::path::Path, seconds: u32) -> String {
    let runs = dir.join("runs");
    format!(
        r#"
[[tools]]
name = "slow_count"
shape = "job"
description = "Counts slowly."
input_schema = {{ type = "object" }}
executor = {{ kind = "exec", program = "sh", args = ["-c", "echo run >> {runs}; sleep {seconds}; echo '{{\"counted\": 7}}'"] }}
"#,
        runs = runs.display()
    )
}

async fn start_agent(client: &common::Client, tool: &str) -> String {
    let started = client
        .call(tool, json!({"task": "Reconcile September 2026."}))
        .await;
    assert_eq!(started["status"], "running", "{started}");
    started["job_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_awaits_a_job_tool_and_answers_with_its_evidence() {
    let model = ScriptedModel::start().await;
    model.script(
        "gpt-jobs",
        vec![
            Scripted::Calls {
                calls: vec![(
                    "start_receipt_ocr".into(),
                    json!({"receipt_ids": ["rcpt-005", "rcpt-015"]}),
                )],
                usage: usage(),
            },
            Scripted::Answer {
                text: "Both receipts read.".into(),
                usage: usage(),
            },
        ],
    );
    let dir = TempDir::new("agent-job");
    let extra = agent(
        "ocr_agent",
        "openai",
        &model.base_url(),
        "gpt-jobs",
        &["start_receipt_ocr"],
    );
    let server = Server::start(&dir.0, &config_with(&dir.0, "", &extra));
    let alice = server.client(TOKEN);
    let job = start_agent(&alice, "ocr_agent").await;
    let done = settle(&alice, &job).await;
    assert_eq!(done["status"], "ok", "{done}");
    let out = &done["result"];
    assert_eq!(out["status"], "answered", "{out}");
    assert_eq!(out["evidence"][0]["tool"], "start_receipt_ocr", "{out}");
    // The model was shown the job's result, not its `running` envelope.
    let second = &model.requests("gpt-jobs")[1];
    let shown = second["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    assert!(shown.contains("amount_cents"), "{second}");
    assert!(!shown.contains("running"), "{second}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_human_tool_suspends_the_agent_until_the_ticket_is_answered() {
    let model = ScriptedModel::start().await;
    model.script(
        "claude-asks",
        vec![
            Scripted::Calls {
                calls: vec![(
                    "ask_user".into(),
                    json!({"question": "Is line 7 travel or meals?", "options": ["travel", "meals"]}),
                )],
                usage: usage(),
            },
            Scripted::Answer {
                text: "Line 7 is travel.".into(),
                usage: usage(),
            },
        ],
    );
    model.script(
        "quick",
        vec![Scripted::Answer {
            text: "Nothing to do.".into(),
            usage: usage(),
        }],
    );
    let dir = TempDir::new("agent-human");
    let extra = format!(
        "{}{}",
        // Two seconds of wall time, and the person takes longer: time spent
        // waiting for them is not the agent's.
        agent(
            "asking_agent",
            "anthropic",
            &model.base_url(),
            "claude-asks",
            &["ask_user"],
        )
        .replace("max_wall_s = 60", "max_wall_s = 2"),
        agent(
            "quick_agent",
            "openai",
            &model.base_url(),
            "quick",
            &["find_expenses"]
        ),
    );
    // One worker slot per pool: a waiting agent that held its slot would
    // keep every other agent from running.
    let server = Server::start(&dir.0, &config_with(&dir.0, "concurrency = 1", &extra));
    let alice = server.client(TOKEN);
    let seen = events(&alice);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let job = start_agent(&alice, "asking_agent").await;
    // The agent asks; the question waits as a ticket for a person, and the
    // tenant's event stream announces it.
    let open = eventually(Duration::from_secs(15), || {
        let seen = seen.clone();
        async move {
            let seen = seen.lock().unwrap();
            seen.iter()
                .find(|e| e["kind"] == "ticket" && e["state"] == "open")
                .and_then(|e| e["id"].as_str())
                .map(str::to_owned)
        }
    })
    .await;
    let ticket = alice.get(&format!("/v1/tickets/{open}")).await;
    assert_eq!(
        ticket["result"]["question"], "Is line 7 travel or meals?",
        "{ticket}"
    );
    // Parked: the job waits, its worker free for other work.
    let parked = eventually(Duration::from_secs(10), || {
        let alice = alice.clone();
        let job = job.clone();
        async move {
            let state = alice.get(&format!("/v1/jobs/{job}")).await;
            (state["state"] == "retrying").then_some(state)
        }
    })
    .await;
    assert_eq!(parked["status"], "running", "{parked}");
    let other = start_agent(&alice, "quick_agent").await;
    let other = settle(&alice, &other).await;
    assert_eq!(other["result"]["answer"], "Nothing to do.", "{other}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        model.requests("claude-asks").len(),
        1,
        "no model call while the person has not answered"
    );
    let answered = alice
        .post(
            &format!("/v1/tickets/{open}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    assert_eq!(answered["result"]["answer"], "travel", "{answered}");
    let done = settle(&alice, &job).await;
    assert_eq!(done["result"]["status"], "answered", "{done}");
    assert_eq!(done["result"]["answer"], "Line 7 is travel.");
    let shown = model.requests("claude-asks")[1].to_string();
    assert!(
        shown.contains("travel"),
        "the answer reached the model: {shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_resumes_the_loop_without_repeating_settled_calls() {
    let model = ScriptedModel::start().await;
    model.script(
        "gpt-resume",
        vec![
            Scripted::Calls {
                calls: vec![("find_expenses".into(), json!({"month": "2026-09"}))],
                usage: usage(),
            },
            Scripted::Calls {
                calls: vec![("slow_count".into(), json!({}))],
                usage: usage(),
            },
            Scripted::Answer {
                text: "Counted 7.".into(),
                usage: usage(),
            },
        ],
    );
    let dir = TempDir::new("agent-resume");
    let extra = format!(
        "{}{}",
        slow_job(&dir.0, 4),
        agent(
            "resuming_agent",
            "openai",
            &model.base_url(),
            "gpt-resume",
            &["find_expenses", "slow_count"],
        )
    );
    let text = config_with(&dir.0, "lease_s = 1", &extra);
    let mut server = Server::start(&dir.0, &text);
    let alice = server.client(TOKEN);
    let job = start_agent(&alice, "resuming_agent").await;
    // Wait until the agent is awaiting the slow job, then kill everything.
    let runs = dir.0.join("runs");
    eventually(Duration::from_secs(20), || {
        let runs = runs.clone();
        async move { runs.exists().then_some(()) }
    })
    .await;
    assert_eq!(model.requests("gpt-resume").len(), 2);
    server.kill();
    // The slow job's process died with the server; its next attempt and the
    // agent's both come from the store after a restart.
    let server = Server::start_with(&server.config.clone());
    let alice = server.client(TOKEN);
    let done = settle(&alice, &job).await;
    assert_eq!(done["status"], "ok", "{done}");
    let out = &done["result"];
    assert_eq!(out["status"], "answered", "{out}");
    assert_eq!(out["answer"], "Counted 7.");
    // The model was not asked again for the steps it had answered: one
    // request per step, and the last step's once.
    let requests = model.requests("gpt-resume");
    assert_eq!(requests.len(), 3, "one model call per step: {requests:?}");
    // find_expenses settled before the kill and was not called again; the
    // slow job was awaited again, not started again.
    let calls: Vec<Value> = out["evidence"].as_array().unwrap().clone();
    let tools: Vec<&str> = calls.iter().map(|e| e["tool"].as_str().unwrap()).collect();
    assert_eq!(tools, ["find_expenses", "slow_count"], "{out}");
    let jobs = alice.get("/v1/jobs?tool=slow_count").await;
    assert_eq!(
        jobs["jobs"].as_array().unwrap().len(),
        1,
        "one slow job, however many attempts: {jobs}"
    );
}

#[test]
fn agent_declarations_that_cannot_work_are_refused_at_start() {
    let base = "http://127.0.0.1:9/v1";
    refused_at_start(
        &agent("lost", "openai", base, "m", &["no_such_tool"]),
        "names tool `no_such_tool`, which is not registered",
    );
    refused_at_start(
        &agent("dotted", "openai", base, "m", &["toolfleet.noop"]),
        "model providers take tool names",
    );
    refused_at_start(
        &agent("keyless", "anthropic", base, "m", &["find_expenses"]).replace(
            "max_steps = 6",
            "max_steps = 6\napi_key_env = \"TOOLFLEET_MISSING_KEY\"",
        ),
        "TOOLFLEET_MISSING_KEY",
    );
    refused_at_start(
        &agent("shapeless", "openai", base, "m", &["find_expenses"])
            .replace("shape = \"agent\"", "shape = \"job\""),
        "needs shape = \"agent\"",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_calling_an_agent_spends_from_its_own_budget() {
    let model = ScriptedModel::start().await;
    model.script(
        "parent",
        vec![
            Scripted::Calls {
                calls: vec![("child_agent".into(), json!({"task": "Sum the receipts."}))],
                usage: usage(),
            },
            Scripted::Answer {
                text: "The child summed them.".into(),
                usage: usage(),
            },
        ],
    );
    model.script(
        "child",
        vec![Scripted::Answer {
            text: "61.87".into(),
            usage: Usage {
                input_tokens: 1000,
                output_tokens: 100,
            },
        }],
    );
    let dir = TempDir::new("agent-nested");
    let extra = format!(
        "{}{}",
        agent(
            "parent_agent",
            "openai",
            &model.base_url(),
            "parent",
            &["child_agent"]
        ),
        agent(
            "child_agent",
            "anthropic",
            &model.base_url(),
            "child",
            &["find_expenses"]
        )
        .replace("max_steps = 6", "max_steps = 20"),
    );
    let server = Server::start(&dir.0, &config_with(&dir.0, "", &extra));
    let alice = server.client(TOKEN);
    let job = start_agent(&alice, "parent_agent").await;
    let done = settle(&alice, &job).await;
    let out = &done["result"];
    assert_eq!(out["status"], "answered", "{done}");
    // The child's tokens count against the parent: 2 x 60 of its own, 1,100 of the child's.
    assert_eq!(out["usage"]["total_tokens"], 1220, "{out}");
    let child = &out["evidence"][0];
    assert_eq!(child["tool"], "child_agent", "{out}");
    // The child ran within what the parent had left: 5 of the parent's 6
    // steps, not the 20 it declares.
    let jobs = alice.get("/v1/jobs?tool=child_agent").await;
    let child_job = jobs["jobs"][0]["job_id"].as_str().unwrap().to_owned();
    let child_done = alice.get(&format!("/v1/jobs/{child_job}")).await;
    assert_eq!(
        child_done["result"]["usage"]["budget"]["max_steps"], 5,
        "{child_done}"
    );
}
