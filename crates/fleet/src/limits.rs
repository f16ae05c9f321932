//! Rate limits that hold across a fleet: the buckets of `rate_limit` kept
//! in the store every dispatcher shares ([`Store::take_token`]), so two
//! dispatchers allow a tool's declared rate between them, not twice it.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use toolfleet_core::middleware::{RateLimit, TokenBuckets};
use toolfleet_core::{ToolError, now_ms};
use toolfleet_store::{Store, TakeToken};

use crate::dispatch::store_error;

/// Token buckets in a store: one per tenant and tool.
pub struct StoreBuckets {
    store: Arc<dyn Store>,
}

impl StoreBuckets {
    /// The buckets kept in `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        StoreBuckets { store }
    }
}

/// The bucket of `tool` in `tenant`: both names, unambiguously.
fn bucket(tenant: &str, tool: &str) -> String {
    serde_json::json!([tenant, tool]).to_string()
}

/// The interval between tokens of `limit`, in microseconds (so a limit
/// above 1,000 calls a second keeps an interval of its own), and its burst.
fn terms(limit: RateLimit) -> (i64, u32) {
    let max = limit.max.max(1);
    let per_us = limit.per.as_micros().min(i64::MAX as u128) as i64;
    ((per_us / i64::from(max)).max(1), max)
}

impl TokenBuckets for StoreBuckets {
    fn take<'a>(
        &'a self,
        tool: &'a str,
        tenant: &'a str,
        limit: RateLimit,
    ) -> BoxFuture<'a, Result<Option<Duration>, ToolError>> {
        Box::pin(async move {
            let key = bucket(tenant, tool);
            let (interval, burst) = terms(limit);
            let take = TakeToken {
                key: &key,
                now: now_ms().saturating_mul(1_000),
                interval,
                burst,
            };
            let wait = self.store.take_token(take).await.map_err(store_error)?;
            Ok(wait.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(1))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolfleet_store::sqlite::SqliteStore;

    /// Two holders of one store share one bucket: between them no more
    /// than the burst passes at once, and each tenant has its own.
    #[tokio::test]
    async fn two_holders_of_one_store_share_a_bucket() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().await.unwrap());
        let (one, two) = (StoreBuckets::new(store.clone()), StoreBuckets::new(store));
        let limit = RateLimit {
            max: 4,
            per: Duration::from_secs(60),
        };
        let mut passed = 0;
        for n in 0..10 {
            let buckets = if n % 2 == 0 { &one } else { &two };
            if buckets.take("ocr", "acme", limit).await.unwrap().is_none() {
                passed += 1;
            }
        }
        assert_eq!(passed, 4);
        let wait = one
            .take("ocr", "acme", limit)
            .await
            .unwrap()
            .expect("limited");
        assert!(
            wait > Duration::from_secs(14) && wait <= Duration::from_secs(15),
            "{wait:?}"
        );
        assert_eq!(two.take("ocr", "globex", limit).await.unwrap(), None);
        // Past 1,000 calls a second the rate still holds: 5,000 a second
        // is a token every 200 µs.
        let fast = RateLimit {
            max: 5_000,
            per: Duration::from_secs(1),
        };
        assert_eq!(terms(fast), (200, 5_000));
        assert_eq!(bucket("a\",\"b", "c"), r#"["a\",\"b","c"]"#);
    }
}
