//! Tool specs out: the list of tools a client sends to a provider.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::{Format, gemini_schema, strict_schema, wire_name};
use crate::registry::Tool;

/// The tool list `format` expects in a request (for MCP, the `tools` of a
/// `tools/list` result), in the order given.
pub fn tool_specs<'a>(format: Format, tools: impl IntoIterator<Item = &'a Arc<Tool>>) -> Value {
    let tools = tools.into_iter();
    if format == Format::Gemini {
        // Gemini groups every function of a request into one Tool object.
        let declarations: Vec<Value> = tools.map(|t| gemini(t)).collect();
        if declarations.is_empty() {
            return json!([]);
        }
        return json!([{ "functionDeclarations": declarations }]);
    }
    Value::Array(tools.map(|t| spec(format, t)).collect())
}

fn spec(format: Format, tool: &Tool) -> Value {
    let name = wire_name(format, tool.name());
    match format {
        Format::OpenAi => {
            let (parameters, strict) = openai_parameters(tool);
            json!({
                "type": "function",
                "function": {
                    "name": name,
                    "description": tool.description(),
                    "parameters": parameters,
                    "strict": strict,
                }
            })
        }
        Format::OpenAiResponses => {
            // Always explicit: the Responses API takes a missing `strict` as true.
            let (parameters, strict) = openai_parameters(tool);
            json!({
                "type": "function",
                "name": name,
                "description": tool.description(),
                "parameters": parameters,
                "strict": strict,
            })
        }
        Format::Anthropic => json!({
            "name": name,
            "description": tool.description(),
            "input_schema": tool.input_schema(),
        }),
        Format::Mcp => mcp(tool),
        Format::Neutral => neutral(tool),
        Format::Gemini => gemini(tool),
    }
}

/// The strict form when the schema has one, else the schema as declared.
fn openai_parameters(tool: &Tool) -> (Value, bool) {
    match strict_schema(tool.input_schema()) {
        Some(strict) => (strict, true),
        None => (tool.input_schema().clone(), false),
    }
}

fn gemini(tool: &Tool) -> Value {
    let mut declaration = Map::new();
    declaration.insert("name".into(), json!(wire_name(Format::Gemini, tool.name())));
    declaration.insert("description".into(), json!(tool.description()));
    let schema = tool.input_schema();
    let has_parameters = schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| !p.is_empty());
    // Gemini wants `parameters` left out for a function without any.
    if has_parameters {
        match gemini_schema(schema) {
            Some(parameters) => declaration.insert("parameters".into(), parameters),
            None => declaration.insert("parametersJsonSchema".into(), schema.clone()),
        };
    }
    Value::Object(declaration)
}

fn mcp(tool: &Tool) -> Value {
    let hints = tool.hints();
    let mut annotations = Map::new();
    if let Some(title) = tool.title() {
        annotations.insert("title".into(), json!(title));
    }
    annotations.insert("readOnlyHint".into(), json!(hints.read_only));
    annotations.insert("destructiveHint".into(), json!(hints.destructive));
    annotations.insert("idempotentHint".into(), json!(hints.idempotent));
    annotations.insert("openWorldHint".into(), json!(hints.open_world));

    let mut spec = Map::new();
    spec.insert("name".into(), json!(tool.name()));
    if let Some(title) = tool.title() {
        spec.insert("title".into(), json!(title));
    }
    spec.insert("description".into(), json!(tool.description()));
    spec.insert("inputSchema".into(), tool.input_schema().clone());
    if let Some(output) = tool.output_schema() {
        spec.insert("outputSchema".into(), output.clone());
    }
    spec.insert("annotations".into(), Value::Object(annotations));
    Value::Object(spec)
}

fn neutral(tool: &Tool) -> Value {
    let mut spec = Map::new();
    spec.insert("name".into(), json!(tool.name()));
    if let Some(title) = tool.title() {
        spec.insert("title".into(), json!(title));
    }
    spec.insert("description".into(), json!(tool.description()));
    spec.insert("shape".into(), json!(tool.shape()));
    spec.insert("input_schema".into(), tool.input_schema().clone());
    if let Some(output) = tool.output_schema() {
        spec.insert("output_schema".into(), output.clone());
    }
    spec.insert("hints".into(), json!(tool.hints()));
    spec.insert("scopes".into(), json!(tool.required_scopes()));
    Value::Object(spec)
}
