//! Envelopes out: the answer to a call, as the provider's tool result.
//!
//! Providers that take text get the envelope's JSON, so the model reads the
//! same `status`, ids and error codes whichever provider it runs on.

use serde_json::{Map, Value, json};

use super::{Format, ProviderCall};
use crate::envelope::Envelope;

/// The tool result that answers `call` with `envelope`, as `format` expects
/// it in the next request (for MCP, a `CallToolResult`). The provider's call
/// id goes back in its field; a call read without one is answered without it.
pub fn render_result(format: Format, call: &ProviderCall, envelope: &Envelope) -> Value {
    let mut out = Map::new();
    let id = call.id.as_ref().map(|id| json!(id));
    match format {
        Format::Neutral => return envelope_value(envelope),
        Format::OpenAi => {
            out.insert("role".into(), json!("tool"));
            insert_some(&mut out, "tool_call_id", id);
            out.insert("content".into(), json!(envelope.to_json()));
        }
        Format::OpenAiResponses => {
            out.insert("type".into(), json!("function_call_output"));
            insert_some(&mut out, "call_id", id);
            out.insert("output".into(), json!(envelope.to_json()));
        }
        Format::Anthropic => {
            out.insert("type".into(), json!("tool_result"));
            insert_some(&mut out, "tool_use_id", id);
            out.insert("content".into(), json!(envelope.to_json()));
            out.insert("is_error".into(), json!(envelope.error_ref().is_some()));
        }
        Format::Gemini => {
            // Gemini reads an `error` key of the response as the error; error
            // envelopes have one.
            let mut response = Map::new();
            response.insert("name".into(), json!(call.wire_name));
            insert_some(&mut response, "id", id);
            response.insert("response".into(), envelope_value(envelope));
            out.insert("functionResponse".into(), Value::Object(response));
        }
        Format::Mcp => return mcp(call, envelope),
    }
    Value::Object(out)
}

/// A `CallToolResult`: text for the model, `structuredContent` for code.
fn mcp(call: &ProviderCall, envelope: &Envelope) -> Value {
    // MCP clients check `structuredContent` against a declared outputSchema
    // whenever it is present, which an envelope that is not the result fails.
    let envelope_fits = call
        .tool
        .as_ref()
        .is_none_or(|t| t.output_schema().is_none());
    let (text, structured) = match envelope {
        Envelope::Ok { result, .. } => {
            let value = result.to_value();
            if value.is_object() {
                (result.get().to_owned(), Some(value))
            } else {
                let wrapped = json!({ "result": value });
                (wrapped.to_string(), Some(wrapped))
            }
        }
        Envelope::Error { error, .. } => {
            let mut text = error.to_string();
            if let Some(seconds) = error.retry_after_s {
                text.push_str(&format!(" (retry after {seconds} s)"));
            }
            (text, envelope_fits.then(|| envelope_value(envelope)))
        }
        Envelope::Running { .. } | Envelope::Suspended { .. } => (
            envelope.to_json(),
            envelope_fits.then(|| envelope_value(envelope)),
        ),
    };
    let mut out = Map::new();
    match blocks(call, envelope) {
        // Pictures, sound and files as they are; no structured copy.
        Some(blocks) => {
            out.insert("content".into(), blocks);
        }
        None => {
            let mut content = vec![json!({ "type": "text", "text": text })];
            content.extend(handle_link(call, envelope));
            out.insert("content".into(), Value::Array(content));
            if let Some(structured) = structured {
                out.insert("structuredContent".into(), structured);
            }
        }
    }
    out.insert("isError".into(), json!(envelope.error_ref().is_some()));
    // Tells an ok result from a job's `running` answer without guessing from its fields.
    out.insert(
        "_meta".into(),
        json!({ "toolfleet/status": envelope.status() }),
    );
    Value::Object(out)
}

/// A handle tool's answer that is a handle links to the handle's resource
/// (`resources/read` pages through it), beside the text a model reads.
fn handle_link(call: &ProviderCall, envelope: &Envelope) -> Option<Value> {
    let Envelope::Ok { result, .. } = envelope else {
        return None;
    };
    let tool = call.tool.as_ref()?;
    if tool.shape() != crate::tool::Shape::Handle {
        return None;
    }
    let value = result.to_value();
    if value.get("read_with").and_then(Value::as_str) != Some(crate::shapes::handle::READ_HANDLE) {
        return None;
    }
    let handle = value.get("handle").and_then(Value::as_str)?;
    let mut link = json!({
        "type": "resource_link",
        "uri": crate::shapes::handle::handle_uri(handle),
        "name": handle,
        "title": format!("The result of {}", tool.name()),
        "description": "The whole result, kept for a time; read it in pages with resources/read (?offset=N&limit=M) or read_handle.",
        "mimeType": "application/json",
    });
    if let Some(size) = value.get("size_bytes").and_then(Value::as_u64) {
        link["size"] = json!(size);
    }
    Some(link)
}

/// The content blocks of an `ok` result of a tool that declares
/// `content_blocks`, when every block is one MCP knows and carries its
/// required fields; otherwise `None`, and the result goes as JSON.
fn blocks(call: &ProviderCall, envelope: &Envelope) -> Option<Value> {
    let declared = call
        .tool
        .as_ref()
        .is_some_and(|t| t.declaration().content_blocks);
    let Envelope::Ok { result, .. } = envelope else {
        return None;
    };
    if !declared {
        return None;
    }
    let value = result.to_value();
    let list = value.get("content")?.as_array()?;
    let text = |b: &Value, key: &str| b.get(key).is_some_and(Value::is_string);
    let known = |b: &Value| match b.get("type").and_then(Value::as_str) {
        Some("text") => text(b, "text"),
        Some("image" | "audio") => text(b, "data") && text(b, "mimeType"),
        Some("resource") => b
            .get("resource")
            .is_some_and(|r| text(r, "uri") && (text(r, "text") || text(r, "blob"))),
        Some("resource_link") => text(b, "uri") && text(b, "name"),
        _ => false,
    };
    (!list.is_empty() && list.iter().all(known)).then(|| Value::Array(list.clone()))
}

fn envelope_value(envelope: &Envelope) -> Value {
    serde_json::to_value(envelope)
        .or_else(|_| serde_json::from_str(&envelope.to_json()))
        .unwrap_or_else(|_| json!({ "status": envelope.status() }))
}

fn insert_some(map: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(value) = value {
        map.insert(key.into(), value);
    }
}
