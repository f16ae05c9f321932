//! Tool calls in: a provider's tool call, read into a name and arguments.
//!
//! Everything here is untrusted model output. Reading it never panics and
//! never gives up on a call that can still be answered: a call with an id
//! but bad arguments, or a name that is not registered, becomes a
//! [`ProviderCall`] whose `args` carry the error, so the provider gets a tool
//! result it can pair with its call. Only input that names no call at all is
//! an `Err`.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::strict::strip_optional_nulls;
use super::{Format, resolve, strict_schema, wire_name};
use crate::envelope::{ErrorCode, ToolError};
use crate::registry::{MAX_NAME_LEN, Registry, Tool, truncate};

/// The largest tool call read, arguments included.
pub const MAX_CALL_BYTES: usize = 1024 * 1024;

/// A provider's tool call, read.
#[derive(Debug, Clone)]
pub struct ProviderCall {
    /// The provider's id for the call, which its result must carry back.
    pub id: Option<String>,
    /// The registry name when the call resolved to a tool, else the name as sent.
    pub name: String,
    /// The name as the provider sent it; Gemini's result repeats it.
    pub wire_name: String,
    /// The tool called, when the name resolved.
    pub tool: Option<Arc<Tool>>,
    /// The arguments, or the error that answers the call instead: an
    /// unknown tool, arguments that are not a JSON object.
    pub args: Result<Value, ToolError>,
}

impl ProviderCall {
    /// Stands in for a call nothing could be read from, to render its error.
    pub(super) fn unidentified() -> Self {
        ProviderCall {
            id: None,
            name: String::new(),
            wire_name: String::new(),
            tool: None,
            args: Ok(Value::Object(Map::new())),
        }
    }
}

/// Reads one tool call of `format` from `raw` and resolves its name in
/// `registry` (exact name first, then the tool whose wire name it is). For a
/// tool exported to OpenAI in strict mode, the `null`s sent for optional
/// properties are removed, so the arguments validate against the tool's own
/// schema.
///
/// `Err` only when nothing identifies a call: input larger than
/// [`MAX_CALL_BYTES`] (`payload_too_large`), not a JSON object, or with
/// neither a name nor an id (`bad_request`).
pub fn parse_call(
    format: Format,
    registry: &Registry,
    raw: &[u8],
) -> Result<ProviderCall, ToolError> {
    if raw.len() > MAX_CALL_BYTES {
        return Err(ToolError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the tool call is {} bytes, more than the {MAX_CALL_BYTES} accepted; send smaller arguments, or pass large data by reference",
                raw.len()
            ),
        ));
    }
    let value: Value = serde_json::from_slice(raw).map_err(|e| {
        bad_request(format!(
            "the tool call is not JSON ({e}); send {}",
            expected(format)
        ))
    })?;
    let Some(obj) = value.as_object() else {
        return Err(bad_request(format!(
            "the tool call must be a JSON object; send {}",
            expected(format)
        )));
    };
    let wire = Wire::read(format, obj);
    let id = wire.id.map(str::to_owned);
    let Some(sent) = wire.name else {
        let error = bad_request(format!(
            "the tool call names no tool; send {}",
            expected(format)
        ));
        // With an id the answer can still be paired with the call.
        return match id {
            None => Err(error),
            Some(_) => Ok(ProviderCall {
                args: Err(error),
                id,
                ..ProviderCall::unidentified()
            }),
        };
    };
    let Some(tool) = resolve(format, registry, sent) else {
        return Ok(ProviderCall {
            id,
            name: sent.to_owned(),
            wire_name: sent.to_owned(),
            tool: None,
            args: Err(unknown(format, registry, sent)),
        });
    };
    let args = wire.args(tool.name()).map(|mut args| {
        if format.is_openai() && strict_schema(tool.input_schema()).is_some() {
            strip_optional_nulls(tool.input_schema(), &mut args);
        }
        args
    });
    Ok(ProviderCall {
        id,
        name: tool.name().to_owned(),
        wire_name: sent.to_owned(),
        tool: Some(tool.clone()),
        args,
    })
}

/// The fields of one call, wherever the provider puts them.
struct Wire<'v> {
    id: Option<&'v str>,
    name: Option<&'v str>,
    args: Option<&'v Value>,
    /// What the provider calls the arguments, for messages.
    field: &'static str,
}

impl<'v> Wire<'v> {
    fn read(format: Format, obj: &'v Map<String, Value>) -> Self {
        let text = |map: &'v Map<String, Value>, key: &str| {
            map.get(key)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        // Accepts the documented wrapper or just what it wraps.
        let inner = |key: &str| obj.get(key).and_then(Value::as_object).unwrap_or(obj);
        let (id, body, name_key, field) = match format {
            Format::Neutral => (None, obj, "tool", "args"),
            Format::OpenAi => (text(obj, "id"), inner("function"), "name", "arguments"),
            Format::OpenAiResponses => (text(obj, "call_id"), obj, "name", "arguments"),
            Format::Anthropic => (text(obj, "id"), obj, "name", "input"),
            Format::Gemini => {
                let call = inner("functionCall");
                (text(call, "id"), call, "name", "args")
            }
            // `tools/call` params, or the whole JSON-RPC request around them.
            Format::Mcp => (None, inner("params"), "name", "arguments"),
        };
        Wire {
            id,
            name: text(body, name_key),
            args: body.get(field),
            field,
        }
    }

    /// The arguments as a JSON object; OpenAI sends them as JSON text.
    fn args(&self, tool: &str) -> Result<Value, ToolError> {
        let value = match self.args {
            None | Some(Value::Null) => return Ok(Value::Object(Map::new())),
            Some(Value::String(text)) if text.trim().is_empty() => {
                return Ok(Value::Object(Map::new()));
            }
            Some(Value::String(text)) => serde_json::from_str::<Value>(text).map_err(|e| {
                ToolError::invalid_arguments(format!(
                    "`{}` is not valid JSON ({e}); send a JSON object matching the schema of `{tool}`",
                    self.field
                ))
            })?,
            Some(other) => other.clone(),
        };
        match value {
            Value::Object(_) => Ok(value),
            Value::Null => Ok(Value::Object(Map::new())),
            other => Err(ToolError::invalid_arguments(format!(
                "`{}` must be a JSON object matching the schema of `{tool}`, got {}; send the arguments as named fields",
                self.field,
                kind(&other)
            ))),
        }
    }
}

/// `unknown_tool`, with the suggestions spelled as this provider knows the tools.
fn unknown(format: Format, registry: &Registry, sent: &str) -> ToolError {
    // No registered name is longer; a huge one would only slow the ranking.
    let mut error = registry.unknown(&truncate(sent, 2 * MAX_NAME_LEN));
    let Some(suggestions) = error
        .details
        .as_mut()
        .and_then(|d| d.get_mut("suggestions"))
        .and_then(Value::as_array_mut)
    else {
        return error;
    };
    for suggestion in suggestions.iter_mut() {
        let Some(name) = suggestion.as_str() else {
            continue;
        };
        let wire = wire_name(format, name);
        if wire != name {
            error.message = error
                .message
                .replace(&format!("`{name}`"), &format!("`{wire}`"));
            *suggestion = json!(wire);
        }
    }
    error
}

fn bad_request(message: String) -> ToolError {
    ToolError::new(ErrorCode::BadRequest, message)
}

fn kind(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Number(_) => "a number".into(),
        Value::String(s) => format!("a string ({})", truncate(s, 40)),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// The documented shape of one call, for messages.
fn expected(format: Format) -> &'static str {
    match format {
        Format::Neutral => r#"{"tool": "<name>", "args": {...}}"#,
        Format::OpenAi => {
            r#"{"id": "<call id>", "type": "function", "function": {"name": "<name>", "arguments": "<JSON object as text>"}}"#
        }
        Format::OpenAiResponses => {
            r#"{"type": "function_call", "call_id": "<call id>", "name": "<name>", "arguments": "<JSON object as text>"}"#
        }
        Format::Anthropic => {
            r#"{"type": "tool_use", "id": "<id>", "name": "<name>", "input": {...}}"#
        }
        Format::Gemini => r#"{"functionCall": {"name": "<name>", "args": {...}}}"#,
        Format::Mcp => r#"{"name": "<name>", "arguments": {...}}"#,
    }
}
