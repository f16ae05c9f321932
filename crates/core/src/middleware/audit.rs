//! `audit`: one record per call, denied and failed calls included, to a
//! pluggable sink. Arguments are recorded with the tool's redacted fields masked.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

use super::{Call, Layer, Next, Stage, redact_value};
use crate::envelope::{Envelope, ErrorCode};

/// What the audit layer writes for each call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditRecord {
    /// Unix time of the call's start, in milliseconds.
    pub at_ms: u64,
    /// The tool called.
    pub tool: String,
    /// The caller's tenant.
    pub tenant: String,
    /// The calling user.
    pub user: String,
    /// The agent run the call belongs to.
    pub run_id: String,
    /// The call.
    pub call_id: String,
    /// Set when a sub-agent made the call: the run id of the agent it
    /// serves (its lineage's `parent_run_id`), beside its own `run_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// Arguments with redacted fields masked.
    pub args: Value,
    /// The envelope's status: ok, error, running or suspended.
    pub status: &'static str,
    /// The error code of an `error` envelope.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
    /// How long the call took, in microseconds.
    pub duration_us: u64,
}

/// Where audit records go. `record` must not block: a sink that writes to a
/// store hands the record to a task of its own.
pub trait AuditSink: Send + Sync + 'static {
    /// Takes one record; must not block.
    fn record(&self, record: AuditRecord);
}

/// Keeps the latest records in memory, up to a bound.
pub struct MemoryAuditSink {
    capacity: usize,
    records: Mutex<VecDeque<AuditRecord>>,
}

impl MemoryAuditSink {
    /// A sink that keeps at most `capacity` records (at least one).
    pub fn new(capacity: usize) -> Self {
        MemoryAuditSink {
            capacity: capacity.max(1),
            records: Mutex::new(VecDeque::new()),
        }
    }

    /// The records kept, oldest first.
    pub fn records(&self) -> Vec<AuditRecord> {
        self.lock().iter().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<AuditRecord>> {
        // A panic elsewhere while holding the lock leaves a valid deque.
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for MemoryAuditSink {
    fn default() -> Self {
        MemoryAuditSink::new(10_000)
    }
}

impl AuditSink for MemoryAuditSink {
    fn record(&self, record: AuditRecord) {
        let mut records = self.lock();
        if records.len() == self.capacity {
            records.pop_front();
        }
        records.push_back(record);
    }
}

/// The audit layer.
pub struct Audit {
    sink: Arc<dyn AuditSink>,
}

impl Audit {
    /// An audit layer writing to `sink`.
    pub fn new(sink: Arc<dyn AuditSink>) -> Self {
        Audit { sink }
    }
}

impl Layer for Audit {
    fn stage(&self) -> Stage {
        Stage::Audit
    }

    fn call<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> BoxFuture<'a, Envelope> {
        Box::pin(async move {
            let started = Instant::now();
            let at_ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            let (tool, ctx) = (call.tool, call.ctx);
            let mut args = call.args.clone();
            redact_value(&mut args, &tool.middleware().redact);
            let envelope = next.run(call).await;
            self.sink.record(AuditRecord {
                at_ms,
                tool: tool.name().to_owned(),
                tenant: ctx.principal.tenant.clone(),
                user: ctx.principal.user.clone(),
                run_id: ctx.run_id.clone(),
                call_id: ctx.call_id.clone(),
                parent_run_id: ctx.lineage.as_ref().map(|l| l.parent_run_id.clone()),
                args,
                status: envelope.status(),
                error_code: envelope.error_code(),
                duration_us: started.elapsed().as_micros() as u64,
            });
            envelope
        })
    }
}
