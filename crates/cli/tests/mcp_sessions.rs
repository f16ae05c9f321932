//! MCP sessions over HTTP (2025 revisions) against a real `toolfleet
//! serve`, spoken on the wire: an `initialize` opens a session of the
//! process, which is its opener's alone; in it a tool that asks the client
//! (`asks_client`) is answered by an event stream carrying the server's own
//! request, and the client's answer, posted back, reaches the tool; and a
//! subscription tells the session's `GET` stream when its resource changes
//! (a declared resource read again, a job when it settles), until it is
//! unsubscribed.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{OTHER_TOKEN, Server, TOKEN, TempDir, config_with};
use serde_json::{Value, json};

const VERSION: &str = "2025-11-25";

/// The tools these tests call: one asking the client, a job, and a
/// declared resource read from a file the test rewrites.
fn extra(dir: &Path, mcp: &str) -> String {
    let note = dir.join("note.json");
    std::fs::write(&note, r#"{"text": "first"}"#).expect("note written");
    format!(
        r#"
[mcp]
{mcp}

[[tools]]
name = "ask_name"
shape = "query"
description = "Asks the client for a name, then greets it."
asks_client = true
input_schema = {{ type = "object", additionalProperties = false, properties = {{ input_responses = {{ type = "object" }}, request_state = {{}}, client_capabilities = {{ type = "object" }} }} }}
executor = {{ kind = "exec", program = "sh", args = ["-c", '''
in=$(cat)
case "$in" in
*'"who":{{"action":"accept"'*'"request_state":"asked"'*)
  name=$(printf '%s' "$in" | sed -n 's/.*"name":"\([0-9A-Za-z _-]*\)".*/\1/p')
  echo "{{\"text\": \"Hello, $name!\"}}" ;;
*'"who":{{'*) echo '{{"text": "no answer"}}' ;;
*) echo '{{"input_requests": {{"who": {{"method": "elicitation/create", "params": {{"message": "Your name?", "requestedSchema": {{"type": "object", "properties": {{"name": {{"type": "string"}}}}, "required": ["name"]}}}}}}}}, "request_state": "asked"}}' ;;
esac
'''] }}

[[tools]]
name = "slow_job"
shape = "job"
description = "Answers after a second."
input_schema = {{ type = "object", additionalProperties = false, properties = {{}} }}
max_attempts = 1
executor = {{ kind = "exec", program = "sh", args = ["-c", "sleep 1; echo '{{\"text\": \"done\"}}'"] }}

[[tools]]
name = "read_note"
shape = "query"
description = "The note's text."
input_schema = {{ type = "object", additionalProperties = false, properties = {{}} }}
executor = {{ kind = "exec", program = "cat", args = ["{note}"] }}

[[tools]]
name = "read_numbered"
shape = "query"
description = "A numbered note."
input_schema = {{ type = "object", additionalProperties = false, required = ["id"], properties = {{ id = {{ type = "string", pattern = "^[0-9]{{1,3}}$" }} }} }}
executor = {{ kind = "exec", program = "sh", args = ["-c", "echo '{{\"text\": \"a numbered note\"}}'"] }}

[[resources]]
uri_template = "notes://numbered/{{id}}"
name = "numbered"
description = "A numbered note."
mime_type = "text/plain"
tool = "read_numbered"

[[resources]]
uri = "notes://current"
name = "note"
description = "The current note."
mime_type = "text/plain"
tool = "read_note"
"#,
        note = note.display()
    )
}

fn start(dir: &TempDir, mcp: &str) -> Server {
    Server::start(&dir.0, &config_with(&dir.0, "", &extra(&dir.0, mcp)))
}

/// One client speaking `/mcp` as `token`, in a session once it opened one.
struct Peer {
    http: reqwest::Client,
    url: String,
    token: String,
    session: Option<String>,
}

impl Peer {
    fn new(server: &Server, token: &str) -> Peer {
        Peer {
            http: toolfleet_executors::http_client().expect("a client"),
            url: format!("{}/mcp", server.base),
            token: token.to_owned(),
            session: None,
        }
    }

    fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .request(method, &self.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", VERSION);
        if let Some(id) = &self.session {
            request = request.header("mcp-session-id", id);
        }
        request
    }

    async fn post(&self, message: Value) -> reqwest::Response {
        self.request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .body(message.to_string())
            .send()
            .await
            .expect("/mcp answers")
    }

    /// `initialize`, declaring elicitation: the session it opened, if any.
    async fn initialize(&mut self) -> Option<String> {
        let answer = self
            .post(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": VERSION,
                    "capabilities": {"elicitation": {}},
                    "clientInfo": {"name": "sessions-test", "version": "1"}
                }}),
            )
            .await;
        assert_eq!(answer.status(), 200);
        let session = answer
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut events = Events::of(answer);
        let result = events.next().await.expect("an answer");
        assert_eq!(result["result"]["protocolVersion"], VERSION, "{result}");
        self.session = session.clone();
        let initialized = self
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(initialized.status(), 202);
        session
    }

    /// A request's one answer (the last message of its stream).
    /// Calls `slow_job` as request `id`: the id of the job it started.
    async fn start_slow_job(&self, id: u64) -> String {
        let call = self
            .ask(
                id,
                "tools/call",
                json!({"name": "slow_job", "arguments": {}}),
            )
            .await;
        call["result"]["structuredContent"]["job_id"]
            .as_str()
            .unwrap_or_else(|| panic!("a running job: {call}"))
            .to_owned()
    }

    async fn ask(&self, id: u64, method: &str, params: Value) -> Value {
        let answer = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let status = answer.status();
        let mut events = Events::of(answer);
        let mut last = None;
        while let Some(message) = events.next().await {
            last = Some(message);
        }
        last.unwrap_or_else(|| panic!("{method} answered {status} with no message"))
    }
}

/// The JSON-RPC messages of an answer, JSON or an event stream, as they come.
struct Events {
    response: Option<reqwest::Response>,
    sse: bool,
    buffer: String,
}

impl Events {
    fn of(response: reqwest::Response) -> Events {
        let sse = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        Events {
            response: Some(response),
            sse,
            buffer: String::new(),
        }
    }

    async fn next(&mut self) -> Option<Value> {
        if !self.sse {
            let response = self.response.take()?;
            let text = response.text().await.ok()?;
            return serde_json::from_str(&text).ok();
        }
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data: String = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim)
                    .collect();
                if let Ok(message) = serde_json::from_str(&data) {
                    return Some(message);
                }
            }
            let chunk = self.response.as_mut()?.chunk().await.ok()??;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The next message within `limit`, if one comes.
    async fn within(&mut self, limit: Duration) -> Option<Value> {
        tokio::time::timeout(limit, self.next())
            .await
            .ok()
            .flatten()
    }
}

#[test]
fn a_session_is_its_openers_alone() {
    common::block_on(async {
        let dir = TempDir::new("mcp-sessions-own");
        let server = start(&dir, "max_sessions = 2");
        let mut alice = Peer::new(&server, TOKEN);
        let id = alice.initialize().await.expect("a session");
        // In the session, a 2025-11-25 tools/list comes as an event stream
        // and still carries what that revision adds for tasks.
        let listed = alice.ask(1, "tools/list", json!({})).await;
        let tools = listed["result"]["tools"].as_array().expect("tools");
        let job = tools
            .iter()
            .find(|t| t["name"] == "slow_job")
            .expect("slow_job");
        assert_eq!(job["execution"]["taskSupport"], "optional", "{job}");

        // Another principal naming it is answered as for no session at all.
        let mut mallory = Peer::new(&server, OTHER_TOKEN);
        mallory.session = Some(id.clone());
        let theirs = mallory
            .post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            .await;
        assert_eq!(theirs.status(), 404);
        let unknown = Peer {
            session: Some("no-such-session".into()),
            ..Peer::new(&server, TOKEN)
        };
        let missing = unknown
            .post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            .await;
        assert_eq!(missing.status(), 404);
        let deleted = mallory
            .request(reqwest::Method::DELETE)
            .send()
            .await
            .expect("answers");
        assert_eq!(deleted.status(), 404);
        // Untouched by them: still Alice's.
        let again = alice.ask(2, "ping", json!({})).await;
        assert_eq!(again["result"], json!({}), "{again}");

        // A request naming no session is answered statelessly, as ever.
        let stateless = Peer::new(&server, TOKEN);
        let listed = stateless.ask(1, "tools/list", json!({})).await;
        assert!(listed["result"]["tools"].is_array(), "{listed}");

        // Past max_sessions an initialize opens none, and the client goes
        // on statelessly; a session ended by DELETE makes room again.
        let mut second = Peer::new(&server, TOKEN);
        assert!(second.initialize().await.is_some());
        let mut third = Peer::new(&server, TOKEN);
        assert_eq!(third.initialize().await, None, "no room for a third");
        let ended = alice
            .request(reqwest::Method::DELETE)
            .send()
            .await
            .expect("answers");
        assert_eq!(ended.status(), 200);
        let gone = alice
            .post(json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}))
            .await;
        assert_eq!(gone.status(), 404, "a deleted session is gone");
        let mut fourth = Peer::new(&server, TOKEN);
        assert!(fourth.initialize().await.is_some(), "room again");
    });
}

/// The bounds hold however many open at once, and one principal cannot
/// take every place: past 100 sessions of its own it opens none, while
/// another still opens one.
#[test]
fn sessions_are_bounded_per_process_and_per_principal() {
    common::block_on(async {
        let dir = TempDir::new("mcp-sessions-bounds");
        let server = start(&dir, "max_sessions = 3");
        let opened = futures_util::future::join_all((0..8).map(|_| {
            let server = &server;
            async move { Peer::new(server, TOKEN).initialize().await }
        }))
        .await;
        let count = opened.iter().filter(|s| s.is_some()).count();
        assert_eq!(count, 3, "8 opened at once, 3 places: {opened:?}");
        drop(server);

        let dir = TempDir::new("mcp-sessions-owner");
        let server = start(&dir, "max_sessions = 1000");
        for n in 0..100 {
            let mut alice = Peer::new(&server, TOKEN);
            assert!(alice.initialize().await.is_some(), "alice's session {n}");
        }
        let mut one_more = Peer::new(&server, TOKEN);
        assert_eq!(one_more.initialize().await, None, "past 100 of hers");
        let mut mallory = Peer::new(&server, OTHER_TOKEN);
        assert!(
            mallory.initialize().await.is_some(),
            "another still opens one"
        );
    });
}

/// A subscription to a running job waits for it on the server's own
/// account: however many a session holds, the caller's long polls (one
/// here) stay free for its own requests.
#[test]
fn job_subscriptions_hold_none_of_the_callers_long_polls() {
    common::block_on(async {
        let dir = TempDir::new("mcp-sessions-polls");
        let text = config_with(&dir.0, "", &extra(&dir.0, ""))
            + "\n[limits]\nlong_polls_per_principal = 1\n";
        let server = Server::start(&dir.0, &text);
        let mut alice = Peer::new(&server, TOKEN);
        alice.initialize().await.expect("a session");
        let mut jobs = Vec::new();
        for n in 0..3 {
            let id = alice.start_slow_job(n).await;
            let uri = format!("toolfleet://jobs/{id}");
            let subscribed = alice
                .ask(10 + n, "resources/subscribe", json!({"uri": uri}))
                .await;
            assert_eq!(subscribed["result"], json!({}), "{subscribed}");
            jobs.push(id);
        }
        // Its one long poll is still its own.
        let rest = server.client(TOKEN);
        let waited = rest.get(&format!("/v1/jobs/{}?wait_s=10", jobs[0])).await;
        assert_eq!(waited["status"], "ok", "{waited}");
    });
}

#[test]
fn sessions_can_be_turned_off() {
    common::block_on(async {
        let dir = TempDir::new("mcp-sessions-off");
        let server = start(&dir, "sessions = false");
        let mut alice = Peer::new(&server, TOKEN);
        assert_eq!(alice.initialize().await, None);
        // Without a session a tool that asks the client says what it needs.
        let call = alice
            .ask(
                1,
                "tools/call",
                json!({"name": "ask_name", "arguments": {}}),
            )
            .await;
        assert_eq!(call["result"]["isError"], true, "{call}");
        let text = call["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(text.contains("Mcp-Session-Id"), "{call}");
    });
}

#[test]
fn a_tool_asks_the_client_of_its_session() {
    common::block_on(async {
        let dir = TempDir::new("mcp-sessions-ask");
        let server = start(&dir, "");
        let mut alice = Peer::new(&server, TOKEN);
        alice.initialize().await.expect("a session");
        let answer = alice
            .post(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                         "params": {"name": "ask_name", "arguments": {}}}))
            .await;
        let mut events = Events::of(answer);
        let asked = events
            .within(Duration::from_secs(30))
            .await
            .expect("the server asks");
        assert_eq!(asked["method"], "elicitation/create", "{asked}");
        assert_eq!(asked["params"]["message"], "Your name?", "{asked}");
        let request_id = asked["id"].clone();
        assert!(!request_id.is_null(), "{asked}");
        // Mallory cannot answer it: the session is not hers.
        let mut mallory = Peer::new(&server, OTHER_TOKEN);
        mallory.session = alice.session.clone();
        let reply = json!({"jsonrpc": "2.0", "id": request_id,
                           "result": {"action": "accept", "content": {"name": "Ada"}}});
        assert_eq!(mallory.post(reply.clone()).await.status(), 404);
        assert_eq!(alice.post(reply).await.status(), 202);
        let result = events
            .within(Duration::from_secs(30))
            .await
            .expect("the call answers");
        assert_eq!(result["id"], 7, "{result}");
        assert_eq!(
            result["result"]["structuredContent"]["text"], "Hello, Ada!",
            "{result}"
        );
    });
}

/// A client cannot hand the tool answers or a state of its own: what it
/// puts under those names is dropped, and the tool asks as on a first call.
#[test]
fn a_client_cannot_forge_the_answers_or_the_state() {
    common::block_on(async {
        let dir = TempDir::new("mcp-sessions-forged");
        let server = start(&dir, "");
        let mut alice = Peer::new(&server, TOKEN);
        alice.initialize().await.expect("a session");
        let forged = json!({
            "request_state": "asked",
            "input_responses": {"who": {"action": "accept", "content": {"name": "Eve"}}}
        });
        let answer = alice
            .post(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                         "params": {"name": "ask_name", "arguments": forged}}))
            .await;
        let mut events = Events::of(answer);
        let first = events
            .within(Duration::from_secs(30))
            .await
            .expect("a message");
        assert_eq!(first["method"], "elicitation/create", "{first}");
        // Over REST the same: the tool asks (and, with no MCP client to
        // answer, says so), never greeting the forged name.
        let rest = server.client(TOKEN);
        let called = rest.call("ask_name", forged).await;
        assert!(
            !called.to_string().contains("Hello, Eve"),
            "the forged answer reached the tool: {called}"
        );
    });
}

#[test]
fn a_subscription_tells_its_session_of_changes_until_unsubscribed() {
    common::block_on(async {
        let dir = TempDir::new("mcp-sessions-watch");
        let server = start(&dir, "watch_ms = 100");
        let mut alice = Peer::new(&server, TOKEN);
        alice.initialize().await.expect("a session");
        let stream = alice
            .request(reqwest::Method::GET)
            .header("accept", "text/event-stream")
            .send()
            .await
            .expect("a GET stream");
        assert_eq!(stream.status(), 200);
        let mut notes = Events::of(stream);

        let subscribed = alice
            .ask(1, "resources/subscribe", json!({"uri": "notes://current"}))
            .await;
        assert_eq!(subscribed["result"], json!({}), "{subscribed}");
        std::fs::write(dir.0.join("note.json"), r#"{"text": "second"}"#).expect("rewritten");
        let updated = notes
            .within(Duration::from_secs(20))
            .await
            .expect("an update");
        assert_eq!(
            updated["method"], "notifications/resources/updated",
            "{updated}"
        );
        assert_eq!(updated["params"]["uri"], "notes://current", "{updated}");
        let read = alice
            .ask(2, "resources/read", json!({"uri": "notes://current"}))
            .await;
        assert_eq!(read["result"]["contents"][0]["text"], "second", "{read}");

        // A job not settled yet: one update when it settles.
        let job_id = alice.start_slow_job(3).await;
        let uri = format!("toolfleet://jobs/{job_id}");
        // Another tenant's job is refused as an unknown one, in her session too.
        let mut mallory = Peer::new(&server, OTHER_TOKEN);
        mallory.initialize().await.expect("her session");
        let theirs = mallory
            .ask(1, "resources/subscribe", json!({"uri": uri}))
            .await;
        assert_eq!(theirs["error"]["code"], -32002, "{theirs}");
        let subscribed = alice
            .ask(4, "resources/subscribe", json!({"uri": uri}))
            .await;
        assert_eq!(subscribed["result"], json!({}), "{subscribed}");
        let settled = notes
            .within(Duration::from_secs(30))
            .await
            .expect("the job's update");
        assert_eq!(settled["params"]["uri"], uri.as_str(), "{settled}");
        let read = alice.ask(5, "resources/read", json!({"uri": uri})).await;
        assert!(read["result"]["contents"][0]["text"].is_string(), "{read}");

        // Unsubscribed, a change is no longer told: the next update seen is
        // of a resource still subscribed.
        let unsubscribed = alice
            .ask(
                6,
                "resources/unsubscribe",
                json!({"uri": "notes://current"}),
            )
            .await;
        assert_eq!(unsubscribed["result"], json!({}), "{unsubscribed}");
        std::fs::write(dir.0.join("note.json"), r#"{"text": "third"}"#).expect("rewritten");
        let quiet = notes.within(Duration::from_secs(2)).await;
        assert_eq!(quiet, None, "no update after unsubscribing");
    });
}

#[test]
fn a_session_holds_a_bounded_number_of_subscriptions() {
    common::block_on(async {
        let dir = TempDir::new("mcp-sessions-bound");
        let server = start(&dir, "");
        let mut alice = Peer::new(&server, TOKEN);
        alice.initialize().await.expect("a session");
        let subscribe = |n: u64| {
            let alice = &alice;
            async move {
                let uri = format!("notes://numbered/{n}");
                alice
                    .ask(n, "resources/subscribe", json!({"uri": uri}))
                    .await
            }
        };
        // Each declared resource is read again and again: ten at most.
        for n in 1..=10 {
            let answer = subscribe(n).await;
            assert_eq!(answer["result"], json!({}), "{answer}");
        }
        let refused = subscribe(11).await;
        assert_eq!(refused["error"]["code"], -32600, "{refused}");
        let why = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(why.contains("at most 10"), "{refused}");
        // Subscribing again to one it holds is no new subscription.
        let again = subscribe(10).await;
        assert_eq!(again["result"], json!({}), "{again}");
        let dropped = alice
            .ask(
                20,
                "resources/unsubscribe",
                json!({"uri": "notes://numbered/1"}),
            )
            .await;
        assert_eq!(dropped["result"], json!({}), "{dropped}");
        let room = subscribe(11).await;
        assert_eq!(room["result"], json!({}), "{room}");
    });
}

/// Bounds out of their range are refused at start, saying which.
#[test]
fn bad_session_settings_are_refused_at_start() {
    common::refused_at_start("[mcp]\nmax_sessions = 0", "[mcp] max_sessions is 0");
    common::refused_at_start(
        "[mcp]\nmax_sessions = 1000001",
        "it must be from 1 to 1000000",
    );
    common::refused_at_start("[mcp]\nwatch_ms = 99", "[mcp] watch_ms is 99");
    common::refused_at_start(
        "[mcp]\nwatch_ms = 3600001",
        "it must be from 100 to 3600000",
    );
}
