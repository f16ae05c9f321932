//! TLS to the servers, against private PostgreSQL and RabbitMQ servers (see
//! common/private.rs) that present a server certificate for `localhost` and
//! 127.0.0.1 signed by a CA the test makes; PostgreSQL refuses every TCP
//! connection without TLS (`hostssl` lines only).
//!
//! - PostgreSQL: `sslmode=verify-full` with the CA carries `toolfleet
//!   migrate`, the store (conformance operations) and the notices' `LISTEN`
//!   connection, all of them encrypted; without the CA, with another CA, or
//!   under a host name the certificate does not hold, it is refused with a
//!   message naming what to check; `verify-ca` accepts that other name;
//!   `require` encrypts without checking, unless a CA is named; `prefer`
//!   encrypts where the server offers it; `disable` is refused by the
//!   server; SCRAM's channel binding matches the server's certificate.
//! - RabbitMQ: `amqps://` with the CA publishes and consumes; without it,
//!   with another CA, or under another host name, it is refused; a CA file
//!   with a plaintext URL is refused.
//! - A job runs end to end through `toolfleet serve` on both, over TLS
//!   only, and `toolfleet worker` without the broker's CA stops at once,
//!   saying what to set.
//!
//! Like every test of private servers, these never skip: without `openssl`,
//! PostgreSQL's server binaries or RabbitMQ's, they fail (so under CI too).
//! Each server lives in a temporary directory and is stopped and removed
//! when its test ends, passed or failed.

mod common;
#[path = "common/private.rs"]
mod private;

use std::path::Path;
use std::process::Command;

use common::{TOKEN, TempDir, config_with, settle};
use private::{PrivatePostgres, PrivateRabbit, TestCerts};
use serde_json::json;
use toolfleet_broker::conformance;
use toolfleet_broker::postgres::{PgNotices, PgOptions};
use toolfleet_broker::rabbit::{RabbitBroker, RabbitOptions};
use toolfleet_store::postgres::{PgConnectOptions, PgStore, migrate_with};

/// Waits on a blocking server operation without stalling the runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn unique(what: &str) -> String {
    format!("tf_{what}_{}", uuid::Uuid::now_v7().simple())
}

/// A connection of tokio-postgres through toolfleet's TLS, or what refused it.
async fn connect(url: &str, ca: Option<&Path>) -> Result<tokio_postgres::Client, String> {
    let target = toolfleet_tls::postgres::target(url, ca)?;
    let (client, connection) =
        target.connector.connect(&target.config).await.map_err(
            |e| match std::error::Error::source(&e) {
                Some(cause) => format!("{e}: {cause}"),
                None => e.to_string(),
            },
        )?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Whether the session of `client` is encrypted, as the server sees it.
async fn encrypted(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl reads")
        .get(0)
}

/// Migrates the schema of `options` at `url` and opens a store there.
async fn migrated_store(url: &str, options: &PgConnectOptions, size: usize, what: &str) -> PgStore {
    migrate_with(url, options)
        .await
        .unwrap_or_else(|e| panic!("migrations {what}: {e}"));
    PgStore::connect_with(url, size, options)
        .await
        .unwrap_or_else(|e| panic!("the store {what}: {e}"))
}

/// The sessions whose application name matches `pattern` (SQL `LIKE`):
/// each one's name and whether it is encrypted, as the server sees them.
async fn sessions(client: &tokio_postgres::Client, pattern: &str) -> Vec<(String, bool)> {
    client
        .query(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) WHERE a.application_name LIKE $1",
            &[&pattern],
        )
        .await
        .expect("sessions read")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// `url` with `param` added to its query.
fn with_param(url: &str, param: &str) -> String {
    let join = if url.contains('?') { '&' } else { '?' };
    format!("{url}{join}{param}")
}

/// A server on the loopback that offers TLS and takes plaintext too (the
/// shared one): without `sslmode`, the store's connections and the
/// notices' talk plaintext; with `sslmode=prefer` named, TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loopback_server_without_sslmode_is_reached_in_plaintext() {
    let shared = common::shared_database_url();
    assert!(
        !shared.contains("sslmode"),
        "this test names the mode itself: {shared}"
    );
    // The server offers TLS: prefer, named, takes it.
    let prefer = connect(&with_param(&shared, "sslmode=prefer"), None)
        .await
        .expect("prefer on the shared server");
    assert!(encrypted(&prefer).await, "the shared server offers no TLS");
    let plain = connect(&shared, None).await.expect("no sslmode");
    assert!(!encrypted(&plain).await);

    // The store's pool and migrations, and the notices' connections.
    let (store_name, notices_name) = (unique("store"), unique("notices"));
    let options = PgConnectOptions {
        schema: Some(unique("plain")),
        ca_file: None,
    };
    let store_url = with_param(&shared, &format!("application_name={store_name}"));
    let store = migrated_store(&store_url, &options, 2, "on the loopback").await;
    toolfleet_store::conformance::insert_records_a_queued_job(&store).await;
    let notices_options = PgOptions {
        application_name: notices_name.clone(),
        ..PgOptions::default()
    };
    let notices = PgNotices::connect_with(&shared, &unique("events"), notices_options)
        .await
        .expect("the notices");
    conformance::notices::every_subscriber_receives_each_event_in_order(&notices).await;
    let mut seen = sessions(&prefer, &store_name).await;
    seen.extend(sessions(&prefer, &notices_name).await);
    let names: Vec<&str> = seen.iter().map(|(name, _)| name.as_str()).collect();
    assert!(names.contains(&store_name.as_str()), "{seen:?}");
    assert!(names.contains(&notices_name.as_str()), "{seen:?}");
    assert!(seen.iter().all(|(_, ssl)| !*ssl), "{seen:?}");
    drop((store, notices));
    let schema = options.schema.unwrap_or_default();
    prefer
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await
        .expect("schema dropped");
}

/// The error a store opened on `url` answers.
async fn store_refusal(url: &str, ca: Option<&Path>) -> String {
    let options = PgConnectOptions {
        schema: Some(unique("refused")),
        ca_file: ca.map(Path::to_path_buf),
    };
    match PgStore::connect_with(url, 1, &options).await {
        Ok(_) => panic!("{url} connected"),
        Err(e) => e.to_string(),
    }
}

fn assert_says(text: &str, wanted: &[&str]) {
    eprintln!("refused: {text}");
    for part in wanted {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_checks_what_sslmode_says() {
    let certs = blocking(TestCerts::generate);
    let pg = blocking(|| PrivatePostgres::start_tls(&certs));
    let port = pg.port();
    let url = |params: &str| format!("postgres://postgres@127.0.0.1:{port}/postgres?{params}");
    let ca = certs.ca.as_path();

    // verify-full with the CA (database_ca_file): migrations, the store and
    // its conformance operations.
    let full = url("sslmode=verify-full");
    let options = PgConnectOptions {
        schema: Some(unique("tls")),
        ca_file: Some(certs.ca.clone()),
    };
    let store = migrated_store(&full, &options, 4, "over verify-full").await;
    toolfleet_store::conformance::ping_answers(&store).await;
    toolfleet_store::conformance::insert_records_a_queued_job(&store).await;
    toolfleet_store::conformance::the_same_key_returns_the_same_job(&store).await;
    toolfleet_store::conformance::a_held_lease_blocks_another_claim(&store).await;
    toolfleet_store::conformance::succeed_settles_once_for_the_holder_only(&store).await;

    // The notices' connections, the CA named by sslrootcert in the URL.
    let notices_url = url(&format!("sslmode=verify-full&sslrootcert={}", ca.display()));
    let notices = PgNotices::connect_with(&notices_url, &unique("events"), PgOptions::default())
        .await
        .expect("the notices over verify-full");
    conformance::notices::every_subscriber_receives_each_event_in_order(&notices).await;
    conformance::notices::a_batch_arrives_whole_each_jobs_events_in_order(&notices).await;

    // Every one of those sessions is encrypted, as the server sees them.
    let client = connect(&full, Some(ca)).await.expect("verify-full");
    let sessions = sessions(&client, "toolfleet%").await;
    let names: Vec<&str> = sessions.iter().map(|(name, _)| name.as_str()).collect();
    assert!(names.contains(&"toolfleet"), "{sessions:?}");
    assert!(names.contains(&"toolfleet-notices"), "{sessions:?}");
    assert!(sessions.iter().all(|(_, ssl)| *ssl), "{sessions:?}");
    drop((store, notices));

    // Refused: the platform's roots do not hold the test CA, nor does
    // another CA; each says to name the CA.
    let untrusted = store_refusal(&full, None).await;
    assert_says(
        &untrusted,
        &["not signed by a CA toolfleet trusts", "database_ca_file"],
    );
    let other = store_refusal(&full, Some(&certs.other_ca)).await;
    assert_says(&other, &["UnknownIssuer", "database_ca_file"]);

    // A host name the certificate does not hold (reached at 127.0.0.1 by
    // hostaddr): refused under verify-full, accepted by verify-ca.
    let elsewhere = |mode: &str| {
        format!(
            "host=db.invalid hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres \
             sslmode={mode}"
        )
    };
    let mismatch = store_refusal(&elsewhere("verify-full"), Some(ca)).await;
    assert_says(&mismatch, &["does not name the host", "verify-ca"]);
    let chain = connect(&elsewhere("verify-ca"), Some(ca))
        .await
        .expect("verify-ca checks the chain alone");
    assert!(encrypted(&chain).await);

    // require: encrypted and unchecked without a CA; with one, the chain
    // is checked (libpq's verify-ca).
    let require = connect(&url("sslmode=require"), None)
        .await
        .expect("require without a CA");
    assert!(encrypted(&require).await);
    let Err(wrong) = connect(&url("sslmode=require"), Some(&certs.other_ca)).await else {
        panic!("require with another CA connected");
    };
    assert_says(&wrong, &["UnknownIssuer"]);
    // prefer: encrypted where the server offers it.
    let prefer = connect(&url("sslmode=prefer"), None).await.expect("prefer");
    assert!(encrypted(&prefer).await);
    // No sslmode, on the loopback: plaintext first, which this server
    // refuses, and then TLS, as prefer does.
    let default = connect(&url(""), None).await.expect("no sslmode");
    assert!(encrypted(&default).await);

    // disable: this server takes no plaintext, and the error says what to set.
    let plaintext = store_refusal(&url("sslmode=disable"), Some(ca)).await;
    assert_says(
        &plaintext,
        &[
            "no encryption",
            "accepts only encrypted connections",
            "sslmode=",
        ],
    );

    // SCRAM with channel binding required: the certificate's hash toolfleet
    // gives matches the server's.
    client
        .batch_execute("CREATE ROLE tf_scram LOGIN PASSWORD 'tf-secret'")
        .await
        .expect("role made");
    let scram = format!(
        "host=127.0.0.1 port={port} user=tf_scram password=tf-secret dbname=postgres \
         sslmode=verify-full channel_binding=require"
    );
    let bound = connect(&scram, Some(ca))
        .await
        .expect("SCRAM-SHA-256-PLUS over verify-full");
    assert!(encrypted(&bound).await);

    // The binary: `toolfleet migrate` without the CA stops and says what to
    // set; with TOOLFLEET_DATABASE_CA_FILE it migrates.
    let dir = TempDir::new("tls-migrate");
    let config = dir.0.join("toolfleet.toml");
    std::fs::write(
        &config,
        format!(
            "database_url = {full:?}\ndatabase_schema = \"{}\"\n",
            unique("cli")
        ),
    )
    .expect("config written");
    let migrate = |ca: Option<&Path>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolfleet"));
        command.arg("--config").arg(&config).arg("migrate");
        command.env_remove("TOOLFLEET_DATABASE_CA_FILE");
        if let Some(ca) = ca {
            command.env("TOOLFLEET_DATABASE_CA_FILE", ca);
        }
        command.output().expect("toolfleet migrate runs")
    };
    let refused = migrate(None);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert_says(
        &said,
        &["not signed by a CA toolfleet trusts", "database_ca_file"],
    );
    let migrated = migrate(Some(ca));
    let said = String::from_utf8_lossy(&migrated.stderr);
    assert!(migrated.status.success(), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_over_tls_and_amqps_refuses_what_it_cannot_verify() {
    let certs = blocking(TestCerts::generate);
    let pg = blocking(|| PrivatePostgres::start_tls(&certs));
    let rabbit = blocking(|| PrivateRabbit::start_tls(&certs));
    let ca = certs.ca.as_path();
    let options = |ca: Option<&Path>| RabbitOptions {
        prefix: unique("tls").replace('_', "-"),
        ca_file: ca.map(Path::to_path_buf),
        ..RabbitOptions::default()
    };

    // amqps with the CA, named by the URL's cacertfile: jobs and events.
    let with_ca = format!(
        "{}?cacertfile={}",
        rabbit.tls_url("localhost"),
        ca.display()
    );
    let broker = RabbitBroker::connect(&with_ca, options(None))
        .await
        .expect("amqps with the CA");
    conformance::broker::publish_then_consume(&broker).await;
    conformance::broker::trace_context_travels_with_the_message(&broker).await;
    conformance::notices::event_arrives_whole_with_its_routing_key(&broker.notices()).await;
    broker.close();

    // Refused: no CA (the platform's roots), another CA, another host name.
    let refusal = |url: String, ca: Option<&Path>| {
        let options = options(ca);
        async move {
            match RabbitBroker::connect(&url, options).await {
                Ok(_) => panic!("{url} connected"),
                Err(e) => e.to_string(),
            }
        }
    };
    let untrusted = refusal(rabbit.tls_url("localhost"), None).await;
    assert_says(
        &untrusted,
        &["not signed by a CA toolfleet trusts", "broker_ca_file"],
    );
    let other = refusal(rabbit.tls_url("localhost"), Some(&certs.other_ca)).await;
    assert_says(&other, &["UnknownIssuer", "broker_ca_file"]);
    let mismatch = refusal(rabbit.tls_url("127.0.0.2"), Some(ca)).await;
    assert_says(&mismatch, &["does not name the host"]);
    let plain = refusal(rabbit.url(), Some(ca)).await;
    assert_says(&plain, &["amqps://"]);

    // A job end to end through `toolfleet serve`: migrate, then the store,
    // the queue and the notices (PostgreSQL's LISTEN, and the events
    // exchange beside it), all over verified TLS.
    let dir = TempDir::new("tls-fleet");
    let top = format!(
        "database_url = \"postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full\"\n\
         database_ca_file = {:?}\ndatabase_schema = \"{}\"\n\
         broker_url = {:?}\nbroker_ca_file = {:?}\nbroker_prefix = \"{}\"\n\
         notices = \"postgres\"\nconfirm_secret = \"{}\"\nconcurrency = 2\n",
        pg.port(),
        ca.display().to_string(),
        unique("fleet"),
        rabbit.tls_url("localhost"),
        ca.display().to_string(),
        unique("fleet").replace('_', "-"),
        "ab".repeat(32),
    );
    let tool = "[[tools]]\nname = \"over_tls\"\nshape = \"job\"\n\
                executor = { kind = \"exec\", program = \"/bin/sh\", \
                args = [\"-c\", \"echo '{\\\"over\\\": \\\"tls\\\"}'\"] }\n";
    let config = dir.0.join("toolfleet.toml");
    std::fs::write(&config, config_with(&dir.0, &top, tool)).expect("config written");
    let toolfleet = |role: &str| {
        Command::new(env!("CARGO_BIN_EXE_toolfleet"))
            .arg("--config")
            .arg(&config)
            .arg(role)
            .env_remove("TOOLFLEET_DATABASE_CA_FILE")
            .env_remove("TOOLFLEET_BROKER_CA_FILE")
            .env("TOOLFLEET_METRICS_LISTEN", "127.0.0.1:0")
            .output()
            .expect("toolfleet runs")
    };
    let migrated = toolfleet("migrate");
    assert!(
        migrated.status.success(),
        "migrate: {}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let server = common::Server::start_with(&config);
    let alice = server.client(TOKEN);
    let running = alice.call("over_tls", json!({})).await;
    let job = running["job_id"].as_str().expect("a job id").to_owned();
    let settled = settle(&alice, &job).await;
    assert_eq!(settled["status"], "ok", "{settled}");
    assert_eq!(settled["result"]["over"], "tls", "{settled}");

    // A worker whose broker CA is missing stops at once and says so.
    let text = std::fs::read_to_string(&config).expect("config read");
    let without: String = text
        .lines()
        .filter(|line| !line.starts_with("broker_ca_file"))
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(&config, without).expect("config written");
    let refused = toolfleet("worker");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert_says(
        &said,
        &["not signed by a CA toolfleet trusts", "broker_ca_file"],
    );
}
