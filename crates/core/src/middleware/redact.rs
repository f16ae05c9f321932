//! `redact`: masks configured fields, wherever they sit in the document, in
//! audit records and in results. Arguments reach the tool unmasked.

use futures_util::future::BoxFuture;
use serde_json::Value;

use super::{Call, Layer, Next, Stage};
use crate::envelope::{Envelope, Json};

/// What a masked field reads.
pub const REDACTED: &str = "[redacted]";

/// Masks every object member named in `fields`, at any depth.
pub fn redact_value(value: &mut Value, fields: &[String]) {
    if fields.is_empty() {
        return;
    }
    match value {
        Value::Object(map) => {
            for (key, member) in map.iter_mut() {
                if fields.iter().any(|f| f == key) {
                    *member = Value::String(REDACTED.to_owned());
                } else {
                    redact_value(member, fields);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| redact_value(item, fields)),
        _ => {}
    }
}

/// `result` with every member named in `fields` masked, at any depth; as
/// it is when there are none.
pub fn redact_json(result: Json, fields: &[String]) -> Json {
    if fields.is_empty() {
        return result;
    }
    let mut value = result.to_value();
    redact_value(&mut value, fields);
    Json::from(value)
}

/// The redact layer: masks fields of `ok` results on the way out.
pub struct Redact {
    fields: Vec<String>,
}

impl Redact {
    /// A layer masking `fields`.
    pub fn new(fields: Vec<String>) -> Self {
        Redact { fields }
    }
}

impl Layer for Redact {
    fn stage(&self) -> Stage {
        Stage::Redact
    }

    fn call<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> BoxFuture<'a, Envelope> {
        Box::pin(async move {
            match next.run(call).await {
                Envelope::Ok { result, call_id } => Envelope::Ok {
                    result: redact_json(result, &self.fields),
                    call_id,
                },
                other => other,
            }
        })
    }
}
