//! The HTTP exchange both wire formats share: one POST of a JSON body, a
//! timeout on every attempt, retries with jittered exponential backoff on
//! 429, 5xx, connect failures and timeouts, and a bounded read of the answer.
//!
//! It must never put the API key or a request header into an error message
//! or a log line, never buffer more than [`MAX_REPLY_BYTES`] of an answer,
//! and never wait longer than [`MAX_RETRY_AFTER`] because a server asked.

use std::error::Error as _;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Client, Response, StatusCode, Url};
use serde_json::Value;

use super::{ApiKey, ModelError};

/// The largest answer read; a reply of a model is far smaller.
pub const MAX_REPLY_BYTES: usize = 8 << 20;

/// How much of an error answer is read to find the provider's message.
const MAX_ERROR_BYTES: usize = 64 << 10;

/// How much of the provider's error message an error quotes.
const MAX_MESSAGE_CHARS: usize = 500;

/// The longest `Retry-After` honoured; a longer one is cut to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Retries after the first attempt, unless told otherwise.
pub const DEFAULT_RETRIES: usize = 3;

/// The first backoff delay, unless told otherwise; later ones double.
pub const DEFAULT_MIN_DELAY: Duration = Duration::from_millis(500);

/// How the API key travels.
#[derive(Debug, Clone, Copy)]
pub enum KeyHeader {
    /// `Authorization: Bearer <key>` (OpenAI).
    Bearer,
    /// `x-api-key: <key>` (Anthropic).
    XApiKey,
}

/// One model endpoint: where to POST, with which headers, how patiently.
#[derive(Clone)]
pub(crate) struct Endpoint {
    client: Client,
    url: Url,
    /// `scheme://host:port`, the only part of the URL errors show (a base
    /// URL may carry credentials in its user info or query).
    origin: String,
    headers: HeaderMap,
    /// Kept to scrub it from quoted server messages.
    key: Option<ApiKey>,
    timeout: Duration,
    retries: usize,
    min_delay: Duration,
}

impl Endpoint {
    /// An endpoint at `base_url` + `path`; `base_url` must be http or https.
    pub(crate) fn new(
        client: Client,
        base_url: &str,
        path: &str,
        key: Option<ApiKey>,
        key_header: KeyHeader,
        extra: &[(&'static str, &'static str)],
        timeout: Duration,
    ) -> Result<Self, String> {
        let base = Url::parse(base_url)
            .map_err(|e| format!("base_url `{base_url}` is not a valid URL: {e}"))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(format!(
                "base_url `{base_url}` must start with http:// or https://, not {}://",
                base.scheme()
            ));
        }
        if base.query().is_some() || base.fragment().is_some() {
            return Err(format!(
                "base_url `{base_url}` must not have a query or fragment: the client appends `{path}`"
            ));
        }
        let url = Url::parse(&format!("{}{path}", base.as_str().trim_end_matches('/')))
            .map_err(|e| format!("base_url `{base_url}` cannot take `{path}`: {e}"))?;
        if timeout.is_zero() {
            return Err("the model timeout must be positive".to_owned());
        }
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        for (name, value) in extra {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        if let Some(key) = &key {
            let (name, text) = match key_header {
                KeyHeader::Bearer => (reqwest::header::AUTHORIZATION, format!("Bearer {}", key.0)),
                KeyHeader::XApiKey => (HeaderName::from_static("x-api-key"), key.0.clone()),
            };
            // The error names neither the key nor the character.
            let mut value = HeaderValue::from_str(&text).map_err(|_| {
                "the API key contains characters an HTTP header cannot carry".to_owned()
            })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        Ok(Endpoint {
            client,
            origin: url.origin().ascii_serialization(),
            url,
            headers,
            key,
            timeout,
            retries: DEFAULT_RETRIES,
            min_delay: DEFAULT_MIN_DELAY,
        })
    }

    pub(crate) fn with_retries(mut self, retries: usize, min_delay: Duration) -> Self {
        self.retries = retries;
        self.min_delay = min_delay;
        self
    }

    /// POSTs `body` and returns the 2xx answer as JSON, retrying what a
    /// retry may cure.
    pub(crate) async fn post(&self, body: &Value) -> Result<Value, ModelError> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| ModelError::Refused(format!("the request could not be encoded: {e}")))?;
        let backoff = ExponentialBuilder::default()
            .with_jitter()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.min_delay.saturating_mul(8).min(MAX_RETRY_AFTER))
            .with_max_times(self.retries);
        let attempts = AtomicUsize::new(0);
        let outcome = (|| {
            attempts.fetch_add(1, Ordering::Relaxed);
            self.attempt(&bytes)
        })
        .retry(backoff)
        .when(|failure: &Failure| failure.retryable)
        .adjust(|failure, delay| delay.map(|d| failure.retry_after.unwrap_or(d)))
        .notify(|failure, delay| {
            tracing::warn!(
                endpoint = %self.origin,
                attempt = attempts.load(Ordering::Relaxed),
                ?delay,
                "model call failed, retrying: {}",
                failure.error
            );
        })
        .await;
        outcome.map_err(|failure| match failure.error {
            ModelError::Unavailable(m)
                if failure.retryable && attempts.load(Ordering::Relaxed) > 1 =>
            {
                ModelError::Unavailable(format!(
                    "{m} (gave up after {} attempts)",
                    attempts.load(Ordering::Relaxed)
                ))
            }
            other => other,
        })
    }

    async fn attempt(&self, body: &[u8]) -> Result<Value, Failure> {
        let request = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .timeout(self.timeout)
            .body(body.to_vec());
        // reqwest's timeout covers the body too; this one is the guarantee.
        match tokio::time::timeout(self.timeout, self.exchange(request)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(self.timed_out()),
        }
    }

    async fn exchange(&self, request: reqwest::RequestBuilder) -> Result<Value, Failure> {
        let mut response = request.send().await.map_err(|e| self.transport(e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.refusal(&mut response).await);
        }
        let body = match read_bounded(&mut response, MAX_REPLY_BYTES).await {
            Ok(Some(body)) => body,
            Ok(None) => {
                return Err(Failure::fatal(ModelError::Malformed(format!(
                    "{} answered more than {MAX_REPLY_BYTES} bytes",
                    self.origin
                ))));
            }
            Err(e) => return Err(self.transport(e)),
        };
        serde_json::from_slice(&body).map_err(|e| {
            Failure::fatal(ModelError::Malformed(format!(
                "{} answered {} with a body that is not JSON: {e}",
                self.origin,
                status.as_u16()
            )))
        })
    }

    /// The failure for a non-2xx answer, with the provider's message.
    async fn refusal(&self, response: &mut Response) -> Failure {
        let status = response.status();
        let retry_after = retry_after(response.headers());
        // The message is a courtesy: a body that breaks off still leaves the status.
        let body = read_prefix(response, MAX_ERROR_BYTES)
            .await
            .unwrap_or_default();
        let message = self.scrub(provider_message(&body));
        let advice = if status.is_redirection() {
            " (redirects are not followed: configure the final base_url)"
        } else {
            ""
        };
        let text = format!("{} answered {status}{advice}{message}", self.origin);
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            Failure {
                error: ModelError::Unavailable(text),
                retryable: true,
                retry_after,
            }
        } else {
            Failure::fatal(ModelError::Refused(text))
        }
    }

    fn timed_out(&self) -> Failure {
        Failure::retry(ModelError::Unavailable(format!(
            "{} did not answer within {:?}",
            self.origin, self.timeout
        )))
    }

    /// Failures below HTTP. The network may heal, so they are retried,
    /// except a request that could not even be built.
    fn transport(&self, error: reqwest::Error) -> Failure {
        if error.is_timeout() {
            return self.timed_out();
        }
        let what = if error.is_connect() {
            "could not connect to"
        } else {
            "the exchange failed with"
        };
        let text = self.scrub(format!(": {}", chain(error.without_url())));
        let failure = ModelError::Unavailable(format!("{what} {}{text}", self.origin));
        Failure::retry(failure)
    }

    /// Removes the key from text a server or library wrote.
    fn scrub(&self, text: String) -> String {
        match &self.key {
            Some(key) if !key.0.is_empty() && text.contains(&key.0) => text.replace(&key.0, "***"),
            _ => text,
        }
    }
}

impl fmt::Debug for Endpoint {
    // Header values are left out: one of them is the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("origin", &self.origin)
            .field("path", &self.url.path())
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("min_delay", &self.min_delay)
            .finish()
    }
}

/// One failed attempt, and whether another may succeed.
struct Failure {
    error: ModelError,
    retryable: bool,
    retry_after: Option<Duration>,
}

impl Failure {
    fn fatal(error: ModelError) -> Self {
        Failure {
            error,
            retryable: false,
            retry_after: None,
        }
    }

    fn retry(error: ModelError) -> Self {
        Failure {
            error,
            retryable: true,
            retry_after: None,
        }
    }
}

/// `Retry-After` in seconds, capped; the HTTP-date form is ignored and the
/// backoff decides instead.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?;
    let seconds: f64 = text.trim().parse().ok()?;
    let delay = Duration::try_from_secs_f64(seconds).ok()?;
    Some(delay.min(MAX_RETRY_AFTER))
}

/// The body if it is at most `limit` bytes, `None` if it is longer.
async fn read_bounded(
    response: &mut Response,
    limit: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    if response
        .content_length()
        .is_some_and(|len| len > limit as u64)
    {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if chunk.len() > limit - bytes.len() {
            return Ok(None);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Some(bytes))
}

/// At most the first `limit` bytes of the body.
async fn read_prefix(response: &mut Response, limit: usize) -> Result<Vec<u8>, reqwest::Error> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit - bytes.len();
        if chunk.len() >= room {
            bytes.extend_from_slice(&chunk[..room]);
            break;
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// `: <message>` from an error body: `error.message` (OpenAI and Anthropic),
/// or `error` or `message` as a string (some compatible servers), or else
/// the body's text; one line, at most [`MAX_MESSAGE_CHARS`] characters.
fn provider_message(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let found = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("error"))
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .and_then(Value::as_str)
    });
    let text = match found {
        Some(text) => text.to_owned(),
        None => String::from_utf8_lossy(body).into_owned(),
    };
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let line = match line.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    };
    if line.is_empty() {
        line
    } else {
        format!(": {line}")
    }
}

/// An error with its causes; the caller removes the URL first.
fn chain(error: reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_messages_are_found_and_cut() {
        let openai = br#"{"error": {"message": "bad model", "type": "invalid_request_error"}}"#;
        assert_eq!(provider_message(openai), ": bad model");
        let anthropic = br#"{"type": "error", "error": {"type": "x", "message": "no"}}"#;
        assert_eq!(provider_message(anthropic), ": no");
        assert_eq!(provider_message(br#"{"error": "plain"}"#), ": plain");
        assert_eq!(provider_message(b"  upstream\n down "), ": upstream down");
        assert_eq!(provider_message(b""), "");
        let long = provider_message("é".repeat(2000).as_bytes());
        assert_eq!(long.chars().count(), 2 + MAX_MESSAGE_CHARS + 1);
    }

    #[test]
    fn retry_after_is_seconds_and_capped() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("86400"));
        assert_eq!(retry_after(&headers), Some(MAX_RETRY_AFTER));
        headers.insert(RETRY_AFTER, HeaderValue::from_static("-1"));
        assert_eq!(retry_after(&headers), None);
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn base_urls_are_checked() {
        let client = toolfleet_executors::http_client().unwrap();
        let make = |url: &str| {
            Endpoint::new(
                client.clone(),
                url,
                "/messages",
                None,
                KeyHeader::XApiKey,
                &[],
                Duration::from_secs(1),
            )
        };
        let ok = make("http://127.0.0.1:9/v1/").unwrap();
        assert_eq!(ok.url.as_str(), "http://127.0.0.1:9/v1/messages");
        assert!(make("ftp://x/v1").unwrap_err().contains("http://"));
        assert!(make("not a url").unwrap_err().contains("not a valid URL"));
        assert!(make("https://x/v1?key=1").unwrap_err().contains("query"));
    }
}
