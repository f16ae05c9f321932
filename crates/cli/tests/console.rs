//! The console in a real browser: Playwright (`playwright-core` from npm)
//! drives Debian's Chromium against a real `toolfleet serve` on the
//! expense pack. This test makes the fleet's data through the API (a run
//! of the expense assistant waiting on a person, a run the caller drives
//! parked on a question (its page live while it resumes, then cancelled
//! from it), two plans to approve, a
//! question that is an HTML payload, another user's and another tenant's
//! tickets and jobs, a failed job and a running one), then runs
//! `tests/console/console.cjs`, which signs in and works the console as a
//! person would, with and without JavaScript, at laptop and phone widths,
//! saving a screenshot of each page; then it reads through the API what
//! the person's clicks did.
//!
//! Screenshots land in `$TOOLFLEET_ARTIFACTS/console` (by default the
//! test's temporary directory under the target directory).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::month::{calls, usage};
use common::{OTHER_TOKEN, Server, TOKEN, TempDir, config_with, eventually};
use serde_json::{Value, json};
use toolfleet_agent::testing::{Scripted, ScriptedModel};

const BOB_TOKEN: &str = "tf_test_bob";
const OPERATOR_TOKEN: &str = "tf_test_olga";

/// Where `playwright-core` is installed (.ci/run puts it there).
fn node_modules() -> PathBuf {
    let dir = std::env::var_os("TOOLFLEET_CONSOLE_NODE_DIR").map_or_else(
        || PathBuf::from("/var/tmp/toolfleet-console"),
        PathBuf::from,
    );
    dir.join("node_modules")
}

fn chromium() -> PathBuf {
    std::env::var_os("TOOLFLEET_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from)
}

fn tools(dir: &Path) -> String {
    let fixed = dir.join("fixed");
    let flaky = format!(
        "test -f {} && echo '{{\"report\": \"filed\"}}' || {{ echo 'the ledger is locked' >&2; exit 1; }}",
        fixed.display()
    );
    format!(
        r#"
[[auth.tokens]]
sha256 = "{bob}"
tenant = "acme"
user = "bob"
scopes = ["expenses:read", "expenses:submit"]

[[auth.tokens]]
sha256 = "{olga}"
tenant = "acme"
user = "olga"
scopes = ["fleet:read", "expenses:read"]

[[tools]]
name = "submit_approved"
shape = "command"
description = "Submit expense lines, with the caller's approval."
input_schema = {{ type = "object", additionalProperties = false, required = ["line_ids", "dry_run"], properties = {{ line_ids = {{ type = "array", minItems = 1, items = {{ type = "string" }} }}, dry_run = {{ type = "boolean" }} }} }}
approval = "caller"
executor = {{ kind = "builtin", name = "expenses.submit" }}

[[tools]]
name = "file_report"
shape = "job"
description = "File the month's report in the ledger."
input_schema = {{ type = "object", properties = {{ month = {{ type = "string" }}, ledger_key = {{ type = "string" }} }} }}
middleware = {{ redact = ["ledger_key"] }}
executor = {{ kind = "exec", program = "/bin/sh", args = ["-c", {flaky:?}] }}

[[tools]]
name = "slow_report"
shape = "job"
description = "A report that takes a minute."
executor = {{ kind = "exec", program = "/bin/sh", args = ["-c", "sleep 60; echo '{{}}'"] }}
"#,
        bob = common::sha(BOB_TOKEN),
        olga = common::sha(OPERATOR_TOKEN),
    )
}

/// A human question of `client`'s, its ticket's id.
async fn ask(client: &common::Client, question: &str, options: &[&str]) -> String {
    let mut args = json!({"question": question});
    if !options.is_empty() {
        args["options"] = json!(options);
    }
    let asked = client.call("ask_user", args).await;
    assert_eq!(asked["status"], "suspended", "{asked}");
    asked["ticket"].as_str().expect("a ticket").to_owned()
}

/// A plan of `submit_approved` for `lines`, waiting on its approval: the
/// ticket's id.
async fn plan(client: &common::Client, lines: &[&str]) -> String {
    let args = json!({"line_ids": lines, "dry_run": true});
    let dry = client.call("submit_approved", args.clone()).await;
    assert_eq!(dry["status"], "ok", "{dry}");
    let mut commit = args;
    commit["dry_run"] = json!(false);
    commit["confirm_token"] = dry["result"]["confirm_token"].clone();
    let suspended = client.call("submit_approved", commit).await;
    assert_eq!(suspended["status"], "suspended", "{suspended}");
    suspended["ticket"].as_str().expect("a ticket").to_owned()
}

/// A job of `tool`, waiting until it is in `state`: its id.
async fn job(client: &common::Client, tool: &str, state: &str) -> String {
    let args = match tool {
        "file_report" => json!({"month": "2026-09", "ledger_key": "k-hunter2"}),
        _ => json!({}),
    };
    let accepted = client.call(tool, args).await;
    let id = accepted["job_id"].as_str().expect("a job").to_owned();
    eventually(Duration::from_secs(20), || {
        let (client, id) = (client.clone(), id.clone());
        async move {
            let read = client.get(&format!("/v1/jobs/{id}")).await;
            let now = match read["status"].as_str() {
                Some("ok") => "succeeded",
                _ => read["state"].as_str().unwrap_or_default(),
            };
            (now == state).then_some(())
        }
    })
    .await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_works_the_console_in_a_real_browser() {
    let modules = node_modules();
    if !modules.join("playwright-core").is_dir() || !chromium().exists() {
        common::missing(&format!(
            "playwright-core in {} and Chromium at {}",
            modules.display(),
            chromium().display()
        ));
        return;
    }
    let model = ScriptedModel::start().await;
    let dir = TempDir::new("console");
    let path = dir.0.join("toolfleet.toml");
    std::fs::write(&path, config_with(&dir.0, "", &tools(&dir.0))).expect("config");
    let url = model.base_url();
    let env = [("EXPENSES_MODEL_URL", url.as_str())];
    let server = Server::start_role_env(&path, "serve", "toolfleet serving on ", &env);
    let (alice, bob, mallory) = (
        server.client(TOKEN),
        server.client(BOB_TOKEN),
        server.client(OTHER_TOKEN),
    );

    // A run of the expense assistant, parked on its question to alice.
    let question = "Is exp-007 travel or meals?";
    model.script(
        "llama3.1",
        vec![
            calls(vec![(
                "ask_user",
                json!({"question": question, "options": ["travel", "meals"]}),
            )]),
            Scripted::Answer {
                text: "Filed exp-007 as travel.".into(),
                usage: usage(),
            },
        ],
    );
    let started = alice
        .post(
            "/v1/runs",
            json!({"agent": "expense_assistant", "input": "Sort out exp-007."}),
        )
        .await;
    let run = started["result"]["run_id"]
        .as_str()
        .expect("a run")
        .to_owned();
    let waiting = eventually(Duration::from_secs(30), || {
        let (alice, run) = (alice.clone(), run.clone());
        async move {
            let read = alice.get(&format!("/v1/runs/{run}")).await;
            (read["result"]["state"] == "waiting").then_some(read)
        }
    })
    .await;
    let run_ticket = waiting["result"]["wait"]["tickets"][0]
        .as_str()
        .expect("the run's ticket")
        .to_owned();

    // A run alice's own loop drives, parked on a question of hers.
    let driven = alice
        .post("/v1/runs", json!({"checkpoint": {"step": 1}}))
        .await;
    let driven = driven["result"]["run_id"]
        .as_str()
        .expect("a run")
        .to_owned();
    let asked = alice
        .post(
            "/v1/calls",
            json!({"tool": "ask_user", "args": {"question": "Keep the run going?"}, "run_id": driven}),
        )
        .await;
    let driven_ticket = asked["ticket"].as_str().expect("a ticket").to_owned();
    let parked = alice
        .post(
            &format!("/v1/runs/{driven}/wait"),
            json!({"tickets": [driven_ticket]}),
        )
        .await;
    assert_eq!(parked["result"]["state"], "waiting", "{parked}");

    let xss = "<img src=x onerror=alert(1)>";
    let xss_ticket = ask(&alice, xss, &["fine"]).await;
    let typed_question = "Which project is the Berlin trip for?";
    let typed_ticket = ask(&alice, typed_question, &[]).await;
    let approve = plan(&alice, &["exp-001"]).await;
    let reject = plan(&alice, &["exp-002"]).await;
    let bobs_question = "A question for Bob alone";
    ask(&bob, bobs_question, &[]).await;
    let mallorys_question = "A question of another tenant";
    ask(&mallory, mallorys_question, &[]).await;
    let bobs_job = job(&bob, "file_report", "failed").await;
    let mallorys_job = job(&mallory, "file_report", "failed").await;
    let failed = job(&alice, "file_report", "failed").await;
    // The ledger is fixed: a retry now succeeds.
    std::fs::write(dir.0.join("fixed"), "").expect("the fix");
    let slow = job(&alice, "slow_report", "running").await;

    let shots = std::env::var_os("TOOLFLEET_ARTIFACTS")
        .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from)
        .join("console");
    std::fs::create_dir_all(&shots).expect("the screenshots' directory");
    let plan = json!({
        "base": server.base,
        "chromium": chromium(),
        "shots": shots,
        "token": TOKEN,
        "operatorToken": OPERATOR_TOKEN,
        "run": run,
        "runTicket": run_ticket,
        "driven": driven,
        "drivenTicket": driven_ticket,
        "question": question,
        "xss": xss,
        "xssTicket": xss_ticket,
        "typedTicket": typed_ticket,
        "typedQuestion": typed_question,
        "approve": approve,
        "reject": reject,
        "bobsQuestion": bobs_question,
        "mallorysQuestion": mallorys_question,
        "bobsJob": bobs_job,
        "mallorysJob": mallorys_job,
        "failed": failed,
        "slow": slow,
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console/console.cjs");
    let ran = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(script)
            .env("NODE_PATH", modules)
            .env("CONSOLE_TEST", plan.to_string())
            .output()
            .expect("node runs")
    })
    .await
    .expect("the browser's run");
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    println!("{said}");
    assert!(ran.status.success(), "the browser test failed:\n{said}");

    // What the clicks did, as the API reads it.
    let ticket = |id: String| {
        let alice = alice.clone();
        async move { alice.get(&format!("/v1/tickets/{id}")).await["result"].clone() }
    };
    let approved: Value = ticket(approve).await;
    assert_eq!(approved["state"], "answered", "{approved}");
    let rejected: Value = ticket(reject).await;
    assert_eq!(rejected["state"], "answered", "{rejected}");
    assert_eq!(
        rejected["outcome"]["error"]["details"]["reason"], "Not this month.",
        "{rejected}"
    );
    let typed: Value = ticket(typed_ticket).await;
    assert_eq!(typed["answer"], "Project Spree", "{typed}");
    let answered = alice.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(answered["result"]["answer"], "Filed exp-007 as travel.");
    let retried = alice.get(&format!("/v1/jobs/{failed}")).await;
    assert_eq!(retried["result"]["report"], "filed", "{retried}");
    let cancelled = alice.get(&format!("/v1/jobs/{slow}")).await;
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    // The job's record: its arguments with the tool's redactions, as the
    // page showed them; another user's or tenant's reads as missing.
    let record = alice.get(&format!("/v1/jobs/{failed}/record")).await;
    assert_eq!(record["status"], "ok", "{record}");
    let record = &record["result"];
    assert_eq!(record["args"]["month"], "2026-09", "{record}");
    assert_eq!(record["args"]["ledger_key"], "[redacted]", "{record}");
    assert_eq!(record["attempts"], 1, "{record}");
    assert_eq!(record["requeues"], 1, "{record}");
    assert_eq!(record["outcome"]["status"], "ok", "{record}");
    for other in [&bobs_job, &mallorys_job] {
        let missing = alice.get(&format!("/v1/jobs/{other}/record")).await;
        assert_eq!(missing["error"]["code"], "not_found", "{missing}");
    }
    // The session cookie is Secure behind a TLS proxy, and only there.
    let http = toolfleet_executors::http_client().expect("a client");
    for (proto, secure) in [("https", true), ("http", false)] {
        let signed = http
            .post(format!("{}/console/login", server.base))
            .header("x-forwarded-proto", proto)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={TOKEN}"))
            .send()
            .await
            .expect("a sign-in");
        assert_eq!(signed.status(), 303);
        let cookie = signed
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(cookie.contains("HttpOnly; SameSite=Strict"), "{cookie}");
        assert!(cookie.contains("Max-Age=28800"), "{cookie}");
        assert_eq!(cookie.ends_with("; Secure"), secure, "{proto}: {cookie}");
    }

    // The list's time window, and its bad input naming the field.
    // (A job's id is made a moment before its record's created_at.)
    let since = record["created_at"].as_i64().unwrap_or_default() - 1_000;
    let windowed = alice.get(&format!("/v1/jobs?since={since}")).await;
    let listed: Vec<&str> = windowed["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["job_id"].as_str())
        .collect();
    assert!(listed.contains(&failed.as_str()), "{windowed}");
    assert!(
        alice.get("/v1/jobs?until=1000").await["jobs"]
            .as_array()
            .is_some_and(Vec::is_empty)
    );
    for (bad, field) in [
        ("since=soon", "since"),
        ("until=-1", "until"),
        ("since=9&until=9", "since must be before until"),
    ] {
        let (status, refused) = alice
            .raw(reqwest::Method::GET, &format!("/v1/jobs?{bad}"), None)
            .await;
        assert_eq!(status, 400, "{refused}");
        assert_eq!(refused["error"]["code"], "bad_request", "{refused}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{refused}");
    }
    let stopped = alice.get(&format!("/v1/runs/{driven}")).await;
    assert_eq!(stopped["result"]["state"], "cancelled", "{stopped}");
    // The queues and a record: bad input and who may read them.
    let operator = server.client(OPERATOR_TOKEN);
    let queues = operator.get("/v1/queues?since_s=600").await;
    assert!(
        queues["result"]["pools"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "{queues}"
    );
    for bad in ["since_s=5", "since_s=86401", "since_s=soon"] {
        let (status, refused) = operator
            .raw(reqwest::Method::GET, &format!("/v1/queues?{bad}"), None)
            .await;
        assert_eq!(status, 400, "{bad}: {refused}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("since_s"), "{refused}");
    }
    let not_operator = alice.get("/v1/queues").await;
    assert_eq!(not_operator["error"]["code"], "forbidden", "{not_operator}");
    for bad in ["not-a-job", "%27%3B--"] {
        let missing = alice.get(&format!("/v1/jobs/{bad}/record")).await;
        assert_eq!(missing["error"]["code"], "not_found", "{bad}: {missing}");
    }
    // Bob's job was never touched by alice.
    let bobs = bob.get(&format!("/v1/jobs/{bobs_job}")).await;
    assert_eq!(bobs["state"], "failed", "{bobs}");
}
