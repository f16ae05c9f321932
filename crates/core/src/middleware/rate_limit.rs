//! `rate_limit`: a token bucket per tool and tenant (or, as the tool
//! declares, per user or per value of an argument). A caller over the limit
//! gets `rate_limited` with `retry_after_s`, never a queue that grows. The
//! buckets are [`TokenBuckets`]: this process's ([`RateLimits`]), or a
//! store's that every dispatcher of a fleet shares (`toolfleet-fleet`'s
//! `StoreBuckets`), so a fleet allows the declared rate, not one per
//! process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::{Call, Layer, Next, Stage};
use crate::envelope::{Envelope, ErrorCode, ToolError};
use crate::tool::CountedBy;

/// At most `max` calls per `per`, per tenant and tool; bursts up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RateLimit {
    /// Calls allowed per window, and the largest burst.
    pub max: u32,
    /// The window, written in seconds.
    #[serde(with = "secs")]
    pub per: Duration,
}

mod secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// The buckets of every tenant and tool, bounded in number.
pub struct RateLimits {
    capacity: usize,
    buckets: Mutex<HashMap<(String, String), Bucket>>,
}

impl RateLimits {
    /// Buckets for at most `capacity` tenant and tool pairs (at least one).
    pub fn new(capacity: usize) -> Self {
        RateLimits {
            capacity: capacity.max(1),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token, or answers how long until one is free.
    fn take(
        &self,
        tool: &str,
        tenant: &str,
        limit: RateLimit,
        now: Instant,
    ) -> Result<(), Duration> {
        let rate = f64::from(limit.max.max(1)) / limit.per.as_secs_f64().max(1e-9);
        let burst = f64::from(limit.max.max(1));
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let key = (tool.to_owned(), tenant.to_owned());
        if !buckets.contains_key(&key) && buckets.len() >= self.capacity {
            // A full bucket carries no state worth keeping.
            buckets.retain(|_, b| {
                b.tokens + now.duration_since(b.updated).as_secs_f64() * rate < burst
            });
        }
        let bucket = buckets.entry(key).or_insert(Bucket {
            tokens: burst,
            updated: now,
        });
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
        }
    }
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits::new(100_000)
    }
}

/// Where a rate-limited tool's tokens are taken.
pub trait TokenBuckets: Send + Sync + 'static {
    /// Takes a token of `limit` for `tool` in `tenant` (a tenant, or a
    /// tenant's scope: [`CountedBy::scope`]): `Ok(None)` when
    /// taken, `Ok(Some(wait))` when none is free for `wait`, `Err` when the
    /// buckets cannot be reached (the call is refused as `unavailable`).
    fn take<'a>(
        &'a self,
        tool: &'a str,
        tenant: &'a str,
        limit: RateLimit,
    ) -> BoxFuture<'a, Result<Option<Duration>, ToolError>>;
}

impl TokenBuckets for RateLimits {
    fn take<'a>(
        &'a self,
        tool: &'a str,
        tenant: &'a str,
        limit: RateLimit,
    ) -> BoxFuture<'a, Result<Option<Duration>, ToolError>> {
        let taken = RateLimits::take(self, tool, tenant, limit, Instant::now());
        Box::pin(std::future::ready(Ok(taken.err())))
    }
}

/// The rate limit layer of one tool.
pub struct RateLimiter {
    limit: RateLimit,
    by: CountedBy,
    buckets: Arc<dyn TokenBuckets>,
}

impl RateLimiter {
    /// The layer applying `limit` per tenant, its buckets kept in `buckets`.
    pub fn new(limit: RateLimit, buckets: Arc<dyn TokenBuckets>) -> Self {
        RateLimiter {
            limit,
            by: CountedBy::Tenant,
            buckets,
        }
    }

    /// This layer, counting by `by` within each tenant.
    pub fn by(mut self, by: CountedBy) -> Self {
        self.by = by;
        self
    }
}

impl Layer for RateLimiter {
    fn stage(&self) -> Stage {
        Stage::RateLimit
    }

    fn call<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> BoxFuture<'a, Envelope> {
        Box::pin(async move {
            let name = call.tool.name();
            let scope = match self.by.scope(name, call.ctx, &call.args, "calls") {
                Ok(scope) => scope,
                Err(error) => return Envelope::error(error),
            };
            match self.buckets.take(name, &scope, self.limit).await {
                Ok(None) => next.run(call).await,
                Ok(Some(wait)) => {
                    let retry_after_s = wait.as_secs_f64().ceil().max(1.0) as u64;
                    let message = format!(
                        "`{name}` allows {} calls per {} s {}; wait {retry_after_s} s before calling it again",
                        self.limit.max,
                        self.limit.per.as_secs_f64(),
                        self.by.describe()
                    );
                    Envelope::error(
                        ToolError::new(ErrorCode::RateLimited, message)
                            .with_retry_after(retry_after_s),
                    )
                }
                Err(error) => Envelope::error(error),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_refill_at_the_declared_rate() {
        let limits = RateLimits::new(10);
        let limit = RateLimit {
            max: 2,
            per: Duration::from_secs(10),
        };
        let t0 = Instant::now();
        assert!(limits.take("t", "a", limit, t0).is_ok());
        assert!(limits.take("t", "a", limit, t0).is_ok());
        let wait = limits.take("t", "a", limit, t0).unwrap_err();
        assert!(wait > Duration::from_secs(4) && wait <= Duration::from_secs(5));
        // Another tenant has its own bucket.
        assert!(limits.take("t", "b", limit, t0).is_ok());
        assert!(
            limits
                .take("t", "a", limit, t0 + Duration::from_secs(5))
                .is_ok()
        );
    }

    #[test]
    fn the_bucket_table_stays_bounded() {
        let limits = RateLimits::new(3);
        let limit = RateLimit {
            max: 5,
            per: Duration::from_secs(1),
        };
        let t0 = Instant::now();
        for tenant in 0..50 {
            let _ = limits.take(
                "t",
                &tenant.to_string(),
                limit,
                t0 + Duration::from_secs(tenant),
            );
        }
        assert!(limits.buckets.lock().unwrap().len() <= 3);
    }
}
