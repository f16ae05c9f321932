//! `/mcp`: MCP over Streamable HTTP behind the same bearer tokens as the rest
//! of the API, and its OAuth protected-resource metadata (RFC 9728). The
//! protocol is toolfleet-mcp's; this module only checks who may speak it.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use serde_json::json;
use std::time::Duration;

use serde_json::Value;
use toolfleet_broker::Broker;
use toolfleet_core::JobState;
use toolfleet_core::metrics::{Denial, UNKNOWN_TOOL};
use toolfleet_core::{Envelope, ErrorCode, Principal, ToolError};
use toolfleet_mcp::{BoxFuture, HttpEndpoint, JobList, JobView, Jobs, Options};
use toolfleet_store::{JobFilter, JobRecord, TicketKind, TicketRecord};

use crate::AppState;
use crate::access;
use crate::status::Status;

/// MCP tasks and elicitation over the fleet's store: a task is its job, so
/// every dispatcher answers for every task, always by the rules of
/// [`crate::access`] for the caller.
#[derive(Clone)]
pub struct McpJobs {
    status: Status,
    broker: Arc<dyn Broker>,
}

impl McpJobs {
    /// MCP's tasks and tickets over `status`; an answered ticket's waiting job goes back on `broker`.
    pub fn new(status: Status, broker: Arc<dyn Broker>) -> Self {
        McpJobs { status, broker }
    }

    /// Those of `state`.
    pub fn of(state: &AppState) -> Self {
        McpJobs::new(state.status(), state.broker.clone())
    }

    /// The view of `job` `principal` reads: with what its tool asks the
    /// client and is not answered yet, while it waits for that.
    async fn view(&self, principal: &Principal, job: JobRecord) -> JobView {
        let input_requests = self
            .input_ticket(&job)
            .await
            .map(|ticket| ticket.pending_inputs())
            .filter(|pending| !pending.is_empty());
        JobView {
            envelope: self.status.answer(principal, &job),
            id: job.id,
            tool: job.tool,
            state: job.state.shown(),
            progress: job.progress,
            created_at: job.created_at,
            updated_at: job.updated_at,
            input_requests,
        }
    }

    /// [`McpJobs::view`] of `job`, if there is one.
    async fn view_of(&self, principal: &Principal, job: Option<JobRecord>) -> Option<JobView> {
        match job {
            Some(job) => Some(self.view(principal, job).await),
            None => None,
        }
    }

    /// The open input ticket a parked job waits on (its checkpoint names
    /// it: see the worker's `input`), if it waits on one.
    async fn input_ticket(&self, job: &JobRecord) -> Option<TicketRecord> {
        if job.state != JobState::Parked {
            return None;
        }
        let store = &self.status.store;
        let saved = store.checkpoint(&job.id).await.ok()??;
        let id = toolfleet_fleet::tickets::input_ticket_of(Some(&saved))?;
        let ticket = store.ticket(&job.tenant, id).await.ok()??;
        (ticket.kind == TicketKind::Input && ticket.is_open()).then_some(ticket)
    }
}

impl Jobs for McpJobs {
    fn job<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>> {
        // A wait that is over at once: the job as it stands.
        self.wait(principal, id, i64::MIN, Duration::ZERO)
    }

    fn wait<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
        since: i64,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>> {
        Box::pin(async move {
            let job = self.status.wait_change(principal, id, since, wait).await?;
            Ok(self.view_of(principal, job).await)
        })
    }

    /// Woken by the job's outcome alone (see
    /// [`toolfleet_broker::Notices::subscribe_settled`]).
    fn wait_settled<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
        _since: i64,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>> {
        Box::pin(async move {
            let job = self.status.wait_settled(principal, id, wait).await?;
            Ok(self.view_of(principal, job).await)
        })
    }

    fn watch_settled<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>> {
        Box::pin(async move {
            let job = self.status.watch_settled(principal, id, wait).await?;
            Ok(self.view_of(principal, job).await)
        })
    }

    fn cancel<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>> {
        Box::pin(async move {
            let job = self.status.cancel_record(principal, id).await?;
            Ok(self.view_of(principal, job).await)
        })
    }

    fn list<'a>(
        &'a self,
        principal: &'a Principal,
        cursor: Option<&'a str>,
        limit: u32,
    ) -> BoxFuture<'a, Result<JobList, ToolError>> {
        Box::pin(async move {
            let filter = JobFilter {
                user: access::listed_user(principal),
                ..JobFilter::default()
            };
            let page = self
                .status
                .store
                .list_jobs(toolfleet_store::ListJobs {
                    tenant: &principal.tenant,
                    filter: &filter,
                    limit,
                    cursor,
                })
                .await
                .map_err(toolfleet_fleet::store_error)?;
            let mut jobs = Vec::with_capacity(page.jobs.len());
            for job in page.jobs {
                jobs.push(self.view(principal, job).await);
            }
            Ok(JobList {
                jobs,
                next_cursor: page.next_cursor,
            })
        })
    }

    /// The job's owner alone (another user's or tenant's job reads as
    /// missing, operators included): the answers are recorded on the input
    /// ticket the parked job waits on, if it waits on one.
    fn respond<'a>(
        &'a self,
        principal: &'a Principal,
        id: &'a str,
        responses: &'a serde_json::Map<String, Value>,
    ) -> BoxFuture<'a, Result<Option<()>, ToolError>> {
        Box::pin(async move {
            let store = &self.status.store;
            let job = match store.job(&principal.tenant, id).await {
                Ok(Some(job)) if job.user == principal.user => job,
                Ok(_) => return Ok(None),
                Err(error) => return Err(toolfleet_fleet::store_error(error)),
            };
            if let Some(ticket) = self.input_ticket(&job).await {
                let notices = self.status.notices.as_ref();
                toolfleet_fleet::tickets::respond(
                    store.as_ref(),
                    self.broker.as_ref(),
                    notices,
                    &ticket,
                    responses,
                )
                .await?;
            }
            Ok(Some(()))
        })
    }

    fn answer<'a>(
        &'a self,
        principal: &'a Principal,
        ticket: &'a str,
        answer: Value,
    ) -> BoxFuture<'a, Envelope> {
        Box::pin(async move {
            let answerer = crate::routes::Answerer {
                store: self.status.store.as_ref(),
                broker: self.broker.as_ref(),
                notices: self.status.notices.as_ref(),
                access: &self.status.access,
            };
            answerer.answer(principal, ticket, &answer).await
        })
    }
}

/// Where the protected-resource metadata is served: the plain well-known
/// path, and RFC 9728's form with the resource's path appended.
pub(crate) const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// The endpoint `/mcp` answers through (mounted by `routes.rs`, from
/// [`crate::openapi::ROUTES`], as are the metadata routes).
pub(crate) fn endpoint(state: &AppState) -> Arc<HttpEndpoint> {
    let metrics = state.runtime.metrics().clone();
    Arc::new(HttpEndpoint::new(
        state.runtime.clone(),
        Options {
            page_size: state.mcp.page_size,
            max_body: state.limits.max_body,
            // The runtime counts every call it runs; one that never reaches
            // it (no registered tool, arguments that are not an object) is
            // counted here.
            on_call: Some(Arc::new(move |tool, envelope| metrics.call(tool, envelope))),
            jobs: Some(Arc::new(McpJobs::of(state))),
            stop: Some(state.stopping.clone()),
            declared: state.mcp.resources.clone(),
            state_key: state.mcp.state_key,
            sessions: state.mcp.sessions,
            max_sessions: state.mcp.max_sessions,
            watch_every: state.mcp.watch_every,
            ..Options::default()
        },
    ))
}

pub(crate) async fn mcp(
    endpoint: &HttpEndpoint,
    state: &AppState,
    request: Request<Body>,
) -> Response {
    let metrics = state.runtime.metrics();
    if let Err(message) = check_origin(request.headers(), &state.mcp.allowed_origins) {
        metrics.denied(UNKNOWN_TOOL, Denial::Forbidden);
        return refuse(
            StatusCode::FORBIDDEN,
            ToolError::new(ErrorCode::Forbidden, message),
            None,
        );
    }
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match state.auth.principal(authorization) {
        Ok(principal) => endpoint.handle(request, principal).await,
        Err(error) => {
            metrics.denied(UNKNOWN_TOOL, Denial::Unauthenticated);
            let challenge = format!(
                "Bearer resource_metadata=\"{}{METADATA_PATH}\"",
                base_url(request.headers())
            );
            refuse(StatusCode::UNAUTHORIZED, error, Some(challenge))
        }
    }
}

fn refuse(status: StatusCode, error: ToolError, challenge: Option<String>) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        Envelope::error(error).to_json(),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        let value = challenge
            .and_then(|c| HeaderValue::from_str(&c).ok())
            .unwrap_or(HeaderValue::from_static("Bearer"));
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// RFC 9728 protected-resource metadata of `/mcp`. Tokens are issued by
/// configuration, not by an authorization server, so none is named.
pub(crate) async fn metadata(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let scopes: BTreeSet<&str> = state
        .runtime
        .registry()
        .tools()
        .flat_map(|t| t.required_scopes().iter().map(String::as_str))
        .collect();
    axum::Json(json!({
        "resource": format!("{}/mcp", base_url(&headers)),
        "resource_name": "toolfleet",
        "bearer_methods_supported": ["header"],
        "scopes_supported": scopes,
    }))
    .into_response()
}

/// This server as its client addressed it: `Host`, and https when a proxy
/// in front says so.
fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .filter(|h| h.len() <= 255 && h.parse::<axum::http::uri::Authority>().is_ok())
        .unwrap_or("localhost");
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    format!("{}://{host}", if https { "https" } else { "http" })
}

/// A request without `Origin` (every non-browser client) passes; one with an
/// `Origin` must be allowed by configuration, or name this server's own host
/// and port when that host is a loopback name (`localhost`, `127.0.0.1`,
/// `[::1]`). A page whose name was rebound to this server sends its own name
/// as both Host and Origin, so matching the two is not enough: only loopback
/// names, which DNS cannot hand to a stranger, pass without configuration.
fn check_origin(headers: &HeaderMap, allowed: &[String]) -> Result<(), String> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin
        .to_str()
        .map_err(|_| "the Origin header is not text".to_owned())?;
    if allowed
        .iter()
        .any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return Ok(());
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let own = origin
        .parse::<Uri>()
        .ok()
        .filter(|u| matches!(u.scheme_str(), Some("http" | "https")))
        .and_then(|u| u.authority().map(|a| a.as_str().to_ascii_lowercase()))
        .is_some_and(|authority| {
            host.is_some_and(|h| h.eq_ignore_ascii_case(&authority)) && is_loopback(&authority)
        });
    if own {
        Ok(())
    } else {
        Err(format!(
            "Origin `{}` may not call /mcp on this server; add it to [mcp] allowed_origins",
            toolfleet_core::registry::truncate(origin, 128)
        ))
    }
}

/// True for `localhost`, `127.x.y.z` and `[::1]`, with or without a port.
fn is_loopback(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolfleet_broker::Notices;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn origins_must_be_this_server_or_allowed() {
        let allowed = vec!["https://app.example.com".to_owned()];
        let host = ("host", "127.0.0.1:8080");
        assert!(check_origin(&headers(&[host]), &allowed).is_ok());
        assert!(
            check_origin(
                &headers(&[host, ("origin", "http://127.0.0.1:8080")]),
                &allowed
            )
            .is_ok()
        );
        assert!(
            check_origin(
                &headers(&[host, ("origin", "https://app.example.com")]),
                &allowed
            )
            .is_ok()
        );
        for bad in [
            "http://evil.example",
            "http://127.0.0.1:9999",
            "http://127.0.0.1",
            "null",
            "file://127.0.0.1:8080",
            "not a url",
        ] {
            assert!(
                check_origin(&headers(&[host, ("origin", bad)]), &allowed).is_err(),
                "{bad}"
            );
        }
        // No Host to compare with: only the allow-list admits an Origin.
        assert!(check_origin(&headers(&[("origin", "http://127.0.0.1:8080")]), &[]).is_err());
        // A rebound name: Host and Origin agree, and neither is loopback.
        let rebound = [
            ("host", "evil.example.com:8080"),
            ("origin", "http://evil.example.com:8080"),
        ];
        assert!(check_origin(&headers(&rebound), &allowed).is_err());
        for local in ["localhost:8080", "[::1]:8080", "127.0.0.1"] {
            let origin = format!("http://{local}");
            assert!(
                check_origin(&headers(&[("host", local), ("origin", &origin)]), &[]).is_ok(),
                "{local}"
            );
        }
    }

    #[test]
    fn the_base_url_is_the_host_addressed() {
        assert_eq!(
            base_url(&headers(&[("host", "example.com:8080")])),
            "http://example.com:8080"
        );
        assert_eq!(
            base_url(&headers(&[
                ("host", "example.com"),
                ("x-forwarded-proto", "https")
            ])),
            "https://example.com"
        );
        assert_eq!(
            base_url(&headers(&[("host", "bad host\"")])),
            "http://localhost"
        );
        assert_eq!(base_url(&HeaderMap::new()), "http://localhost");
    }

    /// Notices that count the subscriptions of each kind.
    #[derive(Default)]
    struct Counting {
        inner: toolfleet_broker::memory::MemoryNotices,
        every: std::sync::atomic::AtomicUsize,
        outcomes: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Notices for Counting {
        async fn publish(
            &self,
            event: &toolfleet_broker::Event,
        ) -> Result<(), toolfleet_broker::BrokerError> {
            self.inner.publish(event).await
        }

        async fn subscribe(
            &self,
        ) -> Result<Box<dyn toolfleet_broker::Subscription>, toolfleet_broker::BrokerError>
        {
            self.every.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.subscribe().await
        }

        async fn subscribe_settled(
            &self,
        ) -> Result<Box<dyn toolfleet_broker::Subscription>, toolfleet_broker::BrokerError>
        {
            self.outcomes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.subscribe().await
        }
    }

    /// `tasks/result`'s wait takes the outcomes' feed and is woken by the
    /// outcome, not by the job starting; `tasks/get`'s wait hears every
    /// change.
    #[tokio::test]
    async fn a_wait_for_the_outcome_hears_outcomes_alone() {
        let store = crate::testing::memory_store().await;
        let notices = Arc::new(Counting::default());
        let jobs = McpJobs::new(
            crate::testing::status(store.clone(), notices.clone()),
            Arc::new(toolfleet_broker::memory::MemoryBroker::new()),
        );
        let new = crate::testing::new_job(None, 1);
        let id = new.id.clone();
        store.insert_job(new).await.expect("insert");
        let waiting = {
            let jobs = Arc::new(jobs);
            let id = id.clone();
            let waiter = jobs.clone();
            (
                tokio::spawn(async move {
                    waiter
                        .wait_settled(&crate::testing::alice(), &id, 1, Duration::from_secs(10))
                        .await
                }),
                jobs,
            )
        };
        let (waiting, jobs) = waiting;
        // Subscribed before it reads; then the job starts, then settles.
        let subscribed = async {
            while notices.outcomes.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), subscribed)
            .await
            .expect("the wait took the outcomes' feed");
        let running = store
            .claim(toolfleet_store::ClaimJob {
                id: &id,
                worker: "w",
                now: 2,
                lease_ms: 30_000,
            })
            .await
            .expect("claim")
            .expect("claimed");
        let event = toolfleet_fleet::job_event(&running, crate::status::POLL_AFTER_S);
        assert_eq!(notices.publish(&event).await, Ok(()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "woken by the job starting");
        let done = store
            .succeed(toolfleet_store::Succeed {
                lease: &running.lease_ref().expect("held"),
                result: &json!({}).into(),
                now: 3,
                claimed: None,
            })
            .await
            .expect("succeed")
            .expect("settled");
        assert_eq!(
            notices
                .publish(&toolfleet_fleet::job_event(
                    &done,
                    crate::status::POLL_AFTER_S
                ))
                .await,
            Ok(())
        );
        let view = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken by the outcome")
            .expect("the wait")
            .expect("read")
            .expect("the job");
        assert_eq!(view.state, toolfleet_core::JobState::Succeeded);
        assert_eq!(notices.every.load(std::sync::atomic::Ordering::SeqCst), 0);
        let changed = jobs
            .wait(&crate::testing::alice(), &id, 0, Duration::from_millis(50))
            .await
            .expect("read");
        assert!(changed.is_some());
        assert_eq!(notices.every.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// Notices that refuse every subscription, as RabbitMQ's do while
    /// reconnecting.
    struct Down;

    #[async_trait::async_trait]
    impl Notices for Down {
        async fn publish(
            &self,
            _: &toolfleet_broker::Event,
        ) -> Result<(), toolfleet_broker::BrokerError> {
            Err(toolfleet_broker::BrokerError::Unavailable("down".into()))
        }

        async fn subscribe(
            &self,
        ) -> Result<Box<dyn toolfleet_broker::Subscription>, toolfleet_broker::BrokerError>
        {
            Err(toolfleet_broker::BrokerError::Unavailable("down".into()))
        }
    }

    /// With the notices down, a wait for an unsettled job pauses before it
    /// answers (a task's result, waiting again at once, polls the store
    /// instead of spinning), and answers long before its deadline.
    #[tokio::test]
    async fn a_wait_without_notices_pauses_instead_of_spinning() {
        let store = crate::testing::memory_store().await;
        let jobs = McpJobs::new(
            crate::testing::status(store.clone(), Arc::new(Down)),
            Arc::new(toolfleet_broker::memory::MemoryBroker::new()),
        );
        let new = crate::testing::new_job(None, 1);
        let id = new.id.clone();
        store.insert_job(new).await.expect("insert");
        for wait in [
            jobs.wait_settled(&crate::testing::alice(), &id, 1, Duration::from_secs(30)),
            jobs.wait(&crate::testing::alice(), &id, 1, Duration::from_secs(30)),
        ] {
            let began = std::time::Instant::now();
            let view = tokio::time::timeout(Duration::from_secs(20), wait)
                .await
                .expect("an answer before the deadline")
                .expect("read")
                .expect("the job");
            assert_eq!(view.state, toolfleet_core::JobState::Queued);
            assert!(
                began.elapsed() >= Duration::from_millis(900),
                "answered after {:?}, without a pause",
                began.elapsed()
            );
        }
    }
}
