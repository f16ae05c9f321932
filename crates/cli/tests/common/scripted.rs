//! A scripted run against `toolfleet serve` on the embedded default that
//! moves every metric of the contract: a cached query called twice, a
//! validation failure, denials of every reason, a job that succeeds and
//! calls back a webhook that fails once, a job that fails after a retry, an
//! agent on a scripted model, `get_job` read and long-polled through the
//! call path. tests/metrics.rs checks the values it leaves;
//! tests/dashboards.rs takes the names and labels toolfleet exports from it.

use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_agent::model::Usage;
use toolfleet_agent::testing::{Scripted, ScriptedModel};

use super::{Server, TOKEN, TempDir, config_with, eventually, hook_receiver, settle, sha};

/// A token of tenant `acme` holding no scope.
pub(crate) const READER: &str = "tf_test_reader";

/// One scrape of a process's `/metrics`.
pub(crate) struct Scrape {
    pub text: String,
}

impl Scrape {
    pub(crate) async fn of(base: &str) -> Scrape {
        let response = reqwest_client()
            .get(format!("{base}/metrics"))
            .send()
            .await
            .expect("/metrics answers");
        assert_eq!(response.status(), 200);
        let kind = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(
            kind.starts_with("application/openmetrics-text"),
            "content type {kind}"
        );
        let text = response.text().await.expect("a body");
        assert!(text.ends_with("# EOF\n"), "{text}");
        Scrape { text }
    }

    /// The value of `series` (its name and labels as rendered), if shown.
    pub(crate) fn value(&self, series: &str) -> Option<f64> {
        self.text
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// The value of `series`, which must be shown.
    pub(crate) fn get(&self, series: &str) -> f64 {
        self.value(series)
            .unwrap_or_else(|| panic!("no `{series}` in\n{}", self.text))
    }

    pub(crate) fn has_type(&self, family: &str, kind: &str) -> bool {
        let line = format!("# TYPE {family} {kind}");
        self.text.lines().any(|l| l == line)
    }
}

pub(crate) fn reqwest_client() -> reqwest::Client {
    toolfleet_executors::http_client().expect("a client")
}

/// The tools of the scripted run beside the expense pack's `find_expenses`
/// (a read-only query with `cache_reads` and scope `expenses:read`).
fn tools(model_url: &str) -> String {
    format!(
        r#"
[[auth.tokens]]
sha256 = "{reader}"
tenant = "acme"
user = "reader"
scopes = []

[[tools]]
name = "limited"
shape = "query"
description = "Answers once a minute."
input_schema = {{ type = "object" }}
middleware = {{ rate_limit = {{ max = 1, per_s = 60 }} }}
executor = {{ kind = "exec", program = "sh", args = ["-c", "echo '{{}}'"] }}

[[tools]]
name = "fine_job"
shape = "job"
description = "Succeeds."
input_schema = {{ type = "object" }}
executor = {{ kind = "exec", program = "sh", args = ["-c", "echo '{{\"fine\": true}}'"] }}

[[tools]]
name = "flaky_job"
shape = "job"
description = "Fails, retryably, every time."
input_schema = {{ type = "object" }}
max_attempts = 2
executor = {{ kind = "exec", program = "sh", args = ["-c", "exit 75"] }}

[[tools]]
name = "counting_agent"
shape = "agent"
description = "Answers at once."
input_schema = {{ type = "object", required = ["task"], properties = {{ task = {{ type = "string" }} }} }}

[tools.executor]
kind = "agent"
provider = "openai"
base_url = "{model_url}"
model = "gpt-metrics"
system_prompt = "Answer."
tools = []
"#,
        reader = sha(READER),
    )
}

/// What a scripted run leaves: the server, still running, and its scrape
/// once every job settled and every worker is idle.
pub(crate) struct ScriptedRun {
    pub server: Server,
    pub scrape: Scrape,
    _dir: TempDir,
    _model: ScriptedModel,
}

/// Runs the script against a new `toolfleet serve`.
pub(crate) async fn scripted_run() -> ScriptedRun {
    let model = ScriptedModel::start().await;
    model.script(
        "gpt-metrics",
        vec![Scripted::Answer {
            text: "Done.".into(),
            usage: Usage {
                input_tokens: 50,
                output_tokens: 10,
            },
        }],
    );
    let (hook, hooks) = hook_receiver(vec![500, 200]).await;
    let dir = TempDir::new("metrics-serve");
    let server = Server::start(
        &dir.0,
        &config_with(&dir.0, "concurrency = 4", &tools(&model.base_url())),
    );
    let alice = server.client(TOKEN);
    let reader = server.client(READER);
    let stranger = server.client("tf_not_a_token");

    // A cached query: a miss, then a hit.
    let september = json!({"month": "2026-09"});
    for _ in 0..2 {
        let found = alice.call("find_expenses", september.clone()).await;
        assert_eq!(found["status"], "ok", "{found}");
    }
    // Arguments that do not match the schema.
    let bad = alice.call("find_expenses", json!({"month": "Sept"})).await;
    assert_eq!(bad["error"]["code"], "invalid_arguments", "{bad}");
    // Denied: a missing scope, an unknown token, over a rate limit.
    let forbidden = reader.call("find_expenses", september.clone()).await;
    assert_eq!(forbidden["error"]["code"], "forbidden", "{forbidden}");
    let (status, _) = stranger.raw(reqwest::Method::GET, "/v1/tools", None).await;
    assert_eq!(status, 401);
    assert_eq!(alice.call("limited", json!({})).await["status"], "ok");
    let limited = alice.call("limited", json!({})).await;
    assert_eq!(limited["error"]["code"], "rate_limited", "{limited}");
    // A tool nobody declared.
    let unknown = alice.call("no_such_tool", json!({})).await;
    assert_eq!(unknown["error"]["code"], "unknown_tool", "{unknown}");

    // A job that succeeds and calls back (the first delivery is refused),
    // one that fails after its retry, and an agent.
    let fine = alice
        .post(
            "/v1/calls",
            json!({"tool": "fine_job", "args": {}, "callback_url": hook}),
        )
        .await;
    let flaky = alice.call("flaky_job", json!({})).await;
    let agent = alice
        .call("counting_agent", json!({"task": "Count."}))
        .await;
    let id = |v: &Value| v["job_id"].as_str().expect("a job id").to_owned();
    assert_eq!(settle(&alice, &id(&fine)).await["status"], "ok");
    let failed = settle(&alice, &id(&flaky)).await;
    assert_eq!(failed["error"]["code"], "tool_failed", "{failed}");
    let answered = settle(&alice, &id(&agent)).await;
    assert_eq!(answered["result"]["status"], "answered", "{answered}");
    // get_job through the call path: a read, and a long poll (wait_s > 0),
    // which is counted but not timed.
    for wait_s in [0, 1] {
        let read = alice
            .call("get_job", json!({"job_id": id(&fine), "wait_s": wait_s}))
            .await;
        assert_eq!(read["status"], "ok", "{read}");
    }
    eventually(Duration::from_secs(20), || {
        let hooks = hooks.clone();
        async move { (hooks.lock().unwrap().len() >= 2).then_some(()) }
    })
    .await;

    // The gauges and the last webhook attempt settle just after the jobs do.
    let scrape = eventually(Duration::from_secs(10), || {
        let base = server.base.clone();
        async move {
            let scrape = Scrape::of(&base).await;
            let idle = scrape.value(r#"toolfleet_worker_busy_slots{pool="default"}"#) == Some(0.0)
                && scrape.value(r#"toolfleet_worker_busy_slots{pool="agents"}"#) == Some(0.0);
            let delivered = scrape
                .value(r#"toolfleet_webhook_deliveries_total{outcome="delivered"}"#)
                == Some(1.0);
            (idle && delivered).then_some(scrape)
        }
    })
    .await;

    ScriptedRun {
        server,
        scrape,
        _dir: dir,
        _model: model,
    }
}
