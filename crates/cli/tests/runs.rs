//! Runs end to end over HTTP against a real `toolfleet serve`: the seed's
//! worked example as a run of `expense_assistant` (pages, the OCR job and
//! the person's question awaited together with the run parked and no
//! worker slot held, a SIGKILL and a restart while it waits, the dry run,
//! the approval, the commit, a retried commit), and the bad input of runs,
//! waits and approvals; a run's callback and event stream, the command
//! line (`run --wait`, `inbox`, `reject`), messages to an answered run,
//! cancelling a waiting one, budgets, the list of runs and who sees them,
//! tickets that expire, and the idempotency of starting a run.

mod common;

use std::time::Duration;

use common::month::{self, Month, calls, usage};
use common::{OTHER_TOKEN, Server, TOKEN, TempDir, config_with, eventually};
use serde_json::{Value, json};
use toolfleet_agent::testing::{Scripted, ScriptedModel};

/// The run as it stands.
async fn run_of(client: &common::Client, run: &str) -> Value {
    client.get(&format!("/v1/runs/{run}")).await["result"].clone()
}

/// Waits until the run is in `state`, answering it then.
async fn run_in(client: &common::Client, run: &str, state: &str) -> Value {
    eventually(Duration::from_secs(30), || {
        let client = client.clone();
        let (run, state) = (run.to_owned(), state.to_owned());
        async move {
            let now = run_of(&client, &run).await;
            (now["state"] == state.as_str()).then_some(now)
        }
    })
    .await
}

/// The busy slots of `pool` in the process's metrics.
async fn busy_slots(client: &common::Client, pool: &str) -> Option<f64> {
    let text = client
        .http
        .get(format!("{}/metrics", client.base))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let series = format!("toolfleet_worker_busy_slots{{pool=\"{pool}\"}}");
    text.lines()
        .find(|l| l.starts_with(&series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worked_example_runs_as_a_parked_and_resumed_run_of_the_assistant() {
    let model = ScriptedModel::start().await;
    let dir = TempDir::new("runs-worked");
    let config = config_with(&dir.0, "", "");
    let env = [("EXPENSES_MODEL_URL", model.base_url())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let path = dir.0.join("toolfleet.toml");
    std::fs::write(&path, &config).unwrap();
    let mut server = Server::start_role_env(&path, "serve", "toolfleet serving on ", &env);
    let alice = server.client(TOKEN);

    let month = Month::read(&alice).await;
    model.script(
        "llama3.1",
        month.script("Your September report is submitted."),
    );

    let started = alice
        .post(
            "/v1/runs",
            json!({"agent": "expense_assistant", "input": "Submit my expenses for 2026-09."}),
        )
        .await;
    assert_eq!(started["status"], "ok", "{started}");
    let run = started["result"]["run_id"].as_str().unwrap().to_owned();

    // Parked on the OCR job and the question at once.
    let waiting = run_in(&alice, &run, "waiting").await;
    let wait = &waiting["wait"];
    let tickets = wait["tickets"].as_array().unwrap().clone();
    assert_eq!(tickets.len(), 1, "{waiting}");
    let question = tickets[0].as_str().unwrap().to_owned();
    // The job settles; the run still waits for the person, holding no slot.
    let still = eventually(Duration::from_secs(30), || {
        let alice = alice.clone();
        let run = run.clone();
        async move {
            let now = run_of(&alice, &run).await;
            let job_done = now["transcript"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["type"] == "tool_result" && e["tool"] == "start_receipt_ocr");
            (job_done || (now["wait"]["jobs"].as_array().is_some_and(|j| j.is_empty())))
                .then_some(now)
        }
    })
    .await;
    assert_eq!(still["state"], "waiting", "{still}");
    assert_eq!(busy_slots(&alice, "agents").await, Some(0.0));
    assert_eq!(
        model.requests("llama3.1").len(),
        3,
        "no model call while it waits"
    );

    // The next morning: every process killed, started again.
    server.kill();
    let mut server = Server::start_role_env(&path, "serve", "toolfleet serving on ", &env);
    let alice = server.client(TOKEN);
    let inbox = alice.get("/v1/tickets?state=open").await;
    let listed: Vec<&str> = inbox["result"]["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["ticket"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [question.as_str()], "{inbox}");
    let answered = alice
        .post(
            &format!("/v1/tickets/{question}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    assert_eq!(answered["status"], "ok", "{answered}");

    // The dry run, then the commit waits for its approval.
    let approving = eventually(Duration::from_secs(30), || {
        let alice = alice.clone();
        async move {
            let inbox = alice.get("/v1/tickets?state=open&kind=approval").await;
            inbox["result"]["tickets"][0]
                .get("ticket")
                .and_then(Value::as_str)
                .map(str::to_owned)
        }
    })
    .await;
    let ticket = alice.get(&format!("/v1/tickets/{approving}")).await;
    assert_eq!(ticket["result"]["kind"], "approval", "{ticket}");
    assert_eq!(
        ticket["result"]["plan"]["lines"],
        month.known.len(),
        "{ticket}"
    );
    let parked = run_in(&alice, &run, "waiting").await;
    assert_eq!(parked["wait"]["tickets"][0], approving.as_str());
    // Answering an approval as a question is refused, nothing changes.
    let wrong = alice
        .post(
            &format!("/v1/tickets/{approving}/answer"),
            json!({"answer": "yes"}),
        )
        .await;
    assert_eq!(wrong["error"]["code"], "invalid_arguments", "{wrong}");

    let approved = common::toolfleet(&[
        "--config",
        path.to_str().unwrap(),
        "approve",
        &approving,
        "--server",
        &server.base,
        "--token",
        TOKEN,
    ]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    let done = run_in(&alice, &run, "answered").await;
    assert_eq!(done["answer"], "Your September report is submitted.");
    let approval = alice.get(&format!("/v1/tickets/{approving}")).await;
    let report = approval["result"]["outcome"]["result"]["report_id"].clone();
    assert!(report.is_string(), "{approval}");

    // A retried commit, as the run made it, answers the same report.
    let again = month::commit_args(&done);
    assert!(
        again["confirm_token"].as_str().unwrap().starts_with("ct1."),
        "{again}"
    );
    let retried = alice.call("submit_report", again).await;
    assert_eq!(retried["result"]["report_id"], report, "{retried}");

    // The transcript shows each step.
    month::assert_steps(&done);
    server.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_to_runs_waits_and_approvals_is_a_clear_error() {
    let dir = TempDir::new("runs-bad");
    let bound = "[limits]\nrun_checkpoint_bytes = 1000\n";
    let server = Server::start(&dir.0, &config_with(&dir.0, "", bound));
    let alice = server.client(TOKEN);
    let mallory = server.client(OTHER_TOKEN);

    let unknown = alice
        .post("/v1/runs", json!({"agent": "nobody", "input": "hi"}))
        .await;
    assert_eq!(unknown["error"]["code"], "invalid_arguments", "{unknown}");
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expense_assistant"),
        "{unknown}"
    );

    // A run the caller drives, and a job of alice's.
    let run = alice
        .post("/v1/runs", json!({"checkpoint": {"messages": []}}))
        .await;
    let run = run["result"]["run_id"].as_str().unwrap().to_owned();
    let job = alice
        .call("start_receipt_ocr", json!({"receipt_ids": ["rcpt-005"]}))
        .await;
    let job = job["job_id"].as_str().unwrap().to_owned();
    // Another tenant's run and job read as missing.
    let theirs = mallory.get(&format!("/v1/runs/{run}")).await;
    assert_eq!(theirs["error"]["code"], "not_found", "{theirs}");
    let their_run = mallory.post("/v1/runs", json!({"checkpoint": {}})).await;
    let their_run = their_run["result"]["run_id"].as_str().unwrap().to_owned();
    let on_other = mallory
        .post(
            &format!("/v1/runs/{their_run}/wait"),
            json!({"jobs": [job]}),
        )
        .await;
    assert_eq!(on_other["error"]["code"], "not_found", "{on_other}");
    let missing = mallory
        .post(
            &format!("/v1/runs/{their_run}/wait"),
            json!({"jobs": ["0190aaaa-0000-7000-8000-000000000000"]}),
        )
        .await;
    assert_eq!(
        on_other["error"]["message"]
            .as_str()
            .map(|m| m.replace(&job, "ID")),
        missing["error"]["message"]
            .as_str()
            .map(|m| m.replace("0190aaaa-0000-7000-8000-000000000000", "ID")),
        "another's job answers exactly as a missing one"
    );
    // A checkpoint over the bound.
    let big = "x".repeat(2000);
    let over = alice
        .post(
            &format!("/v1/runs/{run}/wait"),
            json!({"jobs": [job], "checkpoint": {"blob": big}}),
        )
        .await;
    assert_eq!(over["error"]["code"], "payload_too_large", "{over}");
    // Nothing was lost: the run still runs, and waits now.
    assert_eq!(run_of(&alice, &run).await["state"], "running");
    let waited = alice
        .post(
            &format!("/v1/runs/{run}/wait"),
            json!({"for": "all", "jobs": [job], "checkpoint": {"messages": ["kept"]}}),
        )
        .await;
    assert_eq!(waited["status"], "ok", "{waited}");
    let resumed = run_in(&alice, &run, "running").await;
    assert_eq!(
        resumed["resumed"]["checkpoint"]["messages"][0], "kept",
        "{resumed}"
    );
    assert_eq!(
        resumed["resumed"]["items"][0]["envelope"]["status"], "ok",
        "{resumed}"
    );

    // `messages` to a run that is not an answered assistant's.
    let message = alice
        .post(
            &format!("/v1/runs/{run}/messages"),
            json!({"content": "next"}),
        )
        .await;
    assert_eq!(message["error"]["code"], "conflict", "{message}");

    // Approving a question, or a ticket of nobody's.
    let asked = alice
        .call(
            "ask_user",
            json!({"question": "Which?", "options": ["a", "b"]}),
        )
        .await;
    let question = asked["ticket"].as_str().unwrap().to_owned();
    let approve = alice
        .post(&format!("/v1/tickets/{question}/approve"), json!({}))
        .await;
    assert_eq!(approve["error"]["code"], "invalid_arguments", "{approve}");
    let theirs = mallory
        .post(&format!("/v1/tickets/{question}/approve"), json!({}))
        .await;
    assert_eq!(theirs["error"]["code"], "not_found", "{theirs}");
    // The inbox lists it for alice, not for mallory.
    let inbox = alice.get("/v1/tickets?state=open&kind=question").await;
    assert_eq!(inbox["result"]["tickets"][0]["ticket"], question.as_str());
    let empty = mallory.get("/v1/tickets").await;
    assert_eq!(empty["result"]["tickets"], json!([]), "{empty}");
    let (status, bad) = alice
        .raw(reqwest::Method::GET, "/v1/tickets?state=sideways", None)
        .await;
    assert_eq!(
        (status, &bad["error"]["code"]),
        (400, &json!("bad_request")),
        "{bad}"
    );
}

/// A command declaring `approval` waits for it whoever calls; approving
/// runs the commit once, a settled approval cannot be decided again, and
/// rejecting answers `rejected` with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_declaring_approval_commits_once_approved_or_is_rejected() {
    let dir = TempDir::new("runs-approval");
    let extra = r#"
[[tools]]
name = "submit_approved"
shape = "command"
description = "Submit expense lines, with a manager's approval."
input_schema = { type = "object", additionalProperties = false, required = ["line_ids", "dry_run"], properties = { line_ids = { type = "array", minItems = 1, items = { type = "string" } }, dry_run = { type = "boolean" }, categories = { type = "object" } } }
approval = "caller"
executor = { kind = "builtin", name = "expenses.submit" }

[[tools]]
name = "submit_soon"
shape = "command"
description = "Submit expense lines, approved within a second."
input_schema = { type = "object", additionalProperties = false, required = ["line_ids", "dry_run"], properties = { line_ids = { type = "array", minItems = 1, items = { type = "string" } }, dry_run = { type = "boolean" } } }
approval = "caller"
expires_in_s = 1
executor = { kind = "builtin", name = "expenses.submit" }
"#;
    let server = Server::start(&dir.0, &config_with(&dir.0, "", extra));
    let alice = server.client(TOKEN);
    let (hook, hooks) = common::hook_receiver(vec![200]).await;
    let args = json!({"line_ids": ["exp-001", "exp-002"], "dry_run": true});
    let dry = alice.call("submit_approved", args.clone()).await;
    assert_eq!(dry["status"], "ok", "{dry}");
    let mut commit = args.clone();
    commit["dry_run"] = json!(false);
    commit["confirm_token"] = dry["result"]["confirm_token"].clone();
    // Called outside a run, with a callback: it hears the outcome.
    let suspended = alice
        .post(
            "/v1/calls",
            json!({"tool": "submit_approved", "args": commit, "callback_url": hook}),
        )
        .await;
    assert_eq!(suspended["status"], "suspended", "{suspended}");
    assert_eq!(suspended["plan"]["lines"], 2, "{suspended}");
    let ticket = suspended["ticket"].as_str().unwrap().to_owned();
    // The same commit again waits on the same ticket.
    let again = alice.call("submit_approved", commit.clone()).await;
    assert_eq!(again["ticket"], ticket.as_str(), "{again}");
    let approved = alice
        .post(&format!("/v1/tickets/{ticket}/approve"), json!({}))
        .await;
    assert_eq!(approved["status"], "ok", "{approved}");
    let report = approved["result"]["outcome"]["result"]["report_id"].clone();
    assert!(report.is_string(), "{approved}");
    let heard = eventually(Duration::from_secs(15), || {
        let hooks = hooks.clone();
        async move { hooks.lock().unwrap().first().map(|h| h.body.clone()) }
    })
    .await;
    assert!(common::signed(&hooks.lock().unwrap()[0].signature, &heard));
    let heard: Value = serde_json::from_str(&heard).unwrap();
    assert_eq!(heard["event"], "ticket.answered", "{heard}");
    assert_eq!(heard["outcome"]["result"]["report_id"], report, "{heard}");
    let twice = alice
        .post(&format!("/v1/tickets/{ticket}/approve"), json!({}))
        .await;
    assert_eq!(twice["error"]["code"], "conflict", "{twice}");
    let retried = alice.call("submit_approved", commit).await;
    assert_eq!(retried["result"]["report_id"], report, "{retried}");

    // Another plan, rejected with a reason.
    let args = json!({"line_ids": ["exp-003"], "dry_run": true});
    let dry = alice.call("submit_approved", args.clone()).await;
    let mut commit = args;
    commit["dry_run"] = json!(false);
    commit["confirm_token"] = dry["result"]["confirm_token"].clone();
    let suspended = alice.call("submit_approved", commit.clone()).await;
    let ticket = suspended["ticket"].as_str().unwrap().to_owned();
    let rejected = alice
        .post(
            &format!("/v1/tickets/{ticket}/reject"),
            json!({"reason": "not this month"}),
        )
        .await;
    assert_eq!(
        rejected["result"]["outcome"]["error"]["code"], "rejected",
        "{rejected}"
    );
    let after = alice.call("submit_approved", commit).await;
    assert_eq!(after["error"]["code"], "rejected", "{after}");
    assert!(
        after["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not this month"),
        "{after}"
    );

    // An approval nobody decided in time expires: deciding it is refused,
    // and its commit answers `expired`.
    let args = json!({"line_ids": ["exp-004"], "dry_run": true});
    let dry = alice.call("submit_soon", args.clone()).await;
    let mut commit = args;
    commit["dry_run"] = json!(false);
    commit["confirm_token"] = dry["result"]["confirm_token"].clone();
    let suspended = alice.call("submit_soon", commit.clone()).await;
    let ticket = suspended["ticket"].as_str().unwrap().to_owned();
    eventually(Duration::from_secs(20), || {
        let alice = alice.clone();
        let ticket = ticket.clone();
        async move {
            let now = alice.get(&format!("/v1/tickets/{ticket}")).await;
            (now["result"]["state"] == "expired").then_some(())
        }
    })
    .await;
    let late = alice
        .post(&format!("/v1/tickets/{ticket}/approve"), json!({}))
        .await;
    assert_eq!(late["error"]["code"], "conflict", "{late}");
    assert!(
        late["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{late}"
    );
    let after = alice.call("submit_soon", commit).await;
    assert_eq!(after["error"]["code"], "expired", "{after}");
}

/// A token of alice's tenant, acme, for another user, bob.
const BOB_TOKEN: &str = "tf_test_bob_runs";

/// The `[[auth.tokens]]` table of bob: acme, with the expense scopes.
fn bob() -> String {
    format!(
        "\n[[auth.tokens]]\nsha256 = \"{}\"\ntenant = \"acme\"\nuser = \"bob\"\nscopes = [\"expenses:read\", \"expenses:submit\"]\n",
        common::sha(BOB_TOKEN)
    )
}

/// An `[[agents]]` table on the scripted server `model`, asking for a
/// model named as the assistant, with `tools` and the budget keys `budget`.
fn assistant(model: &ScriptedModel, name: &str, tools: &[&str], budget: &str) -> String {
    format!(
        r#"
[[agents]]
name = "{name}"
description = "An assistant of the tests."
provider = "openai"
base_url = "{url}"
model = "{name}"
system_prompt = "Do as the script says."
tools = {tools:?}
scopes = ["expenses:read", "expenses:submit"]
{budget}
"#,
        url = model.base_url(),
    )
}

/// A `toolfleet serve` on the expense pack and `extra`, its assistants
/// (`expense_assistant` included) asking `model`: its directory, the
/// configuration's path and the server.
fn serve_with(
    name: &str,
    model: &ScriptedModel,
    extra: &str,
) -> (TempDir, std::path::PathBuf, Server) {
    let dir = TempDir::new(name);
    let path = dir.0.join("toolfleet.toml");
    std::fs::write(&path, config_with(&dir.0, "", extra)).unwrap();
    let url = model.base_url();
    let env = [("EXPENSES_MODEL_URL", url.as_str())];
    let server = Server::start_role_env(&path, "serve", "toolfleet serving on ", &env);
    (dir, path, server)
}

fn answer(text: &str) -> Scripted {
    Scripted::Answer {
        text: text.into(),
        usage: usage(),
    }
}

/// An `ask_user` call of a script.
fn ask(question: &str) -> (&'static str, Value) {
    (
        "ask_user",
        json!({"question": question, "options": ["travel", "meals"]}),
    )
}

/// Starts a run of `agent` on `input`, answering its id.
async fn start_run(client: &common::Client, body: Value) -> String {
    let started = client.post("/v1/runs", body).await;
    assert_eq!(started["status"], "ok", "{started}");
    started["result"]["run_id"].as_str().unwrap().to_owned()
}

/// The ticket a waiting run waits on (its only one).
fn ticket_of(waiting: &Value) -> String {
    let tickets = waiting["wait"]["tickets"].as_array().unwrap();
    assert_eq!(tickets.len(), 1, "{waiting}");
    tickets[0].as_str().unwrap().to_owned()
}

/// The received hooks' bodies, parsed, each checked as signed.
fn hook_bodies(seen: &std::sync::Mutex<Vec<common::Hook>>) -> Vec<Value> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|hook| {
            assert!(
                common::signed(&hook.signature, &hook.body),
                "unsigned: {hook:?}"
            );
            assert!(!hook.delivery.is_empty(), "{hook:?}");
            serde_json::from_str(&hook.body).unwrap()
        })
        .collect()
}

/// The `event` of each body.
fn events_of(bodies: &[Value]) -> Vec<String> {
    bodies
        .iter()
        .map(|b| b["event"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_callback_hears_its_waits_answers_and_resumes_signed() {
    let model = ScriptedModel::start().await;
    let (_dir, _path, server) = serve_with("runs-callback", &model, "");
    let alice = server.client(TOKEN);
    model.script(
        "llama3.1",
        vec![
            calls(vec![ask("Travel or meals?")]),
            answer("Filed as travel."),
        ],
    );

    // An assistant's run: waiting, then answered.
    let (url, seen) = common::hook_receiver(vec![200]).await;
    let run = start_run(
        &alice,
        json!({"agent": "expense_assistant", "input": "File exp-020.", "callback_url": url}),
    )
    .await;
    let waiting = run_in(&alice, &run, "waiting").await;
    let question = ticket_of(&waiting);
    let heard = eventually(Duration::from_secs(20), || {
        let bodies = hook_bodies(&seen);
        async move { (!bodies.is_empty()).then_some(bodies) }
    })
    .await;
    assert_eq!(events_of(&heard), ["run.waiting"], "{heard:?}");
    assert_eq!(
        heard[0]["wait"]["tickets"][0],
        question.as_str(),
        "{heard:?}"
    );
    let answered = alice
        .post(
            &format!("/v1/tickets/{question}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    assert_eq!(answered["status"], "ok", "{answered}");
    run_in(&alice, &run, "answered").await;
    let heard = eventually(Duration::from_secs(20), || {
        let bodies = hook_bodies(&seen);
        async move { (bodies.len() >= 2).then_some(bodies) }
    })
    .await;
    assert_eq!(
        events_of(&heard),
        ["run.waiting", "run.answered"],
        "{heard:?}"
    );
    for (body, state) in heard.iter().zip(["waiting", "answered"]) {
        assert_eq!(body["run_id"], run.as_str(), "{body}");
        assert_eq!(body["tenant"], "acme", "{body}");
        assert_eq!(body["state"], state, "{body}");
        assert_eq!(body["agent"], "expense_assistant", "{body}");
        assert!(body.get("transcript").is_none(), "{body}");
        assert!(body.get("entries").is_none(), "{body}");
    }
    assert_eq!(heard[1]["answer"], "Filed as travel.", "{heard:?}");

    // A run its caller drives: waiting, then resumed once, with the
    // checkpoint it parked with and the answer.
    let (url, seen) = common::hook_receiver(vec![200]).await;
    let run = start_run(
        &alice,
        json!({"checkpoint": {"step": 1}, "callback_url": url}),
    )
    .await;
    let asked = alice
        .post(
            "/v1/calls",
            json!({"tool": "ask_user", "args": {"question": "Which?", "options": ["travel", "meals"]}, "run_id": run}),
        )
        .await;
    let question = asked["ticket"].as_str().unwrap().to_owned();
    let parked = alice
        .post(
            &format!("/v1/runs/{run}/wait"),
            json!({"tickets": [question], "checkpoint": {"step": 2}}),
        )
        .await;
    assert_eq!(parked["result"]["state"], "waiting", "{parked}");
    // Each notice is sent on its own: heard in order when one waits.
    eventually(Duration::from_secs(20), || {
        let heard = !hook_bodies(&seen).is_empty();
        async move { heard.then_some(()) }
    })
    .await;
    alice
        .post(
            &format!("/v1/tickets/{question}/answer"),
            json!({"answer": "meals"}),
        )
        .await;
    let heard = eventually(Duration::from_secs(20), || {
        let bodies = hook_bodies(&seen);
        async move {
            events_of(&bodies)
                .contains(&"run.resumed".to_owned())
                .then_some(bodies)
        }
    })
    .await;
    // No second resume comes after a while.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let heard_now = hook_bodies(&seen);
    assert_eq!(heard_now.len(), heard.len(), "{heard_now:?}");
    assert_eq!(
        events_of(&heard),
        ["run.waiting", "run.resumed"],
        "{heard:?}"
    );
    let resumed = &heard[1];
    assert_eq!(resumed["run_id"], run.as_str(), "{resumed}");
    assert_eq!(resumed["tenant"], "acme", "{resumed}");
    assert_eq!(resumed["state"], "running", "{resumed}");
    assert_eq!(
        resumed["resumed"]["checkpoint"],
        json!({"step": 2}),
        "{resumed}"
    );
    let items = resumed["resumed"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{resumed}");
    assert_eq!(
        (&items[0]["kind"], &items[0]["id"]),
        (&json!("ticket"), &json!(question)),
        "{resumed}"
    );
    assert_eq!(items[0]["envelope"]["status"], "ok", "{resumed}");
    assert_eq!(
        items[0]["envelope"]["result"],
        json!({"answer": "meals"}),
        "{resumed}"
    );
}

/// A run's events as its stream sent them: `(event, data)`.
type Heard = std::sync::Arc<std::sync::Mutex<Vec<(String, Value)>>>;

/// `GET /v1/runs/{run}/events` as `(event, data)` pairs, and the task that
/// reads it, which ends when the stream does.
fn run_stream(client: &common::Client, run: &str) -> (Heard, tokio::task::JoinHandle<()>) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = seen.clone();
    let client = client.clone();
    let path = format!("/v1/runs/{run}/events");
    let reading = tokio::spawn(async move {
        let mut response = client
            .http
            .get(format!("{}{path}", client.base))
            .bearer_auth(&client.token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut text = String::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = text.find("\n\n") {
                let block: String = text.drain(..end + 2).collect();
                let field = |name: &str| {
                    block
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(str::to_owned)
                };
                if let (Some(event), Some(data)) = (field("event: "), field("data: ")) {
                    let data = serde_json::from_str(&data).unwrap();
                    store.lock().unwrap().push((event, data));
                }
            }
        }
    });
    (seen, reading)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_event_stream_places_each_step_in_the_transcript_and_ends_once_answered() {
    let model = ScriptedModel::start().await;
    let (_dir, _path, server) = serve_with("runs-sse", &model, "");
    let alice = server.client(TOKEN);
    model.script(
        "llama3.1",
        vec![
            calls(vec![ask("Travel or meals?")]),
            calls(vec![("find_expenses", json!({"month": "2026-09"}))]),
            answer("Done."),
        ],
    );
    let run = start_run(
        &alice,
        json!({"agent": "expense_assistant", "input": "File exp-020."}),
    )
    .await;
    let waiting = run_in(&alice, &run, "waiting").await;
    let question = ticket_of(&waiting);
    let before = waiting["transcript"].as_array().unwrap().len();

    let (events, reading) = run_stream(&alice, &run);
    let first = eventually(Duration::from_secs(10), || {
        let first = events.lock().unwrap().first().cloned();
        async move { first }
    })
    .await;
    assert_eq!(first.0, "run.waiting", "{first:?}");
    assert_eq!(first.1["state"], "waiting", "{first:?}");
    assert_eq!(first.1["run_id"], run.as_str(), "{first:?}");
    assert_eq!(
        first.1["wait"]["tickets"][0],
        question.as_str(),
        "{first:?}"
    );
    assert!(first.1.get("transcript").is_none(), "{first:?}");

    alice
        .post(
            &format!("/v1/tickets/{question}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    tokio::time::timeout(Duration::from_secs(30), reading)
        .await
        .expect("the stream ends once the run answered")
        .unwrap();
    let done = run_of(&alice, &run).await;
    assert_eq!(done["state"], "answered", "{done}");
    let transcript = done["transcript"].as_array().unwrap().clone();
    let events = events.lock().unwrap().clone();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"run.waiting"), "{names:?}");
    assert_eq!(names.last(), Some(&"run.answered"), "{names:?}");
    assert!(names.contains(&"run.step"), "{names:?}");
    assert_eq!(events.last().unwrap().1["answer"], "Done.");
    // Each later event's entries sit at `from`, one after the other, from
    // where the run stood to the transcript's end.
    let mut at = before;
    for (name, data) in &events[1..] {
        let entries = data["entries"].as_array().unwrap();
        assert_eq!(data["from"], at, "{name}: {data}");
        assert_eq!(
            entries.as_slice(),
            &transcript[at..at + entries.len()],
            "{name}: {data}"
        );
        assert!(data.get("transcript").is_none(), "{name}: {data}");
        assert_eq!(
            name.strip_prefix("run.")
                .map(|s| s.replace("step", "running")),
            data["state"].as_str().map(str::to_owned),
            "{name}: {data}"
        );
        at += entries.len();
    }
    assert_eq!(at, transcript.len(), "{events:?}");
    let kinds: Vec<&str> = transcript[before..]
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    for kind in ["resume", "tool_result", "model", "tool_call"] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
}

/// `toolfleet ARGS` on another thread, so the test's runtime goes on.
async fn cli(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::toolfleet(&args)
    })
    .await
    .unwrap()
}

/// `--config`, the command's words, then `--server` and `--token`.
fn cli_args(path: &std::path::Path, server: &Server, words: &[&str]) -> Vec<String> {
    let mut args = vec!["--config".to_owned(), path.display().to_string()];
    args.extend(words.iter().map(|w| (*w).to_owned()));
    args.extend(["--server".to_owned(), server.base.clone()]);
    args.extend(["--token".to_owned(), TOKEN.to_owned()]);
    args
}

/// The `submit_approved` command of the tests: every commit waits for its
/// caller's approval.
const APPROVED_COMMAND: &str = r#"
[[tools]]
name = "submit_approved"
shape = "command"
description = "Submit expense lines, with the caller's approval."
input_schema = { type = "object", additionalProperties = false, required = ["line_ids", "dry_run"], properties = { line_ids = { type = "array", minItems = 1, items = { type = "string" } }, dry_run = { type = "boolean" }, categories = { type = "object" } } }
approval = "caller"
executor = { kind = "builtin", name = "expenses.submit" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_runs_an_assistant_lists_the_inbox_and_rejects() {
    let model = ScriptedModel::start().await;
    let (_dir, path, server) = serve_with("runs-cli", &model, APPROVED_COMMAND);
    let alice = server.client(TOKEN);
    model.script(
        "llama3.1",
        vec![
            calls(vec![("find_expenses", json!({"month": "2026-09"}))]),
            answer("September has 12 lines."),
        ],
    );
    let ran = cli(cli_args(
        &path,
        &server,
        &[
            "run",
            "expense_assistant",
            "How many lines in 2026-09?",
            "--wait",
        ],
    ))
    .await;
    let out = String::from_utf8_lossy(&ran.stdout).into_owned();
    assert!(
        ran.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("run run_"), "{out}");
    let expected = [
        "user: How many lines in 2026-09?",
        r#"model: calls: find_expenses({"month":"2026-09"})"#,
        "tool_call find_expenses -> ok",
        "model: September has 12 lines.",
        "answer: September has 12 lines.",
    ];
    let mut from = 0;
    for line in expected {
        let at = lines[from..]
            .iter()
            .position(|l| *l == line)
            .unwrap_or_else(|| panic!("`{line}` after line {from} of:\n{out}"));
        from += at + 1;
    }
    assert_eq!(
        lines.last(),
        Some(&"answer: September has 12 lines."),
        "{out}"
    );
    // Each step printed once.
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("tool_call ")).count(),
        1,
        "{out}"
    );
    let run = lines[0].strip_prefix("run ").unwrap();
    assert_eq!(run_of(&alice, run).await["state"], "answered");

    // The inbox lists an open question.
    let asked = alice
        .call(
            "ask_user",
            json!({"question": "Travel or meals?", "options": ["travel", "meals"]}),
        )
        .await;
    let question = asked["ticket"].as_str().unwrap().to_owned();
    let inbox = cli(cli_args(&path, &server, &["inbox"])).await;
    let out = String::from_utf8_lossy(&inbox.stdout).into_owned();
    assert!(inbox.status.success(), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with(&question))
        .unwrap_or_else(|| panic!("{question} in:\n{out}"));
    assert!(line.contains("  question  open  ask_user"), "{line}");
    assert!(line.contains("Travel or meals?"), "{line}");
    assert!(line.contains("travel"), "{line}");

    // An approval, rejected with a reason.
    let args = json!({"line_ids": ["exp-003"], "dry_run": true});
    let dry = alice.call("submit_approved", args.clone()).await;
    let mut commit = args;
    commit["dry_run"] = json!(false);
    commit["confirm_token"] = dry["result"]["confirm_token"].clone();
    let suspended = alice.call("submit_approved", commit.clone()).await;
    let approval = suspended["ticket"].as_str().unwrap().to_owned();
    let inbox = cli(cli_args(&path, &server, &["inbox", "--kind", "approval"])).await;
    let out = String::from_utf8_lossy(&inbox.stdout).into_owned();
    assert!(out.lines().any(|l| l.starts_with(&approval)), "{out}");
    assert!(!out.contains(&question), "{out}");
    let rejected = cli(cli_args(
        &path,
        &server,
        &["reject", &approval, "--reason", "not this month"],
    ))
    .await;
    let out = String::from_utf8_lossy(&rejected.stdout).into_owned();
    assert!(
        rejected.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&rejected.stderr)
    );
    let printed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        printed["result"]["outcome"]["error"]["code"], "rejected",
        "{printed}"
    );
    let ticket = alice.get(&format!("/v1/tickets/{approval}")).await;
    assert_eq!(
        ticket["result"]["outcome"]["error"]["details"]["reason"], "not this month",
        "{ticket}"
    );
    let after = alice.call("submit_approved", commit).await;
    assert_eq!(after["error"]["code"], "rejected", "{after}");
}

/// The text of every message of a model request, in order: `role: content`
/// (an assistant's calls as their names).
fn conversation(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap_or("?");
            let content = m["content"].as_str().unwrap_or("");
            let calls: Vec<&str> = m["tool_calls"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .filter_map(|c| c["function"]["name"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            if calls.is_empty() {
                format!("{role}: {content}")
            } else {
                format!("{role}: calls {}", calls.join(","))
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_continues_an_answered_run_and_no_other() {
    let model = ScriptedModel::start().await;
    let (_dir, _path, server) = serve_with("runs-messages", &model, "");
    let alice = server.client(TOKEN);
    model.script(
        "llama3.1",
        vec![
            // Slow, so the run is running when a message comes.
            Scripted::Delay(
                Duration::from_millis(1500),
                Box::new(calls(vec![ask("Travel or meals?")])),
            ),
            answer("Filed exp-020 as travel."),
            answer("Changed exp-020 to meals."),
        ],
    );
    let run = start_run(
        &alice,
        json!({"agent": "expense_assistant", "input": "File exp-020."}),
    )
    .await;

    // Running: refused.
    let early = alice
        .post(
            &format!("/v1/runs/{run}/messages"),
            json!({"content": "too early"}),
        )
        .await;
    assert_eq!(early["error"]["code"], "conflict", "{early}");
    assert_eq!(run_of(&alice, &run).await["state"], "running");
    // Waiting: refused, and nothing changes.
    let waiting = run_in(&alice, &run, "waiting").await;
    let during = alice
        .post(
            &format!("/v1/runs/{run}/messages"),
            json!({"content": "while it waits"}),
        )
        .await;
    assert_eq!(during["error"]["code"], "conflict", "{during}");
    let still = run_of(&alice, &run).await;
    assert_eq!(
        (&still["state"], &still["version"], &still["transcript"]),
        (
            &waiting["state"],
            &waiting["version"],
            &waiting["transcript"]
        ),
    );
    let question = ticket_of(&waiting);
    alice
        .post(
            &format!("/v1/tickets/{question}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    let first = run_in(&alice, &run, "answered").await;
    assert_eq!(first["answer"], "Filed exp-020 as travel.");

    // Answered: the next message continues it.
    let next = alice
        .post(
            &format!("/v1/runs/{run}/messages"),
            json!({"content": "Make it meals instead."}),
        )
        .await;
    assert_eq!(next["status"], "ok", "{next}");
    assert_eq!(next["result"]["state"], "running", "{next}");
    let second = run_in(&alice, &run, "answered").await;
    assert_eq!(second["answer"], "Changed exp-020 to meals.", "{second}");
    let requests = model.requests("llama3.1");
    assert_eq!(requests.len(), 3, "{requests:?}");
    let said = conversation(&requests[2]);
    let before = conversation(&requests[1]);
    // The earlier conversation, whole, then the answer and the new message.
    assert_eq!(&said[..before.len()], before.as_slice(), "{said:?}");
    assert_eq!(
        &said[before.len()..],
        [
            "assistant: Filed exp-020 as travel.",
            "user: Make it meals instead."
        ],
        "{said:?}"
    );
    assert!(said.contains(&"user: File exp-020.".to_owned()), "{said:?}");
    assert!(
        said.contains(&"assistant: calls ask_user".to_owned()),
        "{said:?}"
    );
    let all = serde_json::to_string(&requests).unwrap();
    assert!(!all.contains("too early") && !all.contains("while it waits"));
    let users: Vec<&Value> = second["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "user")
        .map(|e| &e["content"])
        .collect();
    assert_eq!(
        users,
        [&json!("File exp-020."), &json!("Make it meals instead.")]
    );
}

/// A job that takes long, and an assistant on the scripted server that
/// calls it and asks at once.
fn slow_job_and(model: &ScriptedModel) -> String {
    let job = r#"
[[tools]]
name = "slow_job"
shape = "job"
description = "Takes half a minute."
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "sleep 30; echo {}"] }
"#;
    format!(
        "{job}{}",
        assistant(model, "canceller", &["slow_job", "ask_user"], "")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_waiting_run_cancels_its_job_and_nothing_resumes_it() {
    let model = ScriptedModel::start().await;
    let (_dir, _path, server) = serve_with("runs-cancel", &model, &slow_job_and(&model));
    let alice = server.client(TOKEN);
    model.script(
        "canceller",
        vec![
            calls(vec![("slow_job", json!({})), ask("Travel or meals?")]),
            answer("should never be asked"),
        ],
    );
    let run = start_run(&alice, json!({"agent": "canceller", "input": "Go."})).await;
    let waiting = run_in(&alice, &run, "waiting").await;
    let job = waiting["wait"]["jobs"][0].as_str().unwrap().to_owned();
    let question = ticket_of(&waiting);
    let cancelled = alice
        .post(&format!("/v1/runs/{run}/cancel"), json!({}))
        .await;
    assert_eq!(cancelled["result"]["state"], "cancelled", "{cancelled}");
    let stopped = alice.get(&format!("/v1/jobs/{job}")).await;
    assert_eq!(
        (&stopped["status"], &stopped["state"]),
        (&json!("error"), &json!("cancelled")),
        "{stopped}"
    );
    // The question is answered later: the run stays cancelled, and its
    // model is never asked again.
    let answered = alice
        .post(
            &format!("/v1/tickets/{question}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    assert_eq!(answered["status"], "ok", "{answered}");
    // Time enough for a loop to run, had the answer resumed it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = run_of(&alice, &run).await;
    assert_eq!(after["state"], "cancelled", "{after}");
    assert_eq!(after["version"], cancelled["result"]["version"], "{after}");
    assert_eq!(model.requests("canceller").len(), 1);
    // Cancelling again answers it as it is.
    let again = alice
        .post(&format!("/v1/runs/{run}/cancel"), json!({}))
        .await;
    assert_eq!(again["result"]["version"], after["version"], "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_end_a_run_and_waiting_is_not_wall_time() {
    let model = ScriptedModel::start().await;
    let extra = format!(
        "{}{}",
        assistant(&model, "stepper", &["find_expenses"], "max_steps = 2"),
        assistant(&model, "patient", &["ask_user"], "max_wall_s = 2"),
    );
    let (_dir, _path, server) = serve_with("runs-budgets", &model, &extra);
    let alice = server.client(TOKEN);
    let find = || calls(vec![("find_expenses", json!({"month": "2026-09"}))]);
    model.script("stepper", vec![find(), find(), find(), find()]);
    model.script(
        "patient",
        vec![
            calls(vec![ask("Travel or meals?")]),
            answer("Travel it is."),
            answer("Still travel."),
        ],
    );

    let run = start_run(&alice, json!({"agent": "stepper", "input": "Go."})).await;
    let over = run_in(&alice, &run, "budget_exceeded").await;
    assert_eq!(over["error"]["exceeded"], "steps", "{over}");
    assert_eq!(over["error"]["code"], "budget_exceeded", "{over}");
    assert_eq!(over["usage"]["steps"], 2, "{over}");
    assert_eq!(model.requests("stepper").len(), 2);

    let run = start_run(&alice, json!({"agent": "patient", "input": "Go."})).await;
    let waiting = run_in(&alice, &run, "waiting").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let question = ticket_of(&waiting);
    alice
        .post(
            &format!("/v1/tickets/{question}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    let done = eventually(Duration::from_secs(30), || {
        let alice = alice.clone();
        let run = run.clone();
        async move {
            let now = run_of(&alice, &run).await;
            (now["state"] != "running" && now["state"] != "waiting").then_some(now)
        }
    })
    .await;
    assert_eq!(done["state"], "answered", "{done}");
    assert_eq!(done["answer"], "Travel it is.", "{done}");
    assert!(
        done["usage"]["waited_ms"].as_u64().unwrap() >= 3000,
        "{done}"
    );
    assert!(done["usage"]["wall_ms"].as_u64().unwrap() < 2000, "{done}");
    // Nor is the time before the user's next message.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let next = alice
        .post(
            &format!("/v1/runs/{run}/messages"),
            json!({"content": "Sure?"}),
        )
        .await;
    assert_eq!(next["status"], "ok", "{next}");
    let sent = next["result"]["version"].clone();
    let again = eventually(Duration::from_secs(30), || {
        let alice = alice.clone();
        let (run, sent) = (run.clone(), sent.clone());
        async move {
            let now = run_of(&alice, &run).await;
            (now["state"] != "running" && now["version"] != sent).then_some(now)
        }
    })
    .await;
    assert_eq!(again["state"], "answered", "{again}");
    assert_eq!(again["answer"], "Still travel.", "{again}");
    assert!(
        again["usage"]["wall_ms"].as_u64().unwrap() < 2000,
        "{again}"
    );
}

/// The ids of a run list.
fn run_ids(list: &Value) -> Vec<String> {
    list["result"]["runs"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_listed_for_their_owner_and_another_users_read_as_missing() {
    let model = ScriptedModel::start().await;
    let (_dir, _path, server) = serve_with("runs-list", &model, &bob());
    let alice = server.client(TOKEN);
    let bob = server.client(BOB_TOKEN);
    model.script("llama3.1", vec![answer("Nothing to do.")]);

    let driven = start_run(&alice, json!({"checkpoint": {}})).await;
    let assisted = start_run(
        &alice,
        json!({"agent": "expense_assistant", "input": "Anything?"}),
    )
    .await;
    run_in(&alice, &assisted, "answered").await;
    let parked = start_run(&alice, json!({"checkpoint": {}})).await;
    let asked = alice
        .post(
            "/v1/calls",
            json!({"tool": "ask_user", "args": {"question": "Which?"}, "run_id": parked}),
        )
        .await;
    let question = asked["ticket"].as_str().unwrap();
    let waited = alice
        .post(
            &format!("/v1/runs/{parked}/wait"),
            json!({"tickets": [question]}),
        )
        .await;
    assert_eq!(waited["result"]["state"], "waiting", "{waited}");
    let bobs = start_run(&bob, json!({"checkpoint": {}})).await;
    let bobs_job = bob
        .call("start_receipt_ocr", json!({"receipt_ids": ["rcpt-005"]}))
        .await;
    let bobs_job = bobs_job["job_id"].as_str().unwrap().to_owned();

    // Newest first, the caller's own.
    let all = alice.get("/v1/runs").await;
    assert_eq!(
        run_ids(&all),
        [&parked, &assisted, &driven].map(String::clone),
        "{all}"
    );
    assert!(
        all["result"]["runs"][0].get("transcript").is_none(),
        "{all}"
    );
    assert_eq!(run_ids(&bob.get("/v1/runs").await), [bobs.as_str()]);
    for (query, expected) in [
        ("state=waiting", vec![parked.clone()]),
        ("state=answered", vec![assisted.clone()]),
        ("state=running", vec![driven.clone()]),
        ("agent=expense_assistant", vec![assisted.clone()]),
        (
            "state=answered&agent=expense_assistant",
            vec![assisted.clone()],
        ),
        (
            "state=running&agent=expense_assistant",
            Vec::<String>::new(),
        ),
        ("agent=nobody", Vec::new()),
    ] {
        let listed = alice.get(&format!("/v1/runs?{query}")).await;
        assert_eq!(run_ids(&listed), expected, "{query}: {listed}");
    }

    // Bob's run, as alice sees it: missing.
    let missing_run = "run_0190aaaa00007000800000000000000a";
    for (path, body) in [
        (format!("/v1/runs/{bobs}"), None),
        (format!("/v1/runs/{bobs}/cancel"), Some(json!({}))),
        (
            format!("/v1/runs/{bobs}/wait"),
            Some(json!({"jobs": [bobs_job]})),
        ),
    ] {
        let (theirs, missing) = match &body {
            None => (
                alice.get(&path).await,
                alice.get(&path.replace(&bobs, missing_run)).await,
            ),
            Some(body) => (
                alice.post(&path, body.clone()).await,
                alice
                    .post(&path.replace(&bobs, missing_run), body.clone())
                    .await,
            ),
        };
        assert_eq!(theirs["error"]["code"], "not_found", "{path}: {theirs}");
        assert_eq!(
            theirs["error"]["message"]
                .as_str()
                .map(|m| m.replace(&bobs, "ID")),
            missing["error"]["message"]
                .as_str()
                .map(|m| m.replace(missing_run, "ID")),
            "{path}"
        );
    }
    assert_eq!(
        bob.get(&format!("/v1/runs/{bobs}")).await["result"]["state"],
        "running"
    );
    // A wait on bob's job answers as a wait on a missing one.
    let missing_job = "0190aaaa-0000-7000-8000-000000000000";
    let on_bobs = alice
        .post(
            &format!("/v1/runs/{driven}/wait"),
            json!({"jobs": [bobs_job]}),
        )
        .await;
    let on_missing = alice
        .post(
            &format!("/v1/runs/{driven}/wait"),
            json!({"jobs": [missing_job]}),
        )
        .await;
    assert_eq!(on_bobs["error"]["code"], "not_found", "{on_bobs}");
    assert_eq!(
        on_bobs["error"]["message"]
            .as_str()
            .map(|m| m.replace(&bobs_job, "ID")),
        on_missing["error"]["message"]
            .as_str()
            .map(|m| m.replace(missing_job, "ID")),
    );
    assert_eq!(run_of(&alice, &driven).await["state"], "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_question_resumes_its_run_with_expired_and_takes_no_answer() {
    let model = ScriptedModel::start().await;
    let extra = r#"
[[tools]]
name = "ask_quickly"
shape = "human"
description = "Ask the user; the question lapses after a second."
input_schema = { type = "object", additionalProperties = false, required = ["question"], properties = { question = { type = "string" }, options = { type = "array", items = { type = "string" } } } }
expires_in_s = 1
"#;
    let (_dir, _path, server) = serve_with("runs-expiry", &model, extra);
    let alice = server.client(TOKEN);
    let run = start_run(&alice, json!({"checkpoint": {"asked": true}})).await;
    let asked = alice
        .post(
            "/v1/calls",
            json!({"tool": "ask_quickly", "args": {"question": "Travel or meals?", "options": ["travel", "meals"]}, "run_id": run}),
        )
        .await;
    assert_eq!(asked["status"], "suspended", "{asked}");
    let ticket = asked["ticket"].as_str().unwrap().to_owned();
    let read = alice.get(&format!("/v1/tickets/{ticket}")).await;
    assert!(read["result"]["expires_at"].is_number(), "{read}");
    let waited = alice
        .post(
            &format!("/v1/runs/{run}/wait"),
            json!({"tickets": [ticket]}),
        )
        .await;
    assert_eq!(waited["result"]["state"], "waiting", "{waited}");

    // The people sweeper runs every 5 s.
    let resumed = eventually(Duration::from_secs(12), || {
        let alice = alice.clone();
        let run = run.clone();
        async move {
            let now = run_of(&alice, &run).await;
            (now["state"] == "running").then_some(now)
        }
    })
    .await;
    let items = &resumed["resumed"]["items"];
    assert_eq!(items[0]["kind"], "ticket", "{resumed}");
    assert_eq!(items[0]["id"], ticket.as_str(), "{resumed}");
    assert_eq!(items[0]["envelope"]["status"], "error", "{resumed}");
    assert_eq!(
        items[0]["envelope"]["error"]["code"], "expired",
        "{resumed}"
    );
    assert_eq!(resumed["resumed"]["checkpoint"]["asked"], true, "{resumed}");
    let expired = alice.get(&format!("/v1/tickets/{ticket}")).await;
    assert_eq!(expired["result"]["state"], "expired", "{expired}");
    assert_eq!(
        expired["result"]["outcome"]["error"]["code"], "expired",
        "{expired}"
    );
    // Too late to answer.
    let late = alice
        .post(
            &format!("/v1/tickets/{ticket}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    assert_eq!(late["error"]["code"], "conflict", "{late}");
    // Saying why: it expired, nobody answered it.
    let said = late["error"]["message"].as_str().unwrap();
    assert!(
        said.contains("expired") && !said.contains("answered already"),
        "{late}"
    );
    let still = alice.get(&format!("/v1/tickets/{ticket}")).await;
    assert_eq!(still["result"]["state"], "expired", "{still}");
    assert!(still["result"]["answer"].is_null(), "{still}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_idempotency_key_starts_one_run_and_one_loop() {
    let model = ScriptedModel::start().await;
    let (_dir, _path, server) = serve_with("runs-idempotent", &model, "");
    let alice = server.client(TOKEN);
    model.script("llama3.1", vec![answer("Hello.")]);
    let body = json!({"agent": "expense_assistant", "input": "Hi.", "idempotency_key": "k-1"});
    let first = start_run(&alice, body.clone()).await;
    let second = start_run(&alice, body.clone()).await;
    assert_eq!(first, second);
    run_in(&alice, &first, "answered").await;
    // After it answered too: the same run, no loop again.
    assert_eq!(start_run(&alice, body).await, first);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(model.requests("llama3.1").len(), 1);
    let listed = alice.get("/v1/runs").await;
    assert_eq!(run_ids(&listed), [first.as_str()], "{listed}");
    assert_eq!(run_of(&alice, &first).await["state"], "answered");
}

/// A run its caller drives records its caller's answer: `answered`, a
/// second answer refused, a later wait continuing it; an assistant's run
/// takes no caller's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_the_caller_drives_records_its_answer_and_goes_on_after_it() {
    let dir = TempDir::new("runs-answer");
    let server = Server::start(&dir.0, &config_with(&dir.0, "", ""));
    let alice = server.client(TOKEN);
    let run = alice
        .post("/v1/runs", json!({"checkpoint": {"step": 1}}))
        .await;
    let run = run["result"]["run_id"].as_str().unwrap().to_owned();
    let answered = alice
        .post(
            &format!("/v1/runs/{run}/answer"),
            json!({"answer": "All done.", "checkpoint": {"step": 2}}),
        )
        .await;
    assert_eq!(answered["result"]["state"], "answered", "{answered}");
    assert_eq!(answered["result"]["answer"], "All done.");
    assert_eq!(answered["result"]["checkpoint"]["step"], 2);
    let twice = alice
        .post(
            &format!("/v1/runs/{run}/answer"),
            json!({"answer": "Again."}),
        )
        .await;
    assert_eq!(twice["error"]["code"], "conflict", "{twice}");
    assert_eq!(run_of(&alice, &run).await["answer"], "All done.");
    // The user asks again: the caller's loop goes on and waits.
    let job = alice
        .call("start_receipt_ocr", json!({"receipt_ids": ["rcpt-005"]}))
        .await;
    let waited = alice
        .post(
            &format!("/v1/runs/{run}/wait"),
            json!({"jobs": [job["job_id"]], "checkpoint": {"step": 3}}),
        )
        .await;
    assert_eq!(waited["status"], "ok", "{waited}");
    let resumed = run_in(&alice, &run, "running").await;
    assert_eq!(resumed["resumed"]["checkpoint"]["step"], 3, "{resumed}");
    // An assistant's run answers for itself.
    let theirs = alice
        .post(
            "/v1/runs",
            json!({"agent": "expense_assistant", "input": "Hello."}),
        )
        .await;
    let theirs = theirs["result"]["run_id"].as_str().unwrap().to_owned();
    let refused = alice
        .post(&format!("/v1/runs/{theirs}/answer"), json!({"answer": "x"}))
        .await;
    assert_eq!(refused["error"]["code"], "conflict", "{refused}");
}
