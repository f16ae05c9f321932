//! The Kubernetes manifests of `deploy/k8s/` stay valid without a cluster.
//!
//! Each overlay under `deploy/k8s/overlays/` is rendered with kustomize
//! (`kubectl kustomize`, else a `kustomize` binary), and every object it
//! makes is validated offline:
//!
//! - against the Kubernetes JSON schemas bundled in PyPI's
//!   `kubernetes-validate`, strictly (an unknown field is an error), for each
//!   Kubernetes release it bundles from [`MIN_KUBERNETES`] on;
//! - KEDA's objects, custom resources those schemas do not know, against the
//!   `openAPIV3Schema` of the KEDA CRDs vendored in `deploy/k8s/schemas/keda/`
//!   with the `jsonschema` crate, made strict the same way.
//!
//! Then the objects are held to the binary: it serves the ConfigMap's
//! `toolfleet.toml` and answers the dispatcher's probes where the Deployment
//! looks; a worker started as its Deployment says answers its probes and
//! consumes the queue its ScaledObject watches; each ScaledObject counts
//! the pool's running jobs too (RabbitMQ's management API) and aims at the
//! workers' `concurrency` per pod; the pods' PostgreSQL pools fit
//! [`POSTGRES_CONNECTIONS`]; dispatchers ride out a blip of the servers;
//! pods outlast `shutdown_grace_s`; a URL naming no Service is a
//! placeholder; the autoscalers carry the labels the README's switching
//! commands select; every pool of the configured tools has workers and one
//! autoscaler. Broken copies of the manifests fail each check.
//!
//! `.ci/run` installs `kubernetes-validate` and checks for `kubectl`; under
//! CI (`CI` set) a missing tool fails these tests, elsewhere it skips them.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::manifests::{
    AUTOSCALER_LABEL, CONFIG_FILE, Fleet, K8S, MANAGEMENT_URL_KEY, METRICS, MIN_KUBERNETES,
    POSTGRES_CONNECTIONS, SWITCHES, config_map, copy_tree, crd_of, custom_resource_problems,
    documents, edit, env_value, exit_within, find, find_mut, first_container, first_container_mut,
    fleet_problems, get_ok, host_of, kind, kubernetes_validate, label, local_config, name, overlay,
    pool_of, postgres_connections, probe_paths, read, render_overlays, schema_problems,
    secret_value, set_key, start, string_args, switch_command, toolfleet_containers, vendored_crds,
};
use common::{SharedCleanup, TempDir, free_port, repo, shared_amqp_url, shared_database_url};
use serde_json::{Value, json};

#[test]
fn every_overlay_validates_against_the_kubernetes_schemas_and_the_keda_crds() {
    let root = repo().join(K8S);
    let Some(overlays) = render_overlays(&root) else {
        return;
    };
    let names: BTreeSet<&str> = overlays.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, BTreeSet::from(["hpa", "keda"]));
    let crds = vendored_crds(&root);
    let crd_kinds: BTreeSet<&str> = crds.iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(
        crd_kinds,
        BTreeSet::from(["ScaledObject", "TriggerAuthentication"])
    );

    let mut configs = BTreeSet::new();
    for (overlay, objects) in &overlays {
        let report = kubernetes_validate(objects);
        if let Some(report) = &report {
            eprintln!(
                "overlay {overlay}: {} objects, kubernetes-validate {} against Kubernetes {}",
                objects.len(),
                report["validator"],
                report["versions"]
            );
        }
        let problems = schema_problems(objects, report.as_ref(), &crds);
        assert!(
            problems.is_empty(),
            "overlay {overlay}:\n{}",
            problems.join("\n")
        );
        let custom: Vec<String> = objects
            .iter()
            .filter(|o| crd_of(o, &crds).is_some())
            .map(label)
            .collect();
        match overlay.as_str() {
            // Without KEDA the overlay needs no custom resource at all.
            "hpa" => assert!(custom.is_empty(), "overlay hpa needs KEDA for {custom:?}"),
            _ => assert!(
                custom.iter().any(|c| c.starts_with("ScaledObject/"))
                    && custom
                        .iter()
                        .any(|c| c.starts_with("TriggerAuthentication/")),
                "overlay keda makes ScaledObjects and a TriggerAuthentication: {custom:?}"
            ),
        }
        configs.insert(config_map(objects));
    }
    assert_eq!(
        configs.len(),
        1,
        "every overlay carries the same configuration"
    );
}

#[test]
fn a_broken_copy_of_the_manifests_fails_validation() {
    let root = repo().join(K8S);
    let copy = TempDir::new("k8s-broken");
    let broken = copy.0.join("k8s");
    copy_tree(&root, &broken);
    // A misspelt field of a core object, a wrong type in another, a wrong
    // type and an unknown field in the custom resources, and a required
    // field left out.
    edit(
        &broken.join("base/dispatcher-deployment.yaml"),
        "readinessProbe:",
        "readinesProbe:",
    );
    edit(
        &broken.join("pools/default/worker/deployment.yaml"),
        "terminationGracePeriodSeconds: 30",
        "terminationGracePeriodSeconds: thirty",
    );
    edit(
        &broken.join("pools/default/keda/scaledobject.yaml"),
        "minReplicaCount: 1",
        "minReplicaCount: one",
    );
    edit(
        &broken.join("pools/agents/keda/scaledobject.yaml"),
        "pollingInterval:",
        "pollingIntervall:",
    );
    edit(
        &broken.join("overlays/keda/trigger-authentication.yaml"),
        "      key: broker-management-url\n",
        "",
    );

    let Some(overlays) = render_overlays(&broken) else {
        return;
    };
    let crds = vendored_crds(&broken);
    let (_, objects) = overlays.iter().find(|(name, _)| name == "keda").unwrap();
    let report = kubernetes_validate(objects);
    let problems = schema_problems(objects, report.as_ref(), &crds);
    eprintln!("the broken copy:\n{}", problems.join("\n"));
    let caught = |object: &str, says: &str| {
        problems
            .iter()
            .any(|p| p.starts_with(object) && p.contains(says))
    };
    for (object, says) in [
        ("ScaledObject/toolfleet-worker-default", "minReplicaCount"),
        ("ScaledObject/toolfleet-worker-agents", "pollingIntervall"),
        ("TriggerAuthentication/toolfleet-rabbitmq", "key"),
    ] {
        assert!(
            caught(object, says),
            "{object} ({says}) passed:\n{}",
            problems.join("\n")
        );
    }
    if report.is_some() {
        for (object, says) in [
            ("Deployment/toolfleet-dispatcher", "readinesProbe"),
            (
                "Deployment/toolfleet-worker-default",
                "terminationGracePeriodSeconds",
            ),
        ] {
            assert!(
                caught(object, says),
                "{object} ({says}) passed:\n{}",
                problems.join("\n")
            );
        }
    }
    // Nothing else was flagged: the untouched objects still pass.
    let broken = BTreeSet::from([
        "Deployment/toolfleet-dispatcher",
        "Deployment/toolfleet-worker-default",
        "ScaledObject/toolfleet-worker-default",
        "ScaledObject/toolfleet-worker-agents",
        "TriggerAuthentication/toolfleet-rabbitmq",
    ]);
    for problem in &problems {
        let object = problem.split([':', ' ']).next().unwrap();
        assert!(
            broken.contains(object),
            "an untouched object was flagged: {problem}"
        );
    }
}

#[test]
fn the_fleet_holds_together_in_every_overlay() {
    let Some(overlays) = render_overlays(&repo().join(K8S)) else {
        return;
    };
    let guide = read(&repo().join(K8S).join("README.md"));
    for (overlay, objects) in &overlays {
        let problems = fleet_problems(objects);
        assert!(
            problems.is_empty(),
            "overlay {overlay}:\n{}",
            problems.join("\n")
        );
        // deploy/k8s/README.md does the sum of the manifests as they are.
        let fleet = Fleet::of(objects, &mut Vec::new());
        let (connections, parts) = postgres_connections(&fleet, &mut Vec::new());
        let sum = format!("= {connections} ≤ {POSTGRES_CONNECTIONS}");
        assert!(
            guide.contains(&sum),
            "overlay {overlay}: deploy/k8s/README.md says `{sum}` of PostgreSQL connections: {parts:?}"
        );
    }

    // Each check catches what it is for.
    type Breakage = fn(&mut Vec<Value>);
    let breakages: [(&str, &str, Breakage, &str); 21] = [
        (
            "keda",
            "a worker stopped before its grace is over",
            |o| {
                find_mut(o, "Deployment", "toolfleet-worker-default")["spec"]["template"]["spec"]
                    ["terminationGracePeriodSeconds"] = json!(20)
            },
            "terminationGracePeriodSeconds",
        ),
        (
            "keda",
            "a ScaledObject watching another queue",
            |o| {
                find_mut(o, "ScaledObject", "toolfleet-worker-default")["spec"]["triggers"][0]["metadata"]
                    ["queueName"] = json!("toolfleet.default")
            },
            "queueName",
        ),
        (
            "keda",
            "a dispatcher probe on a path not served",
            |o| {
                first_container_mut(find_mut(o, "Deployment", "toolfleet-dispatcher"))["readinessProbe"]
                    ["httpGet"]["path"] = json!("/ready")
            },
            "readinessProbe",
        ),
        (
            "keda",
            "a worker probe on a port not declared",
            |o| {
                first_container_mut(find_mut(o, "Deployment", "toolfleet-worker-agents"))["livenessProbe"]
                    ["httpGet"]["port"] = json!("http")
            },
            "livenessProbe",
        ),
        (
            "keda",
            "a pool without workers",
            |o| o.retain(|x| !(kind(x) == "Deployment" && name(x) == "toolfleet-worker-agents")),
            "\"agents\"",
        ),
        (
            "keda",
            "KEDA reading another secret key than RabbitMQ's management API",
            |o| {
                find_mut(o, "TriggerAuthentication", "toolfleet-rabbitmq")["spec"]["secretTargetRef"]
                    [0]["key"] = json!("database-url")
            },
            "TriggerAuthentication",
        ),
        (
            "keda",
            "KEDA reading the AMQP URL, which shows it the waiting jobs only",
            |o| {
                find_mut(o, "TriggerAuthentication", "toolfleet-rabbitmq")["spec"]["secretTargetRef"]
                    [0]["key"] = json!("broker-url")
            },
            "TriggerAuthentication",
        ),
        (
            "keda",
            "a ScaledObject over AMQP",
            |o| {
                find_mut(o, "ScaledObject", "toolfleet-worker-agents")["spec"]["triggers"][0]["metadata"]
                    ["protocol"] = json!("amqp")
            },
            "protocol",
        ),
        (
            "keda",
            "a ScaledObject leaving the running jobs out",
            |o| {
                find_mut(o, "ScaledObject", "toolfleet-worker-default")["spec"]["triggers"][0]["metadata"]
                    ["excludeUnacknowledged"] = json!("true")
            },
            "excludeUnacknowledged",
        ),
        (
            "keda",
            "a ScaledObject aiming at another number of jobs per worker",
            |o| {
                find_mut(o, "ScaledObject", "toolfleet-worker-default")["spec"]["triggers"][0]["metadata"]
                    ["value"] = json!("32")
            },
            "the concurrency its workers run with",
        ),
        (
            "keda",
            "workers running another concurrency than their ScaledObject's value",
            |o| {
                let args =
                    &mut first_container_mut(find_mut(o, "Deployment", "toolfleet-worker-agents"))
                        ["args"];
                args.as_array_mut()
                    .unwrap()
                    .extend([json!("--concurrency"), json!("8")]);
            },
            "the concurrency its workers run with",
        ),
        (
            "keda",
            "database_pool left to the binary's default",
            |o| {
                let map = o.iter_mut().find(|x| kind(x) == "ConfigMap").unwrap();
                let text = map["data"][CONFIG_FILE]
                    .as_str()
                    .unwrap()
                    .replace("\ndatabase_pool = ", "\n# database_pool = ");
                map["data"][CONFIG_FILE] = json!(text);
            },
            "max_connections",
        ),
        (
            "keda",
            "a pool scaled past PostgreSQL's connections",
            |o| {
                find_mut(o, "ScaledObject", "toolfleet-worker-agents")["spec"]["maxReplicaCount"] =
                    json!(30)
            },
            "max_connections",
        ),
        (
            "hpa",
            "dispatchers with a pool past PostgreSQL's connections",
            |o| {
                let container =
                    first_container_mut(find_mut(o, "Deployment", "toolfleet-dispatcher"));
                for entry in container["env"].as_array_mut().unwrap() {
                    if entry["name"] == "TOOLFLEET_DATABASE_POOL" {
                        entry["value"] = json!("40");
                    }
                }
            },
            "max_connections",
        ),
        (
            "keda",
            "a model server URL naming no Service, not marked a placeholder",
            |o| {
                let container =
                    first_container_mut(find_mut(o, "Deployment", "toolfleet-worker-agents"));
                for entry in container["env"].as_array_mut().unwrap() {
                    if entry["name"] == "EXPENSES_MODEL_URL" {
                        entry["value"] = json!("http://ollama:11434/v1");
                    }
                }
            },
            "EXPENSES_MODEL_URL",
        ),
        (
            "keda",
            "dispatchers leaving the Service after 10 s of a blip",
            |o| {
                first_container_mut(find_mut(o, "Deployment", "toolfleet-dispatcher"))["readinessProbe"]
                    ["failureThreshold"] = json!(2)
            },
            "out of the Service after 10 s",
        ),
        (
            "hpa",
            "an HPA the README's command does not delete",
            |o| {
                find_mut(o, "HorizontalPodAutoscaler", "toolfleet-worker-default")["metadata"]
                    ["labels"]
                    .as_object_mut()
                    .unwrap()
                    .remove(AUTOSCALER_LABEL);
            },
            "toolfleet/autoscaler=hpa",
        ),
        (
            "keda",
            "a ScaledObject whose HPA the HPAs' command would delete",
            |o| {
                find_mut(o, "ScaledObject", "toolfleet-worker-agents")["metadata"]["labels"]
                    [AUTOSCALER_LABEL] = json!("hpa")
            },
            "toolfleet/autoscaler=keda",
        ),
        (
            "keda",
            "a TriggerAuthentication the README's command leaves behind",
            |o| {
                find_mut(o, "TriggerAuthentication", "toolfleet-rabbitmq")["metadata"]["labels"]
                    .as_object_mut()
                    .unwrap()
                    .remove(AUTOSCALER_LABEL);
            },
            "toolfleet/autoscaler=keda",
        ),
        (
            "keda",
            "a management URL on another vhost than the workers'",
            |o| {
                let secret = find_mut(o, "Secret", "toolfleet-secrets");
                let url = secret["stringData"][MANAGEMENT_URL_KEY]
                    .as_str()
                    .unwrap()
                    .replace("/%2f", "/other");
                secret["stringData"][MANAGEMENT_URL_KEY] = json!(url);
            },
            "vhost",
        ),
        (
            "keda",
            "a worker command the binary refuses",
            |o| {
                first_container_mut(find_mut(o, "Deployment", "toolfleet-worker-default"))["args"] =
                    json!(["worker", "--pools", "default"])
            },
            "refuses",
        ),
    ];
    for (overlay, what, break_it, says) in breakages {
        let (_, objects) = overlays.iter().find(|(name, _)| name == overlay).unwrap();
        let mut objects = objects.clone();
        break_it(&mut objects);
        let problems = fleet_problems(&objects);
        assert!(
            problems.iter().any(|p| p.contains(says)),
            "{what} passed: {problems:#?}"
        );
    }
}

#[test]
fn the_binary_serves_the_configmap_configuration_and_the_dispatcher_probes() {
    let Some(objects) = overlay("keda") else {
        return;
    };
    let (_, text) = config_map(&objects);
    let dispatcher = find(&objects, "Deployment", "toolfleet-dispatcher").expect("the dispatchers");
    let container = first_container(dispatcher);
    let dir = TempDir::new("k8s-config");
    let token = "tf_k8s_test";
    let path = dir.0.join(CONFIG_FILE);
    let confirm = ("TOOLFLEET_CONFIRM_SECRET", "cd".repeat(32));
    let webhook = (
        "TOOLFLEET_WEBHOOK_SECRET",
        "k8s-test-webhook-key-0123456789abcdef".to_owned(),
    );
    let listen = ("TOOLFLEET_LISTEN", "127.0.0.1:0".to_owned());

    std::fs::write(&path, local_config(&text, &dir.0, Some(token))).unwrap();
    let shipped = dir.0.join("shipped.toml");
    std::fs::write(&shipped, local_config(&text, &dir.0, None)).unwrap();

    // As shipped, the placeholders keep a dispatcher from starting: the
    // confirm secret and the webhook key of the Secret, then the token
    // digest of the ConfigMap.
    let placeholder = secret_value(&objects, "toolfleet-secrets", "confirm-secret").unwrap();
    let webhook_placeholder =
        secret_value(&objects, "toolfleet-secrets", "webhook-secret").unwrap();
    for (config, env, says) in [
        (
            &path,
            vec![("TOOLFLEET_CONFIRM_SECRET", placeholder), webhook.clone()],
            "confirm_secret",
        ),
        (
            &path,
            vec![
                confirm.clone(),
                ("TOOLFLEET_WEBHOOK_SECRET", webhook_placeholder),
            ],
            "TOOLFLEET_WEBHOOK_SECRET",
        ),
        (&shipped, vec![confirm.clone(), webhook.clone()], "sha256"),
    ] {
        let child = Command::new(env!("CARGO_BIN_EXE_toolfleet"))
            .env_remove("TOOLFLEET_CONFIG")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env(listen.0, &listen.1)
            .arg("--config")
            .arg(config)
            .arg("serve")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = exit_within(child, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(says),
            "a placeholder ({says}) was taken: {stderr}"
        );
    }

    // With them filled, the binary loads the ConfigMap's file (every key, the
    // included pack, its executors) and serves; the dispatcher's probes and
    // its scrape path answer 200 on the routes the Deployment names.
    let (_process, rest) = start(
        &path,
        &["serve".to_owned()],
        &[confirm, webhook, listen],
        "toolfleet serving on http://",
    );
    let address: SocketAddr = rest
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .expect("an address");
    let mut paths = probe_paths(container);
    paths.push(
        dispatcher["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]
            .as_str()
            .unwrap()
            .to_owned(),
    );
    for path in paths {
        get_ok(address, &path, Duration::from_secs(10));
    }
    let tools = Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .args([
            "tools",
            "--server",
            &format!("http://{address}"),
            "--token",
            token,
        ])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&tools.stdout);
    assert!(
        tools.status.success() && listed.contains("reconcile_month"),
        "{listed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_as_deployed_serves_its_probes_and_consumes_the_scaled_queue() {
    let Some(objects) = overlay("keda") else {
        return;
    };
    let (_, text) = config_map(&objects);
    let dir = TempDir::new("k8s-worker");
    let id = uuid::Uuid::now_v7().simple().to_string();
    let (schema, prefix) = (format!("tf_{id}"), format!("tf-{id}"));
    let _cleanup = SharedCleanup {
        database: Some((shared_database_url(), schema.clone())),
        broker: Some((shared_amqp_url(), prefix.clone())),
    };
    // The ConfigMap's file in a fleet of this test's own.
    let mut config = local_config(&text, &dir.0, Some("tf_k8s_worker"));
    config = set_key(&config, "broker_prefix", &format!("{prefix:?}"));
    config = set_key(&config, "database_schema", &format!("{schema:?}"));
    let path = dir.0.join(CONFIG_FILE);
    std::fs::write(&path, config).unwrap();
    let servers = [
        ("TOOLFLEET_DATABASE_URL", shared_database_url()),
        ("TOOLFLEET_BROKER_URL", shared_amqp_url()),
        ("TOOLFLEET_CONFIRM_SECRET", "ef".repeat(32)),
    ];

    // The migration Job's command, then the default pool's worker, each with
    // the arguments of its manifest.
    let job = find(&objects, "Job", "toolfleet-migrate").expect("the migration Job");
    let migrated = Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .env_remove("TOOLFLEET_CONFIG")
        .envs(servers.iter().map(|(k, v)| (*k, v.as_str())))
        .arg("--config")
        .arg(&path)
        .args(string_args(first_container(job)))
        .output()
        .unwrap();
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );

    let worker = find(&objects, "Deployment", "toolfleet-worker-default")
        .expect("the default pool's workers");
    let container = first_container(worker);
    let args = string_args(container);
    let pool = pool_of(&args[1..]).unwrap();
    let manifest_listen = env_value(container, "TOOLFLEET_METRICS_LISTEN").expect("metrics_listen");
    let port = free_port();
    let mut env: Vec<(&str, String)> = servers.to_vec();
    // The manifest's host (every interface) would do; the loopback keeps
    // the test to this machine.
    assert_eq!(host_of(manifest_listen), "0.0.0.0");
    env.push(("TOOLFLEET_METRICS_LISTEN", format!("127.0.0.1:{port}")));
    let (_process, _) = start(&path, &args, &env, "toolfleet worker running");
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    for path in probe_paths(container) {
        get_ok(address, &path, Duration::from_secs(15));
    }
    get_ok(address, METRICS, Duration::from_secs(5));

    // It consumes the queue its ScaledObject names, under this fleet's prefix.
    let scaled = find(&objects, "ScaledObject", name(worker)).expect("the pool's ScaledObject");
    let watched = scaled["spec"]["triggers"][0]["metadata"]["queueName"]
        .as_str()
        .unwrap();
    assert_eq!(
        watched,
        toolfleet_broker::rabbit::pool_queue_name("toolfleet", &pool)
    );
    let queue = toolfleet_broker::rabbit::pool_queue_name(&prefix, &pool);
    let connection =
        lapin::Connection::connect(&shared_amqp_url(), lapin::ConnectionProperties::default())
            .await
            .expect("RabbitMQ");
    let passive = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let start = Instant::now();
    loop {
        // The worker says it runs before its consumer has declared the
        // queue, and a passive declaration of a queue not there yet closes
        // the channel: a new one each time.
        let channel = connection.create_channel().await.unwrap();
        let consumers = channel
            .queue_declare(
                queue.as_str().into(),
                passive,
                lapin::types::FieldTable::default(),
            )
            .await
            .map(|declared| declared.consumer_count());
        if consumers.as_ref().is_ok_and(|n| *n >= 1) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "nobody consumes {queue}: {consumers:?}"
        );
        let _ = channel.close(0, "again".into()).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = connection.close(0, "done".into()).await;
}

#[test]
fn the_configuration_uses_documented_keys_and_the_readme_covers_the_layout() {
    let text = read(&repo().join(K8S).join("base").join(CONFIG_FILE));
    let config: toml::Table = toml::from_str(&text).unwrap();
    let readme = read(&repo().join("README.md"));
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Configuration"))
        .expect("README.md has a Configuration section");
    for key in config.keys() {
        let documented = section.contains(&format!("`{key}`"))
            || section.contains(&format!("`[{key}]`"))
            || section.contains(&format!("`[[{key}"));
        assert!(
            documented,
            "{CONFIG_FILE} sets `{key}`, which README.md's Configuration does not document"
        );
    }
    // Every variable of the binary's that a workload sets, as written.
    let mut variables = BTreeSet::from([
        "TOOLFLEET_SHUTDOWN_GRACE_S".to_owned(),
        "TOOLFLEET_CONFIRM_SECRET".to_owned(),
        "TOOLFLEET_WEBHOOK_SECRET".to_owned(),
        "TOOLFLEET_DATABASE_POOL".to_owned(),
    ]);
    for manifest in [
        "base/dispatcher-deployment.yaml",
        "base/migrate-job.yaml",
        "pools/default/worker/deployment.yaml",
        "pools/agents/worker/deployment.yaml",
    ] {
        for workload in documents(&read(&repo().join(K8S).join(manifest)), manifest) {
            for container in toolfleet_containers(&workload) {
                for entry in container["env"].as_array().into_iter().flatten() {
                    let variable = entry["name"].as_str().unwrap_or_default();
                    if variable.starts_with("TOOLFLEET_") {
                        variables.insert(variable.to_owned());
                    }
                }
            }
        }
    }
    for variable in variables {
        assert!(
            section.contains(&variable),
            "README.md's Configuration documents {variable}"
        );
    }
    let guide = read(&repo().join(K8S).join("README.md"));
    for needed in [
        "overlays/keda",
        "overlays/hpa",
        "pools/default",
        "toolfleet-migrate",
        "shutdown_grace_s",
        "terminationGracePeriodSeconds",
        MIN_KUBERNETES,
        MANAGEMENT_URL_KEY,
        "protocol: http",
        "excludeUnacknowledged",
        "max_connections",
        "PgBouncer",
        "TOOLFLEET_DATABASE_POOL",
        "EXPENSES_MODEL_URL",
    ] {
        assert!(
            guide.contains(needed),
            "deploy/k8s/README.md speaks of {needed}"
        );
    }
    // Switching overlays: the commands that delete the other's autoscalers,
    // whose labels the_fleet_holds_together_in_every_overlay checks.
    let blocks: Vec<&str> = guide
        .split("```sh\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect();
    for (resources, _, value) in SWITCHES {
        let command = switch_command(resources, value);
        assert!(
            blocks
                .iter()
                .any(|block| block.lines().any(|line| line.trim() == command)),
            "deploy/k8s/README.md runs `{command}` before switching overlays"
        );
    }
}

#[test]
fn the_binary_takes_the_database_pool_a_deployment_sets() {
    // The dispatchers' TOOLFLEET_DATABASE_POOL, which the connection count
    // of the_fleet_holds_together_in_every_overlay trusts, is read: a value
    // that is not a number stops the binary, naming it.
    let manifest = "base/dispatcher-deployment.yaml";
    let dispatcher = documents(&read(&repo().join(K8S).join(manifest)), manifest)
        .into_iter()
        .find(|o| kind(o) == "Deployment")
        .expect("the dispatchers");
    let pool = env_value(first_container(&dispatcher), "TOOLFLEET_DATABASE_POOL")
        .expect("the dispatchers set TOOLFLEET_DATABASE_POOL")
        .to_owned();
    let text = read(&repo().join(K8S).join("base").join(CONFIG_FILE));
    let dir = TempDir::new("k8s-database-pool");
    std::fs::create_dir_all(dir.0.join("data")).unwrap();
    let path = dir.0.join(CONFIG_FILE);
    std::fs::write(&path, local_config(&text, &dir.0, Some("tf_k8s_pool"))).unwrap();
    let migrate = |value: &str| {
        Command::new(env!("CARGO_BIN_EXE_toolfleet"))
            .env_remove("TOOLFLEET_CONFIG")
            .env_remove("TOOLFLEET_DATABASE_URL")
            .env_remove("TOOLFLEET_BROKER_URL")
            .env("TOOLFLEET_DATABASE_POOL", value)
            .arg("--config")
            .arg(&path)
            .arg("migrate")
            .output()
            .unwrap()
    };
    let taken = migrate(&pool);
    assert!(
        taken.status.success(),
        "TOOLFLEET_DATABASE_POOL={pool}: {}",
        String::from_utf8_lossy(&taken.stderr)
    );
    let refused = migrate("eight");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("TOOLFLEET_DATABASE_POOL"),
        "TOOLFLEET_DATABASE_POOL=eight was taken: {stderr}"
    );
}

#[test]
fn a_pool_added_as_the_readme_says_holds_together() {
    let copy = TempDir::new("k8s-pool");
    let root = copy.0.join(K8S);
    copy_tree(&repo().join(K8S), &root);
    // The commands of "Adding a pool", run as written.
    let guide = read(&repo().join(K8S).join("README.md"));
    let section = guide
        .split("\n## ")
        .find(|s| s.starts_with("Adding a pool"))
        .expect("deploy/k8s/README.md has a section on adding a pool");
    let script = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a sh block");
    let ran = Command::new("sh")
        .args(["-euc", script])
        .current_dir(&copy.0)
        .output()
        .unwrap();
    assert!(
        ran.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    // Then the overlays list it, and a tool runs on it.
    for overlay in ["keda", "hpa"] {
        let listed = format!("  - ../../pools/reports/{overlay}\n");
        assert!(
            section.contains(&format!("../../pools/reports/{overlay}`")),
            "the README names {listed}"
        );
        let path = root
            .join("overlays")
            .join(overlay)
            .join("kustomization.yaml");
        let anchor = format!("  - ../../pools/agents/{overlay}\n");
        edit(&path, &anchor, &format!("{anchor}{listed}"));
    }
    let config = root.join("base").join(CONFIG_FILE);
    let mut text = read(&config);
    text.push_str("\n[[tools]]\nname = \"build_report\"\nshape = \"job\"\npool = \"reports\"\ninput_schema = { type = \"object\" }\nexecutor = { kind = \"builtin\", name = \"toolfleet.noop\" }\n");
    std::fs::write(&config, text).unwrap();

    let Some(overlays) = render_overlays(&root) else {
        return;
    };
    let crds = vendored_crds(&root);
    for (overlay, objects) in &overlays {
        let mut problems = fleet_problems(objects);
        problems.extend(custom_resource_problems(objects, &crds));
        assert!(
            problems.is_empty(),
            "overlay {overlay}:\n{}",
            problems.join("\n")
        );
        assert!(find(objects, "Deployment", "toolfleet-worker-reports").is_some());
        // Within PostgreSQL's connections still, as the section says.
        let (connections, parts) =
            postgres_connections(&Fleet::of(objects, &mut Vec::new()), &mut Vec::new());
        assert!(
            section.contains(&format!("a third makes {connections}")),
            "overlay {overlay}: the section gives the PostgreSQL connections of a third pool: {parts:?}"
        );
    }
    let (_, keda) = overlays.iter().find(|(name, _)| name == "keda").unwrap();
    let scaled = find(keda, "ScaledObject", "toolfleet-worker-reports").expect("its ScaledObject");
    assert_eq!(
        scaled["spec"]["triggers"][0]["metadata"]["queueName"],
        "toolfleet.pool.reports"
    );
}
