//! `cache_reads`: a bounded in-memory cache of `ok` answers of read-only
//! tools, keyed on tool, tenant, user and canonical arguments, so that no
//! entry is ever served across tenants or users. Registration refuses it on a
//! tool that is not read-only.

use std::fmt::Write;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use lru::LruCache;
use serde_json::Value;

use super::{Call, Layer, Next, Stage};
use crate::envelope::{Envelope, Json};
use crate::metrics::Metrics;

/// JSON text with object members in sorted order: equal values, equal text.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(member, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::String(s) => write_string(s, out),
        other => {
            let _ = write!(out, "{other}");
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    let _ = write!(out, "{}", Value::String(s.to_owned()));
}

/// The shared store behind every tool's cache layer.
pub struct ReadCache {
    entries: Mutex<LruCache<String, (Instant, Json)>>,
}

impl ReadCache {
    /// A cache of at most `capacity` entries; the least recently used go first.
    pub fn new(capacity: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        ReadCache {
            entries: Mutex::new(LruCache::new(capacity)),
        }
    }

    fn key(tool: &str, tenant: &str, user: &str, args: &Value) -> String {
        // Lengths first, so no choice of names can make two identities collide.
        let mut key = format!(
            "{}:{tool}{}:{tenant}{}:{user}",
            tool.len(),
            tenant.len(),
            user.len()
        );
        write_canonical(args, &mut key);
        key
    }

    fn get(&self, key: &str, now: Instant) -> Option<Json> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match entries.get(key) {
            Some((expires, result)) if *expires > now => Some(result.clone()),
            Some(_) => {
                entries.pop(key);
                None
            }
            None => None,
        }
    }

    fn put(&self, key: String, expires: Instant, result: Json) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.put(key, (expires, result));
    }

    /// Number of entries held, expired ones included until they are next touched.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when the cache holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for ReadCache {
    fn default() -> Self {
        ReadCache::new(10_000)
    }
}

/// The cache layer of one tool.
pub struct CacheReads {
    ttl: Duration,
    cache: Arc<ReadCache>,
    metrics: Option<Arc<Metrics>>,
}

impl CacheReads {
    /// The layer keeping `ok` answers for `ttl` in the shared `cache`.
    pub fn new(ttl: Duration, cache: Arc<ReadCache>) -> Self {
        CacheReads {
            ttl,
            cache,
            metrics: None,
        }
    }

    /// Counts hits and misses in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

impl Layer for CacheReads {
    fn stage(&self) -> Stage {
        Stage::Cache
    }

    fn call<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> BoxFuture<'a, Envelope> {
        let principal = &call.ctx.principal;
        let key = ReadCache::key(
            call.tool.name(),
            &principal.tenant,
            &principal.user,
            &call.args,
        );
        let now = Instant::now();
        let hit = self.cache.get(&key, now);
        if let Some(metrics) = &self.metrics {
            match hit {
                Some(_) => metrics.cache_hit(call.tool.name()),
                None => metrics.cache_miss(call.tool.name()),
            }
        }
        if let Some(result) = hit {
            let call_id = call.ctx.call_id.clone();
            return Box::pin(async move { Envelope::ok(result, call_id) });
        }
        Box::pin(async move {
            let envelope = next.run(call).await;
            if let Envelope::Ok { result, .. } = &envelope {
                self.cache.put(key, now + self.ttl, result.clone());
            }
            envelope
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_text_ignores_member_order() {
        let a = json!({"b": 1, "a": {"y": [1, "x"], "x": null}});
        let b: Value = serde_json::from_str(r#"{"a":{"x":null,"y":[1,"x"]},"b":1}"#).unwrap();
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(canonical_json(&a), r#"{"a":{"x":null,"y":[1,"x"]},"b":1}"#);
    }

    #[test]
    fn keys_never_collide_across_identities() {
        let args = json!({});
        assert_ne!(
            ReadCache::key("t", "ab", "c", &args),
            ReadCache::key("t", "a", "bc", &args)
        );
    }

    #[test]
    fn the_cache_is_bounded_and_entries_expire() {
        let cache = ReadCache::new(2);
        let now = Instant::now();
        for i in 0..5 {
            cache.put(
                format!("k{i}"),
                now + Duration::from_secs(1),
                Json::from(json!(i)),
            );
        }
        assert_eq!(cache.len(), 2);
        assert!(cache.get("k4", now).is_some());
        assert!(cache.get("k4", now + Duration::from_secs(2)).is_none());
    }
}
