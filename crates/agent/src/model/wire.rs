//! One client for both wire formats: the endpoint (timeouts, retries,
//! bounded bodies, the key in its header) is shared, and a [`Wire`] says
//! what differs: the path, how the key travels, the fixed headers, and the
//! translation of a request and a reply.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Client;
use serde_json::Value;

use super::http::{Endpoint, KeyHeader};
use super::{ApiKey, Model, ModelError, ModelReply, ModelRequest};

/// What one wire format is.
pub trait Wire: Send + Sync + 'static {
    /// Appended to the base URL.
    const PATH: &'static str;
    /// How the API key is sent.
    const KEY: KeyHeader;
    /// Headers every request carries.
    const HEADERS: &'static [(&'static str, &'static str)];
    /// The request body.
    fn body(model: &str, request: &ModelRequest<'_>) -> Value;
    /// The reply in an answer; anything else is [`ModelError::Malformed`].
    fn reply(answer: &Value) -> Result<ModelReply, ModelError>;
}

/// A client of `model` at one endpoint of wire format `W`.
pub struct WireModel<W> {
    endpoint: Endpoint,
    model: String,
    wire: PhantomData<fn() -> W>,
}

impl<W: Wire> WireModel<W> {
    /// A client of `model` at `base_url` (e.g. `https://api.openai.com/v1`,
    /// `http://localhost:11434/v1` or `https://api.anthropic.com/v1`),
    /// sending `key` when there is one, with `timeout` on every attempt.
    pub fn new(
        client: Client,
        base_url: &str,
        model: &str,
        key: Option<ApiKey>,
        timeout: Duration,
    ) -> Result<Self, String> {
        let endpoint = Endpoint::new(client, base_url, W::PATH, key, W::KEY, W::HEADERS, timeout)?;
        Ok(WireModel {
            endpoint,
            model: model.to_owned(),
            wire: PhantomData,
        })
    }

    /// At most `retries` retries after the first attempt, the first after
    /// about `min_delay` (a server's `Retry-After` wins).
    pub fn with_retries(mut self, retries: usize, min_delay: Duration) -> Self {
        self.endpoint = self.endpoint.with_retries(retries, min_delay);
        self
    }
}

impl<W> Clone for WireModel<W> {
    fn clone(&self) -> Self {
        WireModel {
            endpoint: self.endpoint.clone(),
            model: self.model.clone(),
            wire: PhantomData,
        }
    }
}

impl<W> fmt::Debug for WireModel<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(
            std::any::type_name::<W>()
                .rsplit("::")
                .next()
                .unwrap_or("WireModel"),
        )
        .field("endpoint", &self.endpoint)
        .field("model", &self.model)
        .finish()
    }
}

#[async_trait]
impl<W: Wire> Model for WireModel<W> {
    async fn complete(&self, request: &ModelRequest<'_>) -> Result<ModelReply, ModelError> {
        let answer = self.endpoint.post(&W::body(&self.model, request)).await?;
        W::reply(&answer)
    }
}
