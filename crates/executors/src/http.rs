//! The `http` executor: a tool whose work is done by a service at a URL.
//!
//! It owns one POST per attempt (the arguments as the JSON body, the call's
//! stable key in `Idempotency-Key`) and the reading of the answer: 2xx JSON is
//! the result; 429 and 5xx are retryable failures, other statuses are not.
//! It must never follow a redirect (a POST sent on elsewhere could run twice
//! or lose its key), never wait past its timeout and never buffer more of an
//! answer than `max_response_bytes`.

use std::error::Error as _;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Client, Response, StatusCode, Url};
use rustls_platform_verifier::BuilderVerifierExt;
use serde_json::Value;
use toolfleet_core::{CallCtx, ErrorCode, Executor, Json, ToolError};

use crate::{DEFAULT_MAX_RESULT_BYTES, EXCERPT_BYTES, idempotency_key, quoted};

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const RUN_ID: HeaderName = HeaderName::from_static("toolfleet-run-id");
const TENANT: HeaderName = HeaderName::from_static("toolfleet-tenant");

/// Headers the executor sets itself; configuration may not name them.
pub(crate) const RESERVED_HEADERS: [&str; 7] = [
    "idempotency-key",
    "toolfleet-run-id",
    "toolfleet-tenant",
    "content-type",
    "content-length",
    "transfer-encoding",
    "host",
];

/// The longest `Retry-After` passed on. A service may ask for any delay; the
/// fleet's retry schedule stays bounded.
const MAX_RETRY_AFTER_S: u64 = 3600;

/// The client every HTTP executor of a process shares, so that they share one
/// connection pool: [`client_builder`] on [`tls_config`].
pub fn http_client() -> Result<Client, String> {
    client_builder(tls_config()?)
        .build()
        .map_err(|e| format!("the HTTP client could not be built: {e}"))
}

/// The TLS of toolfleet's HTTP clients: rustls with the `ring` provider and
/// the platform's certificate store, configured here rather than installed
/// as the process default, so nothing global changes. Made once and cloned
/// where clients are made often (one per webhook attempt).
pub fn tls_config() -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|builder| builder.with_platform_verifier())
        .map_err(|e| format!("the HTTP client's TLS could not be configured: {e}"))?
        .with_no_client_auth())
}

/// A builder of a client on `tls` that follows no redirect, with
/// toolfleet's user agent.
pub fn client_builder(tls: rustls::ClientConfig) -> reqwest::ClientBuilder {
    Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("toolfleet/", env!("CARGO_PKG_VERSION")))
}

/// POSTs a call's arguments to a service and reads its answer.
#[derive(Clone)]
pub struct HttpExecutor {
    client: Client,
    url: Url,
    headers: HeaderMap,
    timeout: Duration,
    max_response_bytes: usize,
}

impl HttpExecutor {
    /// An executor for `url`, which must be an absolute http or https URL.
    /// It starts with no extra headers, [`crate::DEFAULT_TIMEOUT`] and
    /// [`DEFAULT_MAX_RESULT_BYTES`].
    pub fn new(client: Client, url: &str) -> Result<Self, String> {
        let url = Url::parse(url).map_err(|e| format!("url `{url}` is not a valid URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "url `{url}` must start with http:// or https://, not {}://",
                url.scheme()
            ));
        }
        Ok(HttpExecutor {
            client,
            url,
            headers: HeaderMap::new(),
            timeout: crate::DEFAULT_TIMEOUT,
            max_response_bytes: DEFAULT_MAX_RESULT_BYTES,
        })
    }

    /// Headers sent with every call, such as credentials for the service.
    /// The executor's own headers (`Idempotency-Key`, `Content-Type`,
    /// `Toolfleet-Run-Id`, `Toolfleet-Tenant`) win over these.
    pub fn with_headers(mut self, headers: HeaderMap) -> Self {
        self.headers = headers;
        self
    }

    /// The wall time of one attempt, from connecting to the last body byte.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The largest 2xx body accepted as a result.
    pub fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// The service's endpoint.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// How long one request may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn call(self, ctx: CallCtx, args: Value) -> Result<Json, ToolError> {
        let request = self.request(&ctx, &args)?;
        match tokio::time::timeout(self.timeout, self.exchange(request)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(timed_out(self.timeout)),
        }
    }

    fn request(&self, ctx: &CallCtx, args: &Value) -> Result<reqwest::Request, ToolError> {
        let body = serde_json::to_vec(args).map_err(|e| {
            ToolError::failed(format!("the arguments could not be encoded: {e}"), false)
        })?;
        let mut headers = self.headers.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        headers.insert(
            IDEMPOTENCY_KEY,
            header_value("idempotency key", idempotency_key(ctx))?,
        );
        headers.insert(RUN_ID, header_value("run id", &ctx.run_id)?);
        headers.insert(TENANT, header_value("tenant", ctx.tenant())?);
        self.client
            .post(self.url.clone())
            .headers(headers)
            .body(body)
            .build()
            .map_err(|e| {
                ToolError::failed(
                    format!("the request could not be built: {}", chain(e)),
                    false,
                )
            })
    }

    async fn exchange(&self, request: reqwest::Request) -> Result<Json, ToolError> {
        let mut response = self
            .client
            .execute(request)
            .await
            .map_err(transport_error)?;
        let status = response.status();
        if !status.is_success() {
            return Err(refusal(&mut response).await);
        }
        let body = self.read_result(&mut response).await?;
        let text = std::str::from_utf8(&body).ok();
        text.and_then(|t| Json::parse(t).ok()).ok_or_else(|| {
            ToolError::failed(
                format!(
                    "the service answered {} with a body that is not JSON{}",
                    status.as_u16(),
                    quoted(&body)
                ),
                false,
            )
        })
    }

    /// The 2xx body, refused as soon as it is known to be over the bound.
    async fn read_result(&self, response: &mut Response) -> Result<Vec<u8>, ToolError> {
        let max = self.max_response_bytes;
        let declared = response.content_length().filter(|&len| len > max as u64);
        if let Some(len) = declared {
            return Err(too_large(format!("declared {len} bytes")));
        }
        let body = read_prefix(response, max).await.map_err(transport_error)?;
        if body.complete {
            Ok(body.bytes)
        } else {
            Err(too_large(format!("sent more than {max} bytes")))
        }
    }
}

impl Executor for HttpExecutor {
    fn execute(&self, ctx: CallCtx, args: Value) -> BoxFuture<'static, Result<Json, ToolError>> {
        Box::pin(self.clone().call(ctx, args))
    }
}

impl fmt::Debug for HttpExecutor {
    // Header values are left out: they are often credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpExecutor")
            .field("url", &self.url.as_str())
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

/// A header value from call data, which a caller may have filled with bytes
/// that HTTP cannot carry.
fn header_value(what: &str, text: &str) -> Result<HeaderValue, ToolError> {
    HeaderValue::from_bytes(text.as_bytes()).map_err(|_| {
        ToolError::new(
            ErrorCode::BadRequest,
            format!("the {what} cannot be sent as an HTTP header: it contains control characters"),
        )
    })
}

/// The first bytes of a body; `complete` is false when more followed.
struct Prefix {
    bytes: Vec<u8>,
    complete: bool,
}

/// Reads the body chunk by chunk and stops once it passes `limit`, so no
/// more than `limit` bytes plus one chunk are ever held.
async fn read_prefix(response: &mut Response, limit: usize) -> Result<Prefix, reqwest::Error> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok(Prefix {
                bytes,
                complete: false,
            });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Prefix {
        bytes,
        complete: true,
    })
}

/// The error for a non-2xx answer, quoting the start of its body.
async fn refusal(response: &mut Response) -> ToolError {
    let status = response.status();
    let retry_after = retry_after_s(response.headers());
    // The excerpt is a courtesy: a body that breaks off still leaves the status.
    let body = read_prefix(response, EXCERPT_BYTES)
        .await
        .map(|p| p.bytes)
        .unwrap_or_default();
    let retryable = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
    let advice = if status.is_redirection() {
        " (redirects are not followed: configure the final URL)"
    } else {
        ""
    };
    let message = format!("the service answered {status}{advice}{}", quoted(&body));
    let error = ToolError::failed(message, retryable);
    match retry_after {
        Some(seconds) if retryable => error.with_retry_after(seconds),
        _ => error,
    }
}

/// `Retry-After` in seconds; the HTTP-date form is not used by the services
/// we call and is ignored.
fn retry_after_s(headers: &HeaderMap) -> Option<u64> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?;
    let seconds: u64 = text.trim().parse().ok()?;
    Some(seconds.min(MAX_RETRY_AFTER_S))
}

fn too_large(how: String) -> ToolError {
    ToolError::new(
        ErrorCode::PayloadTooLarge,
        format!("the service's answer is too large: it {how}"),
    )
    .retryable(false)
}

fn timed_out(timeout: Duration) -> ToolError {
    ToolError::new(
        ErrorCode::Timeout,
        format!("the service did not answer within {timeout:?}"),
    )
}

/// Failures below HTTP. The network may heal, so they are retryable.
fn transport_error(error: reqwest::Error) -> ToolError {
    if error.is_timeout() {
        return ToolError::new(ErrorCode::Timeout, "the service did not answer in time");
    }
    let what = if error.is_connect() {
        "could not connect to the service"
    } else {
        "the exchange with the service failed"
    };
    ToolError::failed(format!("{what}: {}", chain(error)), true)
}

/// An error with its causes, without the URL, which may carry credentials.
fn chain(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
