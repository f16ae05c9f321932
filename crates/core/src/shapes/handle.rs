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

/// A new handle's id: `h_` and a UUIDv7, so ids sort by when they were made.
pub fn new_handle_id() -> String {
    format!("h_{}", uuid::Uuid::now_v7().simple())
}

/// True for an id of the form [`new_handle_id`] makes: what a handle id
/// must be before anyone looks it up.
pub fn is_handle_id(id: &str) -> bool {
    id.strip_prefix("h_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The URI of a handle as an MCP resource: `toolfleet://handles/<handle>`
/// (`?offset=N&limit=M` reads a page of it).
pub fn handle_uri(handle: &str) -> String {
    format!("{HANDLE_URI_PREFIX}{handle}")
}

/// What every handle's resource URI starts with.
pub const HANDLE_URI_PREFIX: &str = "toolfleet://handles/";

/// What is known of a kept handle, without its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HandleMeta {
    /// The handle.
    pub handle: String,
    /// The tool whose result it is.
    pub tool: String,
    /// The size of the result's JSON text in bytes.
    pub size_bytes: u64,
    /// When it was made, Unix milliseconds.
    pub created_at_ms: i64,
    /// When it stops being readable, Unix milliseconds.
    pub expires_at_ms: i64,
}

/// A kept handle: what is known of it and its value.
#[derive(Debug, Clone)]
pub struct Kept {
    /// What is known of it.
    pub meta: HandleMeta,
    /// The (redacted) result.
    pub value: Json,
}

/// Where large results are kept. Each handle is its maker's: a tenant and
/// user read only their own, and another's reads as missing.
pub trait HandleStore: Send + Sync + 'static {
    /// Keeps `value`, the result of `tool`, for `tenant` and `user`;
    /// answers the handle.
    fn put<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        tool: &'a str,
        value: Json,
    ) -> BoxFuture<'a, Result<String, ToolError>>;
    /// The handle `handle`, if it exists, has not expired and belongs to
    /// `tenant` and `user`.
    fn get<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Option<Kept>, ToolError>>;
    /// `tenant` and `user`'s unexpired handles, newest first, at most
    /// `limit`, those older than `before` (a handle) when given.
    fn list<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        before: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<HandleMeta>, ToolError>>;
}

/// Handles in memory, bounded in number and kept for a time: for a runtime
/// without a store (tests, and code that embeds the core alone).
pub struct MemoryHandleStore {
    ttl: Duration,
    entries: Mutex<LruCache<String, (String, String, Instant, Kept)>>,
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
        tool: &'a str,
        value: Json,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let handle = new_handle_id();
            let now = crate::now_ms();
            let ttl_ms = i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX);
            let meta = HandleMeta {
                handle: handle.clone(),
                tool: tool.to_owned(),
                size_bytes: value.len() as u64,
                created_at_ms: now,
                expires_at_ms: now.saturating_add(ttl_ms),
            };
            let entry = (
                tenant.to_owned(),
                user.to_owned(),
                Instant::now() + self.ttl,
                Kept { meta, value },
            );
            self.entries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .put(handle.clone(), entry);
            Ok(handle)
        })
    }

    fn get<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Option<Kept>, ToolError>> {
        Box::pin(async move {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            Ok(entries
                .get(handle)
                .filter(|(t, u, expires, _)| t == tenant && u == user && *expires > Instant::now())
                .map(|(.., kept)| kept.clone()))
        })
    }

    fn list<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        before: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<HandleMeta>, ToolError>> {
        Box::pin(async move {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let mut metas: Vec<HandleMeta> = entries
                .iter()
                .filter(|(id, (t, u, expires, _))| {
                    t == tenant
                        && u == user
                        && *expires > now
                        && before.is_none_or(|before| id.as_str() < before)
                })
                .map(|(_, (.., kept))| kept.meta.clone())
                .collect();
            metas.sort_by(|a, b| b.handle.cmp(&a.handle));
            metas.truncate(limit);
            Ok(metas)
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
                let kept = store
                    .get(ctx.tenant(), ctx.user(), &args.handle)
                    .await?
                    .ok_or_else(|| {
                        ToolError::not_found(format!(
                            "no handle `{}` for this caller (it may have expired); call the tool that made it again",
                            truncate(&args.handle, 64)
                        ))
                    })?;
                Ok(read_page(&args.handle, &kept.value, args.offset, args.limit))
            }
        })
}

/// One page of a kept result: items of a list, else characters of its
/// JSON text, from `offset`, at most `limit` (bounded), with
/// `next_offset` while more remain.
pub fn read_page(handle: &str, value: &Json, offset: usize, limit: Option<usize>) -> Value {
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
