//! `/mcp` over Streamable HTTP, for requests whose caller the server has
//! already authenticated.
//!
//! Two ways of speaking it share one [`ToolServer`]:
//!
//! - **Stateless**, every request on its own: any dispatcher answers any
//!   request. 2026-07-28 requests always go this way, and so does every
//!   request of the 2025 revisions that names no session.
//! - **Sessions** (2025 revisions, [`Options::sessions`]): an `initialize`
//!   opens a session of this process (`Mcp-Session-Id`), whose requests may
//!   be answered by an event stream on which the server also asks the
//!   client (elicitation, sampling, roots) and whose `GET` stream carries
//!   `notifications/resources/updated` for its subscriptions. A session is
//!   its opener's: another principal naming it is answered 404, exactly as
//!   an unknown session. A session lives in one process, so behind a load
//!   balancer requests must reach the process that opened it (route by
//!   `Mcp-Session-Id`); an unknown one is 404 and the client opens another.
//!   At [`Options::max_sessions`] open sessions an `initialize` is answered
//!   without one, and the client goes on statelessly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rmcp::ErrorData;
use rmcp::transport::streamable_http_server::session::SessionId;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;
use toolfleet_core::{Principal, Runtime};

use crate::{Authenticated, Options, ToolServer, core_tasks, trace_of};

/// The header naming a session.
const SESSION_HEADER: &str = "mcp-session-id";

/// The largest answer of rmcp's that [`HttpEndpoint`] completes (an
/// `initialize` or a `tools/list` page).
const MAX_PATCHED: usize = 16 * 1024 * 1024;

/// Marks a request served in a session: the server may ask its client and
/// send it notifications after answering.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InSession;

/// `/mcp`: stateless, or in sessions of this process (see the module).
/// Answers are JSON, or an SSE stream when the server sends anything before
/// the result (progress, log messages, its own requests in a session).
#[derive(Clone)]
pub struct HttpEndpoint {
    stateless: StreamableHttpService<ToolServer, NeverSessionManager>,
    sessions: Option<Sessions>,
    /// For the 2025-11-25 task requests rmcp does not carry.
    server: ToolServer,
    max_body: usize,
}

/// The sessions of this process and whose each is.
#[derive(Clone)]
struct Sessions {
    service: StreamableHttpService<ToolServer, LocalSessionManager>,
    manager: Arc<LocalSessionManager>,
    book: Arc<Mutex<Book>>,
    max: usize,
}

/// Sessions one principal holds open in one process, at most: past it, its
/// `initialize` opens none (the client goes on statelessly).
const MAX_PER_OWNER: usize = 100;

/// Whose each session is, and the places held for those being opened.
#[derive(Default)]
struct Book {
    open: HashMap<String, Owner>,
    /// `initialize` requests rmcp has not answered yet, by owner.
    opening: HashMap<Owner, usize>,
}

impl Book {
    fn total(&self) -> usize {
        self.open.len() + self.opening.values().sum::<usize>()
    }

    fn of(&self, owner: &Owner) -> usize {
        let open = self.open.values().filter(|o| *o == owner).count();
        open + self.opening.get(owner).copied().unwrap_or(0)
    }
}

/// Who opened a session: only they may use it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Owner {
    tenant: String,
    user: String,
}

impl Owner {
    fn of(principal: &Principal) -> Owner {
        Owner {
            tenant: principal.tenant.clone(),
            user: principal.user.clone(),
        }
    }
}

/// A place held for a session being opened, given back when dropped.
struct Opening {
    book: Arc<Mutex<Book>>,
    owner: Owner,
}

impl Opening {
    /// The session opened as `id`: its owner's from now on.
    fn opened(self, id: &str) {
        lock_book(&self.book)
            .open
            .insert(id.to_owned(), self.owner.clone());
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        let mut book = lock_book(&self.book);
        if let Some(count) = book.opening.get_mut(&self.owner) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                book.opening.remove(&self.owner);
            }
        }
    }
}

fn lock_book(book: &Mutex<Book>) -> std::sync::MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        lock_book(&self.book)
    }

    /// Whether `id` is an open session of `principal`'s.
    async fn owned(&self, id: &str, principal: &Principal) -> bool {
        if self.lock().open.get(id) != Some(&Owner::of(principal)) {
            return false;
        }
        let open = self
            .manager
            .sessions
            .read()
            .await
            .contains_key(&SessionId::from(id.to_owned()));
        if !open {
            // Expired (idle past its keep-alive) or closed.
            self.lock().open.remove(id);
        }
        open
    }

    /// Holds a place for a session `principal` opens, while the process
    /// holds fewer than its bound and the principal fewer than
    /// [`MAX_PER_OWNER`], once the sessions that ended meanwhile are
    /// forgotten; `None` otherwise.
    async fn reserve(&self, principal: &Principal) -> Option<Opening> {
        let owner = Owner::of(principal);
        let full = |book: &Book| book.total() >= self.max || book.of(&owner) >= MAX_PER_OWNER;
        if full(&self.lock()) {
            let open = self.manager.sessions.read().await;
            self.lock()
                .open
                .retain(|id, _| open.contains_key(&SessionId::from(id.clone())));
        }
        let mut book = self.lock();
        if full(&book) {
            return None;
        }
        *book.opening.entry(owner.clone()).or_default() += 1;
        Some(Opening {
            book: Arc::clone(&self.book),
            owner,
        })
    }
}

impl HttpEndpoint {
    /// The Streamable HTTP endpoint of `runtime`.
    pub fn new(runtime: Arc<Runtime>, options: Options) -> Self {
        let max_body = options.max_body;
        let (sessions, max_sessions) = (options.sessions, options.max_sessions);
        let server = ToolServer::new(runtime, None, options);
        // Host and Origin are checked by the server before a request gets
        // here, against its own address and configured origins.
        let config = StreamableHttpServerConfig::default()
            .with_json_response(true)
            .with_sse_keep_alive(None)
            .with_max_request_body_bytes(max_body)
            .disable_allowed_hosts()
            .disable_allowed_origins();
        let per_request = server.clone();
        let stateless = StreamableHttpService::new(
            move || Ok(per_request.for_request()),
            Arc::new(NeverSessionManager::default()),
            config.clone().with_legacy_session_mode(false),
        );
        let sessions = sessions.then(|| {
            let manager = Arc::new(LocalSessionManager::default());
            let per_session = server.clone();
            Sessions {
                service: StreamableHttpService::new(
                    move || Ok(per_session.for_request()),
                    manager.clone(),
                    config.with_legacy_session_mode(true),
                ),
                manager,
                book: Arc::default(),
                max: max_sessions.max(1),
            }
        });
        HttpEndpoint {
            stateless,
            sessions,
            server,
            max_body,
        }
    }

    /// Answers one HTTP request to `/mcp` as `principal`: rmcp does, but
    /// for what [`core_tasks`] speaks to 2025-11-25 clients and who may use
    /// a session.
    pub async fn handle(&self, request: Request<Body>, principal: Arc<Principal>) -> Response {
        let session = request
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if request.method() != Method::POST {
            // Only a 2025 revision's GET or DELETE names a session.
            let session = session.filter(|_| !modern(request.headers(), None));
            let in_session = match self.session_of(session.as_deref(), &principal).await {
                Ok(in_session) => in_session,
                Err(refused) => return refused,
            };
            let session = session.filter(|_| in_session);
            return self.outside_post(request, principal, session).await;
        }
        self.post(request, principal, session).await
    }

    /// Whether `session` names an open session of `principal`'s (`Ok(false)`
    /// when it names none or sessions are off), else the 404 to answer.
    async fn session_of(
        &self,
        session: Option<&str>,
        principal: &Principal,
    ) -> Result<bool, Response> {
        match (&self.sessions, session) {
            (Some(sessions), Some(id)) => match sessions.owned(id, principal).await {
                true => Ok(true),
                false => Err(session_not_found()),
            },
            _ => Ok(false),
        }
    }

    /// A GET (a session's stream, or 405) or a DELETE (ending a session),
    /// in `session` when it names one of the caller's.
    async fn outside_post(
        &self,
        request: Request<Body>,
        principal: Arc<Principal>,
        session: Option<String>,
    ) -> Response {
        let in_session = session.is_some();
        if let (Some(sessions), Some(id)) = (&self.sessions, &session)
            && request.method() == Method::DELETE
        {
            sessions.lock().open.remove(id);
            // rmcp's 202 reads as a failure to clients that look for 200.
            let mut ended = self.rmcp(request, principal, in_session).await;
            if ended.status() == StatusCode::ACCEPTED {
                *ended.status_mut() = StatusCode::OK;
            }
            return ended;
        }
        self.rmcp(request, principal, in_session).await
    }

    /// A POST: a JSON-RPC message, in the session it names when it is of a
    /// 2025 revision (a 2026-07-28 request is stateless whatever it names).
    async fn post(
        &self,
        request: Request<Body>,
        principal: Arc<Principal>,
        session: Option<String>,
    ) -> Response {
        let legacy = request
            .headers()
            .get("mcp-protocol-version")
            .and_then(|v| v.to_str().ok())
            == Some(core_tasks::VERSION);
        let (parts, body) = request.into_parts();
        let bytes = match axum::body::to_bytes(body, self.max_body).await {
            Ok(bytes) => bytes,
            Err(_) => {
                let error = ErrorData::invalid_request(
                    format!("the request is larger than {} bytes", self.max_body),
                    None,
                );
                return json_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &core_tasks::reply(&Value::Null, Err(error)),
                );
            }
        };
        let message: Option<Value> = serde_json::from_slice(&bytes).ok();
        let session = session.filter(|_| !modern(&parts.headers, message.as_ref()));
        let in_session = match self.session_of(session.as_deref(), &principal).await {
            Ok(in_session) => in_session,
            Err(refused) => return refused,
        };
        let route = message
            .as_ref()
            .map(|m| core_tasks::route(m, legacy))
            .unwrap_or(core_tasks::Route::Pass);
        // An `initialize` without a session opens one, while there is room.
        let opens = !in_session
            && session.is_none()
            && message
                .as_ref()
                .and_then(|m| m.get("method"))
                .and_then(Value::as_str)
                == Some("initialize");
        let opening = match &self.sessions {
            Some(sessions) if opens => sessions.reserve(&principal).await,
            _ => None,
        };
        let opens = opening.is_some();
        let request = Request::from_parts(parts, Body::from(bytes));
        let response = match (route, message) {
            (core_tasks::Route::Answer, Some(message)) => {
                let trace = trace_of(request.headers());
                let answer = self
                    .server
                    .answer_core_task(principal, &message, None, trace)
                    .await;
                return json_response(StatusCode::OK, &answer);
            }
            (core_tasks::Route::PatchInitialize | core_tasks::Route::PatchToolsList, _)
                if self.server.serves_tasks() =>
            {
                let response = self
                    .rmcp(request, principal.clone(), in_session || opens)
                    .await;
                self.complete(response, route).await
            }
            _ => {
                self.rmcp(request, principal.clone(), in_session || opens)
                    .await
            }
        };
        if let Some(opening) = opening {
            let opened = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok());
            if let Some(id) = opened {
                opening.opened(id);
            }
        }
        response
    }

    async fn rmcp(
        &self,
        mut request: Request<Body>,
        principal: Arc<Principal>,
        in_session: bool,
    ) -> Response {
        use tower_service::Service;
        request.extensions_mut().insert(Authenticated(principal));
        let answered = match (&self.sessions, in_session) {
            (Some(sessions), true) => {
                request.extensions_mut().insert(InSession);
                sessions.service.clone().call(request).await
            }
            _ => self.stateless.clone().call(request).await,
        };
        match answered {
            Ok(response) => response.into_response(),
            Err(never) => match never {},
        }
    }

    /// rmcp's answer with what 2025-11-25 adds for tasks, whether it came
    /// as JSON or as an event stream (in a session); any other answer as
    /// it is.
    async fn complete(&self, response: Response, route: core_tasks::Route) -> Response {
        let kind = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let (json, sse) = (
            kind.starts_with("application/json"),
            kind.starts_with("text/event-stream"),
        );
        if !json && !sse {
            return response;
        }
        let (mut parts, body) = response.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_PATCHED).await else {
            return internal_response("an answer was too large to complete");
        };
        let patch = |message: &mut Value| {
            if let Some(result) = message.get_mut("result") {
                match route {
                    core_tasks::Route::PatchInitialize => core_tasks::patch_initialize(result),
                    core_tasks::Route::PatchToolsList => self.server.patch_tools_list(result),
                    _ => {}
                }
            }
        };
        let body = if json {
            let mut message: Value = match serde_json::from_slice(&bytes) {
                Ok(message) => message,
                Err(_) => return Response::from_parts(parts, Body::from(bytes)),
            };
            patch(&mut message);
            message.to_string()
        } else {
            patch_events(&String::from_utf8_lossy(&bytes), patch)
        };
        parts.headers.remove(header::CONTENT_LENGTH);
        Response::from_parts(parts, Body::from(body))
    }
}

/// An event stream with `patch` applied to each message it carries that is
/// a response (it has a `result`); every other line as it was.
fn patch_events(stream: &str, patch: impl Fn(&mut Value)) -> String {
    let mut out = String::with_capacity(stream.len());
    for line in stream.split_inclusive('\n') {
        let data = line.strip_prefix("data:").map(str::trim);
        match data.and_then(|d| serde_json::from_str::<Value>(d).ok()) {
            Some(mut message) if message.get("result").is_some() => {
                patch(&mut message);
                out.push_str("data: ");
                out.push_str(&message.to_string());
                out.push('\n');
            }
            _ => out.push_str(line),
        }
    }
    out
}

/// Whether a request speaks 2026-07-28 or later (its
/// `MCP-Protocol-Version` header, or its `_meta` protocol version), which
/// has no sessions.
fn modern(headers: &axum::http::HeaderMap, message: Option<&Value>) -> bool {
    const FIRST: &str = "2026-07-28";
    let header = headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok());
    let meta = message
        .and_then(|m| m.pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion"))
        .and_then(Value::as_str);
    [header, meta].into_iter().flatten().any(|v| v >= FIRST)
}

/// What rmcp answers for a session it does not know.
fn session_not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}

fn json_response(status: StatusCode, message: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        message.to_string(),
    )
        .into_response()
}

fn internal_response(what: &str) -> Response {
    let error = ErrorData::internal_error(what.to_owned(), None);
    json_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        &core_tasks::reply(&Value::Null, Err(error)),
    )
}

#[cfg(test)]
mod tests {
    use super::{modern, patch_events};
    use serde_json::json;

    #[test]
    fn a_2026_request_is_told_by_its_header_or_its_meta() {
        let mut headers = axum::http::HeaderMap::new();
        assert!(!modern(&headers, None));
        headers.insert("mcp-protocol-version", "2025-11-25".parse().unwrap());
        assert!(!modern(&headers, Some(&json!({"method": "tools/list"}))));
        let meta = json!({"method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        assert!(modern(&headers, Some(&meta)));
        headers.insert("mcp-protocol-version", "2026-07-28".parse().unwrap());
        assert!(modern(&headers, None));
    }

    #[test]
    fn only_responses_in_an_event_stream_are_patched() {
        let stream = "id: 0\nretry: 3000\ndata: \n\n\
                      data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n\
                      data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"a\":1}}\nid: 1\n\n";
        let patched = patch_events(stream, |m| m["result"]["b"] = json!(2));
        assert!(patched.starts_with("id: 0\nretry: 3000\ndata: \n\n"));
        assert!(
            patched
                .contains("data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n")
        );
        let last = patched
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .next_back()
            .unwrap();
        let message: serde_json::Value = serde_json::from_str(last).unwrap();
        assert_eq!(message["result"], json!({"a": 1, "b": 2}));
        assert!(patched.ends_with("id: 1\n\n"));
    }
}
