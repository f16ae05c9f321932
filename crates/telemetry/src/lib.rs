//! The logs and traces of a toolfleet process.
//!
//! Every process logs to stderr, filtered by `TOOLFLEET_LOG` (default
//! `warn`), as text or as JSON lines ([`LogFormat`]). A job's life is logged
//! inside spans that carry its tool, job id, run id, tenant and attempt, and
//! its place in a W3C trace ([`continue_trace`]): `trace_id`, `span_id` and
//! `parent_span_id`, so each line of it says which job and which trace it
//! belongs to. With an OTLP endpoint ([`Otlp`]) the same spans are exported
//! in batches, and flushed by [`Telemetry::shutdown`]; without one nothing
//! is exported and no exporter runs, yet the trace context still travels
//! and the logs still show it.

mod json;
mod otlp;

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider,
};
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::Deserialize;
use toolfleet_core::TraceContext;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub use otlp::Otlp;

/// How log lines are written: the `log_format` key, or `TOOLFLEET_LOG_FORMAT`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum LogFormat {
    /// Human-readable lines, span fields in front of each message.
    #[default]
    Text,
    /// One JSON object per line, span fields flattened beside the event's.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "log_format = {other:?} is not known: use \"text\" or \"json\""
            )),
        }
    }
}

impl TryFrom<String> for LogFormat {
    type Error = String;

    fn try_from(value: String) -> Result<Self, String> {
        value.parse()
    }
}

/// The installed logging and tracing of a process; [`Telemetry::shutdown`]
/// exports what is still buffered.
#[must_use = "shut it down at exit, or buffered spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Installs the process's subscriber: log lines of `format` on stderr,
    /// filtered by `TOOLFLEET_LOG` (default `warn`), and with `otlp` an
    /// exporter of every span the filter lets through.
    pub fn init(format: LogFormat, otlp: Option<&Otlp>) -> Result<Telemetry, String> {
        let filter = tracing_subscriber::EnvFilter::try_from_env("TOOLFLEET_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let provider = otlp.map(Otlp::provider).transpose()?;
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let text = (format == LogFormat::Text).then(|| {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(ansi)
        });
        let json = (format == LogFormat::Json).then(|| {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                .event_format(json::FlatJson)
        });
        let exported = provider.as_ref().map(|provider| {
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("toolfleet"))
                // The exporter's own HTTP traffic is not part of any trace.
                .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                    !["hyper", "h2", "reqwest", "rustls", "tower"]
                        .iter()
                        .any(|noisy| meta.target().starts_with(noisy))
                }))
        });
        tracing_subscriber::registry()
            .with(filter)
            .with(text)
            .with(json)
            .with(exported)
            .try_init()
            .map_err(|e| format!("cannot set up logging: {e}"))?;
        Ok(Telemetry { provider })
    }

    /// True when spans are exported.
    pub fn exports(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans still buffered and stops the exporter. Call it once
    /// the work is done, outside the runtime's tasks, while the runtime still
    /// runs (the exporter's requests run on it).
    pub fn shutdown(self) -> Result<(), String> {
        match self.provider {
            Some(provider) => provider
                .shutdown()
                .map_err(|e| format!("exporting the last spans: {e}")),
            None => Ok(()),
        }
    }
}

/// Places `span` in a trace and answers its own context: as a child of
/// `parent` (same trace id, `parent_span_id` its span id) or, without one,
/// as the root of a new trace. The span must declare the fields `trace_id`,
/// `span_id` and `parent_span_id` (as `tracing::field::Empty`), which are
/// recorded here, and must not have been entered yet.
///
/// When spans are exported the ids are those of the exported span, so the
/// logs and the traces name the same spans; otherwise they are made here.
/// Either way the answer is what a job made under this span carries.
pub fn continue_trace(span: &tracing::Span, parent: Option<&TraceContext>) -> TraceContext {
    if let Some(parent) = parent {
        let state = parent
            .tracestate()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let flags = if parent.is_sampled() {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let remote = SpanContext::new(
            TraceId::from_bytes(parent.trace_id_bytes()),
            SpanId::from_bytes(parent.span_id_bytes()),
            flags,
            true,
            state,
        );
        // Fails without the exporter's layer, which is no failure.
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
    let exported = span.context();
    let own = exported.span().span_context().clone();
    let tracestate = parent.and_then(|p| p.tracestate().map(str::to_owned));
    let context = own
        .is_valid()
        .then(|| {
            TraceContext::from_ids(
                own.trace_id().to_bytes(),
                own.span_id().to_bytes(),
                own.is_sampled(),
                tracestate,
            )
        })
        .flatten()
        .unwrap_or_else(|| match parent {
            Some(parent) => parent.child(),
            None => TraceContext::new_root(),
        });
    use tracing::field::display;
    span.record("trace_id", display(context.trace_id()));
    span.record("span_id", display(context.span_id()));
    if let Some(parent) = parent {
        span.record("parent_span_id", display(parent.span_id()));
    }
    context
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_formats_read_and_refuse_what_is_unknown() {
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        let unknown = "yaml".parse::<LogFormat>().unwrap_err();
        assert!(unknown.contains("\"json\""), "{unknown}");
        assert_eq!(LogFormat::default(), LogFormat::Text);
    }

    #[test]
    fn without_an_exporter_a_span_continues_its_parent_or_starts_a_trace() {
        let parent = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            Some("congo=t61rcWkgMzE"),
        )
        .expect("valid");
        let span = tracing::info_span!(
            "job",
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
            parent_span_id = tracing::field::Empty
        );
        let child = continue_trace(&span, Some(&parent));
        assert_eq!(child.trace_id(), parent.trace_id());
        assert_ne!(child.span_id(), parent.span_id());
        assert!(!child.is_sampled(), "the parent's decision stands");
        assert_eq!(child.tracestate(), Some("congo=t61rcWkgMzE"));
        let root = continue_trace(&span, None);
        assert_ne!(root.trace_id(), parent.trace_id());
        assert!(root.is_sampled());
    }
}
