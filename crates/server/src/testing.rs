//! What this crate's tests build again and again: an in-memory store, and
//! the jobs and tickets they put in it.

use std::sync::Arc;

use serde_json::json;
use toolfleet_store::{NewJob, NewTicket, Store};

/// A store of a test's own, in memory.
pub async fn memory_store() -> Arc<dyn Store> {
    Arc::new(
        toolfleet_store::sqlite::SqliteStore::open_in_memory()
            .await
            .expect("a store"),
    )
}

/// A queued job of tenant `acme`, recorded at `now`, with a new id.
pub fn new_job(callback_url: Option<&str>, now: i64) -> NewJob {
    NewJob {
        id: toolfleet_core::new_id(),
        tenant: "acme".to_owned(),
        user: "alice".to_owned(),
        tool: "ocr".to_owned(),
        pool: "default".to_owned(),
        args: json!({}),
        idempotency_key: None,
        run_id: toolfleet_core::new_id(),
        call_id: toolfleet_core::new_id(),
        callback_url: callback_url.map(str::to_owned),
        lineage: None,
        scopes: Vec::new(),
        trace: None,
        max_attempts: 3,
        timeout_ms: 60_000,
        now,
    }
}

/// An open ticket of tenant `acme`, opened at `now`, with a new id.
pub fn new_ticket(callback_url: Option<&str>, now: i64) -> NewTicket {
    NewTicket {
        id: format!("t_{}", toolfleet_core::new_id()),
        tenant: "acme".to_owned(),
        user: "alice".to_owned(),
        tool: "ask_user".to_owned(),
        question: "travel or meals?".to_owned(),
        options: Vec::new(),
        args: json!({}),
        run_id: toolfleet_core::new_id(),
        call_id: toolfleet_core::new_id(),
        callback_url: callback_url.map(str::to_owned),
        now,
    }
}
