//! Tools get no secrets of the runtime: an exec tool of a real `toolfleet
//! serve`, whose environment holds the runtime's secrets, sees only `PATH`,
//! `HOME`, `LANG`, `TZ`, what its executor names and the call's own
//! variables, inline and as a job.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::{Server, TOKEN, TempDir, config, settle};
use serde_json::{Value, json};

/// What the server's environment holds that no tool may see.
const SECRETS: [(&str, &str); 6] = [
    (
        "TOOLFLEET_CONFIRM_SECRET",
        "5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2",
    ),
    (
        "TOOLFLEET_WEBHOOK_SECRET",
        "webhook-s3cret-do-not-leak-0123456789",
    ),
    ("TOOLFLEET_TOKEN", "tf_cli_s3cret_do_not_leak"),
    ("OPENAI_API_KEY", "sk-openai-s3cret-do-not-leak"),
    ("ANTHROPIC_API_KEY", "sk-ant-s3cret-do-not-leak"),
    ("UNRELATED_SETTING", "unrelated-s3cret-do-not-leak"),
];

/// Prints the environment the program started with (its own, not the
/// shell's additions), one JSON string `NAME=value` per variable.
const PRINT_ENV: &str = r#"tr '\0' '\n' < /proc/$$/environ | awk 'BEGIN { printf "[" } { gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t"); printf "%s\"%s\"", (NR > 1 ? "," : ""), $0 } END { print "]" }'
"#;

fn tools(dir: &Path) -> String {
    let script = dir.join("print-env.sh");
    std::fs::write(&script, PRINT_ENV).expect("script written");
    let executor = format!(
        r#"{{ kind = "exec", program = "/bin/sh", args = ["{}"], env = {{ TOOL_MODE = "fast" }}, pass_env = ["TOOL_TOKEN", "TOOL_ABSENT"] }}"#,
        script.display()
    );
    format!(
        r#"
[[tools]]
name = "print_env"
shape = "query"
executor = {executor}

[[tools]]
name = "print_env_job"
shape = "job"
executor = {executor}
"#
    )
}

/// The printed variables, by name.
fn variables(result: &Value) -> BTreeMap<String, String> {
    let vars: Vec<String> = serde_json::from_value(result.clone())
        .unwrap_or_else(|e| panic!("not a list of variables ({e}): {result}"));
    vars.iter()
        .map(|var| {
            let (name, value) = var.split_once('=').expect("NAME=value");
            (name.to_owned(), value.to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_sees_only_what_it_is_given_and_none_of_the_runtimes_secrets() {
    let dir = TempDir::new("tool-env");
    let mut env: Vec<(&str, &str)> = SECRETS.to_vec();
    env.extend([("TOOL_TOKEN", "tool-token-given"), ("TZ", "Europe/Paris")]);
    let config_path = dir.0.join("toolfleet.toml");
    std::fs::write(&config_path, config(&dir.0, &tools(&dir.0))).expect("config written");
    let server = Server::start_role_env(&config_path, "serve", "toolfleet serving on ", &env);
    let alice = server.client(TOKEN);

    let inline = alice.call("print_env", json!({})).await;
    assert_eq!(inline["status"], "ok", "{inline}");
    let accepted = alice.call("print_env_job", json!({})).await;
    let job = accepted["job_id"].as_str().expect("a job id").to_owned();
    let settled = settle(&alice, &job).await;
    assert_eq!(settled["status"], "ok", "{settled}");

    for answer in [&inline, &settled] {
        let seen = variables(&answer["result"]);
        // Exactly: the base that the server has, the named, the call's own.
        let mut expected: BTreeSet<&str> = ["PATH", "TZ", "TOOL_TOKEN", "TOOL_MODE"].into();
        expected.extend(
            ["HOME", "LANG"]
                .into_iter()
                .filter(|name| std::env::var_os(name).is_some()),
        );
        expected.extend([
            "TOOLFLEET_IDEMPOTENCY_KEY",
            "TOOLFLEET_RUN_ID",
            "TOOLFLEET_CALL_ID",
            "TOOLFLEET_TENANT",
        ]);
        let names: BTreeSet<&str> = seen.keys().map(String::as_str).collect();
        assert_eq!(names, expected, "{answer}");
        assert_eq!(seen["TOOL_TOKEN"], "tool-token-given");
        assert_eq!(seen["TOOL_MODE"], "fast");
        assert_eq!(seen["TZ"], "Europe/Paris");
        assert_eq!(seen["TOOLFLEET_TENANT"], "acme");
        assert_eq!(
            Some(seen["PATH"].as_str()),
            std::env::var("PATH").ok().as_deref()
        );
        let printed = answer["result"].to_string();
        for (name, value) in SECRETS {
            assert!(
                !printed.contains(name) && !printed.contains(value),
                "{name} reached the tool: {printed}"
            );
        }
    }
}
