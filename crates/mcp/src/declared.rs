//! Resources a configuration declares (`[[resources]]`): a URI, or an RFC
//! 6570 template of simple `{name}` variables, each read by calling a query
//! tool through the one path every call takes (`Runtime::invoke`, with the
//! reader's principal, scopes, audit and limits), the template's variables
//! as its arguments. The tool's `ok` result is the resource: a string is its
//! text; an object with a `text` string, that text; with a `blob` string
//! (base64), those bytes; anything else, its JSON. A tool that refuses the
//! reader (a missing scope, bad arguments) refuses the read.
//!
//! Must never read a resource any other way than through its tool.

use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::model::{Resource, ResourceContents, ResourceTemplate};
use serde::Deserialize;
use serde_json::{Map, Value};
use toolfleet_core::{CallCtx, Envelope, Principal, Registry, Runtime, Shape};

/// The longest value a template's variable takes.
const MAX_VARIABLE: usize = 256;

/// One `[[resources]]` table.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Declared {
    /// The resource's URI (`scheme://...`), or, with `uri_template`, none.
    #[serde(default)]
    pub uri: Option<String>,
    /// A template (`scheme://things/{id}/data`) whose variables become the
    /// tool's arguments.
    #[serde(default)]
    pub uri_template: Option<String>,
    /// Its programmatic name.
    pub name: String,
    /// A human-readable title.
    #[serde(default)]
    pub title: Option<String>,
    /// What it holds.
    #[serde(default)]
    pub description: Option<String>,
    /// Its MIME type (default `application/json` for JSON, `text/plain`
    /// for text, `application/octet-stream` for bytes).
    #[serde(default)]
    pub mime_type: Option<String>,
    /// The query tool that reads it.
    pub tool: String,
}

/// One piece of a template: text to match as it is, or a variable.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Literal(String),
    Variable(String),
}

/// A template's pieces, or why it is not one this server reads.
fn pieces(template: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            out.push(Piece::Literal(rest[..open].to_owned()));
        }
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| format!("`{template}` opens a variable it never closes"))?;
        let name = &rest[open + 1..open + close];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!(
                "`{template}`: a variable is a name of letters, digits and `_` (`{{{name}}}` is not)"
            ));
        }
        if matches!(out.last(), Some(Piece::Variable(_))) {
            return Err(format!(
                "`{template}`: two variables must have text between them"
            ));
        }
        out.push(Piece::Variable(name.to_owned()));
        rest = &rest[open + close + 1..];
    }
    if rest.contains('}') {
        return Err(format!("`{template}` closes a variable it never opened"));
    }
    if !rest.is_empty() {
        out.push(Piece::Literal(rest.to_owned()));
    }
    Ok(out)
}

/// The variables of `uri` if it matches `template`'s pieces: each a
/// non-empty value without `/`, `?` or `#`, at most [`MAX_VARIABLE`] long.
fn matches(pieces: &[Piece], uri: &str) -> Option<Map<String, Value>> {
    let mut vars = Map::new();
    let mut rest = uri;
    for (n, piece) in pieces.iter().enumerate() {
        match piece {
            Piece::Literal(text) => rest = rest.strip_prefix(text.as_str())?,
            Piece::Variable(name) => {
                let end = match pieces.get(n + 1) {
                    Some(Piece::Literal(next)) => rest.find(next.as_str())?,
                    _ => rest.len(),
                };
                let value = &rest[..end];
                if value.is_empty() || value.len() > MAX_VARIABLE || value.contains(['/', '?', '#'])
                {
                    return None;
                }
                vars.insert(name.clone(), Value::String(value.to_owned()));
                rest = &rest[end..];
            }
        }
    }
    rest.is_empty().then_some(vars)
}

/// Checks the declarations against the registered tools: each names a URI
/// or a template (not both), a query tool that exists, and a name and URI
/// no other declaration has; what is wrong, naming it.
pub fn check(declared: &[Declared], registry: &Registry) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for d in declared {
        let what = format!("[[resources]] `{}`", d.name);
        let place = match (&d.uri, &d.uri_template) {
            (Some(uri), None) => {
                if uri.contains(['{', '}']) {
                    return Err(format!(
                        "{what}: `uri` holds a variable; use `uri_template`"
                    ));
                }
                uri
            }
            (None, Some(template)) => {
                pieces(template).map_err(|e| format!("{what}: uri_template {e}"))?;
                template
            }
            _ => return Err(format!("{what}: give one of `uri` and `uri_template`")),
        };
        if !place.contains("://") || place.starts_with("toolfleet://") || place.len() > 512 {
            return Err(format!(
                "{what}: `{place}` must be an absolute URI (`scheme://...`, at most 512 characters) outside toolfleet:// (toolfleet's own)"
            ));
        }
        if d.name.is_empty() || !seen.insert(d.name.clone()) || !seen.insert(place.clone()) {
            return Err(format!(
                "{what}: each resource needs a name and a URI of its own"
            ));
        }
        match registry.get(&d.tool).map(|t| t.shape()) {
            Some(Shape::Query) => {}
            Some(shape) => {
                return Err(format!(
                    "{what}: tool `{}` is a {shape} tool; a resource is read by a query tool",
                    d.tool
                ));
            }
            None => return Err(format!("{what}: no tool `{}`", d.tool)),
        }
    }
    Ok(())
}

/// The declared resources (those with a fixed URI), as `resources/list` names them.
pub fn listed(declared: &[Declared]) -> Vec<Resource> {
    declared
        .iter()
        .filter_map(|d| {
            let uri = d.uri.as_ref()?;
            let mut resource = Resource::new(uri.clone(), d.name.clone());
            resource.title = d.title.clone();
            resource.description = d.description.clone();
            resource.mime_type = d.mime_type.clone();
            Some(resource)
        })
        .collect()
}

/// The declared templates, as `resources/templates/list` names them.
pub fn templates(declared: &[Declared]) -> Vec<ResourceTemplate> {
    declared
        .iter()
        .filter_map(|d| {
            let template = d.uri_template.as_ref()?;
            let mut out = ResourceTemplate::new(template.clone(), d.name.clone());
            out.title = d.title.clone();
            out.description = d.description.clone();
            out.mime_type = d.mime_type.clone();
            Some(out)
        })
        .collect()
}

/// The declaration `uri` names and the arguments its tool takes, if any.
pub fn find<'a>(declared: &'a [Declared], uri: &str) -> Option<(&'a Declared, Map<String, Value>)> {
    declared
        .iter()
        .find_map(|d| match (&d.uri, &d.uri_template) {
            (Some(fixed), _) if fixed == uri => Some((d, Map::new())),
            (None, Some(template)) => {
                let pieces = pieces(template).ok()?;
                matches(&pieces, uri).map(|vars| (d, vars))
            }
            _ => None,
        })
}

/// Reads `uri`, which `declared` names with `args`, through its tool as
/// `principal`.
pub async fn read(
    runtime: &Runtime,
    principal: Arc<Principal>,
    declared: &Declared,
    args: Map<String, Value>,
    uri: &str,
) -> Result<ResourceContents, ErrorData> {
    let ctx = CallCtx::new(principal);
    let envelope = runtime
        .invoke(&declared.tool, Value::Object(args), &ctx)
        .await;
    let result = match envelope {
        Envelope::Ok { result, .. } => result.to_value(),
        Envelope::Error { error, .. } => {
            let data = serde_json::json!({ "uri": uri, "code": error.code.as_str() });
            return Err(ErrorData::internal_error(
                format!("reading `{uri}` failed: {}", error.message),
                Some(data),
            ));
        }
        other => {
            return Err(ErrorData::internal_error(
                format!(
                    "reading `{uri}` answered `{}`, not a result; its tool must be a query",
                    other.status()
                ),
                None,
            ));
        }
    };
    let mime = |default: &str| Some(declared.mime_type.clone().unwrap_or_else(|| default.into()));
    let text = |text: String, default: &str| ResourceContents::TextResourceContents {
        uri: uri.to_owned(),
        mime_type: mime(default),
        text,
        meta: None,
    };
    Ok(match result {
        Value::String(s) => text(s, "text/plain"),
        Value::Object(ref object) => match (object.get("text"), object.get("blob")) {
            (Some(Value::String(s)), _) => text(s.clone(), "text/plain"),
            (_, Some(Value::String(blob))) => ResourceContents::BlobResourceContents {
                uri: uri.to_owned(),
                mime_type: mime("application/octet-stream"),
                blob: blob.clone(),
                meta: None,
            },
            _ => text(result.to_string(), "application/json"),
        },
        other => text(other.to_string(), "application/json"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match_simple_variables_and_nothing_more() {
        let p = pieces("test://template/{id}/data").unwrap();
        let vars = matches(&p, "test://template/123/data").unwrap();
        assert_eq!(vars["id"], "123");
        for miss in [
            "test://template//data",
            "test://template/1/2/data",
            "test://template/123/data/more",
            "test://other/123/data",
            "test://template/a?b/data",
        ] {
            assert_eq!(matches(&p, miss), None, "{miss}");
        }
        let long = format!("test://template/{}/data", "x".repeat(300));
        assert_eq!(matches(&p, &long), None);
        let two = pieces("db://{schema}.{table}").unwrap();
        let vars = matches(&two, "db://public.users").unwrap();
        assert_eq!(
            (vars["schema"].as_str(), vars["table"].as_str()),
            (Some("public"), Some("users"))
        );
        for bad in ["x://{", "x://{a}{b}", "x://{a-b}", "x://a}"] {
            assert!(pieces(bad).is_err(), "{bad}");
        }
    }
}
