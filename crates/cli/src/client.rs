//! The client commands: `toolfleet tools`, `call`, `inbox`, `answer`,
//! `approve`, `reject` and `run`, over the HTTP API of a running server.

use std::fmt::Write as _;
use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::config::Config;
use crate::keys::DEV_TOKEN_FILE;

/// Where the server is and who we are.
#[derive(clap::Args)]
pub(crate) struct ServerArgs {
    /// The server (default: http:// and the `listen` address of the configuration).
    #[arg(long, env = "TOOLFLEET_URL")]
    server: Option<String>,
    /// The bearer token (default: the development token in the data directory).
    #[arg(long, env = "TOOLFLEET_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    fn new(config: &Config, args: &ServerArgs) -> Result<Client, String> {
        let base = args
            .server
            .clone()
            .unwrap_or_else(|| format!("http://{}", config.listen))
            .trim_end_matches('/')
            .to_owned();
        let token = match &args.token {
            Some(token) => token.clone(),
            None => std::fs::read_to_string(config.data_dir.join(DEV_TOKEN_FILE))
                .map(|t| t.trim().to_owned())
                .map_err(|_| "no token: pass --token or set TOOLFLEET_TOKEN (serve prints a development token at start)".to_owned())?,
        };
        let http = toolfleet_executors::http_client()?;
        Ok(Client { http, base, token })
    }

    /// Sends with the token; a transport failure says what to check.
    async fn connect(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, String> {
        request.bearer_auth(&self.token).send().await.map_err(|e| {
            if e.is_connect() {
                format!(
                    "cannot reach toolfleet at {}: is `toolfleet serve` running there?",
                    self.base
                )
            } else {
                format!("request to {} failed: {e}", self.base)
            }
        })
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, String> {
        let response = self.connect(request).await?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| format!("reading the answer failed: {e}"))?;
        serde_json::from_str(&text).map_err(|_| {
            format!(
                "the server answered {status} with a body that is not JSON: {}",
                text.chars().take(200).collect::<String>()
            )
        })
    }

    async fn get(&self, path: &str) -> Result<Value, String> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json")
            .body(body.to_string());
        self.send(request).await
    }
}

fn print(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// An `error` envelope as this command's failure.
fn outcome(envelope: &Value) -> Result<(), String> {
    match envelope["status"].as_str() {
        Some("error") => Err(format!(
            "{}: {}",
            envelope["error"]["code"].as_str().unwrap_or("error"),
            envelope["error"]["message"].as_str().unwrap_or("")
        )),
        _ => Ok(()),
    }
}

pub(crate) async fn tools(config: &Config, args: &ServerArgs, format: &str) -> Result<(), String> {
    let client = Client::new(config, args)?;
    let specs = client.get(&format!("/v1/tools?format={format}")).await?;
    print(&specs);
    outcome(&specs)
}

pub(crate) async fn call(
    config: &Config,
    args: &ServerArgs,
    mut call: Value,
    json_args: &str,
    wait: bool,
) -> Result<(), String> {
    let parsed: Value =
        serde_json::from_str(json_args).map_err(|e| format!("the arguments are not JSON: {e}"))?;
    let client = Client::new(config, args)?;
    call["args"] = parsed;
    let mut envelope = client.post("/v1/calls", &call).await?;
    if wait && envelope["status"] == "running" {
        envelope = wait_for(&client, &envelope).await?;
    }
    print(&envelope);
    outcome(&envelope)
}

/// The most calls one request carries (the server's bound).
const BATCH: usize = 1000;

/// The calls of a batch file: a JSON array of call objects, or one call
/// object a line (blank lines skipped).
fn batch_calls(text: &str) -> Result<Vec<Value>, String> {
    let calls = match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(calls)) => calls,
        Ok(one @ Value::Object(_)) => vec![one],
        Ok(_) => {
            return Err(
                "the batch file holds no calls: give a JSON array of calls, or one call a line"
                    .to_owned(),
            );
        }
        Err(_) => text
            .lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(n, line)| {
                serde_json::from_str::<Value>(line)
                    .map_err(|e| format!("line {} of the batch file is not JSON: {e}", n + 1))
            })
            .collect::<Result<_, _>>()?,
    };
    if let Some(n) = calls
        .iter()
        .position(|c| !c.get("tool").is_some_and(Value::is_string))
    {
        return Err(format!("call {} of the batch file names no `tool`", n + 1));
    }
    Ok(calls)
}

/// `toolfleet call --batch FILE`: every call of the file, 1,000 a request,
/// each envelope printed on a line of its own, in order; fails when any
/// call answered an error.
pub(crate) async fn call_batch(
    config: &Config,
    args: &ServerArgs,
    file: &std::path::Path,
) -> Result<(), String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let calls = batch_calls(&text)?;
    let client = Client::new(config, args)?;
    let mut errors = 0usize;
    for chunk in calls.chunks(BATCH) {
        let answer = client.post("/v1/calls", &json!({"calls": chunk})).await?;
        let Some(results) = answer["results"].as_array() else {
            outcome(&answer)?;
            return Err("the server answered no results for the batch".to_owned());
        };
        for envelope in results {
            errors += usize::from(envelope["status"] == "error");
            println!("{envelope}");
        }
    }
    eprintln!("{} calls, {errors} answered an error", calls.len());
    if errors > 0 {
        return Err(format!(
            "{errors} of {} calls answered an error",
            calls.len()
        ));
    }
    Ok(())
}

/// Long-polls a job until it settles, with a progress line on stderr.
async fn wait_for(client: &Client, running: &Value) -> Result<Value, String> {
    let job_id = running["job_id"]
        .as_str()
        .ok_or("the running answer has no job_id")?
        .to_owned();
    let started = Instant::now();
    let spinner = ['|', '/', '-', '\\'];
    let mut turn = 0usize;
    loop {
        let envelope = client.get(&format!("/v1/jobs/{job_id}?wait_s=1")).await?;
        if envelope["status"] != "running" {
            eprint!("\r\x1b[2K");
            return Ok(envelope);
        }
        let state = envelope["state"].as_str().unwrap_or("queued");
        let attempts = envelope["attempts"].as_u64().unwrap_or(0);
        eprint!(
            "\r\x1b[2K{} job {job_id}: {state}, attempt {attempts}, {:.0} s",
            spinner[turn % spinner.len()],
            started.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().flush();
        turn += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Percent-encodes a query value: RFC 3986's unreserved characters stay.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// An id as one path segment, encoded; `.`, `..` and nothing are refused
/// (a URL would take them as a move in the path, not as a name).
fn segment(id: &str) -> Result<String, String> {
    if matches!(id, "" | "." | "..") {
        return Err(format!("`{id}` is not an id"));
    }
    Ok(encode(id))
}

/// `?name=value&...` of the parameters that are set, or nothing.
fn query(params: &[(&str, Option<&str>)]) -> String {
    let pairs: Vec<String> = params
        .iter()
        .filter_map(|(name, value)| value.map(|value| format!("{name}={}", encode(value))))
        .collect();
    if pairs.is_empty() {
        String::new()
    } else {
        format!("?{}", pairs.join("&"))
    }
}

/// A JSON value on one line, cut to `max` characters.
fn compact(value: &Value, max: usize) -> String {
    let text = value.to_string();
    if text.chars().count() <= max {
        text
    } else {
        text.chars().take(max).chain(['…']).collect()
    }
}

/// A string as it is, anything else as compact JSON cut to `max` characters.
fn text_of(value: &Value, max: usize) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => compact(other, max),
    }
}

/// A list as `[a, b]`: strings unquoted, anything else as JSON.
fn list(value: &Value) -> String {
    let items: Vec<String> = value
        .as_array()
        .map(|items| items.iter().map(|item| text_of(item, 100)).collect())
        .unwrap_or_default();
    format!("[{}]", items.join(", "))
}

/// ANSWER as the contract takes it: JSON, or else the text as a string.
fn parse_answer(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// The most pages `inbox` reads (the server sends 50 tickets a page).
const INBOX_PAGES: usize = 20;

/// `toolfleet inbox`: the tickets the caller may answer, newest first.
pub(crate) async fn inbox(
    config: &Config,
    args: &ServerArgs,
    state: Option<&str>,
    kind: Option<&str>,
    as_json: bool,
) -> Result<(), String> {
    let client = Client::new(config, args)?;
    let mut tickets = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..INBOX_PAGES {
        let params = [
            ("state", state),
            ("kind", kind),
            ("cursor", cursor.as_deref()),
        ];
        let envelope = client
            .get(&format!("/v1/tickets{}", query(&params)))
            .await?;
        if envelope["status"] != "ok" {
            print(&envelope);
            outcome(&envelope)?;
            return Err("the inbox answered no `ok` envelope".to_owned());
        }
        if let Some(page) = envelope["result"]["tickets"].as_array() {
            tickets.extend(page.iter().cloned());
        }
        cursor = envelope["result"]["next_cursor"]
            .as_str()
            .map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    if cursor.is_some() {
        eprintln!(
            "toolfleet: the inbox holds more than {INBOX_PAGES} pages; these are its newest {} tickets",
            tickets.len()
        );
    }
    if as_json {
        print(&Value::Array(tickets));
    } else if tickets.is_empty() {
        eprintln!("no tickets");
    } else {
        for ticket in &tickets {
            println!("{}", ticket_line(ticket));
        }
    }
    Ok(())
}

/// One ticket on one line: id, kind, state, tool, the question and its
/// options (or the approval's plan), the run and the expiry.
fn ticket_line(ticket: &Value) -> String {
    let field = |name: &str| ticket[name].as_str().unwrap_or("-").to_owned();
    let kind = ticket["kind"].as_str().unwrap_or("question");
    let mut line = format!(
        "{}  {kind}  {}  {}",
        field("ticket"),
        field("state"),
        field("tool")
    );
    if kind == "approval" {
        let _ = write!(line, "  plan={}", compact(&ticket["plan"], 160));
    } else if kind == "input" {
        // A job's questions to its MCP client, by key: those not answered yet.
        let _ = write!(line, "  pending={}", list(&ticket["pending"]));
    } else {
        let _ = write!(line, "  {}", ticket["question"]);
        if ticket["options"].as_array().is_some_and(|o| !o.is_empty()) {
            let _ = write!(line, "  options={}", list(&ticket["options"]));
        }
    }
    let _ = write!(line, "  run={}", field("run_id"));
    if !ticket["expires_at"].is_null() {
        let _ = write!(line, "  expires_at={}", ticket["expires_at"]);
    }
    if !ticket["answer"].is_null() {
        let _ = write!(line, "  answer={}", compact(&ticket["answer"], 100));
    }
    line
}

/// `toolfleet answer TICKET ANSWER`.
pub(crate) async fn answer(
    config: &Config,
    args: &ServerArgs,
    ticket: &str,
    answer: &str,
) -> Result<(), String> {
    let body = json!({"answer": parse_answer(answer)});
    decide(config, args, ticket, "answer", &body).await
}

/// `toolfleet approve TICKET`: fails, too, when the approved commit did.
pub(crate) async fn approve(
    config: &Config,
    args: &ServerArgs,
    ticket: &str,
) -> Result<(), String> {
    decide(config, args, ticket, "approve", &json!({})).await
}

/// `toolfleet reject TICKET [--reason TEXT]`.
pub(crate) async fn reject(
    config: &Config,
    args: &ServerArgs,
    ticket: &str,
    reason: Option<&str>,
) -> Result<(), String> {
    let body = match reason {
        Some(reason) => json!({"reason": reason}),
        None => json!({}),
    };
    decide(config, args, ticket, "reject", &body).await
}

/// Posts `body` to `/v1/tickets/{ticket}/{verb}` and prints the envelope.
async fn decide(
    config: &Config,
    args: &ServerArgs,
    ticket: &str,
    verb: &str,
    body: &Value,
) -> Result<(), String> {
    let client = Client::new(config, args)?;
    let path = format!("/v1/tickets/{}/{verb}", segment(ticket)?);
    let envelope = client.post(&path, body).await?;
    print(&envelope);
    outcome(&envelope)?;
    if verb == "approve" {
        outcome(&envelope["result"]["outcome"])
            .map_err(|e| format!("approved, but the commit answered {e}"))?;
    }
    Ok(())
}

/// The states a run stops in (`answered` until the user's next message).
const SETTLED: [&str; 4] = ["answered", "failed", "budget_exceeded", "cancelled"];

/// How long the run's event stream may stay silent (it sends keep-alives)
/// before the run is polled instead.
const STREAM_IDLE: Duration = Duration::from_secs(60);

/// `toolfleet run AGENT INPUT [--wait]`.
pub(crate) async fn run(
    config: &Config,
    args: &ServerArgs,
    agent: &str,
    input: &str,
    wait: bool,
) -> Result<(), String> {
    let client = Client::new(config, args)?;
    let envelope = client
        .post("/v1/runs", &json!({"agent": agent, "input": input}))
        .await?;
    let run_id = envelope["result"]["run_id"].as_str().map(str::to_owned);
    if !wait || envelope["status"] != "ok" {
        if let Some(run_id) = &run_id {
            eprintln!("run {run_id}");
        }
        print(&envelope);
        return outcome(&envelope);
    }
    let run_id = run_id.ok_or("the run's answer has no run_id")?;
    println!("run {run_id}");
    let path = format!("/v1/runs/{}", segment(&run_id)?);
    let mut watch = Watch::default();
    emit(watch.catch_up(&envelope["result"]));
    if !watch.settled()
        && let Err(why) = follow(&client, &path, &mut watch).await
    {
        eprintln!("toolfleet: {why}; polling the run every second");
    }
    let run = loop {
        let envelope = client.get(&path).await?;
        if envelope["status"] != "ok" {
            print(&envelope);
            outcome(&envelope)?;
            return Err("reading the run answered no `ok` envelope".to_owned());
        }
        emit(watch.catch_up(&envelope["result"]));
        if watch.settled() {
            break envelope["result"].clone();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    conclude(&run)
}

fn emit(lines: Vec<String>) {
    for line in lines {
        println!("{line}");
    }
    let _ = std::io::stdout().flush();
}

/// Prints the run's steps from `GET {path}/events` until the run settles;
/// an error when the stream cannot be had, fails, ends or goes silent first.
async fn follow(client: &Client, path: &str, watch: &mut Watch) -> Result<(), String> {
    let request = client
        .http
        .get(format!("{}{path}/events", client.base))
        .header("Accept", "text/event-stream");
    let mut response = client.connect(request).await?;
    if !response.status().is_success() {
        return Err(format!(
            "the run's event stream answered {}",
            response.status()
        ));
    }
    // The steps made before the stream began.
    let run = client.get(path).await?;
    emit(watch.catch_up(&run["result"]));
    let mut parser = SseParser::default();
    while !watch.settled() {
        let chunk = tokio::time::timeout(STREAM_IDLE, response.chunk())
            .await
            .map_err(|_| {
                format!(
                    "the run's event stream was silent {} s",
                    STREAM_IDLE.as_secs()
                )
            })?
            .map_err(|e| format!("the run's event stream failed: {e}"))?
            .ok_or("the run's event stream ended")?;
        for event in parser.feed(&chunk)? {
            emit(watch.on_event(&event));
        }
    }
    Ok(())
}

/// Prints how a settled run ended: its answer, else its error (and fails).
fn conclude(run: &Value) -> Result<(), String> {
    let state = run["state"].as_str().unwrap_or("?");
    if state == "answered" {
        println!("answer: {}", text_of(&run["answer"], 2000));
        return Ok(());
    }
    if !run["error"].is_null() {
        println!("error: {}", compact(&run["error"], 2000));
    }
    Err(format!(
        "the run ended {state}{}",
        run["error"]["code"]
            .as_str()
            .map(|code| format!(" ({code})"))
            .unwrap_or_default()
    ))
}

/// What of a run `--wait` has printed: the transcript entries by position,
/// the newest version seen and the run's state.
#[derive(Default)]
struct Watch {
    printed: usize,
    version: Option<u64>,
    state: String,
}

impl Watch {
    /// The lines of the entries of a run (as `GET` shows it) not printed yet.
    fn catch_up(&mut self, run: &Value) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(transcript) = run["transcript"].as_array() {
            lines.extend(transcript.iter().skip(self.printed).map(entry_line));
            self.printed = self.printed.max(transcript.len());
        }
        if let Some(version) = run["version"].as_u64() {
            self.version = Some(self.version.map_or(version, |known| known.max(version)));
        }
        if let Some(state) = run["state"].as_str() {
            state.clone_into(&mut self.state);
        }
        lines
    }

    /// The lines of one event of the run's stream: its new entries, unless
    /// a read of the run of that version or later showed them already.
    fn on_event(&mut self, event: &SseEvent) -> Vec<String> {
        let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
            return Vec::new();
        };
        let version = data["version"].as_u64();
        if let (Some(version), Some(known)) = (version, self.version)
            && version <= known
        {
            return Vec::new();
        }
        let entries = data["entries"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        self.printed += entries.len();
        if version.is_some() {
            self.version = version;
        }
        match data["state"].as_str() {
            Some(state) => state.clone_into(&mut self.state),
            None => {
                if let Some(state) = event.event.strip_prefix("run.") {
                    state.clone_into(&mut self.state);
                }
            }
        }
        entries.iter().map(entry_line).collect()
    }

    fn settled(&self) -> bool {
        SETTLED.contains(&self.state.as_str())
    }
}

/// One transcript entry as a line: `user: ...`, `model: ... calls: name(args)`,
/// `tool_call name -> status`, `wait jobs=[..] tickets=[..]`, `resume`.
fn entry_line(entry: &Value) -> String {
    let kind = entry["type"].as_str().unwrap_or("?");
    match kind {
        "user" => format!("user: {}", text_of(&entry["content"], 2000)),
        "model" => {
            let mut line = "model:".to_owned();
            if let Some(text) = entry["text"].as_str() {
                line.push(' ');
                line.push_str(text);
            }
            let calls: Vec<String> = entry["calls"]
                .as_array()
                .map(|calls| {
                    calls
                        .iter()
                        .map(|call| {
                            format!(
                                "{}({})",
                                call["name"].as_str().unwrap_or("?"),
                                compact(&call["args"], 200)
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            if !calls.is_empty() {
                let _ = write!(line, " calls: {}", calls.join(", "));
            }
            line
        }
        "tool_call" | "tool_result" => format!(
            "{kind} {} -> {}",
            entry["tool"]
                .as_str()
                .or(entry["call_id"].as_str())
                .unwrap_or("?"),
            envelope_summary(&entry["envelope"])
        ),
        "wait" => format!(
            "wait jobs={} tickets={}",
            list(&entry["jobs"]),
            list(&entry["tickets"])
        ),
        "resume" => "resume".to_owned(),
        other => format!("{other}: {}", compact(entry, 200)),
    }
}

/// An envelope's status, with the job, ticket or error code it names.
fn envelope_summary(envelope: &Value) -> String {
    let status = envelope["status"].as_str().unwrap_or("?");
    let detail = match status {
        "running" => envelope["job_id"].as_str().map(|id| format!("job={id}")),
        "suspended" => envelope["ticket"].as_str().map(|id| format!("ticket={id}")),
        "error" => envelope["error"]["code"].as_str().map(str::to_owned),
        _ => None,
    };
    match detail {
        Some(detail) => format!("{status} {detail}"),
        None => status.to_owned(),
    }
}

/// One Server-Sent Event: its `event` name (`message` when it names
/// none), its `data` lines joined by newlines, and the last `id` seen.
#[derive(Debug, PartialEq)]
struct SseEvent {
    event: String,
    data: String,
    id: Option<String>,
}

/// The most bytes one event may hold before the stream is given up.
const SSE_EVENT_BYTES: usize = 16 << 20;

/// Server-Sent Events from a byte stream, fed in chunks that may split a
/// line (or a character) anywhere. Lines end in LF, CRLF or CR; comments,
/// `retry` and unknown fields are skipped; an event without data is none.
#[derive(Default)]
struct SseParser {
    line: Vec<u8>,
    after_cr: bool,
    event: Option<String>,
    data: Option<String>,
    id: Option<String>,
    held: usize,
}

impl SseParser {
    fn feed(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, String> {
        let mut events = Vec::new();
        for &byte in bytes {
            if std::mem::take(&mut self.after_cr) && byte == b'\n' {
                continue;
            }
            if byte == b'\r' || byte == b'\n' {
                self.after_cr = byte == b'\r';
                events.extend(self.end_line());
                continue;
            }
            self.line.push(byte);
            self.held += 1;
            if self.held > SSE_EVENT_BYTES {
                return Err(format!(
                    "an event of the stream is over {SSE_EVENT_BYTES} bytes"
                ));
            }
        }
        Ok(events)
    }

    fn end_line(&mut self) -> Option<SseEvent> {
        let line = String::from_utf8_lossy(&std::mem::take(&mut self.line)).into_owned();
        if line.is_empty() {
            self.held = 0;
            let event = self.event.take();
            let data = self.data.take()?;
            return Some(SseEvent {
                event: event.unwrap_or_else(|| "message".to_owned()),
                data,
                id: self.id.clone(),
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_str(), ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            _ => {}
        }
        None
    }
}

/// What `toolfleet jobs retry` puts back: one job, or those a filter names.
pub(crate) struct RetryWhat<'a> {
    pub job_id: Option<&'a str>,
    pub tool: Option<&'a str>,
    pub state: Option<&'a str>,
    pub error_code: Option<&'a str>,
    pub since: Option<i64>,
    pub until: Option<i64>,
    pub limit: Option<u32>,
}

/// `toolfleet jobs list`: the caller's jobs (the tenant's for an operator),
/// newest first, one a line (`--json`: the API's page), with the filters of
/// `GET /v1/jobs`.
pub(crate) async fn jobs_list(
    config: &Config,
    args: &ServerArgs,
    state: Option<&str>,
    tool: Option<&str>,
    limit: Option<u32>,
    as_json: bool,
) -> Result<(), String> {
    let client = Client::new(config, args)?;
    let limit = limit.map(|n| n.to_string());
    let params = [
        ("state", state),
        ("tool", tool),
        ("limit", limit.as_deref()),
    ];
    let page = client.get(&format!("/v1/jobs{}", query(&params))).await?;
    if page["status"] == "error" {
        print(&page);
        return outcome(&page);
    }
    if as_json {
        print(&page);
        return Ok(());
    }
    let jobs = page["jobs"].as_array().cloned().unwrap_or_default();
    if jobs.is_empty() {
        println!(
            "no jobs{}",
            if state.or(tool).is_some() {
                " match"
            } else {
                ""
            }
        );
    }
    for job in &jobs {
        println!(
            "{}  {:<10} {:<24} attempts {}",
            job["job_id"].as_str().unwrap_or("?"),
            job["state"].as_str().unwrap_or("?"),
            job["tool"].as_str().unwrap_or("?"),
            job["attempts"]
        );
    }
    Ok(())
}

/// `toolfleet jobs show JOB_ID`: the job's `get_job` envelope.
pub(crate) async fn job_show(config: &Config, args: &ServerArgs, id: &str) -> Result<(), String> {
    let client = Client::new(config, args)?;
    let envelope = client.get(&format!("/v1/jobs/{}", segment(id)?)).await?;
    print(&envelope);
    match envelope["error"]["code"].as_str() {
        // A failed or cancelled job is shown, not this command's failure.
        Some("not_found" | "forbidden" | "unauthenticated" | "unavailable") => outcome(&envelope),
        _ => Ok(()),
    }
}

/// `toolfleet jobs cancel JOB_ID`: the job's envelope once cancelled.
pub(crate) async fn job_cancel(config: &Config, args: &ServerArgs, id: &str) -> Result<(), String> {
    let client = Client::new(config, args)?;
    let path = format!("/v1/jobs/{}/cancel", segment(id)?);
    let envelope = client.post(&path, &json!({})).await?;
    print(&envelope);
    if envelope["state"] == "cancelled" {
        return Ok(());
    }
    outcome(&envelope)
}

/// `toolfleet jobs retry`: one job put back (its envelope), or those a
/// filter names (how many, and their ids).
pub(crate) async fn jobs_retry(
    config: &Config,
    args: &ServerArgs,
    what: RetryWhat<'_>,
) -> Result<(), String> {
    let client = Client::new(config, args)?;
    if let Some(id) = what.job_id {
        let path = format!("/v1/jobs/{}/retry", segment(id)?);
        let envelope = client.post(&path, &json!({})).await?;
        print(&envelope);
        return outcome(&envelope);
    }
    // The filters given; the server's defaults for the others.
    let mut filter = json!({
        "tool": what.tool, "state": what.state, "error_code": what.error_code,
        "since": what.since, "until": what.until, "limit": what.limit,
    });
    if let Some(given) = filter.as_object_mut() {
        given.retain(|_, value| !value.is_null());
    }
    let answer = client.post("/v1/jobs/retry", &filter).await?;
    print(&answer);
    outcome(&answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch file is a JSON array of calls or one call a line; each
    /// names its tool, and a line that is not JSON is named.
    #[test]
    fn a_batch_file_is_an_array_or_lines_of_calls() {
        let array = r#"[{"tool": "a", "args": {}}, {"tool": "b"}]"#;
        let tools = |calls: Vec<Value>| -> Vec<String> {
            calls
                .iter()
                .map(|c| c["tool"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(tools(batch_calls(array).unwrap()), ["a", "b"]);
        let lines = "{\"tool\": \"a\"}\n\n{\"tool\": \"b\", \"idempotency_key\": \"k\"}\n";
        assert_eq!(tools(batch_calls(lines).unwrap()), ["a", "b"]);
        let broken = "{\"tool\": \"a\"}\n{nope\n";
        assert!(batch_calls(broken).unwrap_err().contains("line 2"));
        let toolless = r#"[{"tool": "a"}, {"args": {}}]"#;
        assert!(batch_calls(toolless).unwrap_err().contains("call 2"));
        assert!(batch_calls("42").is_err());
    }

    fn event(event: &str, data: &str, id: Option<&str>) -> SseEvent {
        SseEvent {
            event: event.to_owned(),
            data: data.to_owned(),
            id: id.map(str::to_owned),
        }
    }

    #[test]
    fn sse_events_survive_any_split_of_the_stream() {
        let stream = ": keep-alive\n\nevent: run.running\nid: 7\ndata: {\"state\":\"running\",\r\ndata:\"é\":1}\r\n\r\nretry: 5\nevent: ignored\n\ndata\n\ndata: last\r\r";
        let expected = vec![
            event(
                "run.running",
                "{\"state\":\"running\",\n\"é\":1}",
                Some("7"),
            ),
            event("message", "", Some("7")),
            event("message", "last", Some("7")),
        ];
        let bytes = stream.as_bytes();
        // Whole, and cut at every byte (through the CRLF pairs and the two bytes of é).
        for cut in 0..=bytes.len() {
            let mut parser = SseParser::default();
            let mut events = parser.feed(&bytes[..cut]).unwrap();
            events.extend(parser.feed(&bytes[cut..]).unwrap());
            assert_eq!(events, expected, "cut at {cut}");
        }
        let mut parser = SseParser::default();
        let one_by_one: Vec<SseEvent> = bytes
            .iter()
            .flat_map(|byte| parser.feed(std::slice::from_ref(byte)).unwrap())
            .collect();
        assert_eq!(one_by_one, expected);
    }

    #[test]
    fn an_endless_sse_line_is_refused() {
        let mut parser = SseParser::default();
        let chunk = vec![b'x'; 1 << 20];
        let mut outcome = Ok(Vec::new());
        for _ in 0..17 {
            outcome = parser.feed(&chunk);
            if outcome.is_err() {
                break;
            }
        }
        assert_eq!(
            outcome.unwrap_err(),
            "an event of the stream is over 16777216 bytes"
        );
    }

    #[test]
    fn transcript_entries_read_as_lines() {
        let cases = [
            (
                json!({"at": 1, "type": "user", "content": "submit my September expenses"}),
                "user: submit my September expenses",
            ),
            (
                json!({"type": "model", "text": null, "calls": [
                    {"id": "c1", "name": "find_expenses", "args": {"month": "2026-09"}},
                    {"id": "c2", "name": "start_receipt_ocr", "args": {"receipt_ids": ["rcpt-005"]}}]}),
                r#"model: calls: find_expenses({"month":"2026-09"}), start_receipt_ocr({"receipt_ids":["rcpt-005"]})"#,
            ),
            (
                json!({"type": "model", "text": "The total is 1,204 EUR.", "calls": []}),
                "model: The total is 1,204 EUR.",
            ),
            (
                json!({"type": "tool_call", "call_id": "c2", "tool": "start_receipt_ocr", "args": {},
                       "envelope": {"status": "running", "job_id": "j1", "poll_after_s": 5}}),
                "tool_call start_receipt_ocr -> running job=j1",
            ),
            (
                json!({"type": "tool_call", "call_id": "c1", "tool": "find_expenses",
                       "envelope": {"status": "ok", "result": {}}}),
                "tool_call find_expenses -> ok",
            ),
            (
                json!({"type": "tool_call", "call_id": "c3", "tool": "ask_user",
                       "envelope": {"status": "suspended", "ticket": "t_1", "question": "?", "options": []}}),
                "tool_call ask_user -> suspended ticket=t_1",
            ),
            (
                json!({"type": "tool_result", "call_id": "c4",
                       "envelope": {"status": "error", "error": {"code": "rejected", "message": "no"}}}),
                "tool_result c4 -> error rejected",
            ),
            (
                json!({"type": "wait", "jobs": ["j1", "j2"], "tickets": ["t_1"]}),
                "wait jobs=[j1, j2] tickets=[t_1]",
            ),
            (
                json!({"type": "wait", "jobs": [], "tickets": []}),
                "wait jobs=[] tickets=[]",
            ),
            (json!({"type": "resume", "at": 5}), "resume"),
            (
                json!({"type": "note", "x": 1}),
                r#"note: {"type":"note","x":1}"#,
            ),
        ];
        for (entry, line) in cases {
            assert_eq!(entry_line(&entry), line);
        }
        let long =
            json!({"type": "model", "calls": [{"name": "f", "args": {"q": "a".repeat(300)}}]});
        let line = entry_line(&long);
        assert!(line.ends_with("aaa…)"), "{line}");
        assert_eq!(line.chars().count(), "model: calls: f(".len() + 200 + 2);
    }

    #[test]
    fn an_answer_is_json_or_else_a_string() {
        assert_eq!(parse_answer("travel"), json!("travel"));
        assert_eq!(parse_answer("\"travel\""), json!("travel"));
        assert_eq!(parse_answer("42"), json!(42));
        assert_eq!(parse_answer("true"), json!(true));
        assert_eq!(parse_answer(r#"{"amount": 12.5}"#), json!({"amount": 12.5}));
        assert_eq!(parse_answer("[1, 2"), json!("[1, 2"));
        assert_eq!(parse_answer("two words"), json!("two words"));
        assert_eq!(parse_answer(""), json!(""));
    }

    #[test]
    fn ids_and_query_values_are_encoded() {
        assert_eq!(segment("t_0123abcd").unwrap(), "t_0123abcd");
        assert_eq!(segment("a/b?c").unwrap(), "a%2Fb%3Fc");
        assert_eq!(segment("..").unwrap_err(), "`..` is not an id");
        assert_eq!(query(&[("state", None), ("kind", None)]), "");
        assert_eq!(
            query(&[
                ("state", Some("open")),
                ("kind", None),
                ("cursor", Some("c 1&x=é"))
            ]),
            "?state=open&cursor=c%201%26x%3D%C3%A9"
        );
    }

    #[test]
    fn tickets_read_as_lines() {
        let question = json!({"ticket": "t_1", "kind": "question", "tool": "ask_user",
            "question": "Travel or meals?", "options": ["travel", "meals"], "state": "open",
            "answer": null, "run_id": "run_1", "expires_at": 1790000000000_u64});
        assert_eq!(
            ticket_line(&question),
            r#"t_1  question  open  ask_user  "Travel or meals?"  options=[travel, meals]  run=run_1  expires_at=1790000000000"#
        );
        let approval = json!({"ticket": "t_2", "kind": "approval", "tool": "submit_report",
            "plan": {"total_eur": 84.5, "flags": []}, "state": "answered", "answer": "approve",
            "run_id": "run_2", "expires_at": null});
        assert_eq!(
            ticket_line(&approval),
            r#"t_2  approval  answered  submit_report  plan={"flags":[],"total_eur":84.5}  run=run_2  answer="approve""#
        );
        let input = json!({"ticket": "t_3", "kind": "input", "tool": "confirm_delete",
            "pending": ["confirm", "name"], "state": "open", "answer": null,
            "run_id": "run_3", "expires_at": null});
        assert_eq!(
            ticket_line(&input),
            r#"t_3  input  open  confirm_delete  pending=[confirm, name]  run=run_3"#
        );
    }

    #[test]
    fn a_watch_prints_each_entry_once() {
        let mut watch = Watch::default();
        let run = json!({"state": "running", "version": 2, "transcript": [
            {"type": "user", "content": "hi"},
            {"type": "model", "text": null, "calls": [{"name": "f", "args": {}}]}]});
        assert_eq!(watch.catch_up(&run), ["user: hi", "model: calls: f({})"]);
        // An event the read already showed, then a new one.
        let old = event(
            "run.running",
            r#"{"state": "running", "version": 2, "entries": [{"type": "user", "content": "hi"}]}"#,
            None,
        );
        assert!(watch.on_event(&old).is_empty());
        let new = event(
            "run.waiting",
            r#"{"state": "waiting", "version": 3, "entries": [{"type": "wait", "jobs": ["j1"], "tickets": []}]}"#,
            None,
        );
        assert_eq!(watch.on_event(&new), ["wait jobs=[j1] tickets=[]"]);
        assert!(!watch.settled());
        // Without a state in the data, the event's name says it.
        let done = event(
            "run.answered",
            r#"{"version": 5, "entries": [{"type": "resume"}, {"type": "model", "text": "done"}]}"#,
            None,
        );
        assert_eq!(watch.on_event(&done), ["resume", "model: done"]);
        assert!(watch.settled());
        // The final read prints only what no event did.
        let last = json!({"state": "answered", "version": 6, "transcript": [
            {"type": "user", "content": "hi"}, {"type": "model", "calls": []},
            {"type": "wait"}, {"type": "resume"}, {"type": "model", "text": "done"},
            {"type": "user", "content": "more"}]});
        assert_eq!(watch.catch_up(&last), ["user: more"]);
        assert!(watch.catch_up(&last).is_empty());
    }

    #[test]
    fn a_settled_run_concludes_by_its_state() {
        assert_eq!(
            conclude(&json!({"state": "answered", "answer": "84.50 EUR"})),
            Ok(())
        );
        assert_eq!(
            conclude(
                &json!({"state": "budget_exceeded", "error": {"code": "budget_exceeded", "exceeded": "steps"}})
            ),
            Err("the run ended budget_exceeded (budget_exceeded)".to_owned())
        );
        assert_eq!(
            conclude(&json!({"state": "cancelled", "error": null})),
            Err("the run ended cancelled".to_owned())
        );
    }
}
