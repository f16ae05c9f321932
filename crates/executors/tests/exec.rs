//! The exec executor against real programs, mostly `/bin/sh -c` scripts.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolfleet_core::{
    CallCtx, CallEvent, CallEvents, ErrorCode, Executor, LogLevel, Principal, ToolError,
};
use toolfleet_executors::{BASE_ENV, CALL_ENV, ExecExecutor, MAX_EVENT_LINE, parse_event};

fn ctx() -> CallCtx {
    CallCtx::new(Arc::new(Principal::new("acme", "alice", ["x"])))
}

fn sh(script: &str) -> ExecExecutor {
    ExecExecutor::new("/bin/sh", vec!["-c".to_owned(), script.to_owned()])
        .unwrap()
        .with_timeout(Duration::from_secs(10))
}

async fn call(executor: &ExecExecutor, args: Value) -> Result<Value, ToolError> {
    executor
        .execute(ctx(), args)
        .await
        .map(|json| json.to_value())
}

#[tokio::test]
async fn the_arguments_arrive_on_stdin_and_the_result_leaves_on_stdout() {
    let args = json!({"month": "2026-09", "lines": [1, 2, 3]});
    assert_eq!(call(&sh("cat"), args.clone()).await.unwrap(), args);
}

#[tokio::test]
async fn large_arguments_and_results_do_not_deadlock() {
    let args = json!({"blob": "x".repeat(2 << 20)});
    let executor = sh("cat").with_max_output_bytes(4 << 20);
    assert_eq!(call(&executor, args.clone()).await.unwrap(), args);
}

#[tokio::test]
async fn a_program_that_ignores_stdin_still_answers() {
    let args = json!({"blob": "x".repeat(1 << 20)});
    assert_eq!(
        call(&sh("echo '{\"ok\": true}'"), args).await.unwrap(),
        json!({"ok": true})
    );
}

#[tokio::test]
async fn the_environment_carries_the_calls_keys() {
    let script = r#"printf '{"key":"%s","run":"%s","tenant":"%s"}' "$TOOLFLEET_IDEMPOTENCY_KEY" "$TOOLFLEET_RUN_ID" "$TOOLFLEET_TENANT""#;
    let ctx = ctx().with_run_id("run-7").with_idempotency_key("key-42");
    let out = sh(script).execute(ctx, json!({})).await.unwrap().to_value();
    assert_eq!(
        out,
        json!({"key": "key-42", "run": "run-7", "tenant": "acme"})
    );
}

/// Prints the environment the program started with (its own, not the
/// shell's additions), one JSON string `NAME=value` per variable.
const PRINT_ENV: &str = r#"tr '\0' '\n' < /proc/$$/environ | awk 'BEGIN { printf "[" } { gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t"); printf "%s\"%s\"", (NR > 1 ? "," : ""), $0 } END { print "]" }'"#;

/// The environment `executor` gives a program, by name.
async fn environment_of(executor: &ExecExecutor) -> BTreeMap<String, String> {
    let printed = call(executor, json!({})).await.unwrap();
    let vars: Vec<String> = serde_json::from_value(printed).unwrap();
    vars.iter()
        .map(|var| {
            let (name, value) = var.split_once('=').unwrap();
            (name.to_owned(), value.to_owned())
        })
        .collect()
}

#[tokio::test]
async fn a_program_sees_only_the_base_the_named_and_the_calls_variables() {
    // A variable of this process that a program may not see unless named:
    // it is passed once, and every other one must stay out.
    let passed = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .find(|name| !BASE_ENV.contains(&name.as_str()) && !CALL_ENV.contains(&name.as_str()));
    let env = BTreeMap::from([
        ("TOOL_MODE".to_owned(), "fast \"and\" loose".to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
    ]);
    let executor = sh(PRINT_ENV)
        .with_environment(env, passed.iter().cloned().collect())
        .unwrap();
    let seen = environment_of(&executor).await;

    let mut expected: BTreeSet<String> = BASE_ENV
        .iter()
        .filter(|name| std::env::var_os(name).is_some())
        .chain(&["PATH", "TOOL_MODE", "LANG"])
        .chain(&CALL_ENV)
        .map(|name| name.to_string())
        .collect();
    expected.extend(passed.clone());
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert_eq!(seen["TOOL_MODE"], "fast \"and\" loose");
    assert_eq!(seen["LANG"], "C.UTF-8", "env wins over toolfleet's own");
    if let Some(name) = passed {
        assert_eq!(
            Some(seen[&name].as_str()),
            std::env::var(&name).ok().as_deref()
        );
    }
    for name in ["PATH", "HOME", "TZ"] {
        if let Ok(value) = std::env::var(name) {
            assert_eq!(seen[name], value, "{name} is toolfleet's");
        }
    }
}

#[tokio::test]
async fn a_program_is_found_on_its_own_path() {
    let dir = TempDir::new("path");
    let tool = dir.0.join("my-tool");
    std::fs::write(&tool, "#!/bin/sh\necho '{\"found\": true}'\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", dir.0.display());
    let executor = ExecExecutor::new("my-tool", vec![])
        .unwrap()
        .with_environment(BTreeMap::from([("PATH".to_owned(), path)]), vec![])
        .unwrap();
    assert_eq!(
        call(&executor, json!({})).await.unwrap(),
        json!({"found": true})
    );
}

#[tokio::test]
async fn garbage_on_stdout_is_not_retryable() {
    let err = call(&sh("echo 'hello there'"), json!({}))
        .await
        .unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::ToolFailed, false));
    assert!(
        err.message.contains("not one JSON document") && err.message.contains("hello there"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn nothing_on_stdout_is_named() {
    let err = call(&sh("true"), json!({})).await.unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::ToolFailed, false));
    assert!(err.message.contains("printed nothing"), "{}", err.message);
}

#[tokio::test]
async fn a_failing_program_is_quoted_from_stderr() {
    let err = call(&sh("echo 'quota exceeded for acme' >&2; exit 3"), json!({}))
        .await
        .unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::ToolFailed, false));
    assert!(
        err.message.contains("status 3") && err.message.contains("quota exceeded for acme"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn exit_75_is_retryable() {
    let err = call(&sh("echo 'busy, later' >&2; exit 75"), json!({}))
        .await
        .unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::ToolFailed, true));
    assert!(err.message.contains("status 75"), "{}", err.message);
}

#[tokio::test]
async fn a_program_killed_by_a_signal_is_named() {
    let err = call(&sh("kill -9 $$"), json!({})).await.unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::ToolFailed, false));
    assert!(err.message.contains("signal 9"), "{}", err.message);
}

#[tokio::test]
async fn a_hanging_program_is_killed_at_its_timeout() {
    let executor = sh("sleep 30").with_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let err = call(&executor, json!({})).await.unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::Timeout, true));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_programs_children_die_with_it() {
    let dir = std::env::temp_dir().join(format!("toolfleet-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pid_file = dir.join("grandchild.pid");
    let script = format!("sleep 30 & echo $! > '{}'; wait", pid_file.display());
    let executor = sh(&script).with_timeout(Duration::from_millis(500));
    let err = call(&executor, json!({})).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Timeout);
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_owned();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        gone_soon(&pid).await,
        "the grandchild {pid} outlived the call"
    );
}

/// A temporary directory removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("toolfleet-exec-{name}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `script` (a directory of its own as `$1`) until its timeout, then
/// reads what it wrote with [`WRITE_IDS`]: the pid of the process that must
/// die with the call, its process group and session, and the program's.
/// Answers that pid and all five.
async fn timed_out_leaving(script: &str) -> (String, Vec<String>) {
    let dir = TempDir::new("tree");
    let file = dir.0.join("pids");
    let executor = ExecExecutor::new(
        "/bin/sh",
        vec![
            "-c".to_owned(),
            script.to_owned(),
            "sh".to_owned(),
            dir.0.display().to_string(),
        ],
    )
    .unwrap()
    .with_timeout(Duration::from_secs(3));
    let err = call(&executor, json!({})).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Timeout, "{}", err.message);
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("the program did not write {}: {e}", file.display()));
    let ids: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
    assert_eq!(ids.len(), 5, "{text:?}");
    (ids[0].clone(), ids)
}

/// Writes `$$`'s pid, process group and session, then those of `$2`, to
/// `$1/pids` (all at once, by a rename).
const WRITE_IDS: &str = r#"
ids() { set -- $(sed "s/.*) //" /proc/$1/stat); echo "$3 $4"; }
echo "$$ $(ids $$) $(ids $2)" > "$1/pids.tmp" && mv "$1/pids.tmp" "$1/pids""#;

#[tokio::test]
async fn a_grandchild_that_left_the_group_with_setsid_dies_at_the_timeout() {
    // The grandchild starts a session of its own, out of the program's group.
    let script = format!(r#"setsid sh -c '{WRITE_IDS}; exec sleep 1000' sh "$1" $$ & wait"#);
    let (pid, ids) = timed_out_leaving(&script).await;
    assert_ne!(
        ids[1], ids[3],
        "the grandchild left the program's group: {ids:?}"
    );
    assert!(
        gone_soon(&pid).await,
        "the setsid grandchild {pid} outlived the call"
    );
}

#[tokio::test]
async fn a_daemon_whose_parent_exited_dies_at_the_timeout() {
    // `setsid -f` forks a child into a session of its own and exits at once:
    // the daemon is orphaned while the program still runs.
    let script =
        format!(r#"setsid -f sh -c '{WRITE_IDS}; exec sleep 1000' sh "$1" $$; sleep 1000"#);
    let (pid, ids) = timed_out_leaving(&script).await;
    assert_ne!(
        ids[2], ids[4],
        "the daemon left the program's session: {ids:?}"
    );
    assert!(gone_soon(&pid).await, "the daemon {pid} outlived the call");
}

/// True once the process has exited (gone, or a zombie awaiting its reaper).
async fn gone_soon(pid: &str) -> bool {
    for _ in 0..50 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|rest| rest.trim_start().starts_with('Z')) =>
            {
                return true;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    false
}

#[tokio::test]
async fn endless_output_is_cut_off_at_the_bound() {
    let executor = sh("yes").with_max_output_bytes(64 * 1024);
    let started = Instant::now();
    let err = call(&executor, json!({})).await.unwrap_err();
    assert_eq!(
        (err.code, err.retryable),
        (ErrorCode::PayloadTooLarge, false)
    );
    assert!(err.message.contains("65536"), "{}", err.message);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_chatty_stderr_does_not_block_the_program() {
    let script = "head -c 1000000 /dev/zero | tr '\\0' e >&2; echo '{\"done\": true}'";
    assert_eq!(
        call(&sh(script), json!({})).await.unwrap(),
        json!({"done": true})
    );
}

#[tokio::test]
async fn a_missing_program_is_named() {
    let executor = ExecExecutor::new("/no/such/tool-program", vec![]).unwrap();
    let err = call(&executor, json!({})).await.unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::ToolFailed, false));
    assert!(
        err.message.contains("/no/such/tool-program") && err.message.contains("no such program"),
        "{}",
        err.message
    );
}

#[test]
fn an_empty_program_is_refused() {
    let err = ExecExecutor::new("  ", vec![]).unwrap_err();
    assert!(err.contains("empty"), "{err}");
}

#[tokio::test]
async fn report_lines_reach_the_listener_and_stay_out_of_the_excerpt() {
    let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut ctx = ctx();
    ctx.events = Some(CallEvents::new({
        let heard = heard.clone();
        move |event| heard.lock().unwrap().push(event)
    }));
    let script = r#"
echo 'toolfleet-event: {"progress": 1, "total": 2, "message": "half"}' >&2
echo 'toolfleet-event: {"log": "warning", "message": "slow"}' >&2
echo 'toolfleet-event: not json' >&2
echo 'toolfleet-event: {"log": "loud"}' >&2
echo 'real trouble' >&2
exit 3"#;
    let err = sh(script).execute(ctx, json!({})).await.unwrap_err();
    assert_eq!(
        *heard.lock().unwrap(),
        vec![
            CallEvent::Progress {
                progress: 1.0,
                total: Some(2.0),
                message: Some("half".into())
            },
            CallEvent::Log {
                level: LogLevel::Warning,
                message: "slow".into()
            },
        ]
    );
    // What is not a report is error text, as before.
    assert!(err.message.contains("real trouble"), "{}", err.message);
    assert!(err.message.contains("not json"), "{}", err.message);
    assert!(!err.message.contains("half"), "{}", err.message);
}

#[tokio::test]
async fn reports_without_a_listener_are_dropped() {
    let script = r#"echo 'toolfleet-event: {"progress": 1}' >&2; echo '{"ok": true}'"#;
    assert_eq!(
        call(&sh(script), json!({})).await.unwrap(),
        json!({"ok": true})
    );
}

#[test]
fn only_well_formed_short_lines_are_reports() {
    assert_eq!(
        parse_event(b"toolfleet-event: {\"progress\": 3}\n"),
        Some(CallEvent::Progress {
            progress: 3.0,
            total: None,
            message: None
        })
    );
    for bad in [
        &b"toolfleet-event: {\"progress\": \"3\"}"[..],
        b"toolfleet-event: {\"total\": 3}",
        b"toolfleet-event: {\"log\": \"info\", \"message\": 3}",
        b"toolfleet-event: [1]",
        b"progress: {\"progress\": 3}",
        b" toolfleet-event: {\"progress\": 3}",
    ] {
        assert_eq!(parse_event(bad), None, "{}", String::from_utf8_lossy(bad));
    }
}

#[tokio::test]
async fn an_overlong_report_line_is_error_text() {
    let heard = Arc::new(std::sync::Mutex::new(0));
    let mut ctx = ctx();
    ctx.events = Some(CallEvents::new({
        let heard = heard.clone();
        move |_| *heard.lock().unwrap() += 1
    }));
    let padding = "x".repeat(MAX_EVENT_LINE);
    let script = format!(
        r#"echo 'toolfleet-event: {{"progress": 1, "message": "{padding}"}}' >&2; echo 'toolfleet-event: {{"progress": 2}}' >&2; exit 3"#
    );
    let err = sh(&script).execute(ctx, json!({})).await.unwrap_err();
    assert_eq!(*heard.lock().unwrap(), 1, "only the short line is a report");
    assert!(err.message.contains("xxxx"), "{}", err.message);
}
