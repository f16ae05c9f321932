//! Binding configured executors: what configuration may name, and what it
//! is told when it names something wrong.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolfleet_core::config::ExecutorSpec;
use toolfleet_core::{CallCtx, ErrorCode, Executor, Json, Principal, executor_value};
use toolfleet_executors::{Binder, http_client};

fn binder() -> Binder {
    let echo: Arc<dyn Executor> =
        executor_value(|_ctx, args: Value| async move { Ok(Json::from(args)) });
    let builtins = BTreeMap::from([("things.echo".to_owned(), echo)]);
    Binder::new(builtins, http_client().unwrap())
}

fn ctx() -> CallCtx {
    CallCtx::new(Arc::new(Principal::new("acme", "alice", ["x"])))
}

fn bind_err(spec: ExecutorSpec) -> String {
    match binder().bind("t", &spec) {
        Ok(_) => panic!("{spec:?} was bound"),
        Err(message) => message,
    }
}

fn http(url: &str, headers: &[(&str, &str)], timeout_s: Option<f64>) -> ExecutorSpec {
    let headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ExecutorSpec::Http {
        url: url.to_owned(),
        headers,
        timeout_s,
    }
}

fn exec(program: &str, args: &[&str], timeout_s: Option<f64>) -> ExecutorSpec {
    let args = args.iter().map(|a| a.to_string()).collect();
    ExecutorSpec::Exec {
        program: program.to_owned(),
        args,
        timeout_s,
        env: BTreeMap::new(),
        pass_env: Vec::new(),
    }
}

#[tokio::test]
async fn a_builtin_is_found_by_name() {
    let executor = binder()
        .bind(
            "t",
            &ExecutorSpec::Builtin {
                name: "things.echo".into(),
            },
        )
        .unwrap();
    let out = executor.execute(ctx(), json!({"a": 1})).await.unwrap();
    assert_eq!(out.to_value(), json!({"a": 1}));
}

#[test]
fn an_unknown_builtin_lists_the_known_ones() {
    let err = bind_err(ExecutorSpec::Builtin {
        name: "things.ecko".into(),
    });
    assert!(
        err.contains("things.ecko") && err.contains("known: things.echo"),
        "{err}"
    );
    let none = Binder::new(BTreeMap::new(), http_client().unwrap());
    let err = none
        .bind("t", &ExecutorSpec::Builtin { name: "x".into() })
        .err()
        .unwrap();
    assert!(err.contains("known: none"), "{err}");
}

#[test]
fn an_http_executor_needs_an_http_url() {
    assert!(
        binder()
            .bind("t", &http("http://127.0.0.1:9000/report", &[], None))
            .is_ok()
    );
    assert!(bind_err(http("file:///etc/passwd", &[], None)).contains("http://"));
    assert!(bind_err(http("127.0.0.1:9000/report", &[], None)).contains("127.0.0.1:9000/report"));
    assert!(bind_err(http("", &[], None)).contains("not a valid URL"));
}

#[test]
fn configured_headers_are_checked_without_quoting_values() {
    let ok = http(
        "http://127.0.0.1:9000/",
        &[("Authorization", "Bearer abc")],
        None,
    );
    assert!(binder().bind("t", &ok).is_ok());
    let err = bind_err(http("http://127.0.0.1:9000/", &[("bad name", "v")], None));
    assert!(err.contains("`bad name`"), "{err}");
    let err = bind_err(http(
        "http://127.0.0.1:9000/",
        &[("X-Secret", "s3cret\nInjected: yes")],
        None,
    ));
    assert!(err.contains("X-Secret") && !err.contains("s3cret"), "{err}");
    let err = bind_err(http(
        "http://127.0.0.1:9000/",
        &[("Idempotency-Key", "mine")],
        None,
    ));
    assert!(err.contains("set by toolfleet"), "{err}");
}

#[test]
fn an_exec_executor_needs_a_program() {
    assert!(
        binder()
            .bind("t", &exec("/bin/sh", &["-c", "cat"], None))
            .is_ok()
    );
    assert!(bind_err(exec("", &[], None)).contains("empty"));
}

fn exec_env(env: &[(&str, &str)], pass_env: &[&str]) -> ExecutorSpec {
    ExecutorSpec::Exec {
        program: "/bin/sh".to_owned(),
        args: Vec::new(),
        timeout_s: None,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        pass_env: pass_env.iter().map(|n| n.to_string()).collect(),
    }
}

#[test]
fn an_exec_executors_variables_are_checked_without_quoting_values() {
    let ok = exec_env(
        &[("MODE", "fast"), ("PATH", "/opt/bin")],
        &["TOOL_TOKEN", "HOME"],
    );
    assert!(binder().bind("t", &ok).is_ok());
    // The operator may hand a secret of toolfleet's to a program on purpose.
    let secret = exec_env(&[], &["TOOLFLEET_CONFIRM_SECRET"]);
    assert!(binder().bind("t", &secret).is_ok());

    let long = "N".repeat(129);
    for (spec, says) in [
        (
            exec_env(&[("", "v")], &[]),
            "env: variable name `` is empty",
        ),
        (exec_env(&[], &[""]), "pass_env: variable name `` is empty"),
        (exec_env(&[("A=B", "v")], &[]), "`A=B` contains `=`"),
        (exec_env(&[], &["A\0B"]), "`A\\0B` contains a NUL character"),
        (exec_env(&[], &[long.as_str()]), "is longer than 128 bytes"),
        (
            exec_env(&[("TOOLFLEET_RUN_ID", "mine")], &[]),
            "`TOOLFLEET_RUN_ID` is set by toolfleet itself",
        ),
        (
            exec_env(&[], &["TOOLFLEET_TENANT"]),
            "`TOOLFLEET_TENANT` is set by toolfleet itself",
        ),
        (
            exec_env(&[("MODE", "a")], &["MODE"]),
            "`MODE` is both in env and in pass_env",
        ),
        (
            exec_env(&[], &["MODE", "MODE"]),
            "pass_env names `MODE` twice",
        ),
    ] {
        let err = bind_err(spec);
        assert!(err.contains(says), "{says}: {err}");
    }
    let err = bind_err(exec_env(&[("TOKEN", "s3cret\0x")], &[]));
    assert!(
        err.contains("`TOKEN` contains a NUL") && !err.contains("s3cret"),
        "{err}"
    );
    let big = "v".repeat(32 * 1024 + 1);
    let err = bind_err(exec_env(&[("BIG", big.as_str())], &[]));
    assert!(err.contains("`BIG` is longer than 32768 bytes"), "{err}");
    let names: Vec<String> = (0..65).map(|i| format!("V{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let err = bind_err(exec_env(&[], &names));
    assert!(err.contains("65 variables; at most 64"), "{err}");
}

#[test]
fn a_bad_variable_name_is_refused_at_load_naming_the_tool() {
    let text = "[[tools]]\nname = \"leaky\"\nshape = \"query\"\nexecutor = { kind = \"exec\", program = \"/bin/sh\", pass_env = [\"A=B\"] }\n";
    let err = binder()
        .load_tools(text, &|_| Err("no files".into()))
        .unwrap_err();
    assert!(
        err.message
            .contains("tool `leaky`: executor: pass_env: variable name `A=B`"),
        "{}",
        err.message
    );
}

#[test]
fn timeouts_must_be_positive_seconds() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let err = bind_err(exec("/bin/sh", &[], Some(bad)));
        assert!(
            err.contains("timeout_s must be a positive number"),
            "{bad}: {err}"
        );
        let err = bind_err(http("http://127.0.0.1:9000/", &[], Some(bad)));
        assert!(
            err.contains("timeout_s must be a positive number"),
            "{bad}: {err}"
        );
    }
}

#[tokio::test]
async fn the_default_timeout_bounds_an_executor_that_names_none() {
    let binder = binder().with_default_timeout(Duration::from_millis(300));
    let executor = binder
        .bind("t", &exec("/bin/sh", &["-c", "sleep 30"], None))
        .unwrap();
    let started = Instant::now();
    let err = executor.execute(ctx(), json!({})).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Timeout);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_configured_timeout_wins_over_the_default() {
    let binder = binder().with_default_timeout(Duration::from_secs(3600));
    let executor = binder
        .bind("t", &exec("/bin/sh", &["-c", "sleep 30"], Some(0.3)))
        .unwrap();
    let err = executor.execute(ctx(), json!({})).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::Timeout);
}

#[tokio::test]
async fn the_result_bound_applies_to_bound_executors() {
    let binder = binder().with_max_result_bytes(1024);
    let executor = binder
        .bind("t", &exec("/bin/sh", &["-c", "yes"], None))
        .unwrap();
    let err = executor.execute(ctx(), json!({})).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::PayloadTooLarge);
}

const TOOLS: &str = r#"
[[tools]]
name = "echo"
shape = "query"
executor = { kind = "exec", program = "/bin/sh", args = ["-c", "cat"], timeout_s = 5 }

[[tools]]
name = "report"
shape = "job"
executor = { kind = "http", url = "http://127.0.0.1:9000/report", headers = { Authorization = "Bearer x" } }

[[tools]]
name = "things"
shape = "query"
executor = { kind = "builtin", name = "things.echo" }
"#;

#[tokio::test]
async fn a_configuration_file_becomes_bound_declarations() {
    let tools = binder()
        .load_tools(TOOLS, &|_| Err("no files".into()))
        .unwrap();
    let names: Vec<_> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["echo", "report", "things"]);
    assert!(tools.iter().all(|t| t.executor.is_some()));
    let echo = tools[0].executor.clone().unwrap();
    assert_eq!(
        echo.execute(ctx(), json!({"q": 1}))
            .await
            .unwrap()
            .to_value(),
        json!({"q": 1})
    );
}

#[test]
fn a_configuration_mistake_names_the_tool() {
    let text = "[[tools]]\nname = \"broken\"\nshape = \"query\"\nexecutor = { kind = \"http\", url = \"gopher://x\" }\n";
    let err = binder()
        .load_tools(text, &|_| Err("no files".into()))
        .unwrap_err();
    assert!(
        err.message.contains("tool `broken`") && err.message.contains("gopher"),
        "{}",
        err.message
    );
}
