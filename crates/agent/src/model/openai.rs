//! The OpenAI Chat Completions wire format, which vLLM, llama.cpp, Ollama
//! and other OpenAI-compatible servers also speak.
//!
//! It owns the translation of a [`ModelRequest`] into a
//! `POST {base_url}/chat/completions` body and of the answer into a
//! [`ModelReply`]. It must not trust the answer's shape: anything missing or
//! of the wrong type is [`ModelError::Malformed`], never a panic.

use serde_json::{Map, Value, json};

use super::http::KeyHeader;
use super::wire::{Wire, WireModel};
use super::{ModelError, ModelReply, ModelRequest, ToolCall, ToolResult, ToolSpec, Turn, Usage};

/// The wire format of this module, for [`WireModel`].
pub struct OpenAi;

/// A client of a Chat Completions endpoint.
pub type OpenAiModel = WireModel<OpenAi>;

impl Wire for OpenAi {
    const PATH: &'static str = "/chat/completions";
    const KEY: KeyHeader = KeyHeader::Bearer;
    const HEADERS: &'static [(&'static str, &'static str)] = &[];

    fn body(model: &str, request: &ModelRequest<'_>) -> Value {
        body(model, request)
    }

    fn reply(answer: &Value) -> Result<ModelReply, ModelError> {
        reply(answer)
    }
}

/// The request body.
fn body(model: &str, request: &ModelRequest<'_>) -> Value {
    let mut messages = Vec::with_capacity(request.turns.len() + 1);
    if !request.system.is_empty() {
        messages.push(json!({"role": "system", "content": request.system}));
    }
    for turn in request.turns {
        match turn {
            Turn::User { text } => messages.push(json!({"role": "user", "content": text})),
            Turn::Assistant { text, calls } => messages.push(assistant(text.as_deref(), calls)),
            Turn::Tool { results } => messages.extend(results.iter().map(tool_message)),
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("max_tokens".into(), json!(request.max_output_tokens));
    if !request.tools.is_empty() {
        body.insert(
            "tools".into(),
            request.tools.iter().map(tool).collect::<Vec<_>>().into(),
        );
    }
    Value::Object(body)
}

fn assistant(text: Option<&str>, calls: &[ToolCall]) -> Value {
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    // A message with neither text nor calls must still carry content.
    let content = match text {
        Some(text) => json!(text),
        None if calls.is_empty() => json!(""),
        None => Value::Null,
    };
    message.insert("content".into(), content);
    if !calls.is_empty() {
        let calls = calls.iter().map(|call| {
            json!({
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": arguments_text(&call.args)},
            })
        });
        message.insert("tool_calls".into(), calls.collect::<Vec<_>>().into());
    }
    Value::Object(message)
}

/// The arguments as the format carries them: JSON text. Arguments that
/// are a JSON string are the model's own text that was not JSON, so that
/// text goes back unchanged.
fn arguments_text(args: &Value) -> String {
    match args {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The format has no error flag on a tool message, so the content says it.
fn tool_message(result: &ToolResult) -> Value {
    let content = if result.is_error {
        format!("ERROR: {}", result.content)
    } else {
        result.content.clone()
    };
    json!({"role": "tool", "tool_call_id": result.call_id, "content": content})
}

fn tool(spec: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.input_schema,
        },
    })
}

fn malformed(what: impl Into<String>) -> ModelError {
    ModelError::Malformed(what.into())
}

/// The reply in an answer. A server that reports no `usage` (some
/// compatible servers do not) counts as zero tokens: the call still counts
/// as a step, but the token budget cannot see it.
fn reply(answer: &Value) -> Result<ModelReply, ModelError> {
    let message = answer
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first())
        .and_then(|choice| choice.get("message"))
        .ok_or_else(|| malformed("the answer has no choices[0].message"))?;
    let text = content_text(message.get("content"))?;
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(n, call)| tool_call(n, call))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(malformed("message.tool_calls is not an array")),
    };
    let usage = match answer.get("usage") {
        None | Some(Value::Null) => {
            tracing::debug!("the model's answer reports no usage; counting zero tokens");
            Usage::default()
        }
        Some(usage) => Usage {
            input_tokens: tokens(usage, "prompt_tokens")?,
            output_tokens: tokens(usage, "completion_tokens")?,
        },
    };
    Ok(ModelReply { text, calls, usage })
}

/// `content` as text: a string, or an array of text parts; empty is none.
fn content_text(content: Option<&Value>) -> Result<Option<String>, ModelError> {
    let text = match content {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        Some(_) => return Err(malformed("message.content is neither text nor parts")),
    };
    Ok(Some(text).filter(|t| !t.is_empty()))
}

fn tool_call(n: usize, call: &Value) -> Result<ToolCall, ModelError> {
    let function = call
        .get("function")
        .ok_or_else(|| malformed(format!("tool_calls[{n}] has no function")))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .filter(|name| !name.is_empty())
        .ok_or_else(|| malformed(format!("tool_calls[{n}] has no function.name")))?;
    // Some compatible servers leave the id out; the conversation only needs
    // it to be unique within the reply.
    let id = match call.get("id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => id.to_owned(),
        _ => format!("call_{n}"),
    };
    let args = match function.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(text)) if text.trim().is_empty() => json!({}),
        Some(Value::String(text)) => {
            serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.clone()))
        }
        // Not the format, but unambiguous: already JSON.
        Some(other) => other.clone(),
    };
    Ok(ToolCall {
        id,
        name: name.to_owned(),
        args,
    })
}

/// A token count; missing is zero, anything but a count is malformed.
fn tokens(usage: &Value, field: &str) -> Result<u64, ModelError> {
    match usage.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(value) => value
            .as_u64()
            .ok_or_else(|| malformed(format!("usage.{field} is not a token count"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_become_messages() {
        let turns = [
            Turn::User {
                text: "sum it".into(),
            },
            Turn::Assistant {
                text: None,
                calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "add".into(),
                    args: json!({"a": 1}),
                }],
            },
            Turn::Tool {
                results: vec![ToolResult {
                    call_id: "c1".into(),
                    name: "add".into(),
                    content: "no".into(),
                    is_error: true,
                }],
            },
        ];
        let tools = [ToolSpec {
            name: "add".into(),
            description: "Adds.".into(),
            input_schema: json!({"type": "object"}),
        }];
        let request = ModelRequest {
            system: "be brief",
            turns: &turns,
            tools: &tools,
            max_output_tokens: 64,
        };
        let body = body("m", &request);
        assert_eq!(
            body["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(body["messages"][2]["content"], Value::Null);
        let call = &body["messages"][2]["tool_calls"][0];
        assert_eq!(call["function"]["arguments"], json!(r#"{"a":1}"#));
        assert_eq!(body["messages"][3]["content"], json!("ERROR: no"));
        assert_eq!(body["tools"][0]["function"]["parameters"]["type"], "object");
        assert_eq!(body["max_tokens"], 64);
    }

    #[test]
    fn answers_become_replies() {
        let answer = json!({"choices": [{"message": {"content": "", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 2}"}},
            {"type": "function", "function": {"name": "g", "arguments": "not json"}},
            {"id": "c", "type": "function", "function": {"name": "h", "arguments": ""}},
        ]}}], "usage": {"prompt_tokens": 7, "completion_tokens": 3}});
        let reply = reply(&answer).unwrap();
        assert_eq!(reply.text, None);
        assert_eq!(reply.calls[0].args, json!({"x": 2}));
        assert_eq!(reply.calls[1].id, "call_1");
        assert_eq!(reply.calls[1].args, json!("not json"));
        assert_eq!(reply.calls[2].args, json!({}));
        assert_eq!(reply.usage.total(), 10);
        assert_eq!(arguments_text(&reply.calls[1].args), "not json");

        let bare = super::reply(&json!({"choices": [{"message": {"content": "hi"}}]})).unwrap();
        assert_eq!(bare.text.as_deref(), Some("hi"));
        assert_eq!(bare.usage, Usage::default());

        for bad in [
            json!({}),
            json!({"choices": []}),
            json!({"choices": [{"message": {"content": 5}}]}),
            json!({"choices": [{"message": {"tool_calls": [{"id": "x"}]}}]}),
            json!({"choices": [{"message": {}}], "usage": {"prompt_tokens": -1}}),
        ] {
            assert!(
                matches!(super::reply(&bad), Err(ModelError::Malformed(_))),
                "{bad}"
            );
        }
    }
}
