//! Nothing accepted is lost: `toolfleet serve` killed with SIGKILL while jobs
//! are queued and running, then started again; every job settles, and each
//! side effect of an idempotent executor happens once.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use common::{Server, TOKEN, TempDir, config_with, eventually};
use serde_json::{Value, json};

fn tools(dir: &std::path::Path) -> String {
    let runs = dir.join("runs");
    let effects = dir.join("effects");
    // Every run is logged; the effect is applied once per idempotency key.
    let script = format!(
        "k=\"$TOOLFLEET_IDEMPOTENCY_KEY\"; echo \"$k\" >> {runs}; sleep 0.2; grep -qx \"$k\" {effects} 2>/dev/null || echo \"$k\" >> {effects}; echo '{{\"done\": true}}'",
        runs = runs.display(),
        effects = effects.display()
    );
    format!(
        "[[tools]]\nname = \"side_effect\"\nshape = \"job\"\nexecutor = {{ kind = \"exec\", program = \"/bin/sh\", args = [\"-c\", {script:?}] }}\n"
    )
}

fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn states(client: &common::Client) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/jobs?limit=100&cursor={c}"),
            None => "/v1/jobs?limit=100".to_owned(),
        };
        let page = client.get(&path).await;
        for job in page["jobs"].as_array().unwrap() {
            out.insert(
                job["job_id"].as_str().unwrap().to_owned(),
                job["state"].as_str().unwrap().to_owned(),
            );
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_loses_no_job() {
    let dir = TempDir::new("crash");
    let text = config_with(&dir.0, "lease_s = 1\nconcurrency = 4", &tools(&dir.0));
    let mut server = Server::start(&dir.0, &text);
    let client = server.client(TOKEN);
    let mut ids = BTreeSet::new();
    for _ in 0..40 {
        let accepted = client.call("side_effect", json!({})).await;
        assert_eq!(accepted["status"], "running", "{accepted}");
        ids.insert(accepted["job_id"].as_str().unwrap().to_owned());
    }
    // Kill it mid-flight: some settled, some running, some still queued.
    let before = eventually(Duration::from_secs(20), || {
        let client = client.clone();
        async move {
            let s = states(&client).await;
            let settled = s.values().filter(|v| *v == "succeeded").count();
            (4..40).contains(&settled).then_some(s)
        }
    })
    .await;
    server.kill();
    let settled_before: BTreeSet<String> = before
        .iter()
        .filter(|(_, s)| *s == "succeeded")
        .map(|(id, _)| id.clone())
        .collect();
    assert!(settled_before.len() < 40);

    let server = Server::start_with(&server.config.clone());
    let client = server.client(TOKEN);
    let after = eventually(Duration::from_secs(60), || {
        let client = client.clone();
        async move {
            let s = states(&client).await;
            s.values().all(|v| v == "succeeded").then_some(s)
        }
    })
    .await;
    assert_eq!(
        after.keys().cloned().collect::<BTreeSet<_>>(),
        ids,
        "every accepted job is still there"
    );

    let effects = lines(&dir.0.join("effects"));
    let distinct: BTreeSet<String> = effects.iter().cloned().collect();
    assert_eq!(effects.len(), 40, "each side effect happened once");
    assert_eq!(distinct, ids);
    let runs = lines(&dir.0.join("runs"));
    for id in &settled_before {
        assert_eq!(
            runs.iter().filter(|r| *r == id).count(),
            1,
            "a settled job never runs again: {id}"
        );
    }
    let reruns = runs.len() - 40;
    assert!(
        reruns <= 4,
        "only jobs running at the kill run again ({reruns} reruns)"
    );
    for id in &ids {
        let job: Value = client.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(job["result"]["done"], true);
    }
}

/// A server started again with more due jobs than one read of the store
/// gives (1,000 of each kind) puts them all back in its queue at once, not
/// a thousand a sweep period: its first sweep reads the store a page at a
/// time, and says how many it put back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_requeues_a_backlog_longer_than_a_page_at_once() {
    let dir = TempDir::new("restart-backlog");
    let noop = "[[tools]]\nname = \"noop_job\"\ndescription = \"Does nothing, as a job.\"\nshape = \"job\"\ninput_schema = { type = \"object\" }\nexecutor = { kind = \"builtin\", name = \"toolfleet.noop\" }\n";
    let text = config_with(&dir.0, "", noop);
    let mut server = Server::start(&dir.0, &text);
    let client = server.client(TOKEN);
    // Due within the first sweep's reach (a sweep period ahead), not before
    // the server stops.
    let call = json!({"tool": "noop_job", "args": {}, "delay_s": 4});
    let batch = json!({ "calls": vec![call; 1_000] });
    let mut ids = BTreeSet::new();
    for _ in 0..3 {
        let answered = client.post("/v1/calls", batch.clone()).await;
        for envelope in answered["results"].as_array().expect("results") {
            assert_eq!(envelope["status"], "running", "{envelope}");
            ids.insert(envelope["job_id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(ids.len(), 3_000);
    server.kill();

    let config = server.config.clone();
    let server = Server::start_role_env(
        &config,
        "serve",
        "toolfleet serving on ",
        &[("TOOLFLEET_LOG", "warn,toolfleet=info")],
    );
    let requeued = server
        .startup
        .iter()
        .find(|line| line.contains("requeued jobs left from the last run"))
        .unwrap_or_else(|| panic!("no requeue said: {:?}", server.startup));
    assert!(requeued.contains("jobs=3000"), "{requeued}");
    let client = server.client(TOKEN);
    let after = eventually(Duration::from_secs(60), || {
        let client = client.clone();
        async move {
            let s = states(&client).await;
            (s.len() == 3_000 && s.values().all(|v| v == "succeeded")).then_some(s)
        }
    })
    .await;
    assert_eq!(after.keys().cloned().collect::<BTreeSet<_>>(), ids);
}
