//! A command's commit runs its tool at most once per confirm token, however
//! it is interrupted: a caller that goes away, a second commit meanwhile, a
//! timeout, a failure, a process that stopped mid-commit. Each test drives
//! `Runtime::invoke` on the in-memory commit log.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Semaphore;
use toolfleet_core::shapes::command::{
    COMMIT_RETRY_AFTER_S, Claim, ClaimTerms, CommitLog, commit_key, unix_now,
};
use toolfleet_core::{
    CallCtx, Envelope, ErrorCode, MemoryCommitLog, Principal, Runtime, ToolDecl, ToolError,
};

fn alice() -> CallCtx {
    CallCtx::new(Arc::new(Principal::new("acme", "alice", ["reports"])))
}

/// Sets its flag when dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What the test sees of a command tool's commits.
#[derive(Clone, Default)]
struct Seen {
    /// Commits that started.
    runs: Arc<AtomicUsize>,
    /// Commits that ran to their end.
    finished: Arc<AtomicUsize>,
    /// Set when a commit's future was dropped before its end.
    dropped: Arc<AtomicBool>,
}

/// A command whose commit waits for a permit of `gate`, then answers
/// `answer(n)` for its n-th run (its dry run answers at once).
fn report_tool(
    seen: &Seen,
    gate: Arc<Semaphore>,
    answer: impl Fn(usize) -> Result<Value, ToolError> + Send + Sync + 'static,
) -> ToolDecl {
    let (seen, answer) = (seen.clone(), Arc::new(answer));
    ToolDecl::command("file_report")
        .input_schema(json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["amount", "dry_run"],
            "properties": {"amount": {"type": "integer"}, "dry_run": {"type": "boolean"}}
        }))
        .run(move |_ctx: CallCtx, args: Value| {
            let (seen, gate, answer) = (seen.clone(), gate.clone(), answer.clone());
            async move {
                if args["dry_run"] == true {
                    return Ok(json!({"would_file": args["amount"]}));
                }
                let n = seen.runs.fetch_add(1, Ordering::SeqCst) + 1;
                let guard = DropFlag(seen.dropped.clone());
                let _permit = gate.acquire().await;
                std::mem::forget(guard);
                seen.finished.fetch_add(1, Ordering::SeqCst);
                answer(n)
            }
        })
}

/// A report numbered after its run.
fn filed(n: usize) -> Result<Value, ToolError> {
    Ok(json!({"report_id": format!("r{n}")}))
}

/// The commit's arguments, after a dry run.
async fn dry_run(runtime: &Runtime) -> Value {
    let dry = runtime
        .invoke(
            "file_report",
            json!({"amount": 5, "dry_run": true}),
            &alice(),
        )
        .await;
    let token = dry.result().expect("a plan").to_value()["confirm_token"].clone();
    json!({"amount": 5, "dry_run": false, "confirm_token": token})
}

/// Waits (at most 5 s) until `f` holds.
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn runtime_with(tool: ToolDecl) -> Arc<Runtime> {
    let mut runtime = Runtime::builder().build();
    runtime.register(tool).expect("the tool registers");
    Arc::new(runtime)
}

fn spawn_commit(runtime: &Arc<Runtime>, commit: &Value) -> tokio::task::JoinHandle<Envelope> {
    let (runtime, commit) = (runtime.clone(), commit.clone());
    tokio::spawn(async move { runtime.invoke("file_report", commit, &alice()).await })
}

/// The same token committed again while its first commit runs answers
/// `conflict` with `retry_after_s` after a short wait; once the first
/// settles, it answers the first commit's outcome, and the tool ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_commit_meanwhile_answers_conflict_then_the_outcome() {
    let (seen, gate) = (Seen::default(), Arc::new(Semaphore::new(0)));
    let runtime = runtime_with(report_tool(&seen, gate.clone(), filed));
    let commit = dry_run(&runtime).await;
    let first = spawn_commit(&runtime, &commit);
    until("the first commit runs", || {
        seen.runs.load(Ordering::SeqCst) == 1
    })
    .await;

    let second = runtime
        .invoke("file_report", commit.clone(), &alice())
        .await;
    let error = second.error_ref().expect("an error");
    assert_eq!(error.code, ErrorCode::Conflict, "{}", second.to_json());
    assert!(error.retryable);
    assert_eq!(error.retry_after_s, Some(COMMIT_RETRY_AFTER_S));
    assert!(error.message.contains("still running"), "{}", error.message);

    gate.add_permits(1);
    let first = first.await.expect("the first commit answers");
    assert_eq!(first.result().expect("ok").to_value()["report_id"], "r1");
    let again = runtime.invoke("file_report", commit, &alice()).await;
    assert_eq!(again.result(), first.result());
    assert_eq!(seen.runs.load(Ordering::SeqCst), 1);
}

/// A commit whose caller went away (its future dropped mid-run) runs its
/// tool to the end and records the outcome, which the retry answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_caller_went_away_runs_to_its_end_once() {
    let (seen, gate) = (Seen::default(), Arc::new(Semaphore::new(0)));
    let runtime = runtime_with(report_tool(&seen, gate.clone(), filed));
    let commit = dry_run(&runtime).await;
    let first = spawn_commit(&runtime, &commit);
    until("the commit runs", || seen.runs.load(Ordering::SeqCst) == 1).await;
    first.abort();
    assert!(first.await.expect_err("dropped").is_cancelled());
    assert!(
        !seen.dropped.load(Ordering::SeqCst),
        "the tool's run outlives its caller"
    );

    gate.add_permits(1);
    until("the commit ends", || {
        seen.finished.load(Ordering::SeqCst) == 1
    })
    .await;
    let retried = loop {
        let answer = runtime
            .invoke("file_report", commit.clone(), &alice())
            .await;
        if answer.error_code() != Some(ErrorCode::Conflict) {
            break answer;
        }
    };
    assert_eq!(retried.result().expect("ok").to_value()["report_id"], "r1");
    assert_eq!(seen.runs.load(Ordering::SeqCst), 1);
}

/// A commit past its time limit is stopped and its timeout recorded as its
/// outcome: the same token answers it again and never runs the tool again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_times_out_records_the_timeout() {
    let (seen, gate) = (Seen::default(), Arc::new(Semaphore::new(0)));
    let tool = report_tool(&seen, gate, filed).timeout(Duration::from_millis(100));
    let runtime = runtime_with(tool);
    let commit = dry_run(&runtime).await;
    let first = runtime
        .invoke("file_report", commit.clone(), &alice())
        .await;
    let error = first.error_ref().expect("an error").clone();
    assert_eq!(error.code, ErrorCode::Timeout);
    assert!(!error.retryable, "the same token answers it again");
    assert_eq!(error.details, Some(json!({"outcome": "unknown"})));
    assert!(error.message.contains("dry_run=true"), "{}", error.message);
    assert!(seen.dropped.load(Ordering::SeqCst), "the tool was stopped");

    let again = runtime.invoke("file_report", commit, &alice()).await;
    assert_eq!(again, first);
    assert_eq!(seen.runs.load(Ordering::SeqCst), 1);
}

/// A retryable failure may follow a partial effect: it is recorded, not
/// retryable with the same token, and says how to try again.
#[tokio::test]
async fn a_retryable_failure_of_a_commit_is_recorded() {
    let (seen, gate) = (Seen::default(), Arc::new(Semaphore::new(10)));
    let runtime = runtime_with(report_tool(&seen, gate, |_| {
        Err(ToolError::failed("the ledger answered 503", true))
    }));
    let commit = dry_run(&runtime).await;
    let first = runtime
        .invoke("file_report", commit.clone(), &alice())
        .await;
    let error = first.error_ref().expect("an error");
    assert_eq!(
        (error.code, error.retryable),
        (ErrorCode::ToolFailed, false)
    );
    assert!(error.message.starts_with("the ledger answered 503"));
    assert!(error.message.contains("dry_run=true"), "{}", error.message);
    let again = runtime.invoke("file_report", commit, &alice()).await;
    assert_eq!(again, first);
    assert_eq!(seen.runs.load(Ordering::SeqCst), 1);
}

/// `rate_limited` says the tool refused the call without acting: the claim
/// is released, and the same token runs the tool again.
#[tokio::test]
async fn a_rate_limited_commit_may_run_again_with_its_token() {
    let (seen, gate) = (Seen::default(), Arc::new(Semaphore::new(10)));
    let runtime = runtime_with(report_tool(&seen, gate, |n| match n {
        1 => Err(ToolError::new(ErrorCode::RateLimited, "slow down").with_retry_after(1)),
        n => filed(n),
    }));
    let commit = dry_run(&runtime).await;
    let first = runtime
        .invoke("file_report", commit.clone(), &alice())
        .await;
    let error = first.error_ref().expect("an error");
    assert_eq!(
        (error.code, error.retryable, error.retry_after_s),
        (ErrorCode::RateLimited, true, Some(1))
    );
    let second = runtime.invoke("file_report", commit, &alice()).await;
    assert_eq!(second.result().expect("ok").to_value()["report_id"], "r2");
    assert_eq!(seen.runs.load(Ordering::SeqCst), 2);
}

/// A token whose claim was left pending past its lease (a process that
/// stopped mid-commit) answers that its outcome is unknown, and the tool
/// does not run.
#[tokio::test]
async fn a_commit_abandoned_mid_run_is_never_run_again() {
    let (seen, gate) = (Seen::default(), Arc::new(Semaphore::new(10)));
    let log = Arc::new(MemoryCommitLog::default());
    let mut runtime = Runtime::builder().commit_log(log.clone()).build();
    runtime
        .register(report_tool(&seen, gate, filed))
        .expect("the tool registers");
    let commit = dry_run(&runtime).await;
    let token = commit["confirm_token"].as_str().expect("a token");
    // Another process claimed the token and stopped before its lease ended.
    let terms = ClaimTerms {
        lease: Duration::from_millis(1),
        keep_until_unix: unix_now() + 600,
    };
    let key = commit_key("acme", token);
    assert_eq!(log.claim(&key, terms).await, Ok(Claim::Run));
    tokio::time::sleep(Duration::from_millis(5)).await;

    for _ in 0..2 {
        let answer = runtime
            .invoke("file_report", commit.clone(), &alice())
            .await;
        let error = answer.error_ref().expect("an error");
        assert_eq!(
            (error.code, error.retryable),
            (ErrorCode::ToolFailed, false)
        );
        assert_eq!(error.details, Some(json!({"outcome": "unknown"})));
        assert!(error.message.contains("interrupted"), "{}", error.message);
    }
    assert_eq!(seen.runs.load(Ordering::SeqCst), 0);
}
