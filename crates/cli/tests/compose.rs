//! The docker compose deployment stays valid without docker: the compose
//! file, the Dockerfile and the files under `deploy/compose/` are read and
//! checked against each other, against the README's configuration keys, and
//! against the `toolfleet` binary itself (its subcommands, and the compose
//! configuration loaded by it).

mod common;

use common::{dockerfile, exec_form, read_repo as read, repo, toolfleet};

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use common::manifests::to_json;
use common::{TempDir, sha};
use serde_json::{Map, Value};
use yaml_rust2::YamlLoader;

/// The token README.md and deploy/compose/toolfleet.toml document.
const DEMO_TOKEN: &str = "tf_demo_compose";
const COMPOSE: &str = "docker-compose.yml";
const COMPOSE_CONFIG: &str = "deploy/compose/toolfleet.toml";
/// The one port the dispatchers are reached on.
const PUBLISHED_PORT: &str = "8080";

fn yaml(relative: &str) -> Value {
    let docs = YamlLoader::load_from_str(&read(relative))
        .unwrap_or_else(|e| panic!("{relative} is not YAML: {e}"));
    assert_eq!(docs.len(), 1, "{relative}: one YAML document");
    to_json(&docs[0])
}

fn compose() -> Value {
    yaml(COMPOSE)
}

fn services(compose: &Value) -> &Map<String, Value> {
    compose["services"]
        .as_object()
        .expect("docker-compose.yml has services")
}

fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::Null => Vec::new(),
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect(),
        other => panic!("expected a string or a list of strings, got {other}"),
    }
}

/// `depends_on` in its list and its mapping form: service and condition.
fn depends_on(service: &Value) -> BTreeMap<String, String> {
    match &service["depends_on"] {
        Value::Object(map) => map
            .iter()
            .map(|(name, spec)| {
                let condition = spec["condition"].as_str().unwrap_or("service_started");
                (name.clone(), condition.to_owned())
            })
            .collect(),
        other => strings(other)
            .into_iter()
            .map(|name| (name, "service_started".to_owned()))
            .collect(),
    }
}

/// The services built from this repository's Dockerfile.
fn toolfleet_services(compose: &Value) -> BTreeMap<String, Value> {
    services(compose)
        .iter()
        .filter(|(_, s)| {
            let context = match &s["build"] {
                Value::String(context) => Some(context.as_str()),
                build => build["context"].as_str(),
            };
            matches!(context, Some("." | "./"))
        })
        .map(|(name, s)| (name.clone(), s.clone()))
        .collect()
}

/// A volume of a service, in the short or the long syntax.
struct Mount {
    /// A host path (for a bind mount) or a named volume; empty: anonymous.
    source: String,
    target: String,
    bind: bool,
}

fn mounts(service: &Value) -> Vec<Mount> {
    let Some(volumes) = service["volumes"].as_array() else {
        return Vec::new();
    };
    volumes
        .iter()
        .map(|volume| match volume {
            Value::String(short) => {
                let parts: Vec<&str> = short.split(':').collect();
                assert!(
                    (2..=3).contains(&parts.len()),
                    "volume `{short}`: source:target[:mode]"
                );
                Mount {
                    source: parts[0].to_owned(),
                    target: parts[1].to_owned(),
                    bind: parts[0].starts_with(['.', '/', '~']),
                }
            }
            long => Mount {
                source: long["source"].as_str().unwrap_or_default().to_owned(),
                target: long["target"].as_str().expect("a volume target").to_owned(),
                bind: long["type"] == "bind",
            },
        })
        .collect()
}

/// The container path a host path of the repository is mounted at.
fn mount_target(service: &Value, host: &str) -> Option<String> {
    let want = repo().join(host);
    mounts(service)
        .into_iter()
        .find(|m| m.bind && repo().join(&m.source) == want)
        .map(|m| m.target)
}

/// `host:port` of a URL, without its user information.
fn host_port(url: &str) -> (String, Option<String>) {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or_default();
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host_port)| host_port);
    match host_port.rsplit_once(':') {
        Some((host, port)) => (host.to_owned(), Some(port.to_owned())),
        None => (host_port.to_owned(), None),
    }
}

/// The user information of a URL: `(user, password)`.
fn userinfo(url: &str) -> (String, String) {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (info, _) = rest.rsplit_once('@').expect("the URL names a user");
    let (user, password) = info.split_once(':').expect("the URL names a password");
    (user.to_owned(), password.to_owned())
}

fn compose_config() -> toml::Table {
    toml::from_str(&read(COMPOSE_CONFIG))
        .unwrap_or_else(|e| panic!("{COMPOSE_CONFIG} is not TOML: {e}"))
}

/// The text of the README sections that document configuration keys.
fn documented_sections() -> String {
    let readme = read("README.md");
    let mut text = String::new();
    let mut keep = false;
    for line in readme.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            keep = heading == "Configuration" || heading.starts_with("Run it distributed");
        }
        if keep {
            text.push_str(line);
            text.push('\n');
        }
    }
    assert!(
        text.contains("## Run it distributed"),
        "README.md has a section on docker compose"
    );
    text
}

/// The `code` spans of a text.
fn backticked(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Checks each key of `table` (at `path`) against the README: a key is a
/// documented span; a table or array of tables documented as `[path]` or
/// `[[path]]` has its keys in the same line.
fn check_documented(
    table: &toml::Table,
    path: &str,
    docs: &str,
    spans: &BTreeSet<String>,
    missing: &mut Vec<String>,
) {
    for (key, value) in table {
        let full = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        let header = [format!("`[{full}]`"), format!("`[[{full}]]`")];
        let row = docs
            .lines()
            .find(|line| header.iter().any(|h| line.contains(h.as_str())));
        let entries: Vec<&toml::Table> = match value {
            toml::Value::Table(t) => vec![t],
            toml::Value::Array(items) => items.iter().filter_map(toml::Value::as_table).collect(),
            _ => Vec::new(),
        };
        match (row, entries.is_empty()) {
            (Some(row), false) => {
                let row_spans = backticked(row);
                for entry in entries {
                    for sub in entry.keys() {
                        if !row_spans.contains(sub) {
                            missing.push(format!("{full}.{sub}"));
                        }
                    }
                }
            }
            (None, false) if matches!(value, toml::Value::Table(_)) => {
                check_documented(entries[0], &full, docs, spans, missing);
            }
            _ => {
                if !spans.contains(&full) {
                    missing.push(full);
                }
            }
        }
    }
}

#[test]
fn every_service_has_an_image_or_a_build_and_known_dependencies() {
    let compose = compose();
    let services = services(&compose);
    let named_volumes: BTreeSet<&String> = compose["volumes"]
        .as_object()
        .map(|v| v.keys().collect())
        .unwrap_or_default();
    for (name, service) in services {
        assert!(
            service.get("image").is_some() || service.get("build").is_some(),
            "service `{name}` has neither image nor build"
        );
        for (dependency, condition) in depends_on(service) {
            assert_ne!(&dependency, name, "`{name}` depends on itself");
            let Some(target) = services.get(&dependency) else {
                panic!("`{name}` depends on `{dependency}`, which is not a service");
            };
            match condition.as_str() {
                "service_started" => {}
                "service_healthy" => assert!(
                    target.get("healthcheck").is_some(),
                    "`{name}` waits for `{dependency}` to be healthy, which has no healthcheck"
                ),
                "service_completed_successfully" => assert_eq!(
                    target["restart"].as_str().unwrap_or("no"),
                    "no",
                    "`{name}` waits for `{dependency}` to complete, so it must not restart"
                ),
                other => panic!("`{name}`: unknown depends_on condition `{other}`"),
            }
        }
        for mount in mounts(service) {
            if !mount.bind && !mount.source.is_empty() {
                assert!(
                    named_volumes.contains(&mount.source),
                    "`{name}` mounts volume `{}`, which is not declared under volumes",
                    mount.source
                );
            }
        }
    }
    for wanted in [
        "postgres",
        "rabbitmq",
        "migrate",
        "dispatcher",
        "worker",
        "proxy",
        "prometheus",
        "grafana",
    ] {
        assert!(services.contains_key(wanted), "no `{wanted}` service");
    }
    assert!(
        strings(&services["rabbitmq"]["image"])[0].contains("management"),
        "RabbitMQ runs its management image"
    );
    let plugins = read("deploy/compose/rabbitmq/enabled_plugins");
    for plugin in ["rabbitmq_management", "rabbitmq_prometheus"] {
        assert!(plugins.contains(plugin), "RabbitMQ enables {plugin}");
    }
    assert_eq!(
        mount_target(
            &services["rabbitmq"],
            "deploy/compose/rabbitmq/enabled_plugins"
        )
        .as_deref(),
        Some("/etc/rabbitmq/enabled_plugins"),
        "RabbitMQ reads the enabled_plugins file"
    );
}

#[test]
fn toolfleet_containers_run_real_subcommands_in_order() {
    let compose = compose();
    let ours = toolfleet_services(&compose);
    let instructions = dockerfile();
    let default_command = instructions
        .iter()
        .rev()
        .find(|(word, _)| word == "CMD")
        .map(|(_, args)| exec_form(args))
        .expect("the Dockerfile has a CMD");
    let mut roles = BTreeMap::new();
    for (name, service) in &ours {
        let command = match &service["command"] {
            Value::Null => default_command.clone(),
            Value::Array(_) => strings(&service["command"]),
            other => panic!("`{name}`: give command in the list form, not {other}"),
        };
        let mut args: Vec<&str> = command.iter().map(String::as_str).collect();
        args.push("--help");
        let out = toolfleet(&args);
        assert!(
            out.status.success(),
            "`{name}` runs `toolfleet {}`, which the binary refuses:\n{}",
            command.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        roles.insert(command[0].clone(), (name.clone(), service.clone()));
    }
    for role in ["migrate", "dispatcher", "worker"] {
        assert!(
            roles.contains_key(role),
            "no service runs `toolfleet {role}`"
        );
    }
    let (migrate, migrate_service) = &roles["migrate"];
    assert_eq!(migrate_service["restart"], "no", "`{migrate}` runs once");
    assert_eq!(
        depends_on(migrate_service)
            .get("postgres")
            .map(String::as_str),
        Some("service_healthy"),
        "`{migrate}` waits for a healthy PostgreSQL"
    );
    for role in ["dispatcher", "worker"] {
        let (name, service) = &roles[role];
        let needs = depends_on(service);
        assert_eq!(
            needs.get(migrate).map(String::as_str),
            Some("service_completed_successfully"),
            "`{name}` starts after the migrations"
        );
        assert_eq!(
            needs.get("rabbitmq").map(String::as_str),
            Some("service_healthy"),
            "`{name}` waits for a healthy RabbitMQ"
        );
        assert!(
            service["deploy"]["replicas"].as_u64().unwrap_or(1) >= 2,
            "`{name}` runs two replicas"
        );
        assert!(
            service.get("ports").is_none(),
            "`{name}` publishes no port of its own"
        );
    }
}

#[test]
fn bind_mounts_name_files_of_the_repository() {
    let compose = compose();
    let mut binds = 0;
    for (name, service) in services(&compose) {
        for Mount {
            source,
            target,
            bind,
        } in mounts(service)
        {
            if !bind {
                continue;
            }
            assert!(
                source.starts_with("./"),
                "`{name}` mounts `{source}`: use paths relative to the repository"
            );
            assert!(
                repo().join(&source).exists(),
                "`{name}` mounts `{source}` at {target}, which is not in the repository"
            );
            binds += 1;
        }
    }
    assert!(binds >= 5, "the compose files are mounted");
}

#[test]
fn the_dispatchers_are_reached_through_one_published_port() {
    let compose = compose();
    let services = services(&compose);
    let mut publishers = Vec::new();
    for (name, service) in services {
        for port in strings(&service["ports"]) {
            let parts: Vec<&str> = port.split(':').collect();
            let (host, container) = match parts.as_slice() {
                [_, host, container] | [host, container] => (*host, *container),
                _ => panic!("`{name}`: publish `[ip:]host:container`, not `{port}`"),
            };
            if host == PUBLISHED_PORT {
                publishers.push((name.clone(), container.to_owned()));
            }
        }
    }
    assert_eq!(
        publishers.len(),
        1,
        "one service publishes port {PUBLISHED_PORT}: {publishers:?}"
    );
    let (proxy, container_port) = &publishers[0];
    assert_eq!(proxy, "proxy");
    let service = &services[proxy];
    assert!(
        strings(&service["image"])[0].starts_with("nginx"),
        "the proxy is nginx"
    );
    let conf_target = mount_target(service, "./deploy/compose/nginx.conf")
        .expect("the proxy mounts deploy/compose/nginx.conf");
    assert!(conf_target.starts_with("/etc/nginx/"), "{conf_target}");
    let conf = read("deploy/compose/nginx.conf");
    assert!(
        conf.contains(&format!("listen {container_port};")),
        "nginx listens on the published container port {container_port}"
    );
    let config = compose_config();
    let listen = config["listen"].as_str().expect("listen");
    let (_, port) = host_port(listen);
    let port = port.expect("listen names a port");
    let upstream = format!("server dispatcher:{port}");
    assert!(conf.contains(&upstream), "nginx balances over `{upstream}`");
    assert!(services.contains_key("dispatcher"));
    assert_eq!(
        depends_on(service).get("dispatcher").map(String::as_str),
        Some("service_healthy")
    );
    let probe = strings(&services["dispatcher"]["healthcheck"]["test"]).join(" ");
    assert!(
        probe.contains(&format!("/dev/tcp/127.0.0.1/{port}")) && probe.contains("/readyz"),
        "the dispatchers' healthcheck asks /readyz on their port: {probe}"
    );
}

#[test]
fn the_compose_configuration_uses_documented_keys() {
    let config = compose_config();
    let docs = documented_sections();
    let spans = backticked(&docs);
    let mut missing = Vec::new();
    check_documented(&config, "", &docs, &spans, &mut missing);
    assert!(
        missing.is_empty(),
        "{COMPOSE_CONFIG} sets keys README.md does not document: {missing:?}"
    );
}

#[test]
fn the_compose_configuration_names_the_compose_services_and_the_image() {
    let compose = compose();
    let services = services(&compose);
    let config = compose_config();
    let instructions = dockerfile();

    // The URLs of the file and of the environment reach the compose services
    // with their users, passwords and database.
    let postgres = &services["postgres"]["environment"];
    let rabbitmq = &services["rabbitmq"]["environment"];
    let ours = toolfleet_services(&compose);
    assert!(!ours.is_empty());
    for (name, service) in &ours {
        let env = &service["environment"];
        let config_path = env["TOOLFLEET_CONFIG"]
            .as_str()
            .unwrap_or_else(|| panic!("`{name}` names its configuration in TOOLFLEET_CONFIG"));
        assert_eq!(
            mount_target(service, COMPOSE_CONFIG).as_deref(),
            Some(config_path),
            "`{name}` mounts {COMPOSE_CONFIG} where TOOLFLEET_CONFIG says"
        );
        for (key, variable, server) in [
            ("database_url", "TOOLFLEET_DATABASE_URL", "postgres"),
            ("broker_url", "TOOLFLEET_BROKER_URL", "rabbitmq"),
        ] {
            let in_file = config[key].as_str().expect(key);
            let urls = [in_file, env[variable].as_str().expect(variable)];
            for url in urls {
                let (host, _) = host_port(url);
                assert_eq!(
                    host, server,
                    "`{name}`: {url} reaches the `{server}` service"
                );
            }
            let (user, password) = userinfo(urls[1]);
            let (expect_user, expect_password) = match server {
                "postgres" => (&postgres["POSTGRES_USER"], &postgres["POSTGRES_PASSWORD"]),
                _ => (
                    &rabbitmq["RABBITMQ_DEFAULT_USER"],
                    &rabbitmq["RABBITMQ_DEFAULT_PASS"],
                ),
            };
            assert_eq!(
                Some(user.as_str()),
                expect_user.as_str(),
                "`{name}`: {variable}'s user"
            );
            assert_eq!(
                Some(password.as_str()),
                expect_password.as_str(),
                "`{name}`: {variable}'s password is the {server} service's"
            );
        }
        let database = env["TOOLFLEET_DATABASE_URL"].as_str().unwrap_or_default();
        let db = postgres["POSTGRES_DB"].as_str().expect("POSTGRES_DB");
        assert!(
            database.ends_with(&format!("/{db}")),
            "{database} names database {db}"
        );
    }

    // Each included file is one the Dockerfile copies into the image.
    let copies: BTreeMap<String, String> = instructions
        .iter()
        .filter(|(word, args)| word == "COPY" && !args.starts_with("--from"))
        .filter_map(|(_, args)| {
            let parts: Vec<&str> = args.split_whitespace().collect();
            match parts.as_slice() {
                [source, destination] => Some((destination.to_string(), source.to_string())),
                _ => None,
            }
        })
        .collect();
    let includes = config["include"].as_array().expect("include");
    assert!(
        !includes.is_empty(),
        "the compose configuration includes a pack"
    );
    for include in includes {
        let include = include.as_str().expect("an include path");
        let source = copies.get(include).unwrap_or_else(|| {
            panic!("include `{include}` is not a file the Dockerfile copies: {copies:?}")
        });
        assert!(repo().join(source).is_file(), "{source}");
    }

    // data_dir is the directory the image makes for its user.
    let data_dir = config["data_dir"].as_str().expect("data_dir");
    let runtime_steps: Vec<&String> = instructions
        .iter()
        .filter(|(word, _)| word == "RUN")
        .map(|(_, args)| args)
        .collect();
    assert!(
        runtime_steps
            .iter()
            .any(|step| step.contains("install -d -o 10001") && step.contains(data_dir)),
        "the image makes data_dir {data_dir} for its user"
    );

    // The ports the dispatchers and the workers' metrics listen on are the
    // ones the image exposes.
    let (host, port) = host_port(config["listen"].as_str().expect("listen"));
    assert_eq!(host, "0.0.0.0", "dispatchers listen beyond their loopback");
    let (metrics_host, metrics_port) =
        host_port(config["metrics_listen"].as_str().expect("metrics_listen"));
    assert_eq!(
        metrics_host, "0.0.0.0",
        "workers' metrics beyond their loopback"
    );
    let exposed: Vec<&String> = instructions
        .iter()
        .filter(|(word, _)| word == "EXPOSE")
        .map(|(_, args)| args)
        .collect();
    assert_eq!(
        exposed,
        [
            &port.expect("a port"),
            &metrics_port.expect("a metrics port")
        ]
    );
}

#[test]
fn the_demo_token_and_the_shared_secrets_are_well_formed() {
    let config = compose_config();
    let tokens = config["auth"]["tokens"]
        .as_array()
        .expect("[[auth.tokens]]");
    let demo = sha(DEMO_TOKEN);
    let entry = tokens
        .iter()
        .find(|t| t["sha256"].as_str() == Some(demo.as_str()))
        .unwrap_or_else(|| panic!("no [[auth.tokens]] entry for the demo token {DEMO_TOKEN}"));
    let scopes = entry["scopes"].as_array().expect("scopes");
    for scope in ["expenses:read", "expenses:submit"] {
        assert!(
            scopes.iter().any(|s| s.as_str() == Some(scope)),
            "the demo token holds {scope}"
        );
    }
    assert!(
        read("README.md").contains(&format!("TOOLFLEET_TOKEN={DEMO_TOKEN}")),
        "README.md gives the demo token"
    );
    assert!(read(COMPOSE_CONFIG).contains(DEMO_TOKEN));

    let secret = config["confirm_secret"].as_str().expect("confirm_secret");
    assert!(
        secret.len() == 64 && secret.chars().all(|c| c.is_ascii_hexdigit()),
        "confirm_secret is 64 hex characters"
    );
    let webhooks = config["webhooks"].as_table().expect("[webhooks]");
    assert!(webhooks["secret"].as_str().is_some_and(|s| s.len() >= 32));
    assert!(!webhooks["allow"].as_array().expect("allow").is_empty());
    let dispatcher = &compose()["services"]["dispatcher"];
    for entry in webhooks["allow"].as_array().unwrap() {
        // Entries naming addresses need no name mapped.
        let entry = entry.as_str().unwrap();
        let host = entry.split_once(':').map_or(entry, |(host, _)| host);
        if entry.starts_with('[') || host.contains('/') || host.parse::<std::net::IpAddr>().is_ok()
        {
            continue;
        }
        assert!(
            strings(&dispatcher["extra_hosts"])
                .iter()
                .any(|h| h.starts_with(&format!("{host}:"))),
            "the dispatchers resolve the allowed webhook host {host}"
        );
    }
}

#[test]
fn the_binary_loads_the_compose_configuration() {
    // The configuration as the containers see it, with the image's paths
    // mapped back to the repository's files.
    let mut text = read(COMPOSE_CONFIG);
    let copies: Vec<(String, String)> = dockerfile()
        .into_iter()
        .filter(|(word, args)| word == "COPY" && !args.starts_with("--from"))
        .filter_map(|(_, args)| {
            let (source, destination) = args.split_once(char::is_whitespace)?;
            let destination = destination.trim();
            destination
                .starts_with('/')
                .then(|| (source.to_owned(), destination.to_owned()))
        })
        .collect();
    for (source, destination) in &copies {
        let host = repo().join(source);
        text = text.replace(
            &format!("\"{destination}\""),
            &format!("{:?}", host.display().to_string()),
        );
    }
    let dir = TempDir::new("compose-config");
    let path = dir.0.join("toolfleet.toml");
    std::fs::write(&path, text).unwrap();

    // A stand-in server: `toolfleet tools` loads the configuration (every
    // key, the included pack), then asks it once.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap() == 1 {
            head.push(byte[0]);
        }
        let body = r#"{"status": "ok", "result": {"tools": []}}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(answer.as_bytes()).unwrap();
        String::from_utf8_lossy(&head).into_owned()
    });
    let url = format!("http://{address}");
    let out = toolfleet(&[
        "--config",
        path.to_str().unwrap(),
        "tools",
        "--server",
        &url,
        "--token",
        DEMO_TOKEN,
    ]);
    assert!(
        out.status.success(),
        "toolfleet refuses {COMPOSE_CONFIG}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let request = server.join().unwrap();
    assert!(request.starts_with("GET /v1/tools"), "{request}");
    assert!(
        request
            .to_ascii_lowercase()
            .contains(&format!("authorization: bearer {DEMO_TOKEN}")),
        "{request}"
    );
}

#[test]
fn prometheus_scrapes_the_dispatchers_the_workers_and_rabbitmq() {
    let compose = compose();
    let services = services(&compose);
    let prometheus = &services["prometheus"];
    assert_eq!(
        mount_target(prometheus, "deploy/compose/prometheus.yml").as_deref(),
        Some("/etc/prometheus/prometheus.yml")
    );
    let config = yaml("deploy/compose/prometheus.yml");
    let toolfleet = compose_config();
    let (_, listen_port) = host_port(toolfleet["listen"].as_str().unwrap());
    // Dispatchers and workers serve /metrics on metrics_listen, beyond
    // their loopback and off the API port.
    let metrics_listen = toolfleet
        .get("metrics_listen")
        .and_then(toml::Value::as_str)
        .unwrap_or_else(|| panic!("{COMPOSE_CONFIG} sets metrics_listen"));
    let (metrics_host, metrics_port) = host_port(metrics_listen);
    assert_ne!(metrics_port, listen_port, "metrics stay off the API port");
    assert_eq!(
        metrics_host, "0.0.0.0",
        "workers serve metrics beyond their loopback"
    );
    let metrics_port = metrics_port.expect("metrics_listen names a port");
    // Every rule file is mounted where prometheus.yml names it.
    let rule_files = strings(&config["rule_files"]);
    assert!(
        !rule_files.is_empty(),
        "prometheus.yml loads alerting rules"
    );
    for file in &rule_files {
        assert!(
            mounts(prometheus)
                .iter()
                .any(|m| m.bind && &m.target == file && repo().join(&m.source).is_file()),
            "prometheus loads {file}, which no bind mount of the repository provides"
        );
    }
    let mut scraped = BTreeSet::new();
    for job in config["scrape_configs"].as_array().expect("scrape_configs") {
        let name = job["job_name"].as_str().expect("job_name");
        let mut targets = Vec::new();
        for statics in job["static_configs"].as_array().into_iter().flatten() {
            for target in strings(&statics["targets"]) {
                let (host, port) = host_port(&target);
                targets.push((host, port.expect("a target port")));
            }
        }
        for dns in job["dns_sd_configs"].as_array().into_iter().flatten() {
            let port = dns["port"]
                .as_u64()
                .expect("a DNS discovery port")
                .to_string();
            for host in strings(&dns["names"]) {
                targets.push((host, port.clone()));
            }
        }
        assert!(!targets.is_empty(), "job {name} scrapes something");
        for (host, port) in targets {
            if host == "localhost" {
                continue;
            }
            assert!(
                services.contains_key(&host),
                "job {name} scrapes `{host}`, which is not a compose service"
            );
            let expected = match host.as_str() {
                // Dispatchers and workers serve /metrics on metrics_listen,
                // off the API port.
                "dispatcher" | "worker" => metrics_port.as_str(),
                "rabbitmq" => "15692",
                _ => port.as_str(),
            };
            assert_eq!(
                port, expected,
                "job {name} scrapes {host} on its metrics port"
            );
            assert!(
                depends_on(prometheus).contains_key(&host),
                "prometheus starts after {host}"
            );
            scraped.insert(host);
        }
    }
    assert_eq!(
        scraped,
        BTreeSet::from([
            "dispatcher".to_owned(),
            "rabbitmq".to_owned(),
            "worker".to_owned()
        ])
    );
}

#[test]
fn grafana_is_provisioned_with_the_compose_prometheus() {
    let compose = compose();
    let services = services(&compose);
    let grafana = &services["grafana"];
    let provisioning = "deploy/compose/grafana/provisioning";
    assert_eq!(
        mount_target(grafana, provisioning).as_deref(),
        Some("/etc/grafana/provisioning")
    );
    let datasources = format!("{provisioning}/datasources/prometheus.yml");
    let sources = yaml(&datasources);
    let prometheus = sources["datasources"]
        .as_array()
        .expect("datasources")
        .iter()
        .find(|d| d["type"] == "prometheus")
        .expect("a Prometheus data source");
    let (host, port) = host_port(prometheus["url"].as_str().expect("url"));
    assert!(
        services.contains_key(&host),
        "the data source names `{host}`"
    );
    assert_eq!(
        strings(&services[&host]["image"])[0].split(':').next(),
        Some("prom/prometheus")
    );
    assert_eq!(port.as_deref(), Some("9090"));

    let dashboards_at =
        mount_target(grafana, "dashboards").expect("grafana mounts the repository's dashboards/");
    assert!(repo().join("dashboards").is_dir());
    let providers = yaml(&format!("{provisioning}/dashboards/toolfleet.yml"));
    let paths: Vec<&str> = providers["providers"]
        .as_array()
        .expect("providers")
        .iter()
        .filter_map(|p| p["options"]["path"].as_str())
        .collect();
    assert_eq!(paths, [dashboards_at.as_str()]);
    for file in std::fs::read_dir(repo().join("dashboards")).unwrap() {
        let path = file.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).unwrap();
            serde_json::from_str::<Value>(&text)
                .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
        }
    }
}

#[test]
fn the_dockerfile_builds_the_binary_in_stages_for_a_non_root_user() {
    let instructions = dockerfile();
    let stages: Vec<&String> = instructions
        .iter()
        .filter(|(word, _)| word == "FROM")
        .map(|(_, args)| args)
        .collect();
    assert!(
        stages.len() >= 2,
        "a build stage and a runtime stage: {stages:?}"
    );
    assert!(
        !stages.last().unwrap().starts_with("rust"),
        "the runtime stage is not the Rust image"
    );

    // The builder's Rust is at least every crate's rust-version.
    let rust = instructions
        .iter()
        .find_map(|(word, args)| {
            (word == "ARG")
                .then(|| args.strip_prefix("RUST_VERSION="))
                .flatten()
        })
        .expect("ARG RUST_VERSION=");
    assert!(
        stages[0].starts_with("rust:${RUST_VERSION}-"),
        "{}",
        stages[0]
    );
    let version = |v: &str| -> Vec<u32> { v.split('.').map(|n| n.parse().unwrap()).collect() };
    let mut manifests = vec![repo().join("Cargo.toml")];
    for dir in ["crates", "examples"] {
        for entry in std::fs::read_dir(repo().join(dir)).unwrap() {
            manifests.push(entry.unwrap().path().join("Cargo.toml"));
        }
    }
    for manifest in manifests.iter().filter(|m| m.is_file()) {
        let text = std::fs::read_to_string(manifest).unwrap();
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        let needed = parsed
            .get("package")
            .or_else(|| parsed.get("workspace").and_then(|w| w.get("package")))
            .and_then(|p| p.get("rust-version"))
            .and_then(toml::Value::as_str);
        if let Some(needed) = needed {
            assert!(
                version(rust) >= version(needed),
                "{} needs Rust {needed}; the Dockerfile builds with {rust}",
                manifest.display()
            );
        }
    }

    let builds: Vec<&String> = instructions
        .iter()
        .filter(|(word, args)| word == "RUN" && args.contains("cargo build"))
        .map(|(_, args)| args)
        .collect();
    assert_eq!(builds.len(), 1, "one cargo build");
    for flag in [
        "--release",
        "--locked",
        "-p toolfleet",
        "--mount=type=cache",
    ] {
        assert!(builds[0].contains(flag), "the build runs with {flag}");
    }

    let user = instructions
        .iter()
        .rev()
        .find(|(word, _)| word == "USER")
        .map(|(_, args)| args.clone())
        .expect("the image sets a USER");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("USER `{user}` is numeric"));
    assert_ne!(uid, 0, "the image runs as a non-root user");
    let last = |word: &str| {
        instructions
            .iter()
            .rev()
            .find(|(w, _)| w == word)
            .map(|(_, args)| exec_form(args))
    };
    assert_eq!(
        last("ENTRYPOINT").unwrap(),
        ["/usr/bin/tini", "--", "toolfleet"]
    );
    assert_eq!(last("CMD").unwrap(), ["serve"]);
    assert!(
        instructions
            .iter()
            .any(|(word, args)| word == "EXPOSE" && args == PUBLISHED_PORT)
    );

    let ignored: Vec<String> = read(".dockerignore")
        .lines()
        .map(|l| l.trim().trim_end_matches('/').to_owned())
        .collect();
    for path in ["target", ".git", ".toolfleet"] {
        assert!(
            ignored.iter().any(|i| i == path),
            ".dockerignore leaves out {path}"
        );
    }
}
