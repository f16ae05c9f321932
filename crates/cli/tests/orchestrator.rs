//! `examples/orchestrator/orchestrator.py`, "A run the caller drives" of
//! docs/API.md, run as it is (python3 and httpx) against a real `toolfleet
//! serve` and the scripted model: the model pages `find_expenses`, starts
//! `start_receipt_ocr` (a job) and `ask_user` (a ticket) in one reply, and
//! the script parks its run on both with `/wait`; the test answers the
//! ticket over HTTP, the script goes on when its callback hears a signed
//! `run.resumed`, makes the `submit_report` dry run and commit, and prints
//! its answer. The model saw every tool result. With the wrong webhook
//! secret every notice is refused, and the script goes on only because it
//! reads the run itself once its wait times out.
//!
//! Without python3 or httpx the test is skipped, except under CI, where it
//! fails (.ci/run installs httpx).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::month::Month;
use common::{Client, Server, TOKEN, TempDir, WEBHOOK_SECRET, config_with};
use serde_json::{Value, json};
use toolfleet_agent::testing::ScriptedModel;

const ANSWER: &str = "Your September report is submitted: 62 lines, two of them travel.";

/// Whether the script can run here; under CI it must.
fn python_ready() -> bool {
    let ready = Command::new("python3")
        .args(["-c", "import httpx"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        common::missing("python3 with the `httpx` package is not installed");
    }
    ready
}

/// The worked example's script, from what the month holds: both pages,
/// the OCR job and the question in one reply, the dry run, the commit.
/// Answers the second page's cursor too.
async fn script(model: &ScriptedModel, name: &str, alice: &Client) -> String {
    let month = Month::read(alice).await;
    model.script(name, month.script(ANSWER));
    month.cursor
}

/// The orchestrator as a child process, its stderr kept as it comes.
struct Orchestrator {
    child: Child,
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Orchestrator {
    fn start(server: &Server, model_url: &str, model: &str, secret: &str, wait_s: u32) -> Self {
        let script = common::repo().join("examples/orchestrator/orchestrator.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .args(["--server", &server.base, "--token", TOKEN])
            .args(["--model-url", model_url, "--model", model])
            .args(["--callback-host", "127.0.0.1", "--callback-port", "0"])
            .args(["--webhook-secret", secret])
            .args(["--wait-timeout-s", &wait_s.to_string()])
            .args(["--input", "Submit my expenses for 2026-09."])
            .env_remove("TOOLFLEET_TOKEN")
            .env_remove("TOOLFLEET_WEBHOOK_SECRET")
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut out = child.stdout.take().expect("stdout");
        let stdout = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text);
            text
        });
        let err = child.stderr.take().expect("stderr");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let echo = std::env::var_os("TOOLFLEET_TEST_ECHO").is_some();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("[orchestrator] {line}");
                }
                lines.lock().unwrap().push(line);
            }
        });
        Orchestrator {
            child,
            stdout: Some(stdout),
            stderr,
        }
    }

    fn said(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Fails the test, with what the script said, unless `ok`.
    fn check(&mut self, ok: bool, what: &str) {
        if !ok {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!("{what}; the orchestrator said:\n{}", self.said());
        }
    }

    /// Waits for the script to exit: its status, stdout and stderr.
    async fn finish(mut self, limit: Duration) -> (ExitStatus, String, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("the child is ours") {
                break status;
            }
            self.check(
                Instant::now() < deadline,
                &format!("the orchestrator did not finish within {limit:?}"),
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let stdout = self
            .stdout
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        // The stderr reader ends with the pipe; give it a moment.
        tokio::time::sleep(Duration::from_millis(100)).await;
        (status, stdout, self.said())
    }
}

impl Drop for Orchestrator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until alice has a run parked, answering it then.
async fn parked(alice: &Client, orchestrator: &mut Orchestrator) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let runs = alice.get("/v1/runs?state=waiting").await;
        if let Some(run) = runs["result"]["runs"].get(0) {
            return run.clone();
        }
        let exited = orchestrator.child.try_wait().ok().flatten();
        orchestrator.check(
            exited.is_none(),
            &format!("the orchestrator exited ({exited:?}) before its run waited"),
        );
        orchestrator.check(Instant::now() < deadline, "no run waited within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The tool messages of one model request, by tool call id, each content
/// read as the envelope it carries.
fn tool_results(request: &Value) -> Vec<(String, Value)> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let content = m["content"].as_str().expect("a tool message's content");
            let envelope = serde_json::from_str(content)
                .unwrap_or_else(|e| panic!("a tool message is not JSON ({e}): {content}"));
            (m["tool_call_id"].as_str().unwrap().to_owned(), envelope)
        })
        .collect()
}

/// The envelope the model saw for `call` in its request of `step`.
fn saw<'a>(results: &'a [Vec<(String, Value)>], step: usize, call: &str) -> &'a Value {
    results[step]
        .iter()
        .find(|(id, _)| id == call)
        .map(|(_, envelope)| envelope)
        .unwrap_or_else(|| panic!("request {step} has no tool message for {call}"))
}

/// What [`drive`] leaves: the processes (kept until the test ends), the
/// run as it waited and as it ended, and how the script ended.
struct Driven {
    // Stopped before its data directory goes (fields drop in order).
    _server: Server,
    _dir: TempDir,
    model: ScriptedModel,
    waiting: Value,
    run: Value,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Starts a server, scripts the model `name`, runs the orchestrator with
/// `secret` and answers its question once its run waits. `None` where
/// python3 or httpx is missing (outside CI).
async fn drive(name: &str, secret: &str, wait_s: u32) -> Option<Driven> {
    if !python_ready() {
        return None;
    }
    let model = ScriptedModel::start().await;
    let dir = TempDir::new(name);
    let server = Server::start(&dir.0, &config_with(&dir.0, "", ""));
    let alice = server.client(TOKEN);
    let cursor = script(&model, name, &alice).await;

    let mut orchestrator = Orchestrator::start(&server, &model.base_url(), name, secret, wait_s);
    // Parked on the job and the question together, its checkpoint kept.
    let waiting = parked(&alice, &mut orchestrator).await;
    let run = waiting["run_id"].as_str().unwrap().to_owned();
    let wait = &waiting["wait"];
    assert_eq!(wait["for"], "all", "{waiting}");
    assert_eq!(wait["jobs"].as_array().map(Vec::len), Some(1), "{waiting}");
    assert_eq!(
        wait["tickets"].as_array().map(Vec::len),
        Some(1),
        "{waiting}"
    );
    assert_eq!(
        model.requests(name).len(),
        3,
        "no model call while it waits"
    );
    let pending = waiting["checkpoint"]["pending"]
        .as_array()
        .unwrap_or_else(|| panic!("{waiting}"));
    assert_eq!(pending.len(), 2, "{waiting}");
    // The checkpoint is the conversation so far: both pages answered.
    let kept = waiting["checkpoint"]["messages"].to_string();
    assert!(kept.contains(&cursor), "{kept}");
    // The job is the run's.
    let job = wait["jobs"][0].as_str().unwrap();
    let jobs = alice.get("/v1/jobs?limit=20").await;
    let listed = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_id"] == job)
        .cloned()
        .unwrap_or_else(|| panic!("job {job} not listed: {jobs}"));
    assert_eq!(listed["run_id"], run.as_str(), "{listed}");

    // The person answers from the inbox.
    let inbox = alice.get("/v1/tickets?state=open").await;
    let open = inbox["result"]["tickets"].as_array().unwrap();
    assert_eq!(open.len(), 1, "{inbox}");
    let question = open[0]["ticket"].as_str().unwrap().to_owned();
    assert_eq!(wait["tickets"][0], question.as_str(), "{waiting}");
    let answered = alice
        .post(
            &format!("/v1/tickets/{question}/answer"),
            json!({"answer": "travel"}),
        )
        .await;
    assert_eq!(answered["status"], "ok", "{answered}");

    let (status, stdout, stderr) = orchestrator.finish(Duration::from_secs(90)).await;
    assert!(
        stderr.contains(&question),
        "the script names the ticket: {stderr}"
    );
    let run = alice.get(&format!("/v1/runs/{run}")).await["result"].clone();
    Some(Driven {
        _server: server,
        _dir: dir,
        model,
        waiting,
        run,
        status,
        stdout,
        stderr,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_orchestrator_drives_its_run_through_a_wait_and_a_signed_resume() {
    let name = "orchestrator-signed";
    let Some(Driven {
        model,
        waiting,
        run,
        status,
        stdout,
        stderr,
        ..
    }) = drive(name, WEBHOOK_SECRET, 60).await
    else {
        return;
    };
    assert_eq!(
        status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(
        stdout.lines().last(),
        Some(format!("ANSWER: {ANSWER}").as_str()),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // It went on because its callback heard run.resumed, signed.
    assert!(stderr.contains("heard run.resumed"), "stderr:\n{stderr}");
    assert!(!stderr.contains("no run.resumed reached"), "{stderr}");

    // The run's record: it waited, and resumed with both outcomes.
    // Answered at the end, with the answer the script printed.
    assert_eq!(run["state"], "answered", "{run}");
    assert_eq!(run["answer"], ANSWER, "{run}");
    assert!(
        run["version"].as_i64() > waiting["version"].as_i64(),
        "{run}"
    );
    let items = run["resumed"]["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|i| i["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["job", "ticket"], "{run}");
    assert_eq!(items[0]["id"], waiting["wait"]["jobs"][0], "{run}");
    assert_eq!(items[0]["envelope"]["status"], "ok", "{run}");
    assert_eq!(items[1]["id"], waiting["wait"]["tickets"][0], "{run}");
    assert_eq!(items[1]["envelope"]["result"]["answer"], "travel", "{run}");
    assert_eq!(
        run["resumed"]["checkpoint"]["pending"], waiting["checkpoint"]["pending"],
        "{run}"
    );

    // The model saw each tool result, each as the call of its reply.
    let requests = model.requests(name);
    assert_eq!(requests.len(), 6, "{requests:?}");
    let results: Vec<Vec<(String, Value)>> = requests.iter().map(tool_results).collect();
    let page = saw(&results, 1, "call_0_0");
    assert!(page["result"]["next_cursor"].is_string(), "{page}");
    let last = saw(&results, 2, "call_1_0");
    assert!(last["result"]["next_cursor"].is_null(), "{last}");
    assert!(
        !last["result"]["lines"].as_array().unwrap().is_empty(),
        "{last}"
    );
    let ocr = saw(&results, 3, "call_2_0");
    assert_eq!(ocr["status"], "ok", "{ocr}");
    assert_eq!(ocr, &items[0]["envelope"], "the job's final envelope");
    let asked = saw(&results, 3, "call_2_1");
    assert_eq!(asked["result"]["answer"], "travel", "{asked}");
    let plan = saw(&results, 4, "call_3_0");
    assert!(
        plan["result"]["confirm_token"]
            .as_str()
            .is_some_and(|t| t.starts_with("ct1.")),
        "{plan}"
    );
    let report = saw(&results, 5, "call_4_0");
    assert_eq!(report["status"], "ok", "{report}");
    assert!(report["result"]["report_id"].is_string(), "{report}");
    // The system prompt and the user's message came first; nothing was lost
    // across the wait.
    let last_messages = requests[5]["messages"].as_array().unwrap();
    assert_eq!(last_messages[0]["role"], "system");
    assert_eq!(
        last_messages[1]["content"],
        "Submit my expenses for 2026-09."
    );
    assert_eq!(
        last_messages.iter().filter(|m| m["role"] == "tool").count(),
        6,
        "{last_messages:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_wrong_webhook_secret_the_orchestrator_refuses_notices_and_reads_its_run() {
    let name = "orchestrator-unsigned";
    let wrong = "not-the-webhook-key-0123456789abcdef";
    let Some(Driven {
        model,
        run,
        status,
        stdout,
        stderr,
        ..
    }) = drive(name, wrong, 12).await
    else {
        return;
    };
    assert_eq!(
        status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(
        stdout.lines().last(),
        Some(format!("ANSWER: {ANSWER}").as_str()),
        "{stdout}"
    );
    assert!(stderr.contains("no run.resumed reached"), "{stderr}");
    assert!(!stderr.contains("heard run.resumed"), "{stderr}");
    assert_eq!(run["resumed"]["items"].as_array().map(Vec::len), Some(2));
    assert_eq!(model.requests(name).len(), 6);
}
