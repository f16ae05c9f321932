//! The Kubernetes manifests of `deploy/k8s/` read and checked without a
//! cluster, for tests/kubernetes.rs: overlays rendered with kustomize and
//! their YAML read as JSON, validated against `kubernetes-validate`'s
//! schemas and the vendored KEDA CRDs, a linter of the fleet they make (the
//! configuration, probes, grace periods, pools, autoscalers, PostgreSQL
//! connections) held to the Dockerfile and the binary, and the binary run
//! as a manifest says. tests/compose.rs reads its YAML with [`to_json`].

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use toolfleet_core::config::parse_tools;
use toolfleet_core::{RuntimeConfig, Shape};
use yaml_rust2::{Yaml, YamlLoader};

use super::{dockerfile, missing, repo, sha, toolfleet, under_ci};

/// The manifests, relative to the repository.
pub(crate) const K8S: &str = "deploy/k8s";
/// The vendored KEDA CRDs, relative to [`K8S`].
const CRDS: &str = "schemas/keda";
/// The oldest Kubernetes release the manifests are validated against
/// (deploy/k8s/README.md says so).
pub(crate) const MIN_KUBERNETES: &str = "1.29";
/// The `kubernetes-validate` of `.ci/run`, required under CI.
const VALIDATOR_VERSION: &str = "1.37.0";
/// The file of the ConfigMap the processes read.
pub(crate) const CONFIG_FILE: &str = "toolfleet.toml";
/// What the dispatcher serves (crates/server/src/routes.rs) and workers
/// serve on `metrics_listen`.
const LIVENESS: &str = "/healthz";
const READINESS: &str = "/readyz";
pub(crate) const METRICS: &str = "/metrics";
/// The least a pod's terminationGracePeriodSeconds leaves beyond
/// `shutdown_grace_s`: unfinished jobs are handed back, connections closed.
const GRACE_MARGIN_S: f64 = 5.0;
/// What a placeholder of the Secret and the configuration says.
const PLACEHOLDER: &str = "REPLACE-ME";
/// The Secret key KEDA reads RabbitMQ's management API URL from: over HTTP
/// a queue's count includes the messages workers hold unacknowledged.
pub(crate) const MANAGEMENT_URL_KEY: &str = "broker-management-url";
/// The most PostgreSQL connections the fleet may hold at once: 90 of the
/// default `max_connections` of 100 (deploy/k8s/README.md says why).
pub(crate) const POSTGRES_CONNECTIONS: u64 = 90;
/// `database_pool` when nothing sets it (crates/cli/src/config.rs).
const DEFAULT_DATABASE_POOL: u64 = 16;
/// The least time, in seconds, a dispatcher's readiness probe fails before
/// it leaves the Service: a blip of the servers reaches all at once.
const READINESS_TOLERANCE_S: u64 = 30;
/// The label whose value (`hpa` or `keda`) tells an overlay's autoscalers
/// apart, for deleting one overlay's when switching to the other.
pub(crate) const AUTOSCALER_LABEL: &str = "toolfleet/autoscaler";

/// The text of the file at `path`.
pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

// ---------------------------------------------------------------- rendering

/// A YAML node as JSON, with `<<` merge keys applied as compose does
/// (kustomize writes none).
pub(crate) fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Real(text) => Value::from(text.parse::<f64>().expect("a YAML real")),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(hash) => {
            let mut map = Map::new();
            if let Some(merged) = hash.get(&Yaml::String("<<".into())) {
                let sources = match to_json(merged) {
                    Value::Array(sources) => sources,
                    source => vec![source],
                };
                for source in sources {
                    let Value::Object(source) = source else {
                        panic!("a `<<` merge key names a mapping, not {source}");
                    };
                    map.extend(source);
                }
            }
            for (key, value) in hash {
                let key = match key {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    other => panic!("unexpected YAML key {other:?}"),
                };
                if key != "<<" {
                    map.insert(key, to_json(value));
                }
            }
            Value::Object(map)
        }
        Yaml::Alias(_) | Yaml::BadValue => panic!("unresolved YAML node {yaml:?}"),
    }
}

/// The documents of a YAML stream, empty ones left out.
pub(crate) fn documents(text: &str, what: &str) -> Vec<Value> {
    YamlLoader::load_from_str(text)
        .unwrap_or_else(|e| panic!("{what} is not YAML: {e}"))
        .iter()
        .filter(|doc| !matches!(doc, Yaml::Null))
        .map(to_json)
        .collect()
}

/// Renders the kustomization in `dir` with `kubectl kustomize`, else
/// `kustomize build`; None when neither is installed.
fn kustomize(dir: &Path) -> Option<Result<String, String>> {
    let candidates: [(&str, &[&str]); 2] = [("kubectl", &["kustomize"]), ("kustomize", &["build"])];
    for (program, args) in candidates {
        match Command::new(program).args(args).arg(dir).output() {
            Ok(out) if out.status.success() => {
                return Some(Ok(String::from_utf8(out.stdout).expect("UTF-8 manifests")));
            }
            Ok(out) => {
                return Some(Err(format!(
                    "`{program} {} {}` failed: {}",
                    args.join(" "),
                    dir.display(),
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Some(Err(format!("{program}: {e}"))),
        }
    }
    None
}

/// Every overlay under `root/overlays`, rendered: `(name, objects)`. None
/// (skipped, or failed under CI) without kustomize.
pub(crate) fn render_overlays(root: &Path) -> Option<Vec<(String, Vec<Value>)>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("overlays"))
        .expect("deploy/k8s/overlays")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.join("kustomization.yaml").is_file())
        .collect();
    dirs.sort();
    let mut overlays = Vec::new();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let text = match kustomize(&dir) {
            None => {
                missing(
                    "kustomize: neither `kubectl` (kubectl kustomize) nor `kustomize` is on PATH",
                );
                return None;
            }
            Some(Err(error)) => panic!("overlay {name} does not render: {error}"),
            Some(Ok(text)) => text,
        };
        overlays.push((name.clone(), documents(&text, &format!("overlay {name}"))));
    }
    assert!(!overlays.is_empty(), "no overlays under {}", root.display());
    Some(overlays)
}

/// A copy of `from` (a directory tree) at `to`.
pub(crate) fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Replaces `old` (which must occur exactly once) in the file `path`.
pub(crate) fn edit(path: &Path, old: &str, new: &str) {
    let text = read(path);
    assert_eq!(
        text.matches(old).count(),
        1,
        "`{old}` occurs once in {}",
        path.display()
    );
    std::fs::write(path, text.replacen(old, new, 1)).unwrap();
}

// ------------------------------------------------------------------ objects

pub(crate) fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

pub(crate) fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

pub(crate) fn label(object: &Value) -> String {
    format!("{}/{}", kind(object), name(object))
}

fn of_kind<'a>(objects: &'a [Value], wanted: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    objects.iter().filter(move |o| kind(o) == wanted)
}

/// The only object of `wanted` kind named `object_name`.
pub(crate) fn find<'a>(objects: &'a [Value], wanted: &str, object_name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| kind(o) == wanted && name(o) == object_name)
}

pub(crate) fn find_mut<'a>(
    objects: &'a mut [Value],
    wanted: &str,
    object_name: &str,
) -> &'a mut Value {
    objects
        .iter_mut()
        .find(|o| kind(o) == wanted && name(o) == object_name)
        .unwrap_or_else(|| panic!("no {wanted}/{object_name}"))
}

/// The env entry `variable` of a container.
fn env<'a>(container: &'a Value, variable: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == variable)
}

/// The literal value of env entry `variable`.
pub(crate) fn env_value<'a>(container: &'a Value, variable: &str) -> Option<&'a str> {
    env(container, variable)?["value"].as_str()
}

/// The Secret and key an env entry reads: `(secret, key)`.
fn env_secret(container: &Value, variable: &str) -> Option<(String, String)> {
    let reference = &env(container, variable)?["valueFrom"]["secretKeyRef"];
    Some((
        reference["name"].as_str()?.to_owned(),
        reference["key"].as_str()?.to_owned(),
    ))
}

/// The value of a Secret's key under `stringData`; a key under `data` is
/// there too, but stays base64 (the Secret of base/ uses `stringData`).
pub(crate) fn secret_value(objects: &[Value], secret: &str, key: &str) -> Option<String> {
    let object = find(objects, "Secret", secret)?;
    if let Some(value) = object["stringData"][key].as_str() {
        return Some(value.to_owned());
    }
    object["data"][key]
        .as_str()
        .map(|encoded| format!("(base64) {encoded}"))
}

/// The number a container port reference (a number or a port name) means.
fn resolve_port(container: &Value, port: &Value) -> Option<u64> {
    match port {
        Value::Number(n) => n.as_u64(),
        Value::String(port_name) => container["ports"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == port_name.as_str())?["containerPort"]
            .as_u64(),
        _ => None,
    }
}

/// The port of `host:port`.
fn port_of(address: &str) -> Option<u64> {
    address.rsplit_once(':')?.1.parse().ok()
}

pub(crate) fn host_of(address: &str) -> &str {
    address.rsplit_once(':').map_or(address, |(host, _)| host)
}

/// The scheme and the host of a URL (`scheme://user:password@host:port/...`).
fn url_parts(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = host_port.split(':').next().unwrap_or_default();
    Some((scheme, host))
}

/// The RabbitMQ vhost a URL names: its path's last segment, decoded
/// (RabbitMQ's management API may sit under a path prefix), `/` if none.
fn vhost_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let path = rest.split_once('/').map_or("", |(_, path)| path);
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let last = path.rsplit('/').next().unwrap_or_default();
    match last.replace("%2f", "/").replace("%2F", "/") {
        vhost if vhost.is_empty() => "/".to_owned(),
        vhost => vhost,
    }
}

/// `selector` (matchLabels, or a Service's plain map) selects `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(selector) = selector.as_object() else {
        return false;
    };
    !selector.is_empty() && selector.iter().all(|(k, v)| &labels[k] == v)
}

// --------------------------------------------------------------- Dockerfile

/// What the image sets that the manifests rely on.
struct Image {
    /// The numeric user of `USER`.
    uid: u64,
    /// `ENV` variables.
    env: BTreeMap<String, String>,
    /// `COPY` destinations (absolute) and their sources in the repository.
    copies: BTreeMap<String, String>,
}

/// What the Dockerfile's instructions set for the manifests.
fn image() -> Image {
    let mut image = Image {
        uid: 0,
        env: BTreeMap::new(),
        copies: BTreeMap::new(),
    };
    for (word, rest) in dockerfile() {
        match word.as_str() {
            "USER" => {
                image.uid = rest
                    .split(':')
                    .next()
                    .unwrap()
                    .parse()
                    .expect("a numeric USER")
            }
            "ENV" => {
                if let Some((key, value)) = rest.split_once('=') {
                    image.env.insert(key.to_owned(), value.to_owned());
                }
            }
            "COPY" if !rest.starts_with("--") => {
                if let Some((source, destination)) = rest.split_once(char::is_whitespace) {
                    image
                        .copies
                        .insert(destination.trim().to_owned(), source.to_owned());
                }
            }
            _ => {}
        }
    }
    image
}

// -------------------------------------------------------- the configuration

/// The ConfigMap holding toolfleet.toml: `(its name, the file)`.
pub(crate) fn config_map(objects: &[Value]) -> (String, String) {
    let maps: Vec<&Value> = of_kind(objects, "ConfigMap")
        .filter(|m| m["data"][CONFIG_FILE].is_string())
        .collect();
    assert_eq!(maps.len(), 1, "one ConfigMap holds {CONFIG_FILE}");
    (
        name(maps[0]).to_owned(),
        maps[0]["data"][CONFIG_FILE].as_str().unwrap().to_owned(),
    )
}

/// The configuration's `include` paths in the image, mapped to the
/// repository's files the Dockerfile copies there.
fn included_files(config: &toml::Table) -> Vec<PathBuf> {
    let image = image();
    config
        .get("include")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .map(|include| {
            let include = include.as_str().expect("an include path");
            let source = image.copies.get(include).unwrap_or_else(|| {
                panic!("include `{include}` is not a file the Dockerfile copies into the image")
            });
            repo().join(source)
        })
        .collect()
}

/// The pools the configured job and agent tools run on, as the runtime
/// picks them (a tool's `pool`, else the shape's default pool).
fn configured_pools(text: &str, config: &toml::Table) -> BTreeSet<String> {
    let defaults = RuntimeConfig::default();
    let mut texts = vec![text.to_owned()];
    texts.extend(included_files(config).iter().map(|path| read(path)));
    let mut pools = BTreeSet::new();
    for text in texts {
        for tool in parse_tools(&text).expect("the configured tools parse") {
            if tool.shape.is_enqueued() {
                pools.insert(tool.pool.clone().unwrap_or_else(|| match tool.shape {
                    Shape::Agent => defaults.default_agent_pool.clone(),
                    _ => defaults.default_pool.clone(),
                }));
            }
        }
    }
    pools
}

/// `line` with the value of top-level `key = ...` replaced, in TOML text.
pub(crate) fn set_key(text: &str, key: &str, literal: &str) -> String {
    let prefix = format!("{key} = ");
    let mut found = false;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            if line.starts_with(&prefix) && !found {
                found = true;
                format!("{prefix}{literal}")
            } else {
                line.to_owned()
            }
        })
        .collect();
    let mut text = lines.join("\n");
    if !found {
        text = format!("{prefix}{literal}\n{text}");
    }
    text + "\n"
}

/// The ConfigMap's configuration made to run on this machine: the data
/// directory in `dir`, the image's included files at their repository
/// paths, and the token placeholder replaced by the digest of `token`
/// (kept with None).
pub(crate) fn local_config(text: &str, dir: &Path, token: Option<&str>) -> String {
    let config: toml::Table = toml::from_str(text).expect("TOML");
    let includes: Vec<String> = included_files(&config)
        .iter()
        .map(|p| format!("{:?}", p.display().to_string()))
        .collect();
    let mut text = set_key(
        text,
        "data_dir",
        &format!("{:?}", dir.join("data").display().to_string()),
    );
    text = set_key(&text, "include", &format!("[{}]", includes.join(", ")));
    let placeholders = text.matches(PLACEHOLDER).count();
    assert_eq!(
        placeholders, 1,
        "one placeholder (the token digest) in {CONFIG_FILE}"
    );
    let line = text
        .lines()
        .find(|l| l.contains(PLACEHOLDER))
        .unwrap()
        .to_owned();
    assert!(line.starts_with("sha256 = "), "{line}");
    match token {
        Some(token) => text.replace(&line, &format!("sha256 = \"{}\"", sha(token))),
        None => text,
    }
}

// ------------------------------------------------------------- validation

/// A served version of a vendored CRD, compiled strict.
pub(crate) struct Crd {
    group: String,
    pub kind: String,
    versions: BTreeMap<String, jsonschema::Validator>,
}

/// Kubernetes prunes fields a structural schema does not name; to catch a
/// misspelt field as the API server's strict field validation does, every
/// object schema naming its properties allows no others.
fn forbid_unknown_fields(schema: &mut Value) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    if map.contains_key("properties")
        && !map.contains_key("additionalProperties")
        && map.get("x-kubernetes-preserve-unknown-fields") != Some(&Value::Bool(true))
    {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in map.iter_mut() {
        match key.as_str() {
            "properties" => {
                for property in value
                    .as_object_mut()
                    .into_iter()
                    .flat_map(|p| p.values_mut())
                {
                    forbid_unknown_fields(property);
                }
            }
            "items" | "additionalProperties" | "not" => forbid_unknown_fields(value),
            "allOf" | "anyOf" | "oneOf" => {
                for branch in value.as_array_mut().into_iter().flatten() {
                    forbid_unknown_fields(branch);
                }
            }
            _ => {}
        }
    }
}

/// The CRDs vendored under `root/schemas/keda`.
pub(crate) fn vendored_crds(root: &Path) -> Vec<Crd> {
    let dir = root.join(CRDS);
    let mut crds = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the vendored CRDs") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        for doc in documents(&read(&path), &path.display().to_string()) {
            assert_eq!(kind(&doc), "CustomResourceDefinition", "{}", path.display());
            let spec = &doc["spec"];
            let mut versions = BTreeMap::new();
            for version in spec["versions"].as_array().expect("versions") {
                if version["served"] != true {
                    continue;
                }
                let mut schema = version["schema"]["openAPIV3Schema"].clone();
                assert!(schema.is_object(), "{}: an openAPIV3Schema", path.display());
                forbid_unknown_fields(&mut schema);
                let validator = jsonschema::options()
                    .build(&schema)
                    .unwrap_or_else(|e| panic!("{}: the schema compiles: {e}", path.display()));
                versions.insert(version["name"].as_str().unwrap().to_owned(), validator);
            }
            crds.push(Crd {
                group: spec["group"].as_str().unwrap().to_owned(),
                kind: spec["names"]["kind"].as_str().unwrap().to_owned(),
                versions,
            });
        }
    }
    crds
}

/// The vendored CRD an object is an instance of.
pub(crate) fn crd_of<'a>(object: &Value, crds: &'a [Crd]) -> Option<&'a Crd> {
    let group = object["apiVersion"].as_str()?.split_once('/')?.0;
    crds.iter()
        .find(|crd| crd.group == group && crd.kind == kind(object))
}

/// What is wrong with the custom resources among `objects`, by their CRDs.
pub(crate) fn custom_resource_problems(objects: &[Value], crds: &[Crd]) -> Vec<String> {
    let mut problems = Vec::new();
    for object in objects {
        let Some(crd) = crd_of(object, crds) else {
            continue;
        };
        let version = object["apiVersion"]
            .as_str()
            .and_then(|v| v.split_once('/'))
            .map(|(_, v)| v)
            .unwrap_or_default();
        let Some(validator) = crd.versions.get(version) else {
            problems.push(format!(
                "{}: {}/{version} is not a served version of the vendored CRD",
                label(object),
                crd.group
            ));
            continue;
        };
        for error in validator.iter_errors(object) {
            problems.push(format!(
                "{} against the {} CRD: {}: {error}",
                label(object),
                crd.kind,
                error.instance_path()
            ));
        }
        let object_name = name(object);
        let dns = !object_name.is_empty()
            && object_name.len() <= 253
            && object_name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        if !dns {
            problems.push(format!(
                "{}: the name is not a DNS subdomain",
                label(object)
            ));
        }
    }
    problems
}

/// Validates each object with `kubernetes-validate` (strict) against every
/// bundled Kubernetes release from MIN_KUBERNETES on. Prints one JSON
/// document: the validator's version, the releases, and an outcome per
/// object and release (`ok`, `invalid`, or `no-schema` for kinds it does
/// not know, such as custom resources).
const VALIDATE_PY: &str = r#"
import json, sys
from packaging.version import Version
from kubernetes_validate import utils
from kubernetes_validate.version import __version__

minimum = Version(sys.argv[1])
versions = sorted({v for v in utils.all_versions() if Version(v) >= minimum}, key=Version)
results = []
for index, obj in enumerate(json.load(sys.stdin)):
    for version in versions:
        try:
            utils.validate(obj, version, strict=True)
            outcome, message = "ok", ""
        except utils.SchemaNotFoundError as e:
            outcome, message = "no-schema", e.message
        except utils.ValidationError as e:
            path = ".".join(str(p) for p in e.path) or "(root)"
            outcome, message = "invalid", "%s: %s" % (path, e.message)
        results.append({"index": index, "version": version, "outcome": outcome, "message": message})
json.dump({"validator": __version__, "versions": versions, "results": results}, sys.stdout)
"#;

/// What `kubernetes-validate` says of `objects`; None (skipped, or failed
/// under CI) when it is not installed.
pub(crate) fn kubernetes_validate(objects: &[Value]) -> Option<Value> {
    let installed = Command::new("python3")
        .args(["-c", "import kubernetes_validate"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !installed {
        missing(&format!(
            "the Kubernetes schema validator: python3 -m pip install 'kubernetes-validate=={VALIDATOR_VERSION}'"
        ));
        return None;
    }
    let mut child = Command::new("python3")
        .args(["-c", VALIDATE_PY, MIN_KUBERNETES])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    // The script reads all of its input before it writes anything.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(Value::Array(objects.to_vec()).to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubernetes-validate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("the validator's JSON");
    if under_ci() {
        assert_eq!(
            report["validator"], VALIDATOR_VERSION,
            "CI validates with the kubernetes-validate .ci/run pins"
        );
    }
    let versions = report["versions"].as_array().expect("versions");
    assert!(
        !versions.is_empty(),
        "kubernetes-validate {} bundles no release from {MIN_KUBERNETES} on",
        report["validator"]
    );
    Some(report)
}

/// What is wrong with `objects` by the Kubernetes schemas (`report`) and
/// the vendored CRDs. An object neither knows is a problem too.
pub(crate) fn schema_problems(
    objects: &[Value],
    report: Option<&Value>,
    crds: &[Crd],
) -> Vec<String> {
    let mut problems = custom_resource_problems(objects, crds);
    let Some(report) = report else {
        return problems;
    };
    let releases = report["versions"].as_array().unwrap().len();
    let mut seen = vec![0; objects.len()];
    for result in report["results"].as_array().expect("results") {
        let index = result["index"].as_u64().unwrap() as usize;
        let object = &objects[index];
        seen[index] += 1;
        let release = result["version"].as_str().unwrap_or_default();
        let message = result["message"].as_str().unwrap_or_default();
        match result["outcome"].as_str() {
            Some("ok") => {}
            Some("no-schema") if crd_of(object, crds).is_some() => {}
            Some("no-schema") => problems.push(format!(
                "{}: no schema of Kubernetes {release} nor a vendored CRD knows {} {}",
                label(object),
                object["apiVersion"],
                kind(object)
            )),
            _ => problems.push(format!(
                "{} against Kubernetes {release}: {message}",
                label(object)
            )),
        }
    }
    for (index, count) in seen.iter().enumerate() {
        if *count != releases {
            problems.push(format!("{}: not validated", label(&objects[index])));
        }
    }
    problems
}

// --------------------------------------------------------- the fleet's sense

/// The seconds a `preStop` hook holds a container before SIGTERM.
fn pre_stop_s(container: &Value) -> f64 {
    let hook = &container["lifecycle"]["preStop"];
    if let Some(seconds) = hook["sleep"]["seconds"].as_f64() {
        return seconds;
    }
    match hook["exec"]["command"].as_array().map(Vec::as_slice) {
        Some([program, seconds]) if program == "sleep" => {
            seconds.as_str().and_then(|s| s.parse().ok()).unwrap_or(0.0)
        }
        _ => 0.0,
    }
}

/// The pool of a worker's arguments (`--pool P` or `--pool=P`), if exactly one.
pub(crate) fn pool_of(args: &[String]) -> Result<String, String> {
    let mut pools = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--pool" {
            pools.extend(rest.next().cloned());
        } else if let Some(pool) = arg.strip_prefix("--pool=") {
            pools.push(pool.to_owned());
        }
    }
    match pools.as_slice() {
        [pool] => Ok(pool.clone()),
        _ => Err(format!(
            "a worker Deployment runs one pool (`--pool P`), got {args:?}"
        )),
    }
}

/// Records `message` in `problems` unless `cond` holds.
macro_rules! ensure {
    ($problems:expr, $cond:expr, $($message:tt)+) => {
        let holds: bool = $cond;
        if !holds {
            $problems.push(format!($($message)+));
        }
    };
}

/// What the checks of every workload read: the objects, the image and the
/// ConfigMap's configuration.
pub(crate) struct Fleet<'a> {
    objects: &'a [Value],
    image: Image,
    config_map: String,
    text: String,
    config: toml::Table,
    grace: f64,
    prefix: String,
    listen: String,
    data_dir: String,
}

impl<'a> Fleet<'a> {
    pub(crate) fn of(objects: &'a [Value], problems: &mut Vec<String>) -> Fleet<'a> {
        let (config_map, text) = config_map(objects);
        let config: toml::Table =
            toml::from_str(&text).unwrap_or_else(|e| panic!("{CONFIG_FILE} is not TOML: {e}"));
        let grace = config
            .get("shutdown_grace_s")
            .and_then(|v| v.as_float().or(v.as_integer().map(|i| i as f64)));
        ensure!(
            problems,
            grace.is_some(),
            "{CONFIG_FILE} sets shutdown_grace_s, which the pods' terminationGracePeriodSeconds follow"
        );
        for key in ["database_url", "broker_url", "confirm_secret"] {
            ensure!(
                problems,
                !config.contains_key(key),
                "{CONFIG_FILE} leaves {key} to the Secret"
            );
        }
        ensure!(
            problems,
            config
                .get("webhooks")
                .is_none_or(|w| w.get("secret").is_none()),
            "{CONFIG_FILE} leaves the webhook secret to the Secret"
        );
        let string = |key: &str, default: &str| {
            config
                .get(key)
                .and_then(toml::Value::as_str)
                .unwrap_or(default)
                .to_owned()
        };
        Fleet {
            objects,
            image: image(),
            grace: grace.unwrap_or(20.0),
            prefix: string("broker_prefix", "toolfleet"),
            listen: string("listen", "127.0.0.1:8080"),
            data_dir: string("data_dir", ".toolfleet"),
            config_map,
            text,
            config,
        }
    }
}

/// What is wrong with the fleet `objects` make, beyond the schemas: the
/// configuration each process reads, the probes, the grace of stopping
/// pods, the pools, their autoscalers and the queues those watch.
pub(crate) fn fleet_problems(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let fleet = Fleet::of(objects, &mut problems);
    let mut worker_pools = BTreeSet::new();
    let mut roles = BTreeMap::<String, usize>::new();
    for workload in objects
        .iter()
        .filter(|o| matches!(kind(o), "Deployment" | "Job"))
    {
        let Some((container, args)) = workload_problems(&fleet, workload, &mut problems) else {
            continue;
        };
        let role = args.first().cloned().unwrap_or_default();
        *roles.entry(role.clone()).or_default() += 1;
        match role.as_str() {
            "dispatcher" => dispatcher_problems(&fleet, workload, container, &mut problems),
            "worker" => {
                worker_pools.extend(worker_problems(
                    &fleet,
                    workload,
                    container,
                    &args,
                    &mut problems,
                ));
            }
            "migrate" => {
                let what = label(workload);
                let pod = &workload["spec"]["template"]["spec"];
                ensure!(
                    problems,
                    kind(workload) == "Job",
                    "{what}: migrations run as a Job"
                );
                ensure!(
                    problems,
                    pod["restartPolicy"] != "Always",
                    "{what}: runs once"
                );
                ensure!(
                    problems,
                    env_secret(container, "TOOLFLEET_DATABASE_URL").is_some(),
                    "{what}: TOOLFLEET_DATABASE_URL comes from a Secret"
                );
            }
            other => problems.push(format!(
                "{}: runs `toolfleet {other}`, not dispatcher, worker or migrate",
                label(workload)
            )),
        }
    }
    for role in ["dispatcher", "migrate"] {
        ensure!(
            problems,
            roles.get(role) == Some(&1),
            "one {role} workload, got {:?}",
            roles.get(role)
        );
    }
    let pools = configured_pools(&fleet.text, &fleet.config);
    ensure!(
        problems,
        worker_pools == pools,
        "worker Deployments run pools {worker_pools:?}; the configured tools run on {pools:?}"
    );
    for secret in of_kind(objects, "Secret") {
        for (key, value) in secret["stringData"].as_object().into_iter().flatten() {
            ensure!(
                problems,
                value.as_str().is_some_and(|v| v.contains(PLACEHOLDER)),
                "{}: {key} is a placeholder marked {PLACEHOLDER}, not a secret in the repository",
                label(secret)
            );
        }
    }
    // What deletes one overlay's autoscalers before the other is applied
    // (deploy/k8s/README.md) selects them all. KEDA copies a ScaledObject's
    // labels onto the HPA it makes, so `keda` on the ScaledObjects also
    // keeps the HPAs' command off KEDA's own.
    for (resources, kinds, value) in SWITCHES {
        for object in objects.iter().filter(|o| kinds.contains(&kind(o))) {
            ensure!(
                problems,
                object["metadata"]["labels"][AUTOSCALER_LABEL] == value,
                "{}: not labelled {AUTOSCALER_LABEL}={value}, which `{}` selects",
                label(object),
                switch_command(resources, value)
            );
        }
    }
    let (connections, parts) = postgres_connections(&fleet, &mut problems);
    ensure!(
        problems,
        connections <= POSTGRES_CONNECTIONS,
        "PostgreSQL connections: the fleet may hold {connections} at once ({}), over the {POSTGRES_CONNECTIONS} of max_connections deploy/k8s/README.md allows; lower database_pool or the most replicas, or put PgBouncer in front",
        parts.join(", ")
    );
    problems
}

/// The commands of deploy/k8s/README.md that delete one overlay's
/// autoscalers before switching to the other: the resources they name, the
/// kinds those are and the value of [`AUTOSCALER_LABEL`] they select.
pub(crate) const SWITCHES: [(&str, &[&str], &str); 2] = [
    ("hpa", &["HorizontalPodAutoscaler"], "hpa"),
    (
        "scaledobject,triggerauthentication",
        &["ScaledObject", "TriggerAuthentication"],
        "keda",
    ),
];

pub(crate) fn switch_command(resources: &str, value: &str) -> String {
    format!("kubectl -n toolfleet delete {resources} -l {AUTOSCALER_LABEL}={value}")
}

/// A workload's toolfleet containers: those naming TOOLFLEET_CONFIG.
pub(crate) fn toolfleet_containers(workload: &Value) -> Vec<&Value> {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| env(c, "TOOLFLEET_CONFIG").is_some())
        .collect()
}

/// The ScaledObjects and the HorizontalPodAutoscalers scaling a Deployment.
fn autoscalers<'a>(objects: &'a [Value], workload: &Value) -> (Vec<&'a Value>, Vec<&'a Value>) {
    let targets = |o: &&Value| {
        o["spec"]["scaleTargetRef"]["name"] == name(workload)
            && o["spec"]["scaleTargetRef"]["kind"]
                .as_str()
                .unwrap_or("Deployment")
                == "Deployment"
    };
    (
        of_kind(objects, "ScaledObject").filter(targets).collect(),
        of_kind(objects, "HorizontalPodAutoscaler")
            .filter(targets)
            .collect(),
    )
}

/// The most pods a Deployment runs at once: its autoscaler's maximum (KEDA's
/// default is 100), else its `replicas`; and the pods a rolling update adds
/// beyond that (`maxSurge`, by default 25 % rounded up).
fn most_pods(objects: &[Value], workload: &Value) -> (u64, u64) {
    let (scaled, hpas) = autoscalers(objects, workload);
    let most = scaled
        .iter()
        .map(|s| s["spec"]["maxReplicaCount"].as_u64().unwrap_or(100))
        .chain(
            hpas.iter()
                .map(|h| h["spec"]["maxReplicas"].as_u64().unwrap_or(0)),
        )
        .max()
        .unwrap_or_else(|| workload["spec"]["replicas"].as_u64().unwrap_or(1));
    let strategy = &workload["spec"]["strategy"];
    let of_most = |share: &str| {
        share
            .strip_suffix('%')
            .and_then(|p| p.trim().parse::<u64>().ok())
            .map(|p| (most * p).div_ceil(100))
    };
    let surge = if strategy["type"] == "Recreate" {
        0
    } else {
        match &strategy["rollingUpdate"]["maxSurge"] {
            Value::Number(n) => n.as_u64().unwrap_or(0),
            Value::String(share) => of_most(share.as_str()).unwrap_or(0),
            _ => of_most("25%").unwrap_or(0),
        }
    };
    (most, surge)
}

/// The most PostgreSQL connections the fleet may hold at once, and what
/// each workload adds: a dispatcher or worker pod its whole `database_pool`
/// (TOOLFLEET_DATABASE_POOL of its container, else the ConfigMap's), two
/// more with PostgreSQL notices (a listener and a publisher), at the most
/// pods its Deployment runs; `toolfleet migrate` one.
pub(crate) fn postgres_connections(
    fleet: &Fleet,
    problems: &mut Vec<String>,
) -> (u64, Vec<String>) {
    let mut total = 0;
    let mut parts = Vec::new();
    for workload in fleet
        .objects
        .iter()
        .filter(|o| matches!(kind(o), "Deployment" | "Job"))
    {
        let what = label(workload);
        let Some(container) = toolfleet_containers(workload).first().copied() else {
            continue;
        };
        let role = container["args"][0].as_str().unwrap_or_default();
        if role == "migrate" {
            let runs = workload["spec"]["parallelism"].as_u64().unwrap_or(1);
            total += runs;
            parts.push(format!("{what}: {runs}"));
            continue;
        }
        if !matches!(role, "dispatcher" | "worker" | "serve") {
            continue;
        }
        let from_file = fleet
            .config
            .get("database_pool")
            .and_then(toml::Value::as_integer)
            .and_then(|n| u64::try_from(n).ok());
        let pool = match env(container, "TOOLFLEET_DATABASE_POOL") {
            Some(entry) => entry["value"]
                .as_str()
                .and_then(|v| v.trim().parse::<u64>().ok()),
            None => from_file,
        };
        ensure!(
            problems,
            pool.is_some(),
            "{what}: database_pool is set (in {CONFIG_FILE}, or a number in TOOLFLEET_DATABASE_POOL), not left to the binary's default of {DEFAULT_DATABASE_POOL}"
        );
        let pool = pool.unwrap_or(DEFAULT_DATABASE_POOL);
        let notices = env_value(container, "TOOLFLEET_NOTICES")
            .or(fleet.config.get("notices").and_then(toml::Value::as_str));
        let listeners = if notices == Some("postgres") { 2 } else { 0 };
        let (most, surge) = most_pods(fleet.objects, workload);
        total += (most + surge) * (pool + listeners);
        parts.push(format!(
            "{what}: ({most} + {surge}) × ({pool} + {listeners})"
        ));
    }
    (total, parts)
}

/// The hosts the manifests' Services answer at in the cluster.
fn service_hosts(objects: &[Value]) -> BTreeSet<String> {
    let mut hosts = BTreeSet::new();
    for service in of_kind(objects, "Service") {
        let service_name = name(service);
        let namespace = service["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default");
        hosts.insert(service_name.to_owned());
        for suffix in ["", ".svc", ".svc.cluster.local"] {
            hosts.insert(format!("{service_name}.{namespace}{suffix}"));
        }
    }
    hosts
}

/// What every toolfleet workload must be: non-root, bounded, reading the
/// ConfigMap's file and Secrets that exist, running a command the binary
/// takes. Its toolfleet container and arguments, when it has one.
fn workload_problems<'o>(
    fleet: &Fleet,
    workload: &'o Value,
    problems: &mut Vec<String>,
) -> Option<(&'o Value, Vec<String>)> {
    let what = label(workload);
    let pod = &workload["spec"]["template"]["spec"];
    let ours = toolfleet_containers(workload);
    ensure!(
        problems,
        ours.len() == 1,
        "{what}: one toolfleet container (naming TOOLFLEET_CONFIG)"
    );
    let container = *ours.first()?;

    // Non-root, as the image's user, with nothing to escalate.
    ensure!(
        problems,
        pod["securityContext"]["runAsNonRoot"] == true,
        "{what}: runAsNonRoot"
    );
    let uid = container["securityContext"]["runAsUser"]
        .as_u64()
        .or(pod["securityContext"]["runAsUser"].as_u64());
    ensure!(
        problems,
        uid == Some(fleet.image.uid) && fleet.image.uid != 0,
        "{what}: runs as the image's non-root user {}",
        fleet.image.uid
    );
    let security = &container["securityContext"];
    ensure!(
        problems,
        security["allowPrivilegeEscalation"] == false,
        "{what}: allowPrivilegeEscalation: false"
    );
    ensure!(
        problems,
        security["capabilities"]["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|c| c == "ALL")),
        "{what}: drops every capability"
    );
    for (part, resource) in [
        ("requests", "cpu"),
        ("requests", "memory"),
        ("limits", "cpu"),
        ("limits", "memory"),
    ] {
        ensure!(
            problems,
            container["resources"][part][resource].is_string(),
            "{what}: resources.{part}.{resource}"
        );
    }

    // The configuration: TOOLFLEET_CONFIG is the ConfigMap's file.
    let config_path = env_value(container, "TOOLFLEET_CONFIG").unwrap_or_default();
    let (dir, file) = config_path.rsplit_once('/').unwrap_or_default();
    let volume_at = |path: &str| {
        let mount = container["volumeMounts"]
            .as_array()?
            .iter()
            .find(|m| m["mountPath"] == path)?;
        pod["volumes"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == mount["name"])
            .map(|v| (v, mount["readOnly"] == true))
    };
    ensure!(
        problems,
        file == CONFIG_FILE
            && volume_at(dir).is_some_and(|(v, _)| {
                v["configMap"]["name"] == fleet.config_map.as_str()
                    && v["configMap"]["items"].is_null()
            }),
        "{what}: TOOLFLEET_CONFIG ({config_path}) is the file of ConfigMap {}",
        fleet.config_map
    );
    // A read-only root leaves data_dir to a writable volume.
    if security["readOnlyRootFilesystem"] == true {
        ensure!(
            problems,
            volume_at(&fleet.data_dir).is_some_and(|(_, read_only)| !read_only),
            "{what}: data_dir {} is a writable volume under readOnlyRootFilesystem",
            fleet.data_dir
        );
    }
    // Every secret it reads exists.
    for entry in container["env"].as_array().into_iter().flatten() {
        let reference = &entry["valueFrom"]["secretKeyRef"];
        if let (Some(secret), Some(key)) = (reference["name"].as_str(), reference["key"].as_str()) {
            ensure!(
                problems,
                secret_value(fleet.objects, secret, key).is_some(),
                "{what}: {} reads key {key} of Secret {secret}, which is not there",
                entry["name"]
            );
        }
    }
    // A URL it names reaches a Service of these manifests, or is a
    // placeholder to replace.
    let hosts = service_hosts(fleet.objects);
    for entry in container["env"].as_array().into_iter().flatten() {
        let Some(value) = entry["value"].as_str() else {
            continue;
        };
        if let Some((_, host)) = url_parts(value) {
            ensure!(
                problems,
                hosts.contains(&host.to_ascii_lowercase()) || value.contains(PLACEHOLDER),
                "{what}: {} = {value} names {host}, which no Service of these manifests is: mark it {PLACEHOLDER}, as the Secret's placeholders are",
                entry["name"]
            );
        }
    }

    // Its arguments are a command the binary takes.
    let args: Vec<String> = container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    let mut with_help: Vec<&str> = args.iter().map(String::as_str).collect();
    with_help.push("--help");
    let out = toolfleet(&with_help);
    ensure!(
        problems,
        out.status.success(),
        "{what}: the binary refuses `toolfleet {}`: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    if matches!(
        args.first().map(String::as_str),
        Some("dispatcher" | "worker")
    ) {
        for variable in [
            "TOOLFLEET_DATABASE_URL",
            "TOOLFLEET_BROKER_URL",
            "TOOLFLEET_CONFIRM_SECRET",
        ] {
            ensure!(
                problems,
                env_secret(container, variable).is_some(),
                "{what}: {variable} comes from a Secret"
            );
        }
    }
    Some((container, args))
}

/// The pod template's annotations ask Prometheus to scrape /metrics on `port`.
fn scraped_on(workload: &Value, port: Option<u64>) -> bool {
    let annotations = &workload["spec"]["template"]["metadata"]["annotations"];
    port.is_some_and(|port| {
        annotations["prometheus.io/scrape"] == "true"
            && annotations["prometheus.io/port"] == port.to_string().as_str()
            && annotations["prometheus.io/path"] == METRICS
    })
}

/// The liveness and readiness probes ask LIVENESS and READINESS on `port`.
fn probe_problems(what: &str, container: &Value, port: Option<u64>, problems: &mut Vec<String>) {
    for (which, path) in [("livenessProbe", LIVENESS), ("readinessProbe", READINESS)] {
        let get = probe(container, which);
        ensure!(
            problems,
            get["path"] == path && port.is_some() && resolve_port(container, &get["port"]) == port,
            "{what}: {which} asks {path} on port {port:?}, not {} on {}",
            get["path"],
            get["port"]
        );
    }
}

/// The seconds a pod is given to stop.
fn termination_s(workload: &Value) -> f64 {
    workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_f64()
        .unwrap_or(30.0)
}

/// The `metrics_listen` of a container: its TOOLFLEET_METRICS_LISTEN, else
/// the configuration's; empty when neither sets it.
fn metrics_listen_of<'a>(fleet: &'a Fleet, container: &'a Value) -> &'a str {
    env_value(container, "TOOLFLEET_METRICS_LISTEN")
        .or(fleet
            .config
            .get("metrics_listen")
            .and_then(toml::Value::as_str))
        .unwrap_or_default()
}

fn dispatcher_problems(
    fleet: &Fleet,
    workload: &Value,
    container: &Value,
    problems: &mut Vec<String>,
) {
    let what = label(workload);
    let pod_labels = &workload["spec"]["template"]["metadata"]["labels"];
    let replicas = workload["spec"]["replicas"].as_u64().unwrap_or(1);
    ensure!(
        problems,
        kind(workload) == "Deployment",
        "{what}: dispatchers are a Deployment"
    );
    ensure!(problems, replicas >= 2, "{what}: two dispatchers or more");
    ensure!(
        problems,
        env_secret(container, "TOOLFLEET_WEBHOOK_SECRET").is_some(),
        "{what}: TOOLFLEET_WEBHOOK_SECRET comes from a Secret"
    );
    // The port it listens on: TOOLFLEET_LISTEN of the pod, else of the
    // image, else `listen`; all say the same.
    let effective = env_value(container, "TOOLFLEET_LISTEN")
        .or(fleet.image.env.get("TOOLFLEET_LISTEN").map(String::as_str))
        .unwrap_or(&fleet.listen);
    let port = port_of(effective);
    ensure!(
        problems,
        port.is_some() && port == port_of(&fleet.listen),
        "{what}: listens on the port of `listen` ({}), not {effective}",
        fleet.listen
    );
    probe_problems(&what, container, port, problems);
    // /metrics off the API port: on metrics_listen, beyond the loopback.
    let metrics = metrics_listen_of(fleet, container);
    let metrics_port = port_of(metrics);
    ensure!(
        problems,
        matches!(host_of(metrics), "0.0.0.0" | "[::]") && metrics_port != port,
        "{what}: metrics_listen ({metrics:?}, TOOLFLEET_METRICS_LISTEN) is set, reachable from the kubelet and off the API port"
    );
    ensure!(
        problems,
        scraped_on(workload, metrics_port),
        "{what}: Prometheus scrapes {METRICS} on port {metrics_port:?}"
    );
    // A blip of PostgreSQL or RabbitMQ fails every dispatcher's readiness at
    // once; if that took them out of the Service, it would have none.
    let readiness = &container["readinessProbe"];
    let unready_after = readiness["periodSeconds"].as_u64().unwrap_or(10)
        * readiness["failureThreshold"].as_u64().unwrap_or(3);
    ensure!(
        problems,
        unready_after >= READINESS_TOLERANCE_S,
        "{what}: the readinessProbe takes a dispatcher out of the Service after {unready_after} s of failures, under {READINESS_TOLERANCE_S} s: a blip of the servers would leave the Service without dispatchers"
    );
    let needed = pre_stop_s(container) + fleet.grace;
    let termination = termination_s(workload);
    ensure!(
        problems,
        termination >= needed,
        "{what}: terminationGracePeriodSeconds {termination} < preStop + shutdown_grace_s = {needed}"
    );
    let service =
        of_kind(fleet.objects, "Service").find(|s| selects(&s["spec"]["selector"], pod_labels));
    ensure!(
        problems,
        service.is_some_and(|s| s["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| resolve_port(container, &p["targetPort"]) == port)),
        "{what}: a Service reaches its listen port"
    );
    let budget = of_kind(fleet.objects, "PodDisruptionBudget")
        .find(|b| selects(&b["spec"]["selector"]["matchLabels"], pod_labels));
    ensure!(
        problems,
        budget.is_some_and(|b| b["spec"]["minAvailable"]
            .as_u64()
            .is_some_and(|m| m >= 1 && m < replicas)),
        "{what}: a PodDisruptionBudget keeps a dispatcher and lets a drain go on"
    );
}

/// The checks of a worker Deployment; the pool it runs.
fn worker_problems(
    fleet: &Fleet,
    workload: &Value,
    container: &Value,
    args: &[String],
    problems: &mut Vec<String>,
) -> Option<String> {
    let what = label(workload);
    ensure!(
        problems,
        kind(workload) == "Deployment",
        "{what}: workers are a Deployment"
    );
    ensure!(
        problems,
        workload["spec"]["replicas"].is_null(),
        "{what}: no replicas; the pool's autoscaler owns the count"
    );
    let pool = pool_of(&args[1..])
        .map_err(|e| problems.push(format!("{what}: {e}")))
        .ok()?;
    // /metrics, /healthz and /readyz of the worker: metrics_listen.
    let metrics = metrics_listen_of(fleet, container);
    ensure!(
        problems,
        matches!(host_of(metrics), "0.0.0.0" | "[::]"),
        "{what}: metrics_listen ({metrics:?}, TOOLFLEET_METRICS_LISTEN) is set and reachable from the kubelet"
    );
    let port = port_of(metrics);
    probe_problems(&what, container, port, problems);
    ensure!(
        problems,
        scraped_on(workload, port),
        "{what}: Prometheus scrapes {METRICS} on port {port:?}"
    );
    let needed = pre_stop_s(container) + fleet.grace + GRACE_MARGIN_S;
    let termination = termination_s(workload);
    ensure!(
        problems,
        termination >= needed,
        "{what}: terminationGracePeriodSeconds {termination} < shutdown_grace_s {} + {GRACE_MARGIN_S} s to hand back",
        fleet.grace
    );

    // One autoscaler per pool.
    let (scaled, hpas) = autoscalers(fleet.objects, workload);
    ensure!(
        problems,
        scaled.len() + hpas.len() == 1,
        "{what}: one autoscaler (ScaledObject or HorizontalPodAutoscaler), got {}",
        scaled.len() + hpas.len()
    );
    let concurrency = concurrency_of(&args[1..], &fleet.config);
    ensure!(
        problems,
        concurrency.is_some(),
        "{what}: its concurrency is set (`concurrency` of {CONFIG_FILE}, or --concurrency), which its ScaledObject's value follows"
    );
    let broker = env_secret(container, "TOOLFLEET_BROKER_URL");
    for so in scaled {
        scaled_object_problems(fleet, so, &pool, concurrency, broker.as_ref(), problems);
    }
    for hpa in hpas {
        let spec = &hpa["spec"];
        let min = spec["minReplicas"].as_u64().unwrap_or(1);
        ensure!(
            problems,
            spec["scaleTargetRef"]["apiVersion"] == "apps/v1"
                && min >= 1
                && spec["maxReplicas"].as_u64().is_some_and(|max| max >= min),
            "{}: targets apps/v1 Deployment {} with 1 <= minReplicas <= maxReplicas",
            label(hpa),
            name(workload)
        );
    }
    Some(pool)
}

/// The jobs a worker runs at once: `--concurrency N` of its arguments, else
/// `concurrency` of the configuration; None if neither sets it.
fn concurrency_of(args: &[String], config: &toml::Table) -> Option<u64> {
    let mut given = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg == "--concurrency" {
            given = rest.next().map(|v| v.parse().ok());
        } else if let Some(value) = arg.strip_prefix("--concurrency=") {
            given = Some(value.parse().ok());
        }
    }
    match given {
        Some(parsed) => parsed,
        None => config
            .get("concurrency")
            .and_then(toml::Value::as_integer)
            .and_then(|n| u64::try_from(n).ok()),
    }
}

/// A ScaledObject of `pool` counts the pool's jobs, running and waiting:
/// the pool's queue, through RabbitMQ's management API, whose count
/// includes the messages workers hold unacknowledged (a worker's prefetch
/// is its `concurrency` and its `prefetch_ahead`: jobs running and jobs
/// at hand, all of them jobs of the pool). KEDA's HPA keeps
/// ceil(count / value) workers, so `value` is the workers' `concurrency`.
/// The API's URL comes through a TriggerAuthentication from the Secret
/// the workers read their broker URL (`broker`) from, on the same vhost.
fn scaled_object_problems(
    fleet: &Fleet,
    so: &Value,
    pool: &str,
    concurrency: Option<u64>,
    broker: Option<&(String, String)>,
    problems: &mut Vec<String>,
) {
    let what = label(so);
    let spec = &so["spec"];
    let min = spec["minReplicaCount"].as_u64().unwrap_or(0);
    let max = spec["maxReplicaCount"].as_u64().unwrap_or(100);
    ensure!(
        problems,
        min >= 1 && max >= min,
        "{what}: 1 <= minReplicaCount <= maxReplicaCount (from zero, a job waits for KEDA's poll and a pod's start)"
    );
    let triggers: Vec<&Value> = spec["triggers"].as_array().into_iter().flatten().collect();
    ensure!(
        problems,
        !triggers.is_empty() && triggers.iter().all(|t| t["type"] == "rabbitmq"),
        "{what}: rabbitmq triggers"
    );
    let queue = toolfleet_broker::rabbit::pool_queue_name(&fleet.prefix, pool);
    for trigger in triggers {
        let metadata = &trigger["metadata"];
        ensure!(
            problems,
            metadata["queueName"] == queue.as_str(),
            "{what}: queueName {} is not {queue}, the queue of pool {pool} under broker_prefix {}",
            metadata["queueName"],
            fleet.prefix
        );
        ensure!(
            problems,
            metadata["mode"] == "QueueLength",
            "{what}: scales on the queue's length"
        );
        ensure!(
            problems,
            metadata["protocol"] == "http",
            "{what}: protocol {} is not http: over AMQP KEDA counts the waiting jobs only, not the running ones workers hold unacknowledged, and shrinks a busy pool",
            metadata["protocol"]
        );
        ensure!(
            problems,
            metadata["excludeUnacknowledged"]
                .as_str()
                .is_none_or(|v| !v.trim().eq_ignore_ascii_case("true")),
            "{what}: excludeUnacknowledged leaves the running jobs out of the count"
        );
        let value = metadata["value"]
            .as_str()
            .and_then(|v| v.trim().parse::<u64>().ok());
        ensure!(
            problems,
            value.is_some() && value == concurrency,
            "{what}: value {} is not the concurrency its workers run with ({concurrency:?}); KEDA keeps ceil(jobs / value) workers",
            metadata["value"]
        );
        ensure!(
            problems,
            metadata["host"].is_null() && metadata["hostFromEnv"].is_null(),
            "{what}: the broker's URL comes from the TriggerAuthentication, not the trigger"
        );
        let auth_name = trigger["authenticationRef"]["name"]
            .as_str()
            .unwrap_or_default();
        let host = find(fleet.objects, "TriggerAuthentication", auth_name).and_then(|a| {
            let reference = a["spec"]["secretTargetRef"]
                .as_array()?
                .iter()
                .find(|r| r["parameter"] == "host")?;
            Some((
                reference["name"].as_str()?.to_owned(),
                reference["key"].as_str()?.to_owned(),
            ))
        });
        ensure!(
            problems,
            host.as_ref().is_some_and(|(secret, key)| {
                key == MANAGEMENT_URL_KEY && broker.is_some_and(|(workers, _)| workers == secret)
            }),
            "{what}: TriggerAuthentication {auth_name:?} gives `host` from {MANAGEMENT_URL_KEY} of the Secret the workers read their broker from ({broker:?}), not {host:?}"
        );
        let Some(url) = host.and_then(|(secret, key)| secret_value(fleet.objects, &secret, &key))
        else {
            continue;
        };
        let scheme = url_parts(&url).map(|(scheme, _)| scheme);
        ensure!(
            problems,
            matches!(scheme, Some("http" | "https")),
            "{what}: {MANAGEMENT_URL_KEY} ({url}) is the http(s) URL of RabbitMQ's management API"
        );
        let workers = broker
            .and_then(|(secret, key)| secret_value(fleet.objects, secret, key))
            .map(|url| vhost_of(&url));
        ensure!(
            problems,
            workers.as_deref() == Some(vhost_of(&url).as_str()),
            "{what}: {MANAGEMENT_URL_KEY} ({url}) names vhost {:?}, not that of the workers' broker URL ({workers:?})",
            vhost_of(&url)
        );
    }
}

// -------------------------------------------------------------- processes

/// Waits for `child` to exit, at most `limit`; kills it past that.
pub(crate) fn exit_within(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "toolfleet still ran after {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// A `toolfleet` process of these tests, killed when dropped.
pub(crate) struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `toolfleet --config <config> <args>` with `env`, and waits for
/// the stderr line starting with `ready`: (the process, the rest of it).
pub(crate) fn start(
    config: &Path,
    args: &[String],
    env: &[(&str, String)],
    ready: &str,
) -> (Process, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolfleet"))
        .env_remove("TOOLFLEET_CONFIG")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolfleet starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    let rest = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(rest) = line.strip_prefix(ready) {
                    break rest.to_owned();
                }
                said.push(line);
            }
            _ => {
                let _ = child.kill();
                panic!(
                    "`toolfleet {}` exited before `{ready}`:\n{}",
                    args.join(" "),
                    said.join("\n")
                );
            }
        }
    };
    std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
    (Process(child), rest)
}

/// `GET path` on `address`: the status and the body.
fn http_get(address: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut stream =
        TcpStream::connect_timeout(&address, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not HTTP: {answer}"))?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// `GET path` until it answers 200, for at most `limit`.
pub(crate) fn get_ok(address: SocketAddr, path: &str, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let outcome = http_get(address, path);
        match &outcome {
            Ok((200, body)) => return body.clone(),
            _ if start.elapsed() > limit => panic!("GET {path} on {address}: {outcome:?}"),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The httpGet paths of a container's liveness and readiness probes.
pub(crate) fn probe_paths(container: &Value) -> Vec<String> {
    ["livenessProbe", "readinessProbe"]
        .iter()
        .map(|p| {
            container[p]["httpGet"]["path"]
                .as_str()
                .expect("an httpGet probe")
                .to_owned()
        })
        .collect()
}

/// The httpGet of a container's probe `which`.
fn probe<'a>(container: &'a Value, which: &str) -> &'a Value {
    &container[which]["httpGet"]
}

pub(crate) fn first_container(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]["containers"][0]
}

pub(crate) fn first_container_mut(workload: &mut Value) -> &mut Value {
    &mut workload["spec"]["template"]["spec"]["containers"][0]
}

pub(crate) fn string_args(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The rendered overlay `wanted`.
pub(crate) fn overlay(wanted: &str) -> Option<Vec<Value>> {
    let overlays = render_overlays(&repo().join(K8S))?;
    Some(
        overlays
            .into_iter()
            .find(|(name, _)| name == wanted)
            .unwrap_or_else(|| panic!("no overlay {wanted}"))
            .1,
    )
}
