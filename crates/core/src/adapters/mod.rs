//! Provider adapters: the one registry, served to every model provider and to MCP.
//!
//! Each provider names the same three things differently: the list of tools a
//! client sends with a request, the tool call the model answers with, and the
//! tool result that goes back. This module owns those translations, both ways,
//! for the [`Format`]s of docs/API.md: tool specs out ([`tool_specs`]), tool calls
//! in ([`parse_call`]) and envelopes out ([`render_result`]), with [`call`]
//! doing all three around [`Runtime::invoke`].
//!
//! It must never decide anything itself: the registry and the runtime still
//! validate and authorise every call, so a schema this module relaxes for a
//! provider (Gemini's subset, OpenAI's strict mode) only changes what the
//! model is told, never what is accepted. It must never panic on what a model
//! sends, and, like the rest of the core, never does I/O.

mod calls;
mod gemini;
mod names;
mod results;
mod schema;
mod specs;
mod strict;

use std::fmt;

use serde_json::Value;

use crate::envelope::Envelope;
use crate::runtime::Runtime;
use crate::tool::CallCtx;

pub use calls::{MAX_CALL_BYTES, ProviderCall, parse_call};
pub use gemini::gemini_schema;
pub use names::{resolve, wire_name};
pub use results::render_result;
pub use specs::tool_specs;
pub use strict::strict_schema;

/// A provider's wire format, named as in `GET /v1/tools?format=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// toolfleet's own shapes: `{"tool", "args"}` in, the envelope out.
    Neutral,
    /// OpenAI Chat Completions.
    OpenAi,
    /// OpenAI Responses.
    OpenAiResponses,
    /// Anthropic Messages.
    Anthropic,
    /// Google Gemini (`generateContent`).
    Gemini,
    /// Model Context Protocol: `tools/list` and `tools/call`.
    Mcp,
}

impl Format {
    /// Every format, in the order docs/API.md lists them.
    pub const ALL: [Format; 6] = [
        Format::Neutral,
        Format::OpenAi,
        Format::OpenAiResponses,
        Format::Anthropic,
        Format::Gemini,
        Format::Mcp,
    ];

    /// Reads exactly the names of docs/API.md; anything else is `None`.
    pub fn parse(name: &str) -> Option<Format> {
        Some(match name {
            "neutral" => Format::Neutral,
            "openai" => Format::OpenAi,
            "openai-responses" => Format::OpenAiResponses,
            "anthropic" => Format::Anthropic,
            "gemini" => Format::Gemini,
            "mcp" => Format::Mcp,
            _ => return None,
        })
    }

    /// The format's name in docs/API.md.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Neutral => "neutral",
            Format::OpenAi => "openai",
            Format::OpenAiResponses => "openai-responses",
            Format::Anthropic => "anthropic",
            Format::Gemini => "gemini",
            Format::Mcp => "mcp",
        }
    }

    /// OpenAI's two APIs share function names and strict mode.
    fn is_openai(self) -> bool {
        matches!(self, Format::OpenAi | Format::OpenAiResponses)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Answers one provider tool call end to end: reads `raw` as `format`, calls
/// the tool through [`Runtime::invoke`], and renders the envelope as that
/// provider's tool result. A call that cannot be read is answered with the
/// provider's error result, never a panic.
pub async fn call(runtime: &Runtime, format: Format, raw: &[u8], ctx: &CallCtx) -> Value {
    let call = match parse_call(format, runtime.registry(), raw) {
        Ok(call) => call,
        Err(error) => {
            return render_result(
                format,
                &ProviderCall::unidentified(),
                &Envelope::error(error),
            );
        }
    };
    let envelope = match &call.args {
        Ok(args) => runtime.invoke(&call.name, args.clone(), ctx).await,
        Err(error) => Envelope::error(error.clone()),
    };
    render_result(format, &call, &envelope)
}
