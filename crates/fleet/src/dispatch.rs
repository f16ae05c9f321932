//! The dispatcher's side of the fleet: accepted jobs become job rows and
//! messages (the lifecycle's `enqueue`), human calls become tickets,
//! command outcomes and audit records go to the store.
//!
//! The job row is written before its message is published, so the row is its
//! own outbox: the call answers `running` once the row is committed, and the
//! message follows from the [`Outbox`], which tries again while a publish
//! fails; what a crash left unpublished another process publishes within
//! seconds (`crate::outbox`). Nothing here runs a job.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use toolfleet_broker::{Broker, Notices};
use toolfleet_core::shapes::command::{COMMIT_WAIT, Claim, ClaimTerms, CommitLog};
use toolfleet_core::{
    Approval, ApprovalRequest, AuditRecord, AuditSink, Envelope, ErrorCode, Fleet, JobRequest,
    JobState, Metrics, TicketRequest, ToolError, approval_question, now_ms,
};
use toolfleet_store::{
    ClaimCommit, CommitClaim, Inserted, NewJob, NewTicket, Store, StoreError, TicketKind,
    TicketRecord,
};

use crate::announcer::Announcer;
use crate::events::ticket_event;
use crate::outbox::Outbox;

/// The poll hint of the envelopes a dispatcher announces (`poll_after_s`
/// of a job still running).
pub const POLL_AFTER_S: u32 = 5;

/// A store failure as a caller reads it.
pub fn store_error(error: StoreError) -> ToolError {
    match error {
        StoreError::Conflict(message) => ToolError::new(ErrorCode::Conflict, message),
        StoreError::Unavailable(message) | StoreError::Schema(message) => ToolError::new(
            ErrorCode::Unavailable,
            format!("the job store is unavailable ({message}); try again shortly"),
        ),
    }
}

/// A crash the tests of the outbox can trigger (`TOOLFLEET_FAULT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The process dies after writing a job row and before answering.
    AbortAfterJobWrite,
    /// The process dies after answering `running` and before publishing.
    AbortAfterAnswer,
}

impl Fault {
    /// The fault named by `TOOLFLEET_FAULT`, if any.
    pub fn from_env() -> Option<Fault> {
        match std::env::var("TOOLFLEET_FAULT").ok()?.as_str() {
            "abort_after_job_write" => Some(Fault::AbortAfterJobWrite),
            "abort_after_answer" => Some(Fault::AbortAfterAnswer),
            _ => None,
        }
    }
}

/// Accepts jobs and tickets into the store and the broker.
pub struct Dispatcher {
    store: Arc<dyn Store>,
    /// Publishes events in order, off the call's path.
    announcer: Announcer,
    /// Publishes jobs' first messages, off the call's path.
    outbox: Arc<Outbox>,
    fault: Option<Fault>,
    /// Where new jobs are counted.
    metrics: Option<Arc<Metrics>>,
    /// A scheduled job due within this is published at once, with its
    /// delay; a later one holds no message until the sweeper's pass before
    /// it is due.
    horizon: Duration,
}

impl Dispatcher {
    /// A dispatcher recording in `store`, publishing on `broker` and announcing on `notices`.
    pub fn new(store: Arc<dyn Store>, broker: Arc<dyn Broker>, notices: Arc<dyn Notices>) -> Self {
        let fault = Fault::from_env();
        Dispatcher {
            store,
            outbox: Arc::new(Outbox::new(broker, fault)),
            announcer: Announcer::spawn(notices, 65_536),
            fault,
            metrics: None,
            horizon: crate::sweeper::sweep_period(Duration::MAX),
        }
    }

    /// Publishes at once, with their delay, the scheduled jobs due within
    /// `horizon`: the sweeper's period ([`crate::sweeper::sweep_period`]),
    /// whose passes publish the later ones as they come within reach.
    pub fn with_horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon;
        self
    }

    /// Where this dispatcher's jobs are published from: its beat and its
    /// last flush are [`crate::outbox::run_outbox`]'s.
    pub fn outbox(&self) -> Arc<Outbox> {
        self.outbox.clone()
    }

    /// Counts each job it records in `toolfleet_jobs_enqueued_total`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

impl Fleet for Dispatcher {
    fn submit<'a>(&'a self, job: JobRequest) -> BoxFuture<'a, Result<String, ToolError>> {
        let id = toolfleet_core::new_id();
        // The job's span on this side: a child of the call's, and the parent
        // of each attempt's span on the worker (the job carries its context).
        // At ERROR level, so that it is enabled whatever TOOLFLEET_LOG lets
        // through and every line it logs carries its fields. Made only where
        // something reads it: an exporter, or logs of `info` or finer (its
        // lines are `info`; nothing coarser is logged in it). Otherwise the
        // job still carries the context the span would have had, and the
        // call's span names the tool, tenant and run around it: under load
        // the span's fields, formatted as it is made, cost more than the
        // rest of the job's way to the store.
        let placement = toolfleet_telemetry::Placement::new(job.ctx.trace.as_ref());
        let read = placement.exported()
            || tracing::level_filters::LevelFilter::current() >= tracing::Level::INFO;
        let span = if read {
            tracing::error_span!(
                "job",
                tool = %job.tool,
                job_id = %id,
                run_id = %job.ctx.run_id,
                tenant = %job.ctx.principal.tenant,
                attempt = 0u32,
                trace_id = placement.trace_id(),
                span_id = placement.span_id(),
                parent_span_id = placement.parent_span_id(),
            )
        } else {
            tracing::Span::none()
        };
        let trace = placement.place(&span);
        let enqueue = async move {
            let ctx = &job.ctx;
            // In a fair pool, the job takes its tenant's next turn.
            let fair_rank = if job.fair {
                self.store
                    .fair_turn(&job.pool, &ctx.principal.tenant)
                    .await
                    .map_err(store_error)?
            } else {
                0
            };
            let new = NewJob {
                id,
                tenant: ctx.principal.tenant.clone(),
                user: ctx.principal.user.clone(),
                tool: job.tool.clone(),
                pool: job.pool.clone(),
                args: job.args,
                idempotency_key: ctx.idempotency_key.clone(),
                run_id: ctx.run_id.clone(),
                call_id: ctx.call_id.clone(),
                callback_url: ctx.callback_url.clone(),
                lineage: ctx.lineage.clone(),
                scopes: ctx.principal.scopes.iter().cloned().collect(),
                trace: Some(trace),
                max_attempts: job.max_attempts,
                timeout_ms: job.timeout.as_millis().min(i64::MAX as u128) as i64,
                now: now_ms(),
                run_at: ctx.run_at,
                priority: job.priority,
                concurrency_key: job.concurrency.as_ref().map(|(key, _)| key.clone()),
                concurrency_limit: job.concurrency.as_ref().map(|(_, limit)| *limit),

                fair_rank,
                origin: Some(self.outbox.origin().to_owned()),
            };
            let inserted = self.store.insert_job(new).await.map_err(store_error)?;
            let Inserted::Created(record) = inserted else {
                let existing = inserted.job();
                tracing::Span::current().record("job_id", tracing::field::display(&existing.id));
                tracing::info!(state = %existing.state, "the idempotency key names an existing job");
                return Ok(existing.id.clone());
            };
            if self.fault == Some(Fault::AbortAfterJobWrite) {
                std::process::abort();
            }
            if let Some(metrics) = &self.metrics {
                // The runtime only hands over jobs of registered tools.
                metrics.job_enqueued(&record.tool);
            }
            // The row is durable: the call answers now, the message follows;
            // for a job scheduled past the horizon, the sweeper's, later.
            let wait = u64::try_from(record.run_at.saturating_sub(now_ms())).unwrap_or(0);
            let wait = Duration::from_millis(wait);
            if record.state != JobState::Scheduled || wait <= self.horizon {
                let trace = record.trace.as_ref();
                self.outbox
                    .publish(&record.pool, &record.id, trace, wait)
                    .await;
            }
            tracing::info!(pool = %record.pool, state = %record.state, "job enqueued");
            self.announcer.announce_job(&record, POLL_AFTER_S);
            Ok(record.id)
        };
        Box::pin(tracing::Instrument::instrument(enqueue, span))
    }

    fn open_ticket<'a>(
        &'a self,
        ticket: TicketRequest,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let id = format!("t_{}", uuid::Uuid::now_v7().simple());
            let record = self
                .store
                .insert_ticket(new_ticket(id, ticket))
                .await
                .map_err(store_error)?;
            self.announcer.announce(ticket_event(&record));
            Ok(record.id)
        })
    }

    fn request_approval<'a>(
        &'a self,
        approval: ApprovalRequest,
    ) -> BoxFuture<'a, Result<Approval, ToolError>> {
        Box::pin(async move {
            let tenant = approval.ctx.principal.tenant.clone();
            let id = approval.ticket.clone();
            let standing = |record: &TicketRecord| match &record.outcome {
                Some(outcome) => Approval::Settled(outcome.clone()),
                None if record.expired_at.is_some() => {
                    Approval::Settled(Envelope::error(crate::runs::expired(&record.id)))
                }
                None => Approval::Pending(record.id.clone()),
            };
            let found = self.store.ticket(&tenant, &id).await;
            if let Some(record) = found.map_err(store_error)? {
                return Ok(standing(&record));
            }
            let question = TicketRequest {
                question: approval_question(&approval.tool),
                options: vec!["approve".to_owned(), "reject".to_owned()],
                tool: approval.tool,
                args: approval.args,
                ctx: approval.ctx,
                answered_by: approval.answered_by,
                expires_in: approval.expires_in,
            };
            let new = NewTicket {
                kind: TicketKind::Approval,
                plan: Some(approval.plan),
                ..new_ticket(id.clone(), question)
            };
            match self.store.insert_ticket(new).await {
                Ok(record) => {
                    self.announcer.announce(ticket_event(&record));
                    Ok(Approval::Pending(record.id))
                }
                // Opened by another commit of the same token meanwhile.
                Err(error) => match self.store.ticket(&tenant, &id).await {
                    Ok(Some(record)) => Ok(standing(&record)),
                    _ => Err(store_error(error)),
                },
            }
        })
    }
}

/// The question ticket `id` of `ticket`, as its caller opened it now.
fn new_ticket(id: String, ticket: TicketRequest) -> NewTicket {
    let ctx = &ticket.ctx;
    let now = now_ms();
    NewTicket {
        id,
        tenant: ctx.principal.tenant.clone(),
        user: ctx.principal.user.clone(),
        tool: ticket.tool,
        question: ticket.question,
        options: ticket.options,
        args: ticket.args,
        run_id: ctx.run_id.clone(),
        call_id: ctx.call_id.clone(),
        callback_url: ctx.callback_url.clone(),
        answered_by: ticket.answered_by,
        kind: TicketKind::Question,
        plan: None,
        scopes: ctx.principal.scopes.iter().cloned().collect(),
        expires_at: ticket
            .expires_in
            .map(|after| now.saturating_add(millis(after))),
        input_requests: None,
        now,
    }
}

/// Command outcomes in the store, so a confirm token commits once across
/// restarts and dispatchers. A claim left pending past its lease (its
/// dispatcher stopped mid-commit) is never taken over: the token answers
/// that its outcome is unknown.
pub struct StoreCommitLog {
    store: Arc<dyn Store>,
    /// How long a claim waits for a running commit of the same token.
    wait: Duration,
}

impl StoreCommitLog {
    /// How often a claim that waits reads the token again.
    const POLL: Duration = Duration::from_millis(50);

    /// A commit log in `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        StoreCommitLog {
            store,
            wait: COMMIT_WAIT,
        }
    }
}

/// Milliseconds of `d`, as the store counts them.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl CommitLog for StoreCommitLog {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        terms: ClaimTerms,
    ) -> BoxFuture<'a, Result<Claim, ToolError>> {
        Box::pin(async move {
            let give_up = tokio::time::Instant::now() + self.wait;
            let keep_until = millis(Duration::from_secs(terms.keep_until_unix));
            loop {
                let claim = ClaimCommit {
                    key,
                    now: now_ms(),
                    lease_ms: millis(terms.lease),
                    keep_until,
                    take_over: false,
                };
                match self.store.claim_commit(claim).await.map_err(store_error)? {
                    CommitClaim::Run => return Ok(Claim::Run),
                    CommitClaim::Settled(envelope) => return Ok(Claim::Settled(envelope)),
                    CommitClaim::Abandoned => return Ok(Claim::Abandoned),
                    CommitClaim::Pending if tokio::time::Instant::now() >= give_up => {
                        return Ok(Claim::Busy);
                    }
                    CommitClaim::Pending => tokio::time::sleep(Self::POLL).await,
                }
            }
        })
    }

    fn settle<'a>(
        &'a self,
        key: &'a str,
        outcome: Option<&'a Envelope>,
        keep_until_unix: u64,
    ) -> BoxFuture<'a, Result<(), ToolError>> {
        Box::pin(async move {
            let keep_until = millis(Duration::from_secs(keep_until_unix));
            self.store
                .settle_commit(toolfleet_store::SettleCommit {
                    key,
                    outcome,
                    keep_until,
                })
                .await
                .map_err(store_error)
        })
    }
}

/// Audit records to the store, written in batches by a task of their own so
/// that a call never waits on them.
pub struct StoreAuditSink {
    queue: mpsc::Sender<AuditRecord>,
}

impl StoreAuditSink {
    /// Spawns the writer; a full queue drops records rather than stall calls.
    pub fn spawn(store: Arc<dyn Store>, capacity: usize) -> Self {
        let (queue, mut records) = mpsc::channel::<AuditRecord>(capacity.max(1));
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(256);
            while records.recv_many(&mut batch, 256).await > 0 {
                if let Err(error) = store.append_audit(&batch).await {
                    tracing::warn!(%error, dropped = batch.len(), "audit records not written");
                }
                batch.clear();
            }
        });
        StoreAuditSink { queue }
    }
}

impl AuditSink for StoreAuditSink {
    fn record(&self, record: AuditRecord) {
        if self.queue.try_send(record).is_err() {
            tracing::warn!("audit queue full; a record was dropped");
        }
    }
}
