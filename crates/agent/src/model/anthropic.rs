//! The Anthropic Messages wire format.
//!
//! It owns the translation of a [`ModelRequest`] into a
//! `POST {base_url}/messages` body, where roles alternate and tool results
//! travel as `tool_result` blocks of a user message, and of the answer's
//! content blocks into a [`ModelReply`]. It must not trust the answer's
//! shape: anything missing or of the wrong type is
//! [`ModelError::Malformed`], never a panic.

use serde_json::{Map, Value, json};

use super::http::KeyHeader;
use super::wire::{Wire, WireModel};
use super::{ModelError, ModelReply, ModelRequest, ToolCall, ToolSpec, Turn, Usage};

/// The `anthropic-version` header every request carries.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The wire format of this module, for [`WireModel`].
pub struct Anthropic;

/// A client of a Messages endpoint.
pub type AnthropicModel = WireModel<Anthropic>;

impl Wire for Anthropic {
    const PATH: &'static str = "/messages";
    const KEY: KeyHeader = KeyHeader::XApiKey;
    const HEADERS: &'static [(&'static str, &'static str)] =
        &[("anthropic-version", ANTHROPIC_VERSION)];

    fn body(model: &str, request: &ModelRequest<'_>) -> Value {
        body(model, request)
    }

    fn reply(answer: &Value) -> Result<ModelReply, ModelError> {
        reply(answer)
    }
}

/// The request body.
fn body(model: &str, request: &ModelRequest<'_>) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("max_tokens".into(), json!(request.max_output_tokens));
    if !request.system.is_empty() {
        body.insert("system".into(), json!(request.system));
    }
    body.insert("messages".into(), messages(request.turns).into());
    if !request.tools.is_empty() {
        body.insert(
            "tools".into(),
            request.tools.iter().map(tool).collect::<Vec<_>>().into(),
        );
    }
    Value::Object(body)
}

/// The messages, one per turn, except that turns of the same role are
/// merged (a tool turn and a following user turn are one user message, as
/// roles must alternate) and an assistant turn with nothing in it is left
/// out (empty content is refused).
fn messages(turns: &[Turn]) -> Vec<Value> {
    let mut messages: Vec<(&str, Vec<Value>)> = Vec::with_capacity(turns.len());
    for turn in turns {
        let (role, blocks) = match turn {
            Turn::User { text } => ("user", vec![json!({"type": "text", "text": text})]),
            Turn::Assistant { text, calls } => {
                let text = text.as_deref().filter(|t| !t.trim().is_empty());
                let text = text.map(|text| json!({"type": "text", "text": text}));
                let uses = calls.iter().map(|call| {
                    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.args})
                });
                ("assistant", text.into_iter().chain(uses).collect())
            }
            Turn::Tool { results } => {
                let blocks = results.iter().map(|result| {
                    json!({
                        "type": "tool_result",
                        "tool_use_id": result.call_id,
                        "content": result.content,
                        "is_error": result.is_error,
                    })
                });
                ("user", blocks.collect())
            }
        };
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }
    messages
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

fn tool(spec: &ToolSpec) -> Value {
    json!({
        "name": spec.name,
        "description": spec.description,
        "input_schema": spec.input_schema,
    })
}

fn malformed(what: impl Into<String>) -> ModelError {
    ModelError::Malformed(what.into())
}

/// The reply in an answer: text blocks concatenated, `tool_use` blocks as
/// calls, other blocks (such as thinking) skipped. Input tokens include
/// those read from or written to the prompt cache, which Anthropic counts
/// apart. An answer without `usage` counts as zero tokens, as in
/// [`super::openai`].
fn reply(answer: &Value) -> Result<ModelReply, ModelError> {
    let blocks = answer
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("the answer has no content array"))?;
    let mut text = String::new();
    let mut calls = Vec::new();
    for (n, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let part = block.get("text").and_then(Value::as_str).ok_or_else(|| {
                    malformed(format!("content[{n}] is a text block without text"))
                })?;
                text.push_str(part);
            }
            Some("tool_use") => calls.push(tool_use(n, block)?),
            Some(_) => {}
            None => return Err(malformed(format!("content[{n}] has no type"))),
        }
    }
    let usage = match answer.get("usage") {
        Some(usage) if !usage.is_null() => usage,
        _ => {
            tracing::debug!("the model's answer reports no usage; counting zero tokens");
            &Value::Null
        }
    };
    let input = [
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]
    .into_iter()
    .try_fold(0u64, |sum, field| {
        Ok(sum.saturating_add(tokens(usage, field)?))
    })?;
    Ok(ModelReply {
        text: Some(text).filter(|t| !t.is_empty()),
        calls,
        usage: Usage {
            input_tokens: input,
            output_tokens: tokens(usage, "output_tokens")?,
        },
    })
}

fn tool_use(n: usize, block: &Value) -> Result<ToolCall, ModelError> {
    let field = |name: &str| {
        block
            .get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| malformed(format!("content[{n}] is a tool_use block without {name}")))
    };
    Ok(ToolCall {
        id: field("id")?.to_owned(),
        name: field("name")?.to_owned(),
        args: block.get("input").cloned().unwrap_or_else(|| json!({})),
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
    use super::super::ToolResult;
    use super::*;

    #[test]
    fn turns_become_alternating_messages() {
        let call = ToolCall {
            id: "t1".into(),
            name: "add".into(),
            args: json!({"a": 1}),
        };
        let turns = [
            Turn::User { text: "sum".into() },
            Turn::Assistant {
                text: Some("adding".into()),
                calls: vec![call],
            },
            Turn::Tool {
                results: vec![ToolResult {
                    call_id: "t1".into(),
                    name: "add".into(),
                    content: "2".into(),
                    is_error: false,
                }],
            },
            Turn::User {
                text: "and now?".into(),
            },
            Turn::Assistant {
                text: None,
                calls: vec![],
            },
        ];
        let request = ModelRequest {
            system: "",
            turns: &turns,
            tools: &[],
            max_output_tokens: 10,
        };
        let body = body("m", &request);
        assert!(body.get("system").is_none() && body.get("tools").is_none());
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert_eq!(messages[1]["content"][1]["type"], "tool_use");
        assert_eq!(messages[2]["role"], "user");
        assert_eq!(messages[2]["content"][0]["tool_use_id"], "t1");
        assert_eq!(messages[2]["content"][1]["text"], "and now?");
    }

    #[test]
    fn answers_become_replies() {
        let answer = json!({"content": [
            {"type": "thinking", "thinking": "hm"},
            {"type": "text", "text": "a"},
            {"type": "tool_use", "id": "t", "name": "f", "input": {"x": 1}},
            {"type": "text", "text": "b"},
        ], "usage": {"input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 4}});
        let reply = reply(&answer).unwrap();
        assert_eq!(reply.text.as_deref(), Some("ab"));
        assert_eq!(reply.calls[0].args, json!({"x": 1}));
        assert_eq!(reply.usage.input_tokens, 7);
        assert_eq!(reply.usage.output_tokens, 4);
        for bad in [
            json!({}),
            json!({"content": [{"type": "text"}], "usage": {}}),
            json!({"content": [{"type": "tool_use", "name": "f"}], "usage": {}}),
            json!({"content": [], "usage": {"output_tokens": "many"}}),
            json!({"content": "text", "usage": {}}),
        ] {
            assert!(
                matches!(super::reply(&bad), Err(ModelError::Malformed(_))),
                "{bad}"
            );
        }
    }
}
