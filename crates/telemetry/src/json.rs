//! JSON log lines: one object per event, with the fields of every span the
//! event happened in flattened beside its own.
//!
//! tracing-subscriber's own JSON format nests span fields under `span` and
//! `spans`; here they sit at the top level, so that every line logged during
//! a job's life carries `tool`, `job_id`, `run_id`, `tenant`, `attempt` and
//! `trace_id` where a log search expects them. An inner span's field wins
//! over an outer one's of the same name, and the event's own fields win over
//! both. `span` names the innermost span.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The event format of JSON lines; its span fields must be formatted by
/// [`tracing_subscriber::fmt::format::JsonFields`].
pub(crate) struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        let mut timestamp = String::new();
        if SystemTime
            .format_time(&mut Writer::new(&mut timestamp))
            .is_ok()
        {
            line.insert("timestamp".into(), Value::String(timestamp));
        }
        let meta = event.metadata();
        line.insert("level".into(), Value::from(meta.level().as_str()));
        line.insert("target".into(), Value::from(meta.target()));
        if let Some(scope) = ctx.event_scope() {
            let mut innermost = None;
            for span in scope.from_root() {
                innermost = Some(span.name());
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                    continue;
                };
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                    line.extend(fields);
                }
            }
            if let Some(name) = innermost {
                line.insert("span".into(), Value::from(name));
            }
        }
        event.record(&mut Fields(&mut line));
        let text = serde_json::to_string(&Value::Object(line)).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// Writes an event's fields into the line.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Fields<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        self.0.insert(field.name().to_owned(), value);
    }
}

impl Visit for Fields<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::from(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::from(format!("{value:?}")));
    }
}
