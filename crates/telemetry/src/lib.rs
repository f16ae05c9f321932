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
//!
//! Spans are cheap to make when their fields are given at creation: a span
//! field recorded later is formatted again, and in JSON the span's fields
//! are parsed and written again on each record. [`Placement`] works out a
//! span's trace ids before the span is made whenever it can (when nothing
//! is exported), so they are creation fields too.

mod fields;
mod json;
mod otlp;

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider,
};
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::Deserialize;
use toolfleet_core::TraceContext;
use tracing::field::{DisplayValue, Field, Value, display};
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
                .fmt_fields(fields::PlainFields)
        });
        let json = (format == LogFormat::Json).then(|| {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                .event_format(json::FlatJson)
        });
        let exporting = provider.as_ref().map(|_| Exporting);
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
            .with(exporting)
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

/// Marks a subscriber whose spans are exported, so that [`Placement`] knows
/// whether the ids of a span to be made are the exporter's to choose.
struct Exporting;

impl<S: tracing::Subscriber> Layer<S> for Exporting {}

/// True when the current subscriber exports spans.
fn exporting() -> bool {
    tracing::dispatcher::get_default(|dispatch| dispatch.downcast_ref::<Exporting>().is_some())
}

/// Where a span about to be made stands in a trace: a child of `parent` or,
/// without one, the root of a new trace. Its ids are given to the span as
/// creation fields, then [`Placement::place`] answers the span's context:
///
/// ```
/// # use toolfleet_core::TraceContext;
/// # use toolfleet_telemetry::Placement;
/// # let parent: Option<TraceContext> = None;
/// let placement = Placement::new(parent.as_ref());
/// let span = tracing::error_span!(
///     "job",
///     trace_id = placement.trace_id(),
///     span_id = placement.span_id(),
///     parent_span_id = placement.parent_span_id(),
/// );
/// let trace = placement.place(&span);
/// # assert!(trace.is_sampled());
/// ```
///
/// When nothing is exported the ids are made here, before the span, and
/// nothing is recorded on it afterwards. When spans are exported the ids
/// are those of the exported span, which only exists once the span is
/// made: the fields are empty at creation and recorded by `place`, in one
/// record (see [`continue_trace`]).
pub struct Placement<'a> {
    parent: Option<&'a TraceContext>,
    made: Option<Made>,
}

/// A context made before its span, with its ids as the span shows them.
struct Made {
    context: TraceContext,
    trace_id: String,
    span_id: String,
    parent_span_id: Option<String>,
}

impl<'a> Placement<'a> {
    /// A placement under `parent`, or at the root of a new trace.
    pub fn new(parent: Option<&'a TraceContext>) -> Placement<'a> {
        let made = (!exporting()).then(|| {
            let context = match parent {
                Some(parent) => parent.child(),
                None => TraceContext::new_root(),
            };
            Made {
                trace_id: context.trace_id(),
                span_id: context.span_id(),
                parent_span_id: parent.map(TraceContext::span_id),
                context,
            }
        });
        Placement { parent, made }
    }

    /// Whether the span would be exported: then only the span knows its
    /// ids, and it must be made for [`Placement::place`] to answer them.
    pub fn exported(&self) -> bool {
        self.made.is_none()
    }

    /// The span's `trace_id` field, when it is known before the span.
    pub fn trace_id(&self) -> Option<DisplayValue<&str>> {
        self.made.as_ref().map(|m| display(m.trace_id.as_str()))
    }

    /// The span's `span_id` field, when it is known before the span.
    pub fn span_id(&self) -> Option<DisplayValue<&str>> {
        self.made.as_ref().map(|m| display(m.span_id.as_str()))
    }

    /// The span's `parent_span_id` field, when it is known before the span
    /// and the span has a parent.
    pub fn parent_span_id(&self) -> Option<DisplayValue<&str>> {
        self.made
            .as_ref()
            .and_then(|m| m.parent_span_id.as_deref())
            .map(display)
    }

    /// Places `span`, made with this placement's fields and not entered
    /// yet, and answers its context: what a job made under it carries.
    pub fn place(self, span: &tracing::Span) -> TraceContext {
        match self.made {
            Some(made) => made.context,
            None => continue_trace(span, self.parent),
        }
    }
}

/// Places `span` in a trace and answers its own context: as a child of
/// `parent` (same trace id, `parent_span_id` its span id) or, without one,
/// as the root of a new trace. The span must declare the fields `trace_id`,
/// `span_id` and `parent_span_id` (as `tracing::field::Empty`), which are
/// recorded here in one record, and must not have been entered yet.
/// [`Placement`] records nothing when nothing is exported.
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
    record_ids(span, &context, parent);
    context
}

/// Records the trace ids of `span` in one record: each record of a span's
/// fields formats them again (in JSON, all of them).
fn record_ids(span: &tracing::Span, context: &TraceContext, parent: Option<&TraceContext>) {
    let (trace_id, span_id) = (context.trace_id(), context.span_id());
    let parent_span_id = parent.map(TraceContext::span_id);
    let trace_id = display(trace_id.as_str());
    let span_id = display(span_id.as_str());
    let parent_span_id = parent_span_id.as_deref().map(display);
    let Some(meta) = span.metadata() else {
        // A disabled span records nothing.
        return;
    };
    let fields = meta.fields();
    match (
        fields.field("trace_id"),
        fields.field("span_id"),
        fields.field("parent_span_id"),
    ) {
        (Some(t), Some(s), Some(p)) => {
            let values: [(&Field, Option<&dyn Value>); 3] = [
                (&t, Some(&trace_id)),
                (&s, Some(&span_id)),
                (&p, Some(&parent_span_id)),
            ];
            span.record_all(&fields.value_set(&values));
        }
        // Not declared as asked: what is declared, one by one.
        _ => {
            span.record("trace_id", trace_id);
            span.record("span_id", span_id);
            span.record("parent_span_id", parent_span_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::Subscriber;
    use tracing::span::{Attributes, Id, Record};
    use tracing_subscriber::layer::Context;

    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// What a subscriber saw of its spans' fields: those given at creation,
    /// the records made afterwards and what they held.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Fields>>);

    #[derive(Default)]
    struct Fields {
        created: Vec<(String, String)>,
        records: usize,
        recorded: Vec<(String, String)>,
    }

    struct Collect<'a>(&'a mut Vec<(String, String)>);

    impl tracing::field::Visit for Collect<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push((field.name().to_owned(), format!("{value:?}")));
        }
    }

    impl<S: Subscriber> Layer<S> for Seen {
        fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
            attrs.record(&mut Collect(&mut self.0.lock().unwrap().created));
        }

        fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
            let mut seen = self.0.lock().unwrap();
            seen.records += 1;
            values.record(&mut Collect(&mut seen.recorded));
        }
    }

    fn ids(context: &TraceContext, parent: &TraceContext) -> Vec<(String, String)> {
        vec![
            ("trace_id".to_owned(), context.trace_id()),
            ("span_id".to_owned(), context.span_id()),
            ("parent_span_id".to_owned(), parent.span_id()),
        ]
    }

    #[test]
    fn without_an_exporter_a_placed_span_gets_its_ids_at_creation_and_no_record() {
        let parent = TraceContext::parse(PARENT, None).unwrap();
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry().with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            let placement = Placement::new(Some(&parent));
            let span = tracing::info_span!(
                "job",
                tool = "ocr",
                trace_id = placement.trace_id(),
                span_id = placement.span_id(),
                parent_span_id = placement.parent_span_id(),
            );
            let context = placement.place(&span);
            assert_eq!(context.trace_id(), parent.trace_id());
            assert_ne!(context.span_id(), parent.span_id());
            let fields = std::mem::take(&mut *seen.0.lock().unwrap());
            assert_eq!(fields.records, 0, "{:?}", fields.recorded);
            assert_eq!(fields.created[1..], ids(&context, &parent));

            // A span of empty fields placed afterwards: one record of the three.
            let span = tracing::info_span!(
                "job",
                trace_id = tracing::field::Empty,
                span_id = tracing::field::Empty,
                parent_span_id = tracing::field::Empty,
            );
            let context = continue_trace(&span, Some(&parent));
            let fields = seen.0.lock().unwrap();
            assert_eq!(fields.records, 1);
            assert_eq!(fields.recorded, ids(&context, &parent));
        });
    }

    #[test]
    fn with_an_exporter_a_placed_span_records_the_exported_ids_at_once() {
        let parent = TraceContext::parse(PARENT, None).unwrap();
        let provider = SdkTracerProvider::builder().build();
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry()
            .with(seen.clone())
            .with(Some(Exporting))
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let placement = Placement::new(Some(&parent));
            assert!(placement.trace_id().is_none(), "the exporter's to choose");
            let span = tracing::info_span!(
                "job",
                trace_id = placement.trace_id(),
                span_id = placement.span_id(),
                parent_span_id = placement.parent_span_id(),
            );
            let context = placement.place(&span);
            let exported = span.context().span().span_context().clone();
            assert_eq!(exported.trace_id().to_bytes(), parent.trace_id_bytes());
            assert_eq!(exported.span_id().to_bytes(), context.span_id_bytes());
            let fields = seen.0.lock().unwrap();
            assert!(fields.created.is_empty(), "{:?}", fields.created);
            assert_eq!(fields.records, 1, "{:?}", fields.recorded);
            assert_eq!(fields.recorded, ids(&context, &parent));
        });
    }

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
