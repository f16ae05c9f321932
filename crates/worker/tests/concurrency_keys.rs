//! Concurrency keys through the in-process path: a tool declaring at most
//! 2 running jobs per account never runs a third of one account, whatever
//! the worker's slots, runs other accounts meanwhile, and finishes every
//! job; a call without the key's argument is refused.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_core::{
    CallCtx, CountedBy, Envelope, ErrorCode, JobState, Principal, Runtime, RuntimeConfig, ToolDecl,
    ToolError,
};
use toolfleet_worker::WorkerConfig;

const POOL: &str = "sync";

/// Per account: running now, and the most at once.
type Counts = Arc<Mutex<HashMap<String, (u32, u32)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_the_limit_of_one_key_runs_at_once_and_every_job_finishes() {
    let rig = common::Rig::new().await;
    let mut runtime = rig.runtime(RuntimeConfig::default());
    let counts: Counts = Arc::default();
    let seen = counts.clone();
    let sync = ToolDecl::job("sync")
        .pool(POOL)
        .input_schema(json!({
            "type": "object",
            "properties": {"account": {"type": "string"}},
            "required": ["account"]
        }))
        .concurrency(2, CountedBy::Pointer("/account".to_owned()))
        .run(move |_ctx: CallCtx, args: Value| {
            let seen = seen.clone();
            async move {
                let account = args["account"].as_str().unwrap_or_default().to_owned();
                {
                    let mut counts = seen.lock().unwrap();
                    let entry = counts.entry(account.clone()).or_insert((0, 0));
                    entry.0 += 1;
                    entry.1 = entry.1.max(entry.0);
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
                seen.lock().unwrap().get_mut(&account).unwrap().0 -= 1;
                Ok::<_, ToolError>(json!({}))
            }
        });
    runtime.register(sync).expect("the tool registers");
    assert!(
        runtime.is_ordered(POOL),
        "a concurrency limit orders its pool"
    );
    let runtime = Arc::new(runtime);
    let mut config = WorkerConfig::new(POOL);
    config.concurrency = 8;
    config.ordered = true;
    let worker = rig.worker(config, &runtime);
    let principal = Arc::new(Principal::new("acme", "alice", Vec::<String>::new()));
    let mut ids = Vec::new();
    for n in 0..30 {
        let account = ["a", "b", "c"][n % 3];
        let ctx = CallCtx::new(principal.clone());
        match runtime
            .invoke("sync", json!({"account": account}), &ctx)
            .await
        {
            Envelope::Running { job_id, .. } => ids.push(job_id),
            other => panic!("{other:?}"),
        }
    }
    let missing = runtime
        .invoke("sync", json!({}), &CallCtx::new(principal.clone()))
        .await;
    match missing {
        Envelope::Error { error, .. } => {
            assert_eq!(error.code, ErrorCode::InvalidArguments);
        }
        other => panic!("{other:?}"),
    }
    let stop = rig.start(&worker);
    for id in &ids {
        rig.until(id, JobState::Succeeded, Duration::from_secs(20))
            .await;
    }
    let counts = counts.lock().unwrap().clone();
    assert_eq!(counts.len(), 3);
    for (account, (now, most)) in &counts {
        assert_eq!(*now, 0, "{account}");
        assert!(*most <= 2, "account {account} ran {most} at once");
    }
    assert!(
        counts.values().any(|(_, most)| *most == 2),
        "the limit is reached, not undercut: {counts:?}"
    );
    let _ = stop.send(true);
}

#[test]
fn a_concurrency_key_is_refused_where_it_cannot_count() {
    let job = |decl: ToolDecl| {
        decl.run(|_ctx: CallCtx, _args: Value| async move { Ok::<_, ToolError>(json!({})) })
    };
    let mut runtime = Runtime::builder().build();
    let nowhere = job(ToolDecl::job("j1")
        .input_schema(json!({"type": "object", "properties": {"account": {"type": "string"}}}))
        .concurrency(2, CountedBy::Pointer("/acount".to_owned())));
    let error = runtime.register(nowhere).unwrap_err();
    assert_eq!(error.rule, "concurrency");
    assert!(
        error.message.contains("points into nothing"),
        "{}",
        error.message
    );
    let zero = job(ToolDecl::job("j2").concurrency(0, CountedBy::Tenant));
    assert_eq!(runtime.register(zero).unwrap_err().rule, "concurrency");
    let query = job(ToolDecl::query("q").concurrency(1, CountedBy::User));
    assert_eq!(runtime.register(query).unwrap_err().rule, "concurrency");
    assert_eq!(CountedBy::parse("tenant"), Some(CountedBy::Tenant));
    assert_eq!(CountedBy::parse("user"), Some(CountedBy::User));
    assert_eq!(CountedBy::parse("account"), None);
}
