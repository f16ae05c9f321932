//! Gemini's `parameters` schema: a subset of the OpenAPI 3.0 Schema object.
//!
//! Gemini answers 400 to a request whose function declarations carry a field
//! its Schema object lacks, a `format` it does not know for the type, or an
//! `enum` that is not a list of strings. So the schema is rebuilt from an
//! allow-list of its fields (`type`, `format`, `title`, `description`,
//! `nullable`, `enum`, `items`, `properties`, `required`, `anyOf`, ...),
//! translating what has an equivalent (`["T", "null"]` to `nullable`, `const`
//! to `enum`, `oneOf` to `anyOf`, local `$ref`s inlined) and dropping the
//! rest, with dropped constraints noted in the description. What cannot be
//! rebuilt faithfully (recursion, tuples, a value of any type, parameter
//! names Gemini refuses) is not guessed at: the declaration carries the
//! schema as `parametersJsonSchema` instead.

use serde_json::{Map, Value, json};

use super::schema::{MAX_REF_HOPS, local_ref, note_dropped};

/// Past this many schema nodes inlining `$ref`s is refused.
const MAX_NODES: usize = 10_000;

/// Gemini fields that carry over unchanged.
const KEEP: &[&str] = &[
    "title",
    "description",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "default",
    "example",
    "propertyOrdering",
];

/// Constraints Gemini has no field for, worth telling the model about.
const NOTED: &[&str] = &[
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "uniqueItems",
    "minContains",
    "maxContains",
];

/// The Gemini `parameters` form of `schema`, or `None` when only
/// `parametersJsonSchema` can carry it.
pub fn gemini_schema(schema: &Value) -> Option<Value> {
    let mut walk = Gemini {
        root: schema,
        path: Vec::new(),
        nodes: 0,
    };
    walk.node(schema).map(Value::Object)
}

struct Gemini<'a> {
    root: &'a Value,
    /// The `$ref`s being inlined around the current node: one seen again is recursion.
    path: Vec<String>,
    nodes: usize,
}

impl Gemini<'_> {
    fn node(&mut self, schema: &Value) -> Option<Map<String, Value>> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return None;
        }
        let obj = schema.as_object()?;
        if let Some(reference) = obj.get("$ref") {
            return self.inline(reference.as_str()?, obj);
        }
        if let Some(all) = obj.get("allOf") {
            // One branch is a common way to attach a description to a `$ref`.
            let [only] = all.as_array()?.as_slice() else {
                return None;
            };
            let mut merged = only.as_object()?.clone();
            merged.extend(
                obj.iter()
                    .filter(|(k, _)| *k != "allOf")
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
            return self.node(&Value::Object(merged));
        }

        let mut out = Map::new();
        let mut dropped = Vec::new();
        let mut nullable = obj.get("nullable") == Some(&Value::Bool(true));
        for (key, value) in obj {
            match key.as_str() {
                "type" => {
                    let (types, null) = types(value)?;
                    nullable |= null;
                    match types.as_slice() {
                        [] => return None,
                        [one] => {
                            out.insert("type".into(), json!(one));
                        }
                        many => {
                            if obj.contains_key("anyOf") || obj.contains_key("oneOf") {
                                return None;
                            }
                            let branches = many.iter().map(|t| json!({"type": t})).collect();
                            out.insert("anyOf".into(), Value::Array(branches));
                        }
                    }
                }
                "properties" => {
                    let mut props = Map::new();
                    for (name, sub) in value.as_object()? {
                        if !parameter_name_ok(name) {
                            return None;
                        }
                        props.insert(name.clone(), Value::Object(self.node(sub)?));
                    }
                    out.insert(key.clone(), Value::Object(props));
                }
                "required" => {
                    let names = value.as_array()?;
                    if names.iter().all(Value::is_string) {
                        out.insert(key.clone(), value.clone());
                    }
                }
                "items" => {
                    out.insert(key.clone(), Value::Object(self.node(value)?));
                }
                "anyOf" | "oneOf" => {
                    if out.contains_key("anyOf")
                        || (obj.contains_key("anyOf") && obj.contains_key("oneOf"))
                    {
                        return None;
                    }
                    let mut branches = Vec::new();
                    for branch in value.as_array()? {
                        if branch == &json!({"type": "null"}) {
                            nullable = true;
                        } else {
                            branches.push(Value::Object(self.node(branch)?));
                        }
                    }
                    out.insert("anyOf".into(), Value::Array(branches));
                }
                "examples" => {
                    if let Some(first) = value.as_array().and_then(|e| e.first()) {
                        out.insert("example".into(), first.clone());
                    }
                }
                k if KEEP.contains(&k) => {
                    out.insert(key.clone(), value.clone());
                }
                k if NOTED.contains(&k) && !value.is_object() && !value.is_array() => {
                    dropped.push((key.clone(), value.clone()));
                }
                // `enum`, `const` and `format` depend on the type, below;
                // the rest (`additionalProperties`, `$schema`, `$defs`, `not`,
                // `if`, `patternProperties`, ...) has no Gemini field.
                _ => {}
            }
        }

        let listed = match (obj.get("enum"), obj.get("const")) {
            (Some(values), _) => Some(values.as_array()?.clone()),
            (None, Some(value)) => Some(vec![value.clone()]),
            (None, None) => None,
        };
        if let Some(mut values) = listed {
            if values.contains(&Value::Null) {
                nullable = true;
                values.retain(|v| !v.is_null());
            }
            let string_typed = match out.get("type") {
                Some(t) => t == "string",
                None => !out.contains_key("anyOf"),
            };
            if !values.is_empty() && string_typed && values.iter().all(Value::is_string) {
                out.insert("type".into(), json!("string"));
                out.insert("enum".into(), Value::Array(values));
            } else if !values.is_empty() {
                dropped.push(("one of".into(), Value::Array(values)));
            }
        }
        if let Some(format) = obj.get("format") {
            let supported = match (out.get("type").and_then(Value::as_str), format.as_str()) {
                (Some("string"), Some(f)) => matches!(f, "enum" | "date-time"),
                (Some("number"), Some(f)) => matches!(f, "float" | "double"),
                (Some("integer"), Some(f)) => matches!(f, "int32" | "int64"),
                _ => false,
            };
            if supported {
                out.insert("format".into(), format.clone());
            } else {
                dropped.push(("format".into(), format.clone()));
            }
        }

        if let Some(Value::Array(branches)) = out.get("anyOf") {
            match branches.as_slice() {
                [] => return None,
                // `anyOf: [X, {"type": "null"}]` is just a nullable X.
                [only] => {
                    let only = only.as_object()?.clone();
                    out.remove("anyOf");
                    for (k, v) in only {
                        out.entry(k).or_insert(v);
                    }
                }
                _ => {}
            }
        }
        if !out.contains_key("type") && !out.contains_key("anyOf") {
            // Gemini needs a type; a value of any type has none.
            let inferred = if out.contains_key("properties") {
                "object"
            } else if out.contains_key("items") {
                "array"
            } else {
                return None;
            };
            out.insert("type".into(), json!(inferred));
        }
        // Gemini refuses an OBJECT without properties.
        if out.get("type") == Some(&json!("object"))
            && out
                .get("properties")
                .and_then(Value::as_object)
                .is_none_or(Map::is_empty)
        {
            return None;
        }
        if nullable {
            out.insert("nullable".into(), Value::Bool(true));
        }
        note_dropped(&mut out, &dropped);
        Some(out)
    }

    /// The referenced schema, with the referring schema's own keywords on top.
    fn inline(&mut self, reference: &str, obj: &Map<String, Value>) -> Option<Map<String, Value>> {
        if self.path.len() >= MAX_REF_HOPS || self.path.iter().any(|r| r == reference) {
            return None;
        }
        let mut merged = local_ref(self.root, reference)?.as_object()?.clone();
        merged.extend(
            obj.iter()
                .filter(|(k, _)| *k != "$ref")
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        self.path.push(reference.to_owned());
        let out = self.node(&Value::Object(merged));
        self.path.pop();
        out
    }
}

/// The types a `type` keyword names other than `null`, and whether it names `null`.
fn types(value: &Value) -> Option<(Vec<&str>, bool)> {
    let all: Vec<&str> = match value {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().map(Value::as_str).collect::<Option<_>>()?,
        _ => return None,
    };
    let null = all.contains(&"null");
    Some((all.into_iter().filter(|t| *t != "null").collect(), null))
}

/// Gemini: a letter or underscore, then letters, digits or underscores, at most 64.
fn parameter_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 64
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translations_have_the_gemini_spelling() {
        let schema = json!({
            "type": "object",
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "additionalProperties": false,
            "$defs": {"month": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}},
            "properties": {
                "month": {"$ref": "#/$defs/month", "description": "The month."},
                "note": {"type": ["string", "null"], "format": "uri"},
                "kind": {"const": "travel"},
                "limit": {"type": "integer", "exclusiveMinimum": 0},
                "pick": {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
                "level": {"type": "integer", "enum": [1, 2]}
            },
            "required": ["month"]
        });
        let out = gemini_schema(&schema).expect("translatable");
        assert_eq!(
            out,
            json!({
                "type": "object",
                "properties": {
                    "month": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$", "description": "The month."},
                    "note": {"type": "string", "nullable": true, "description": "(format: \"uri\")"},
                    "kind": {"type": "string", "enum": ["travel"]},
                    "limit": {"type": "integer", "description": "(exclusiveMinimum: 0)"},
                    "pick": {"anyOf": [{"type": "string"}, {"type": "integer"}], "nullable": true},
                    "level": {"type": "integer", "description": "(one of: [1,2])"}
                },
                "required": ["month"]
            })
        );
    }

    #[test]
    fn what_gemini_cannot_take_falls_back() {
        for schema in [
            json!({"type": "object", "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "properties": {"n": {"$ref": "#/$defs/n"}}}),
            json!({"type": "object", "properties": {"any": {}}}),
            json!({"type": "object", "properties": {"free": {"type": "object"}}}),
            json!({"type": "object", "properties": {"tuple": {"type": "array", "items": [{"type": "string"}]}}}),
            json!({"type": "object", "properties": {"my-name": {"type": "string"}}}),
            json!({"type": "object", "properties": {"x": {"allOf": [{"type": "string"}, {"minLength": 1}]}}}),
        ] {
            assert_eq!(gemini_schema(&schema), None, "{schema}");
        }
    }
}
