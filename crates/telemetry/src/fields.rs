//! The fields of text log lines, written as tracing-subscriber's default
//! formatter writes them, without its styling when lines carry no colours.
//!
//! The text layer formats a span's fields once, as the span is made, and
//! every job has spans of eight or nine fields, made whatever
//! `TOOLFLEET_LOG` lets through (they are at `ERROR`, so that a warning
//! inside one carries them). The default formatter paints each name italic
//! and each `=` dimmed, which without colours writes nothing but still
//! goes through two styled strings per field: more than half of what a
//! span's fields cost (measured with callgrind on an embedded serve). This
//! writes `name=value` directly, and hands everything else (colours, the
//! message, errors and their sources, raw identifiers) to the default, so
//! a line reads the same byte for byte. It must never write a field
//! differently from the default formatter (a test compares the two).

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};

/// The text layer's field formatter.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PlainFields;

impl<'writer> FormatFields<'writer> for PlainFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        if writer.has_ansi_escapes() {
            let mut styled = DefaultVisitor::new(writer, true);
            fields.record(&mut styled);
            return styled.finish();
        }
        let mut plain = Plain {
            writer,
            empty: true,
            result: Ok(()),
        };
        fields.record(&mut plain);
        plain.result
    }
}

struct Plain<'a> {
    writer: Writer<'a>,
    /// No field written yet: the next one needs no space before it.
    empty: bool,
    result: fmt::Result,
}

impl Plain<'_> {
    /// Writes one field through the default formatter, where it writes
    /// more than `name=value`.
    fn as_default(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        if self.result.is_err() {
            return;
        }
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), self.empty);
        record(&mut visitor);
        self.result = visitor.finish();
        self.empty = false;
    }
}

impl Visit for Plain<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.as_default(|v| v.record_str(field, value));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.as_default(|v| v.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        if name == "message" || name.starts_with("r#") {
            return self.as_default(|v| v.record_debug(field, value));
        }
        if self.result.is_err() {
            return;
        }
        if !std::mem::take(&mut self.empty) {
            self.result = self.writer.write_char(' ');
        }
        self.result = self
            .result
            .and_then(|()| self.writer.write_str(name))
            .and_then(|()| self.writer.write_char('='))
            .and_then(|()| write!(self.writer, "{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;

        fn make_writer(&'a self) -> Lines {
            self.clone()
        }
    }

    #[derive(Debug)]
    struct Cause;

    impl fmt::Display for Cause {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the disk is full")
        }
    }

    impl std::error::Error for Cause {}

    #[derive(Debug)]
    struct Failure(Cause);

    impl fmt::Display for Failure {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("cannot write \"the row\"")
        }
    }

    impl std::error::Error for Failure {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// Every kind of field the runtime's spans and events carry, in a span
    /// and in an event inside it, with a field recorded after creation.
    fn log() {
        let id = String::from("0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b");
        let span = tracing::error_span!(
            "job",
            pool = %"default",
            job_id = %id,
            attempt = 2u32,
            delta = -3i64,
            ready = true,
            share = 0.5f64,
            quoted = "a \"b\"\n",
            shown = ?Some("x"),
            r#type = "job",
            later = tracing::field::Empty,
        );
        span.record("later", "set afterwards");
        let _inside = span.enter();
        let failure = Failure(Cause);
        let error: &(dyn std::error::Error + 'static) = &failure;
        tracing::warn!(
            code = "unavailable",
            error,
            plain = %"text with \"quotes\"",
            "claim failed: {}; the message goes back",
            "busy"
        );
        tracing::warn!(message = "given as a field", n = 7u64);
    }

    fn written<N>(fields: N, ansi: bool) -> String
    where
        N: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let lines = Lines::default();
        let layer = tracing_subscriber::fmt::layer()
            .without_time()
            .with_ansi(ansi)
            .with_writer(lines.clone())
            .fmt_fields(fields);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, log);
        let bytes = lines.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn lines_read_as_the_default_formatter_writes_them() {
        use tracing_subscriber::fmt::format::DefaultFields;
        for ansi in [false, true] {
            let plain = written(PlainFields, ansi);
            let default = written(DefaultFields::new(), ansi);
            assert_eq!(plain, default, "ansi {ansi}");
            assert_eq!(plain.lines().count(), 2, "{plain}");
        }
        let plain = written(PlainFields, false);
        for part in [
            "job{pool=default job_id=0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b attempt=2 delta=-3 \
             ready=true share=0.5 quoted=\"a \\\"b\\\"\\n\" shown=Some(\"x\") type=\"job\" \
             later=\"set afterwards\"}",
            "claim failed: busy; the message goes back code=\"unavailable\" \
             error=cannot write \"the row\" error.sources=[the disk is full] \
             plain=text with \"quotes\"",
            "given as a field n=7",
        ] {
            assert!(plain.contains(part), "{part}\nin\n{plain}");
        }
    }
}
