//! What this crate's unit tests share: a job to record.

use serde_json::json;
use toolfleet_core::new_id;
use toolfleet_store::NewJob;

/// A job of tool `ocr` for alice of tenant `acme` on pool `default`,
/// accepted at `now`, due then, with three attempts.
pub(crate) fn new_job(now: i64) -> NewJob {
    NewJob {
        id: new_id(),
        tenant: "acme".into(),
        user: "alice".into(),
        tool: "ocr".into(),
        pool: "default".into(),
        args: json!({}),
        idempotency_key: None,
        run_id: new_id(),
        call_id: new_id(),
        callback_url: None,
        lineage: None,
        scopes: Vec::new(),
        trace: None,
        max_attempts: 3,
        timeout_ms: 1_000,
        now,
        run_at: None,
        priority: None,
        concurrency_key: None,
        concurrency_limit: None,
        fair_rank: 0,
        origin: None,
    }
}
