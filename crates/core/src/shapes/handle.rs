//! The handle shape: a result too large for a model's context is kept by the
//! runtime; the model gets a handle, a short preview and the size, and pages
//! through it with the built-in `read_handle` tool. A handle is readable only
//! by the tenant and user it was made for.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use lru::LruCache;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::envelope::{Json, ToolError};
use crate::registry::truncate;
use crate::tool::{CallCtx, ToolDecl};

/// The name of the built-in paging tool.
pub const READ_HANDLE: &str = "read_handle";
/// Characters of a result shown in its preview.
const PREVIEW_CHARS: usize = 300;

/// Where large results are kept.
pub trait HandleStore: Send + Sync + 'static {
    /// Keeps `value` for `tenant` and `user`; answers the handle.
    fn put<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        value: Json,
    ) -> BoxFuture<'a, Result<String, ToolError>>;
    /// The value behind `handle`, if it exists and belongs to `tenant` and `user`.
    fn get<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Option<Json>, ToolError>>;
}

struct Kept {
    tenant: String,
    user: String,
    expires: Instant,
    value: Json,
}

/// Handles in memory, bounded in number and kept for a time.
pub struct MemoryHandleStore {
    ttl: Duration,
    entries: Mutex<LruCache<String, Kept>>,
}

impl MemoryHandleStore {
    /// A store of at most `capacity` handles, each kept for `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        MemoryHandleStore {
            ttl,
            entries: Mutex::new(LruCache::new(
                NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }
}

impl Default for MemoryHandleStore {
    fn default() -> Self {
        MemoryHandleStore::new(1_000, Duration::from_secs(3600))
    }
}

impl HandleStore for MemoryHandleStore {
    fn put<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        value: Json,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let handle = format!("h_{}", uuid::Uuid::now_v7().simple());
            let kept = Kept {
                tenant: tenant.to_owned(),
                user: user.to_owned(),
                expires: Instant::now() + self.ttl,
                value,
            };
            self.entries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .put(handle.clone(), kept);
            Ok(handle)
        })
    }

    fn get<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Option<Json>, ToolError>> {
        Box::pin(async move {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            Ok(entries
                .get(handle)
                .filter(|k| k.tenant == tenant && k.user == user && k.expires > Instant::now())
                .map(|k| k.value.clone()))
        })
    }
}

/// What a model gets instead of a large result.
#[derive(Debug, Serialize)]
pub(crate) struct HandleAnswer {
    pub handle: String,
    pub size_bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items: Option<usize>,
    pub preview: String,
    pub read_with: &'static str,
}

impl HandleAnswer {
    pub(crate) fn new(handle: String, value: &Json) -> Self {
        let items = match value.to_value() {
            Value::Array(items) => Some(items.len()),
            _ => None,
        };
        HandleAnswer {
            handle,
            size_bytes: value.len(),
            items,
            preview: truncate(value.get(), PREVIEW_CHARS),
            read_with: READ_HANDLE,
        }
    }
}

#[derive(Deserialize)]
struct ReadArgs {
    handle: String,
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
}

/// The declaration of `read_handle`, reading from `store`.
pub fn read_handle_tool(store: Arc<dyn HandleStore>) -> ToolDecl {
    ToolDecl::query(READ_HANDLE)
        .title("Read a kept result")
        .description(
            "Read part of a large result that another tool returned as a handle. \
             For a list, `offset` and `limit` count items (limit up to 200, default 20); \
             otherwise they count characters of its JSON text (limit up to 16000, default 4000). \
             Call again with `next_offset` until it is absent.",
        )
        .input_schema(json!({
            "type": "object",
            "properties": {
                "handle": {"type": "string", "minLength": 1, "maxLength": 64},
                "offset": {"type": "integer", "minimum": 0},
                "limit": {"type": "integer", "minimum": 1, "maximum": 16000}
            },
            "required": ["handle"],
            "additionalProperties": false
        }))
        .run(move |ctx: CallCtx, args: ReadArgs| {
            let store = store.clone();
            async move {
                let value = store
                    .get(ctx.tenant(), ctx.user(), &args.handle)
                    .await?
                    .ok_or_else(|| {
                        ToolError::not_found(format!(
                            "no handle `{}` for this caller (it may have expired); call the tool that made it again",
                            truncate(&args.handle, 64)
                        ))
                    })?;
                Ok(read_page(&args.handle, &value, args.offset, args.limit))
            }
        })
}

fn read_page(handle: &str, value: &Json, offset: usize, limit: Option<usize>) -> Value {
    let page = |total: usize, limit: usize, body: (&str, Value)| {
        let end = offset.saturating_add(limit).min(total);
        let mut out = json!({"handle": handle, "offset": offset, "total": total});
        out[body.0] = body.1;
        if end < total {
            out["next_offset"] = json!(end);
        }
        out
    };
    match value.to_value() {
        Value::Array(items) => {
            let limit = limit.unwrap_or(20).min(200);
            let total = items.len();
            let slice: Vec<Value> = items.into_iter().skip(offset).take(limit).collect();
            page(total, limit, ("items", Value::Array(slice)))
        }
        _ => {
            let limit = limit.unwrap_or(4000).min(16000);
            let chars: Vec<char> = value.get().chars().collect();
            let total = chars.len();
            let text: String = chars.iter().skip(offset).take(limit).collect();
            page(total, limit, ("text", Value::String(text)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_page_by_items_and_text_by_characters() {
        let list = Json::from(json!((0..45).collect::<Vec<_>>()));
        let first = read_page("h", &list, 0, None);
        assert_eq!(first["items"].as_array().unwrap().len(), 20);
        assert_eq!(first["next_offset"], 20);
        let last = read_page("h", &list, 40, None);
        assert_eq!(last["items"], json!([40, 41, 42, 43, 44]));
        assert!(last.get("next_offset").is_none());
        let text = Json::from(json!({"a": "é".repeat(10)}));
        let p = read_page("h", &text, 3, Some(4));
        assert_eq!(p["text"].as_str().unwrap().chars().count(), 4);
        assert_eq!(p["next_offset"], 7);
    }
}
