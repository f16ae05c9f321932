//! The console at `/console`: the pages a person answering tickets and an
//! operator of the fleet open in a browser, served by every dispatcher
//! from assets compiled into the binary.
//!
//! Every page is rendered on the server ([`pages`], maud: every value a
//! tool, a model or a person wrote is escaped) and every action is a plain
//! form post, so the console works without JavaScript; `console.js` only
//! adds live updates (over [`events`], the session's `/v1/events`) and
//! local times. What a page shows and what an action does are the API's
//! own answers: each handler calls the API router in process
//! ([`Console::api`]) as the session's principal (the [`Signed`] request
//! extension, which only this module sets), so the console sees and
//! touches exactly what that principal's API calls would, audit included.
//!
//! Sessions and CSRF tokens are in [`session`]. Every answer carries a
//! strict Content-Security-Policy (scripts, styles and connections from
//! the console's own origin only; no inline code), `no-store`, and refuses
//! framing.

mod pages;
pub mod session;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use toolfleet_core::Principal;
use tower::ServiceExt;

use crate::AppState;
use session::{ConsoleKey, SESSION_S};

/// The principal a console request to the API is made for; set only by
/// [`Console::api`], read by the API's `Caller`.
#[derive(Clone)]
pub(crate) struct Signed(pub(crate) Arc<Principal>);

/// The most bytes of an API answer a page reads.
const MAX_ANSWER: usize = 8 << 20;

/// The console's handlers' state: the dispatcher's, its key, and the API
/// router its pages and actions call.
#[derive(Clone)]
pub(crate) struct Console {
    state: AppState,
    key: ConsoleKey,
    api: Router,
}

/// A signed-in request: its principal, its session and the session's
/// CSRF token.
pub(crate) struct Session {
    pub(crate) principal: Arc<Principal>,
    pub(crate) csrf: String,
    cookie: String,
}

impl axum::extract::FromRequestParts<Console> for Session {
    type Rejection = Response;

    /// A signed-in request's session; else the way to the sign-in page.
    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        console: &Console,
    ) -> Result<Self, Response> {
        console
            .session(&parts.headers)
            .ok_or_else(|| see_other("/console/login"))
    }
}

/// The console's routes, under `/console`, calling `api`.
pub(crate) fn routes(state: AppState, api: Router) -> Router {
    let key = state.console_key.clone();
    let console = Console { state, key, api };
    Router::new()
        .route("/console", get(front))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route("/console/inbox", get(inbox))
        .route("/console/tickets/{id}/{action}", post(decide))
        .route("/console/jobs", get(jobs))
        .route("/console/jobs/{id}", get(job))
        .route("/console/jobs/{id}/{action}", post(job_action))
        .route("/console/runs", get(runs))
        .route("/console/runs/{id}", get(run))
        .route("/console/runs/{id}/cancel", post(run_cancel))
        .route("/console/queues", get(queues))
        .route("/console/tools", get(tools))
        .route("/console/events", get(events))
        .route("/console/assets/{name}", get(asset))
        .route("/console/{*rest}", get(missing))
        .layer(axum::middleware::map_response(secured))
        .with_state(console)
}

/// The headers of every console answer.
async fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

impl Console {
    /// The session of `headers`, while it holds and its token is known.
    fn session(&self, headers: &HeaderMap) -> Option<Session> {
        let cookies = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok());
        let cookie = session::cookie_of(cookies)?;
        let sha = self.key.verify(cookie, now_s())?;
        let principal = self.state.auth.by_sha256(&sha)?;
        Some(Session {
            principal,
            csrf: self.key.csrf(cookie),
            cookie: cookie.to_owned(),
        })
    }

    /// Calls the API as `principal`: its answer as it comes (a stream for
    /// `/v1/events`), or `None` when `uri` makes no request.
    async fn call(
        &self,
        principal: &Arc<Principal>,
        method: Method,
        uri: &str,
        body: Option<Value>,
    ) -> Option<Response> {
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .extension(Signed(principal.clone()))
            .body(body)
            .ok()?;
        let Ok(response) = self.api.clone().oneshot(request).await;
        Some(response)
    }

    /// Calls the API as `principal`: its status and JSON answer.
    async fn api(
        &self,
        principal: &Arc<Principal>,
        method: Method,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let Some(response) = self.call(principal, method, uri, body).await else {
            return (StatusCode::BAD_REQUEST, unreadable("the request"));
        };
        let status = response.status();
        match axum::body::to_bytes(response.into_body(), MAX_ANSWER).await {
            Ok(bytes) => (
                status,
                serde_json::from_slice(&bytes).unwrap_or_else(|_| unreadable("the answer")),
            ),
            Err(_) => (StatusCode::BAD_GATEWAY, unreadable("the answer")),
        }
    }

    /// Refuses a form post of `session` whose CSRF token does not hold.
    fn check(&self, session: &Session, csrf: Option<&str>) -> Result<(), Box<Response>> {
        match csrf {
            Some(token) if self.key.csrf_holds(&session.cookie, token) => Ok(()),
            _ => Err(Box::new(pages::refused(
                StatusCode::FORBIDDEN,
                "This form is out of date or did not come from the console. Reload the page and try again.",
            ))),
        }
    }
}

fn unreadable(what: &str) -> Value {
    json!({"status": "error", "error": {"code": "unavailable", "message": format!("{what} could not be read"), "retryable": true}})
}

fn now_s() -> i64 {
    toolfleet_core::now_ms() / 1000
}

fn see_other(to: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(to) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// False for a form posted from another site (its browser says so, in
/// `Sec-Fetch-Site` or `Origin`): the sign-in form takes no CSRF token,
/// since there is no session yet, so it refuses those instead.
fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site") {
        return matches!(site, "same-origin" | "none");
    }
    match (text("origin"), text("host")) {
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host)),
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// True when the request came over TLS (its proxy says so).
fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// A path segment as the API's URI carries it.
fn segment(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `pairs` as a query string (empty values left out).
fn query(pairs: &[(&str, Option<&str>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| {
            v.filter(|v| !v.is_empty())
                .map(|v| format!("{k}={}", segment(v)))
        })
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

async fn front(State(c): State<Console>, session: Session) -> Response {
    let p = &session.principal;
    let (_, tickets) = c.api(p, Method::GET, "/v1/tickets?state=open", None).await;
    let (_, failed) = c
        .api(p, Method::GET, "/v1/jobs?state=failed&limit=100", None)
        .await;
    let (_, runs) = c.api(p, Method::GET, "/v1/runs", None).await;
    pages::front(&session, &tickets, &failed, &runs)
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login_page(State(c): State<Console>, headers: HeaderMap) -> Response {
    if c.session(&headers).is_some() {
        return see_other("/console");
    }
    pages::login(None)
}

async fn login(State(c): State<Console>, headers: HeaderMap, form: Form<LoginForm>) -> Response {
    if !same_origin(&headers) {
        return pages::refused(
            StatusCode::FORBIDDEN,
            "Sign in from the console's own page.",
        );
    }
    let token = form.token.trim();
    let bearer = format!("Bearer {token}");
    match c.state.auth.principal(Some(&bearer)) {
        Ok(_) => {
            let cookie = c.key.issue(&crate::auth::token_sha256(token), now_s());
            let mut response = see_other("/console");
            let set = session::set_cookie(&cookie, SESSION_S, over_tls(&headers));
            if let Ok(value) = HeaderValue::from_str(&set) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        Err(_) => {
            let mut page = pages::login(Some(
                "That token is not known here. Check it and try again.",
            ));
            *page.status_mut() = StatusCode::UNAUTHORIZED;
            page
        }
    }
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: Option<String>,
}

async fn logout(
    State(c): State<Console>,
    session: Session,
    headers: HeaderMap,
    form: Form<CsrfForm>,
) -> Response {
    if let Err(refused) = c.check(&session, form.csrf.as_deref()) {
        return *refused;
    }
    let mut response = see_other("/console/login");
    let set = session::set_cookie("", 0, over_tls(&headers));
    if let Ok(value) = HeaderValue::from_str(&set) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[derive(Deserialize)]
struct Notice {
    done: Option<String>,
    error: Option<String>,
    sig: Option<String>,
}

async fn inbox(
    State(c): State<Console>,
    session: Session,
    Query(notice): Query<Notice>,
) -> Response {
    let (_, open) = c
        .api(
            &session.principal,
            Method::GET,
            "/v1/tickets?state=open",
            None,
        )
        .await;
    let (_, answered) = c
        .api(
            &session.principal,
            Method::GET,
            "/v1/tickets?state=answered",
            None,
        )
        .await;
    pages::inbox(&session, &open, &answered, &c.notice_of(&notice))
}

impl Console {
    /// What a page says about the action that led to it: only what this
    /// console signed (a link from elsewhere shows nothing).
    fn notice_of(&self, notice: &Notice) -> pages::Flash {
        let sig = notice.sig.as_deref().unwrap_or_default();
        let holds = |kind: &str, text: &Option<String>| {
            text.clone()
                .filter(|t| t.len() <= 1200 && self.key.flash_holds(kind, t, sig))
        };
        pages::Flash {
            done: holds("done", &notice.done),
            error: holds("error", &notice.error),
        }
    }

    /// Where an action goes back to, saying (signed) how it went.
    fn back(&self, to: &str, status: StatusCode, answer: &Value, done: &str) -> Response {
        let failed = !status.is_success() || answer["status"] == "error";
        let (key, text) = if failed {
            let message = answer["error"]["message"]
                .as_str()
                .unwrap_or("the action failed")
                .chars()
                .take(300)
                .collect::<String>();
            ("error", message)
        } else {
            ("done", done.to_owned())
        };
        let sig = self.key.flash_sig(key, &text);
        see_other(&format!(
            "{to}{}",
            query(&[(key, Some(&text)), ("sig", Some(&sig))])
        ))
    }
}

#[derive(Deserialize)]
struct DecideForm {
    csrf: Option<String>,
    answer: Option<String>,
    reason: Option<String>,
}

async fn decide(
    State(c): State<Console>,
    session: Session,
    Path((id, action)): Path<(String, String)>,
    form: Form<DecideForm>,
) -> Response {
    if let Err(refused) = c.check(&session, form.csrf.as_deref()) {
        return *refused;
    }
    let (body, done) = match action.as_str() {
        "answer" => (
            json!({"answer": form.answer.clone().unwrap_or_default()}),
            "Answered.",
        ),
        "approve" => (json!({}), "Approved."),
        "reject" => {
            let reason = form
                .reason
                .as_deref()
                .map(str::trim)
                .filter(|r| !r.is_empty());
            (json!({"reason": reason}), "Rejected.")
        }
        _ => return missing().await,
    };
    let uri = format!("/v1/tickets/{}/{action}", segment(&id));
    let (status, answer) = c
        .api(&session.principal, Method::POST, &uri, Some(body))
        .await;
    c.back("/console/inbox", status, &answer, done)
}

#[derive(Deserialize)]
struct JobsQuery {
    state: Option<String>,
    tool: Option<String>,
    id: Option<String>,
    cursor: Option<String>,
    /// `YYYY-MM-DDTHH:MM`, in UTC, as a `datetime-local` field sends it.
    from: Option<String>,
    to: Option<String>,
}

/// A `datetime-local` value read as UTC: Unix milliseconds.
fn utc_ms(value: Option<&str>) -> Option<String> {
    let value = value.map(str::trim).filter(|v| !v.is_empty())?;
    let at = chrono::NaiveDateTime::parse_from_str(value, "%Y-%m-%dT%H:%M")
        .or_else(|_| chrono::NaiveDateTime::parse_from_str(value, "%Y-%m-%dT%H:%M:%S"))
        .ok()?;
    Some(at.and_utc().timestamp_millis().to_string())
}

async fn jobs(State(c): State<Console>, session: Session, Query(q): Query<JobsQuery>) -> Response {
    if let Some(id) = q.id.as_deref().map(str::trim).filter(|id| !id.is_empty()) {
        return see_other(&format!("/console/jobs/{}", segment(id)));
    }
    let uri = format!(
        "/v1/jobs{}",
        query(&[
            ("state", q.state.as_deref()),
            ("tool", q.tool.as_deref()),
            ("cursor", q.cursor.as_deref()),
            ("since", utc_ms(q.from.as_deref()).as_deref()),
            ("until", utc_ms(q.to.as_deref()).as_deref()),
            ("limit", Some("50")),
        ])
    );
    let (_, list) = c.api(&session.principal, Method::GET, &uri, None).await;
    let filter = pages::JobFilter {
        state: q.state.clone().unwrap_or_default(),
        tool: q.tool.clone().unwrap_or_default(),
        from: q.from.clone().unwrap_or_default(),
        to: q.to.clone().unwrap_or_default(),
    };
    pages::jobs(&session, &list, &filter, &pages::Flash::default())
}

async fn job(
    State(c): State<Console>,
    session: Session,
    Path(id): Path<String>,
    Query(notice): Query<Notice>,
) -> Response {
    let uri = format!("/v1/jobs/{}/record", segment(&id));
    let (_, record) = c.api(&session.principal, Method::GET, &uri, None).await;
    pages::job(&session, &id, &record, &c.notice_of(&notice))
}

async fn job_action(
    State(c): State<Console>,
    session: Session,
    Path((id, action)): Path<(String, String)>,
    form: Form<CsrfForm>,
) -> Response {
    if let Err(refused) = c.check(&session, form.csrf.as_deref()) {
        return *refused;
    }
    let done = match action.as_str() {
        "cancel" => "Cancelled.",
        "retry" => "Put back: it runs again.",
        _ => return missing().await,
    };
    let uri = format!("/v1/jobs/{}/{action}", segment(&id));
    let (status, answer) = c.api(&session.principal, Method::POST, &uri, None).await;
    // A cancel answers the job's final envelope: its error is the cancel.
    let answer = if action == "cancel" && answer["error"]["code"] == "cancelled" {
        json!({"status": "ok"})
    } else {
        answer
    };
    c.back(
        &format!("/console/jobs/{}", segment(&id)),
        status,
        &answer,
        done,
    )
}

#[derive(Deserialize)]
struct RunsQuery {
    state: Option<String>,
    cursor: Option<String>,
}

async fn runs(State(c): State<Console>, session: Session, Query(q): Query<RunsQuery>) -> Response {
    let uri = format!(
        "/v1/runs{}",
        query(&[
            ("state", q.state.as_deref()),
            ("cursor", q.cursor.as_deref())
        ])
    );
    let (_, list) = c.api(&session.principal, Method::GET, &uri, None).await;
    pages::runs(&session, &list)
}

async fn run(
    State(c): State<Console>,
    session: Session,
    Path(id): Path<String>,
    Query(notice): Query<Notice>,
) -> Response {
    let uri = format!("/v1/runs/{}", segment(&id));
    let (_, envelope) = c.api(&session.principal, Method::GET, &uri, None).await;
    pages::run(&session, &id, &envelope, &c.notice_of(&notice))
}

async fn run_cancel(
    State(c): State<Console>,
    session: Session,
    Path(id): Path<String>,
    form: Form<CsrfForm>,
) -> Response {
    if let Err(refused) = c.check(&session, form.csrf.as_deref()) {
        return *refused;
    }
    let uri = format!("/v1/runs/{}/cancel", segment(&id));
    let (status, answer) = c
        .api(&session.principal, Method::POST, &uri, Some(json!({})))
        .await;
    c.back(
        &format!("/console/runs/{}", segment(&id)),
        status,
        &answer,
        "Cancelled.",
    )
}

async fn queues(State(c): State<Console>, session: Session) -> Response {
    let (_, stats) = c
        .api(&session.principal, Method::GET, "/v1/queues", None)
        .await;
    pages::queues(&session, &stats)
}

async fn tools(State(c): State<Console>, session: Session) -> Response {
    let mut specs = BTreeMap::new();
    for format in toolfleet_core::adapters::Format::ALL.map(|f| f.as_str()) {
        let uri = format!("/v1/tools?format={format}");
        let (_, list) = c.api(&session.principal, Method::GET, &uri, None).await;
        specs.insert(format, list);
    }
    pages::tools(&session, &specs)
}

#[derive(Deserialize)]
struct EventsQuery {
    kinds: Option<String>,
}

/// The session's `/v1/events`, for `console.js` (an `EventSource` sends
/// cookies, not bearer tokens).
async fn events(
    State(c): State<Console>,
    headers: HeaderMap,
    Query(q): Query<EventsQuery>,
) -> Response {
    let Some(session) = c.session(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let uri = format!("/v1/events{}", query(&[("kinds", q.kinds.as_deref())]));
    c.call(&session.principal, Method::GET, &uri, None)
        .await
        .unwrap_or_else(|| StatusCode::BAD_REQUEST.into_response())
}

/// The console's stylesheet and script, compiled in.
async fn asset(Path(name): Path<String>) -> Response {
    let (body, kind) = match name.as_str() {
        "console.css" => (
            include_str!("assets/console.css"),
            "text/css; charset=utf-8",
        ),
        "console.js" => (
            include_str!("assets/console.js"),
            "text/javascript; charset=utf-8",
        ),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

async fn missing() -> Response {
    pages::refused(
        StatusCode::NOT_FOUND,
        "There is no such page. Start from the inbox.",
    )
}
