//! toolfleet as PID 1, as in the image: the Dockerfile's ENTRYPOINT runs it
//! under `tini`, which reaps the processes exec tools orphan (toolfleet reaps
//! only its own children). Docker is not needed: the entrypoint runs as PID 1
//! of a PID namespace of its own (`unshare --pid --fork --mount-proc`, as
//! root). Under CI (`CI` set) a missing tool or privilege fails the test,
//! elsewhere it skips it.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Server, TOKEN, TempDir, config, dockerfile, exec_form, missing};
use serde_json::{Value, json};

/// The image's ENTRYPOINT.
fn entrypoint() -> Vec<String> {
    dockerfile()
        .iter()
        .rev()
        .find(|(word, _)| word == "ENTRYPOINT")
        .map(|(_, args)| exec_form(args))
        .expect("the Dockerfile has an ENTRYPOINT")
}

#[test]
fn the_image_runs_toolfleet_under_tini() {
    let instructions = dockerfile();
    let entrypoint = entrypoint();
    assert_eq!(
        entrypoint,
        ["/usr/bin/tini", "--", "toolfleet"],
        "tini is PID 1 and runs toolfleet"
    );
    // The runtime stage, after the last FROM, installs it.
    let runtime = instructions
        .iter()
        .rposition(|(word, _)| word == "FROM")
        .expect("a FROM");
    let installs_tini = instructions[runtime..].iter().any(|(word, args)| {
        word == "RUN"
            && args.split("&&").any(|step| {
                step.contains("apt-get install") && step.split_whitespace().any(|w| w == "tini")
            })
    });
    assert!(installs_tini, "the runtime stage installs tini");
}

/// The tool `orphans` starts a grandchild through a subshell that exits at
/// once (a double fork) and answers. The grandchild, adopted by the program
/// and, once the program has exited, by PID 1, waits for that, writes its
/// pid and exits: PID 1 must reap it. The tool `processes` lists the
/// namespace's processes and its zombies (`State: Z`).
fn tools(dir: &Path) -> String {
    let grandchild = dir.join("grandchild.sh");
    std::fs::write(
        &grandchild,
        r#"# Waits to be adopted by PID 1, then says so and exits.
while [ "$(sed 's/.*) [A-Za-z] //; s/ .*//' /proc/$$/stat)" != 1 ]; do sleep 0.05; done
echo $$ > "$1/orphan.tmp" && mv "$1/orphan.tmp" "$1/orphan"
"#,
    )
    .expect("script written");
    let orphans = dir.join("orphans.sh");
    std::fs::write(
        &orphans,
        format!(
            "( sh '{}' '{}' </dev/null >/dev/null 2>&1 & )\necho '{{\"started\": true}}'\n",
            grandchild.display(),
            dir.display()
        ),
    )
    .expect("script written");
    let processes = dir.join("processes.sh");
    std::fs::write(
        &processes,
        r#"pids=; zombies=
for d in /proc/[0-9]*; do
  state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "$d/status" 2>/dev/null)
  [ -n "$state" ] || continue
  pid=${d#/proc/}
  pids="$pids${pids:+,}$pid"
  [ "$state" = Z ] && zombies="$zombies${zombies:+,}$pid"
done
echo "{\"pids\": [$pids], \"zombies\": [$zombies]}"
"#,
    )
    .expect("script written");
    format!(
        r#"
[[tools]]
name = "orphans"
shape = "query"
executor = {{ kind = "exec", program = "/bin/sh", args = ["{orphans}"] }}

[[tools]]
name = "processes"
shape = "query"
executor = {{ kind = "exec", program = "/bin/sh", args = ["{processes}"] }}
"#,
        orphans = orphans.display(),
        processes = processes.display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid_1_under_the_images_entrypoint_no_tool_leaves_a_zombie() {
    let entrypoint = entrypoint();
    // Its init (tini), where named by path; `toolfleet` is found on PATH.
    let program = Path::new(&entrypoint[0]);
    if program.is_absolute() && !program.is_file() {
        return missing(&format!("{} is not installed", entrypoint[0]));
    }
    let unshare = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .output();
    if !unshare.is_ok_and(|out| out.status.success()) {
        return missing("`unshare --pid --fork --mount-proc` fails (it needs root)");
    }

    let dir = TempDir::new("pid1");
    let config_path = dir.0.join("toolfleet.toml");
    std::fs::write(&config_path, config(&dir.0, &tools(&dir.0))).expect("config written");
    // The entrypoint as the image has it, `toolfleet` found on PATH, as PID 1
    // of a PID namespace that dies with `unshare` (--kill-child).
    let bin = Path::new(env!("CARGO_BIN_EXE_toolfleet"))
        .parent()
        .expect("the binary's directory");
    let path = std::env::join_paths(std::iter::once(bin.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("a PATH");
    let mut command = Command::new("unshare");
    command
        .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .args(&entrypoint)
        .arg("--config")
        .arg(&config_path)
        .arg("serve")
        .env("PATH", path);
    let server = Server::launch(command, &config_path, "toolfleet serving on ");
    let alice = server.client(TOKEN);

    // Tools see the namespace's own processes, the entrypoint's first program as PID 1.
    let before = alice.call("processes", json!({})).await;
    assert_eq!(before["status"], "ok", "{before}");
    assert!(
        pids(&before["result"]["pids"]).contains(&1),
        "the tool sees the namespace's processes: {before}"
    );

    let started = alice.call("orphans", json!({})).await;
    assert_eq!(started["result"], json!({"started": true}), "{started}");
    let orphan_file = dir.0.join("orphan");
    let deadline = Instant::now() + Duration::from_secs(60);
    let orphan: u64 = loop {
        if let Some(pid) = std::fs::read_to_string(&orphan_file)
            .ok()
            .and_then(|text| text.trim().parse().ok())
        {
            break pid;
        }
        assert!(
            Instant::now() < deadline,
            "the orphan never said it was adopted by PID 1"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // Once it has exited, PID 1 must have reaped it: it is gone, not a zombie.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = alice.call("processes", json!({})).await;
        if !pids(&answer["result"]["pids"]).contains(&orphan) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the orphan {orphan} was never reaped by PID 1: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = alice.call("processes", json!({})).await;
    assert_eq!(
        after["result"]["zombies"],
        json!([]),
        "zombies in the namespace: {after}"
    );
}

/// The pids of a JSON list.
fn pids(list: &Value) -> Vec<u64> {
    list.as_array()
        .map(|pids| pids.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}
