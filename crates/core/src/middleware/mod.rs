//! Middleware: cross-cutting behaviour written once as a [`Layer`] that wraps
//! the next one, declared per tool and composed at call time.
//!
//! The order is fixed by [`Stage`], outermost first: audit, redact, authorise,
//! rate limit, cache, timeout, then custom layers, then the tool. Audit is
//! outermost so denied calls are logged; the cache sits inside authorisation
//! so a cached answer never reaches a caller who lacks the scope. A layer
//! never sees another tenant's state: every key it builds includes the tenant.
//!
//! A layer of one's own is a few lines:
//!
//! ```
//! use toolfleet_core::middleware::{Call, Layer, Next};
//! use toolfleet_core::Envelope;
//! use futures_util::future::BoxFuture;
//!
//! struct CountCalls(std::sync::atomic::AtomicU64);
//!
//! impl Layer for CountCalls {
//!     fn call<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> BoxFuture<'a, Envelope> {
//!         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
//!         next.run(call)
//!     }
//! }
//! ```

mod audit;
mod cache;
mod rate_limit;
mod redact;
mod scope;
mod timeout;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::envelope::Envelope;
use crate::registry::Tool;
use crate::tool::CallCtx;

pub use audit::{Audit, AuditRecord, AuditSink, MemoryAuditSink};
pub use cache::{CacheReads, ReadCache, canonical_json};
pub use rate_limit::{RateLimit, RateLimiter, RateLimits, TokenBuckets};
pub use redact::{REDACTED, Redact, redact_json, redact_value};
pub use scope::RequireScopes;
pub use timeout::Timeout;

/// Where a layer sits in the stack, outermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Records the call in the audit log.
    Audit,
    /// Masks configured fields.
    Redact,
    /// Checks the scopes the tool requires.
    Authorise,
    /// Applies the tool's rate limit.
    RateLimit,
    /// Answers reads from the cache.
    Cache,
    /// Bounds the call's run time.
    Timeout,
    /// Layers of the user's own run innermost, just before the tool.
    Custom,
}

/// One call on its way through the stack.
pub struct Call<'a> {
    /// The registered tool called.
    pub tool: &'a Tool,
    /// Principal, run and call ids of the call.
    pub ctx: &'a CallCtx,
    /// Arguments, already validated against the tool's schema.
    pub args: Value,
}

/// Cross-cutting behaviour around a tool call.
pub trait Layer: Send + Sync + 'static {
    /// Where the layer sits; layers of one's own default to innermost.
    fn stage(&self) -> Stage {
        Stage::Custom
    }

    /// Handles the call, usually by passing it to `next` and looking at the answer.
    fn call<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> BoxFuture<'a, Envelope>;
}

/// What runs once every layer has passed the call on: the shape's contract.
pub(crate) trait Endpoint: Send + Sync {
    fn run<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Envelope>;
}

/// The rest of the stack below a layer.
pub struct Next<'a> {
    layers: &'a [Arc<dyn Layer>],
    endpoint: &'a dyn Endpoint,
}

impl<'a> Next<'a> {
    pub(crate) fn new(layers: &'a [Arc<dyn Layer>], endpoint: &'a dyn Endpoint) -> Self {
        Next { layers, endpoint }
    }

    /// Passes the call to the next layer, or to the tool.
    pub fn run(self, call: Call<'a>) -> BoxFuture<'a, Envelope> {
        match self.layers.split_first() {
            Some((layer, rest)) => layer.call(
                call,
                Next {
                    layers: rest,
                    endpoint: self.endpoint,
                },
            ),
            None => self.endpoint.run(call),
        }
    }
}

/// The shared state that built-in layers keep between calls.
#[derive(Clone)]
pub struct LayerServices {
    /// Where the audit layer writes its records.
    pub audit_sink: Arc<dyn AuditSink>,
    /// The read cache every tool's cache layer shares.
    pub cache: Arc<ReadCache>,
    /// The token buckets of every rate-limited tool.
    pub rate_limits: Arc<dyn TokenBuckets>,
    /// Where the cache counts its hits and misses.
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// Builds a tool's stack from its declaration, sorted by stage.
pub(crate) fn build_stack(
    spec: &crate::tool::MiddlewareSpec,
    default_timeout: std::time::Duration,
    services: &LayerServices,
) -> Vec<Arc<dyn Layer>> {
    let mut stack: Vec<Arc<dyn Layer>> = Vec::new();
    if spec.audit {
        stack.push(Arc::new(Audit::new(services.audit_sink.clone())));
    }
    if !spec.redact.is_empty() {
        stack.push(Arc::new(Redact::new(spec.redact.clone())));
    }
    if !spec.scopes.is_empty() {
        stack.push(Arc::new(RequireScopes::new(spec.scopes.clone())));
    }
    if let Some(limit) = spec.rate_limit {
        stack.push(Arc::new(
            RateLimiter::new(limit, services.rate_limits.clone()).by(spec.rate_limit_by.clone()),
        ));
    }
    if let Some(ttl) = spec.cache_ttl {
        stack.push(Arc::new(
            CacheReads::new(ttl, services.cache.clone()).with_metrics(services.metrics.clone()),
        ));
    }
    // Every inline call is bounded in time, declared or not.
    stack.push(Arc::new(Timeout::new(
        spec.timeout.unwrap_or(default_timeout),
    )));
    stack.extend(spec.custom.iter().cloned());
    stack.sort_by_key(|layer| layer.stage());
    stack
}
