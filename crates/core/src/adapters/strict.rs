//! OpenAI strict mode ("Structured Outputs" for function calls).
//!
//! With `strict: true` OpenAI constrains decoding to the schema, but accepts
//! only a subset of JSON Schema: every object closed with
//! `additionalProperties: false`, every property listed in `required` (an
//! optional one says so by allowing `null`), and a short list of keywords.
//! A schema that fits is rewritten into that form; one that does not is sent
//! as it is with `strict: false`, because a strict schema that means
//! something else than ours would have the model produce calls we refuse.
//!
//! On the way back the model sends `null` for the optional fields it leaves
//! out; [`strip_optional_nulls`] removes those before validation, so the
//! original schema, which the runtime enforces, sees them as absent.

use serde_json::{Map, Value, json};

use super::schema::{allows_null, deref, note_dropped};

/// OpenAI's documented limits for one strict schema.
const MAX_OBJECT_DEPTH: usize = 10;
const MAX_PROPERTIES: usize = 5000;
const MAX_ENUM_VALUES: usize = 1000;

/// The string formats strict mode documents.
const FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];

/// The strict-mode form of `schema`, or `None` when strict mode cannot say
/// the same thing: `additionalProperties` other than `false`, an object
/// without `properties` below the root, composition strict mode lacks
/// (`allOf`, `oneOf`, `not`, `if`/`then`/`else`, `dependent*`,
/// `patternProperties`, ...), a keyword this module does not know, or one of
/// OpenAI's size limits.
///
/// Length and count limits strict mode does not take (`minLength`,
/// `maxLength`, `uniqueItems`, `default`, unsupported formats, ...) move into
/// the description: the runtime still enforces them.
pub fn strict_schema(schema: &Value) -> Option<Value> {
    if schema.get("type") != Some(&json!("object")) || schema.get("anyOf").is_some() {
        return None;
    }
    Strict::default().node(schema, 0, true)
}

#[derive(Default)]
struct Strict {
    properties: usize,
    enum_values: usize,
}

impl Strict {
    /// `depth` counts the objects around this node.
    fn node(&mut self, schema: &Value, depth: usize, root: bool) -> Option<Value> {
        let obj = schema.as_object()?;
        let mut out = Map::new();
        let mut dropped = Vec::new();
        let object = is_object(obj);
        let inner = if object { depth + 1 } else { depth };
        for (key, value) in obj {
            match key.as_str() {
                "type" => {
                    if non_null_types(value)? > 1 {
                        return None;
                    }
                    out.insert(key.clone(), value.clone());
                }
                // Rebuilt below for objects.
                "properties" | "required" | "additionalProperties" if object => {}
                "items" => {
                    out.insert(key.clone(), self.node(value, inner, false)?);
                }
                "anyOf" => {
                    let branches = value
                        .as_array()?
                        .iter()
                        .map(|b| self.node(b, inner, false))
                        .collect::<Option<Vec<_>>>()?;
                    out.insert(key.clone(), Value::Array(branches));
                }
                "$defs" | "definitions" => {
                    let mut defs = Map::new();
                    for (name, def) in value.as_object()? {
                        defs.insert(name.clone(), self.node(def, 0, false)?);
                    }
                    out.insert(key.clone(), Value::Object(defs));
                }
                "$ref" if value.as_str().is_some_and(|r| r.starts_with('#')) => {
                    out.insert(key.clone(), value.clone());
                }
                "enum" => {
                    self.enum_values += value.as_array()?.len();
                    out.insert(key.clone(), value.clone());
                }
                "format" if value.as_str().is_some_and(|f| FORMATS.contains(&f)) => {
                    out.insert(key.clone(), value.clone());
                }
                "const" | "description" | "title" | "pattern" | "minimum" | "maximum"
                | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" | "minItems"
                | "maxItems" => {
                    out.insert(key.clone(), value.clone());
                }
                "format" | "minLength" | "maxLength" | "minProperties" | "maxProperties"
                | "uniqueItems" | "default" => dropped.push((key.clone(), value.clone())),
                // Annotations with no bearing on what is valid.
                "$schema" | "$id" | "$comment" | "examples" | "readOnly" | "writeOnly"
                | "deprecated" | "contentMediaType" | "contentEncoding" => {}
                _ => return None,
            }
        }
        if !["type", "anyOf", "$ref", "enum", "const"]
            .iter()
            .any(|k| obj.contains_key(*k))
        {
            // An unconstrained value has no strict form.
            return None;
        }
        if object {
            self.object(obj, &mut out, inner, root)?;
        }
        note_dropped(&mut out, &dropped);
        (self.enum_values <= MAX_ENUM_VALUES).then_some(Value::Object(out))
    }

    fn object(
        &mut self,
        obj: &Map<String, Value>,
        out: &mut Map<String, Value>,
        depth: usize,
        root: bool,
    ) -> Option<()> {
        if depth > MAX_OBJECT_DEPTH {
            return None;
        }
        match obj.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(_) => return None,
        }
        let empty = Map::new();
        let properties = match obj.get("properties") {
            Some(p) => p.as_object()?,
            // The root of a tool without arguments; deeper, a free-form object.
            None if root => &empty,
            None => return None,
        };
        self.properties += properties.len();
        if self.properties > MAX_PROPERTIES {
            return None;
        }
        let required = required_names(obj);
        let mut props = Map::new();
        for (name, sub) in properties {
            let strict = self.node(sub, depth, false)?;
            let strict = if required.contains(&name.as_str()) {
                strict
            } else {
                nullable(strict)
            };
            props.insert(name.clone(), strict);
        }
        let all: Vec<Value> = props.keys().map(|k| Value::String(k.clone())).collect();
        out.insert("properties".into(), Value::Object(props));
        out.insert("required".into(), Value::Array(all));
        out.insert("additionalProperties".into(), Value::Bool(false));
        Some(())
    }
}

fn is_object(obj: &Map<String, Value>) -> bool {
    obj.contains_key("properties")
        || match obj.get("type") {
            Some(Value::String(t)) => t == "object",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
            _ => false,
        }
}

/// How many types other than `null` a `type` keyword names.
fn non_null_types(value: &Value) -> Option<usize> {
    match value {
        Value::String(t) => Some(usize::from(t != "null")),
        Value::Array(ts) => {
            let mut n = 0;
            for t in ts {
                n += usize::from(t.as_str()? != "null");
            }
            Some(n)
        }
        _ => None,
    }
}

fn required_names(obj: &Map<String, Value>) -> Vec<&str> {
    obj.get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `schema`, also accepting `null`: how strict mode says "optional".
fn nullable(mut schema: Value) -> Value {
    let Some(obj) = schema.as_object_mut() else {
        return schema;
    };
    if let Some(c) = obj.remove("const") {
        obj.insert("enum".into(), json!([c]));
    }
    if let Some(Value::Array(values)) = obj.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
    match obj.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = std::mem::take(t);
            obj.insert("type".into(), json!([t, "null"]));
        }
        Some(Value::Array(ts)) => {
            if !ts.iter().any(|t| t == "null") {
                ts.push(json!("null"));
            }
        }
        Some(_) => {}
        None => {
            if let Some(Value::Array(branches)) = obj.get_mut("anyOf") {
                if !branches
                    .iter()
                    .any(|b| b.get("type") == Some(&json!("null")))
                {
                    branches.push(json!({"type": "null"}));
                }
            } else if !obj.contains_key("enum") {
                return json!({"anyOf": [schema, {"type": "null"}]});
            }
        }
    }
    schema
}

/// Removes, recursively, the `null`s a strict-mode model sends for optional
/// properties whose original schema does not accept `null`.
pub(super) fn strip_optional_nulls(root: &Value, args: &mut Value) {
    strip(root, root, args);
}

fn strip(root: &Value, schema: &Value, value: &mut Value) {
    let Some(schema) = deref(root, schema) else {
        return;
    };
    match value {
        Value::Object(map) => {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                return;
            };
            let required = schema.as_object().map(required_names).unwrap_or_default();
            map.retain(|name, v| {
                let optional = !required.contains(&name.as_str());
                let refused = props.get(name).is_some_and(|s| !allows_null(root, s));
                !(v.is_null() && optional && refused)
            });
            for (name, v) in map.iter_mut() {
                if let Some(sub) = props.get(name) {
                    strip(root, sub, v);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items").filter(|s| s.is_object()) {
                for v in items {
                    strip(root, sub, v);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_properties_become_nullable_in_every_spelling() {
        assert_eq!(
            nullable(json!({"type": "string"})),
            json!({"type": ["string", "null"]})
        );
        assert_eq!(
            nullable(json!({"type": "string", "enum": ["a"]})),
            json!({"type": ["string", "null"], "enum": ["a", null]})
        );
        assert_eq!(
            nullable(json!({"anyOf": [{"type": "string"}]})),
            json!({"anyOf": [{"type": "string"}, {"type": "null"}]})
        );
        assert_eq!(
            nullable(json!({"$ref": "#/$defs/x"})),
            json!({"anyOf": [{"$ref": "#/$defs/x"}, {"type": "null"}]})
        );
        assert_eq!(
            nullable(json!({"type": ["integer", "null"]})),
            json!({"type": ["integer", "null"]})
        );
    }

    #[test]
    fn refs_and_defs_stay_and_are_made_strict() {
        let schema = json!({
            "type": "object",
            "$defs": {"line": {"type": "object", "properties": {"id": {"type": "string"}}}},
            "properties": {"lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}},
            "required": ["lines"]
        });
        let strict = strict_schema(&schema).expect("fits strict mode");
        assert_eq!(strict["$defs"]["line"]["additionalProperties"], false);
        assert_eq!(strict["$defs"]["line"]["required"], json!(["id"]));
        assert_eq!(
            strict["$defs"]["line"]["properties"]["id"]["type"],
            json!(["string", "null"])
        );
    }

    #[test]
    fn what_strict_mode_cannot_say_stays_loose() {
        for schema in [
            json!({"type": "object", "properties": {"a": {"type": "object"}}}),
            json!({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}),
            json!({"type": "object", "additionalProperties": true}),
            json!({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}]}}}),
            json!({"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}),
            json!({"type": "object", "properties": {"a": {"$ref": "https://example.com/x"}}}),
            json!({"type": "object", "properties": {"a": {"description": "anything"}}}),
        ] {
            assert_eq!(strict_schema(&schema), None, "{schema}");
        }
    }
}
