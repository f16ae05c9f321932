//! Small JSON Schema helpers shared by the strict-mode and Gemini rewrites.

use serde_json::{Map, Value};

/// How many `$ref` hops are followed before a schema counts as too tangled
/// to rewrite (recursive schemas never end).
pub(super) const MAX_REF_HOPS: usize = 16;

/// The target of a local reference (`#/$defs/x`) within `root`.
pub(super) fn local_ref<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    root.pointer(pointer)
}

/// `schema` with `$ref` chains followed to the schema they name; `None` when
/// a reference is not local, dangles or loops.
pub(super) fn deref<'a>(root: &'a Value, mut schema: &'a Value) -> Option<&'a Value> {
    for _ in 0..MAX_REF_HOPS {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => schema = local_ref(root, reference)?,
            None => return Some(schema),
        }
    }
    None
}

/// Whether the (possibly referenced) schema accepts `null`. Errs towards
/// `false` for what it cannot see through, which only means a `null` is
/// dropped rather than passed on.
pub(super) fn allows_null(root: &Value, schema: &Value) -> bool {
    let Some(schema) = deref(root, schema) else {
        return false;
    };
    let Some(obj) = schema.as_object() else {
        return schema == &Value::Bool(true);
    };
    let typed = match obj.get("type") {
        Some(Value::String(t)) => Some(t == "null"),
        Some(Value::Array(ts)) => Some(ts.iter().any(|t| t == "null")),
        _ => None,
    };
    let listed = match (obj.get("enum"), obj.get("const")) {
        (Some(Value::Array(values)), _) => Some(values.contains(&Value::Null)),
        (_, Some(value)) => Some(value.is_null()),
        _ => None,
    };
    let branches = ["anyOf", "oneOf"]
        .iter()
        .filter_map(|k| obj.get(*k).and_then(Value::as_array))
        .map(|branches| branches.iter().any(|b| allows_null(root, b)))
        .reduce(|a, b| a && b);
    match (typed, listed, branches) {
        (None, None, None) => true,
        (t, l, b) => t.unwrap_or(true) && l.unwrap_or(true) && b.unwrap_or(true),
    }
}

/// Appends constraints a provider cannot take as keywords to the schema's
/// description, so the model still reads them (the runtime enforces them).
pub(super) fn note_dropped(out: &mut Map<String, Value>, dropped: &[(String, Value)]) {
    if dropped.is_empty() {
        return;
    }
    let notes = dropped
        .iter()
        .map(|(key, value)| format!("{key}: {value}"))
        .collect::<Vec<_>>()
        .join(", ");
    let text = match out.get("description").and_then(Value::as_str) {
        Some(description) if !description.is_empty() => format!("{description} ({notes})"),
        _ => format!("({notes})"),
    };
    out.insert("description".into(), Value::String(text));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn null_is_seen_through_types_enums_branches_and_refs() {
        let root = json!({"$defs": {"n": {"type": ["string", "null"]}, "s": {"type": "string"}}});
        assert!(allows_null(&root, &json!({"type": ["integer", "null"]})));
        assert!(allows_null(
            &root,
            &json!({"anyOf": [{"type": "string"}, {"type": "null"}]})
        ));
        assert!(allows_null(&root, &json!({"$ref": "#/$defs/n"})));
        assert!(allows_null(&root, &json!({"description": "anything"})));
        assert!(!allows_null(&root, &json!({"$ref": "#/$defs/s"})));
        assert!(!allows_null(&root, &json!({"type": "string"})));
        assert!(!allows_null(
            &root,
            &json!({"type": ["string", "null"], "enum": ["a"]})
        ));
        assert!(!allows_null(&root, &json!({"$ref": "#/$defs/missing"})));
    }
}
