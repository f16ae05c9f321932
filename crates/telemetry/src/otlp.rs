//! The OTLP exporter: spans to an OTLP/HTTP receiver (a collector, Jaeger,
//! Tempo...) as protobuf, in batches, from the SDK's batch processor.
//!
//! The batch processor runs on a thread of its own and drives each export
//! with a plain executor; the request itself is sent by the process's own
//! reqwest client on the process's tokio runtime ([`OnRuntime`]), so no
//! second HTTP stack or runtime is started for it.

use std::time::Duration;

use async_trait::async_trait;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where spans go, and as whom.
#[derive(Debug, Clone)]
pub struct Otlp {
    /// The receiver's base URL (`http://collector:4318`), as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` names it: spans are posted to
    /// `<endpoint>/v1/traces`.
    pub endpoint: String,
    /// The `service.name` of the spans: the process's role.
    pub service_name: String,
    /// The client that posts them.
    pub client: reqwest::Client,
    /// The runtime the client runs on.
    pub runtime: tokio::runtime::Handle,
}

impl Otlp {
    /// The URL spans are posted to: the endpoint with `/v1/traces`.
    pub fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.endpoint.trim_end_matches('/'))
    }

    /// A tracer provider exporting in batches to this receiver.
    pub(crate) fn provider(&self) -> Result<SdkTracerProvider, String> {
        let url = self.traces_url();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(OnRuntime {
                client: self.client.clone(),
                runtime: self.runtime.clone(),
            })
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.as_str())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("the OTLP endpoint {url}: {e}"))?;
        let resource = Resource::builder()
            .with_service_name(self.service_name.clone())
            .build();
        Ok(SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build())
    }
}

/// The process's reqwest client, each request sent on its tokio runtime
/// whatever thread asks (the batch processor's own has no runtime).
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            match tokio::time::timeout(EXPORT_TIMEOUT, client.send_bytes(request)).await {
                Ok(answer) => answer,
                Err(_) => Err(HttpError::from(format!(
                    "no answer within {EXPORT_TIMEOUT:?}"
                ))),
            }
        });
        sent.await.map_err(|e| HttpError::from(e.to_string()))?
    }
}
