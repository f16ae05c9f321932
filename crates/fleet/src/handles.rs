//! Handles kept in the store ([`StoreHandles`]): a handle-shaped tool's
//! large result, already redacted as its tool declares, written once and
//! read by any process of the fleet, before and after a restart, until it
//! expires. Each tenant keeps at most so many handles and bytes; past
//! either bound its oldest handles go. A handle is read by the tenant and
//! user it was made for alone: another's, an expired or an unknown one
//! reads as missing.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use toolfleet_core::{
    ErrorCode, HandleMeta, HandleStore, Json, Kept, ToolError, is_handle_id, new_handle_id, now_ms,
};
use toolfleet_store::{HandleInfo, HandleOwner, NewHandle, Store};

use crate::store_error;

/// How long handles are kept and how much of them a tenant keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleBounds {
    /// How long a handle is readable after it was made.
    pub ttl: Duration,
    /// The most handles a tenant keeps.
    pub max_per_tenant: u32,
    /// The most bytes of handles a tenant keeps; a result larger alone is
    /// refused.
    pub max_bytes_per_tenant: u64,
}

impl Default for HandleBounds {
    /// An hour; 1,000 handles and 256 MiB a tenant.
    fn default() -> Self {
        HandleBounds {
            ttl: Duration::from_secs(3600),
            max_per_tenant: 1_000,
            max_bytes_per_tenant: 256 << 20,
        }
    }
}

/// The [`HandleStore`] of a fleet: handles in the [`Store`].
pub struct StoreHandles {
    store: Arc<dyn Store>,
    bounds: HandleBounds,
}

impl StoreHandles {
    /// Handles kept in `store` within `bounds`.
    pub fn new(store: Arc<dyn Store>, bounds: HandleBounds) -> Self {
        StoreHandles { store, bounds }
    }
}

fn meta(info: HandleInfo) -> HandleMeta {
    HandleMeta {
        handle: info.id,
        tool: info.tool,
        size_bytes: u64::try_from(info.size_bytes).unwrap_or(0),
        created_at_ms: info.created_at,
        expires_at_ms: info.expires_at,
    }
}

impl HandleStore for StoreHandles {
    fn put<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        tool: &'a str,
        value: Json,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let max_bytes = self.bounds.max_bytes_per_tenant;
            if value.len() as u64 > max_bytes {
                return Err(ToolError::new(
                    ErrorCode::PayloadTooLarge,
                    format!(
                        "the result is {} bytes, more than the {max_bytes} bytes a tenant's handles may hold; \
                         call the tool again for less (a narrower filter or a smaller page)",
                        value.len()
                    ),
                ));
            }
            let id = new_handle_id();
            let now = now_ms();
            let ttl_ms = i64::try_from(self.bounds.ttl.as_millis()).unwrap_or(i64::MAX);
            let evicted = self
                .store
                .put_handle(NewHandle {
                    id: &id,
                    tenant,
                    user,
                    tool,
                    value: value.get(),
                    now,
                    expires_at: now.saturating_add(ttl_ms),
                    max_per_tenant: self.bounds.max_per_tenant,
                    max_bytes_per_tenant: i64::try_from(max_bytes).unwrap_or(i64::MAX),
                })
                .await
                .map_err(store_error)?;
            if evicted > 0 {
                tracing::debug!(tenant, evicted, "a tenant's oldest handles made room");
            }
            Ok(id)
        })
    }

    fn get<'a>(
        &'a self,
        tenant: &'a str,
        user: &'a str,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<Option<Kept>, ToolError>> {
        Box::pin(async move {
            if !is_handle_id(handle) {
                return Ok(None);
            }
            let owner = HandleOwner {
                tenant,
                user,
                now: now_ms(),
            };
            let Some(record) = self
                .store
                .handle(owner, handle)
                .await
                .map_err(store_error)?
            else {
                return Ok(None);
            };
            let value = Json::parse(&record.value).map_err(|error| {
                ToolError::new(
                    ErrorCode::ToolFailed,
                    format!(
                        "a kept handle is not JSON ({error}); call the tool that made it again"
                    ),
                )
            })?;
            Ok(Some(Kept {
                meta: meta(record.info),
                value,
            }))
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
            let owner = HandleOwner {
                tenant,
                user,
                now: now_ms(),
            };
            let limit = u32::try_from(limit).unwrap_or(u32::MAX);
            let before = before.filter(|b| is_handle_id(b));
            let infos = self
                .store
                .list_handles(owner, before, limit)
                .await
                .map_err(store_error)?;
            Ok(infos.into_iter().map(meta).collect())
        })
    }
}
