//! toolfleet fails closed, against the real binary: a process serving the
//! HTTP API without a configured token refuses to start (but `serve` on a
//! loopback address, which makes a development token), the data directory
//! and every file in it are owner-only, a secret file others may read is
//! refused, and so are keys too short to be keys.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, TempDir};

/// The expense pack, for configurations that need tools.
fn pack() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/expenses/toolfleet.toml")
        .display()
        .to_string()
}

/// A configuration without `[[auth.tokens]]`: the data directory in `dir`,
/// the expense pack, then `rest` (keys, then tables).
fn without_tokens(dir: &Path, rest: &str) -> std::path::PathBuf {
    let config = dir.join("toolfleet.toml");
    let text = format!(
        "data_dir = {:?}\ninclude = [{:?}]\n{rest}\n",
        dir.join("data").display().to_string(),
        pack()
    );
    std::fs::write(&config, text).expect("config written");
    config
}

/// Runs `toolfleet --config <config> <role>` with `env`, which must exit
/// unsuccessfully (a process still running after a minute is killed and
/// fails the test): its stderr.
fn refused(config: &Path, role: &str, env: &[(&str, &str)]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .env_remove("TOOLFLEET_CONFIG")
        .env_remove("TOOLFLEET_LISTEN")
        .env_remove("TOOLFLEET_WEBHOOK_SECRET")
        .env_remove("TOOLFLEET_CONFIRM_SECRET")
        .envs(env.iter().copied())
        .arg("--config")
        .arg(config)
        .arg(role)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolfleet starts");
    let mut stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`toolfleet {role}` kept running: it did not refuse to start");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = reader.join().expect("stderr read");
    assert!(!status.success(), "`toolfleet {role}` started: {text}");
    text
}

/// What a message asking for a token must say.
fn says_how_to_add_a_token(message: &str) {
    for needed in [
        "[[auth.tokens]]",
        "sha256 = ",
        "printf %s \"$TOKEN\" | sha256sum",
        "tenant = ",
        "user = ",
        "scopes = ",
    ] {
        assert!(message.contains(needed), "no `{needed}` in: {message}");
    }
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn a_dispatcher_without_tokens_refuses_to_start_and_says_how_to_add_one() {
    let dir = TempDir::new("closed-dispatcher");
    // Servers nobody listens on: the refusal comes before any is reached.
    // On loopback too: a dispatcher never makes a development token.
    let config = without_tokens(
        &dir.0,
        "listen = \"127.0.0.1:0\"\ndatabase_url = \"postgres://toolfleet@127.0.0.1:1/none\"\nbroker_url = \"amqp://127.0.0.1:1/%2f\"",
    );
    let said = refused(&config, "dispatcher", &[]);
    assert!(
        said.contains("the dispatcher needs at least one token"),
        "{said}"
    );
    says_how_to_add_a_token(&said);
    assert!(
        !dir.0.join("data").exists(),
        "nothing is made before the refusal"
    );
}

#[test]
fn serve_without_tokens_refuses_beyond_loopback() {
    let dir = TempDir::new("closed-serve");
    for (listen, env) in [
        ("0.0.0.0:0", None),
        ("[::]:0", None),
        ("192.0.2.1:0", None),
        // The image's way: TOOLFLEET_LISTEN over the file's loopback address.
        ("127.0.0.1:0", Some("0.0.0.0:0")),
    ] {
        let config = without_tokens(&dir.0, &format!("listen = {listen:?}"));
        let env: Vec<(&str, &str)> = env.map(|e| ("TOOLFLEET_LISTEN", e)).into_iter().collect();
        let said = refused(&config, "serve", &env);
        assert!(
            said.contains("only when it listens on a loopback address"),
            "{listen} {env:?}: {said}"
        );
        says_how_to_add_a_token(&said);
        assert!(
            !dir.0.join("data").exists(),
            "{listen}: no development token (nor anything) is made"
        );
    }
}

#[test]
fn serve_on_localhost_without_tokens_makes_a_development_token() {
    let dir = TempDir::new("closed-localhost");
    let config = without_tokens(&dir.0, "listen = \"localhost:0\"");
    let server = Server::start_with(&config);
    let said = server.startup.join("\n");
    assert!(said.contains("made a development token"), "{said}");
    let token = dir.0.join("data").join("dev-token");
    assert_eq!(mode(&token), 0o600, "{}", token.display());
}

#[test]
fn the_data_directory_and_every_file_in_it_are_owner_only_and_open_secrets_are_refused() {
    let dir = TempDir::new("closed-modes");
    // No token, no confirm_secret, no webhook secret: every one is kept in
    // data_dir, beside SQLite's files.
    let config = without_tokens(&dir.0, "listen = \"127.0.0.1:0\"");
    let data = dir.0.join("data");
    let mut server = Server::start_with(&config);
    let token = std::fs::read_to_string(data.join("dev-token")).expect("dev-token");
    // A call: SQLite's WAL and shared memory in use.
    let found = common::block_on({
        let client = server.client(token.trim());
        async move {
            client
                .call("find_expenses", serde_json::json!({"month": "2026-09"}))
                .await
        }
    });
    assert_eq!(found["status"], "ok", "{found}");

    assert_eq!(mode(&data), 0o700, "data_dir");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&data).expect("data_dir listed") {
        let path = entry.expect("an entry").path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
        seen.push(path.file_name().unwrap().to_string_lossy().into_owned());
    }
    for name in [
        "toolfleet.db",
        "toolfleet.db-wal",
        "toolfleet.db-shm",
        "secret",
        "webhook-secret",
        "dev-token",
    ] {
        assert!(seen.iter().any(|s| s == name), "{name} in {seen:?}");
    }
    server.kill();

    // Each secret, made readable by others, keeps the process from starting
    // with the command that fixes it.
    for name in ["secret", "webhook-secret", "dev-token"] {
        let path = data.join(name);
        chmod(&path, 0o644);
        let said = refused(&config, "serve", &[]);
        assert!(
            said.contains(&format!("chmod 600 {}", path.display())),
            "{name}: {said}"
        );
        chmod(&path, 0o600);
    }
    // Fixed as it says, it starts again with the same token.
    let server = Server::start_with(&config);
    assert!(
        server
            .startup
            .join("\n")
            .contains("using the development token"),
        "{:?}",
        server.startup
    );
}

#[test]
fn a_data_directory_others_may_write_in_is_refused() {
    let dir = TempDir::new("closed-shared-dir");
    let config = without_tokens(&dir.0, "listen = \"127.0.0.1:0\"");
    let data = dir.0.join("data");
    std::fs::create_dir(&data).expect("data_dir");
    chmod(&data, 0o777);
    let said = refused(&config, "serve", &[]);
    assert!(
        said.contains(&format!("chmod 700 {}", data.display())),
        "{said}"
    );
    assert_eq!(
        std::fs::read_dir(&data).expect("listed").count(),
        0,
        "nothing is written there"
    );
}

#[test]
fn a_webhook_secret_shorter_than_32_bytes_is_refused() {
    let dir = TempDir::new("closed-webhook");
    let short = "0123456789abcdef0123456789abcde"; // 31 bytes
    let config = without_tokens(
        &dir.0,
        &format!("listen = \"127.0.0.1:0\"\n\n[webhooks]\nsecret = {short:?}\n"),
    );
    let said = refused(&config, "serve", &[]);
    assert!(
        said.contains("[webhooks] secret") && said.contains("at least 32 bytes"),
        "{said}"
    );
    // From the environment too.
    let config = without_tokens(&dir.0, "listen = \"127.0.0.1:0\"");
    let said = refused(&config, "serve", &[("TOOLFLEET_WEBHOOK_SECRET", short)]);
    assert!(
        said.contains("TOOLFLEET_WEBHOOK_SECRET") && said.contains("at least 32 bytes"),
        "{said}"
    );
    // And a confirm-token key that is not 32 bytes in hex.
    let said = refused(&config, "serve", &[("TOOLFLEET_CONFIRM_SECRET", "abcd")]);
    assert!(said.contains("64 hex characters"), "{said}");
    assert!(
        !dir.0.join("data").exists(),
        "refused before anything is made"
    );
}
