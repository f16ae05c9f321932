//! The executors a tool can declare in `toolfleet.toml` beyond builtin Rust
//! functions: [`HttpExecutor`] posts the arguments to a service,
//! [`ExecExecutor`] runs a program, and [`Binder`] turns an
//! [`ExecutorSpec`](toolfleet_core::config::ExecutorSpec) into one of them
//! or into a registered builtin.
//!
//! This crate owns one attempt of a tool's work outside the process: it sends
//! the call's stable idempotency key, bounds the attempt by its timeout and
//! the result by its size, and turns every answer into a result or a
//! [`ToolError`](toolfleet_core::ToolError) that says whether a retry may
//! help. It must never retry on its own (the worker decides, from
//! `retryable`), never panic on what a service or program sends back, and
//! never hold an unbounded answer in memory.

mod binder;
mod exec;
mod http;

pub use binder::{AgentFactory, Binder, DEFAULT_TIMEOUT};
pub use exec::{
    BASE_ENV, CALL_ENV, DEFAULT_PATH, EVENT_PREFIX, EX_TEMPFAIL, ExecExecutor, MAX_ENV_NAME,
    MAX_ENV_VALUE, MAX_ENV_VARS, MAX_EVENT_LINE, parse_event,
};
pub use http::{HttpExecutor, client_builder, http_client, tls_config};

use toolfleet_core::CallCtx;

/// The largest result an executor hands back unless told otherwise: 1 MiB.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1 << 20;

/// How much of an error body or of stderr a message quotes. Messages are read
/// by a model with a small context window, so a hint, not a log.
const EXCERPT_CHARS: usize = 200;

/// How many bytes are read to make an excerpt; the rest is never kept.
const EXCERPT_BYTES: usize = 4 * EXCERPT_CHARS;

/// The key downstream systems deduplicate on: the caller's key when there is
/// one, else the call id, which a retried job keeps.
fn idempotency_key(ctx: &CallCtx) -> &str {
    ctx.idempotency_key.as_deref().unwrap_or(&ctx.call_id)
}

/// A short, one-line quotation of untrusted output for an error message.
fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// `: <excerpt>` when there is anything to quote, else nothing.
fn quoted(bytes: &[u8]) -> String {
    let text = excerpt(bytes);
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_short_single_lines() {
        assert_eq!(excerpt(b"  a\n b\t c  "), "a b c");
        let long = "é".repeat(EXCERPT_CHARS + 10);
        let cut = excerpt(long.as_bytes());
        assert_eq!(cut.chars().count(), EXCERPT_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(excerpt(&[0xff, b'x']), "\u{fffd}x");
        assert_eq!(quoted(b"  "), "");
    }
}
