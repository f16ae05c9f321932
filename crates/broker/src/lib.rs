//! The broker: how a job id reaches a worker of its pool, and how settled
//! work is announced to every process that may be waiting for it.
//!
//! A message carries a job id and nothing else the worker must trust: the
//! store holds the job, so a duplicate or stale message is harmless (the
//! worker's claim fails and it acks). The broker never decides a job's state.
//! Beside the id a message may carry the job's W3C trace context (RabbitMQ's
//! `traceparent` and `tracestate` headers), so the worker's span continues
//! the trace of the call that made the job.
//!
//! [`Broker`] moves job ids; [`Notices`] fans out events. Each has an
//! in-process implementation here and a conformance suite in [`conformance`]
//! that every implementation runs. Across processes, jobs move over RabbitMQ
//! ([`rabbit`]) and events over RabbitMQ's events exchange or PostgreSQL's
//! `LISTEN`/`NOTIFY` ([`postgres`]), each behind a [`fanout::Fanout`] so a
//! process holds one subscription however many local subscribers it has
//! (on RabbitMQ, two where the HTTP API runs: outcomes and every event, see
//! [`split`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolfleet_core::{JobState, TraceContext};

mod amqps;
pub mod conformance;
pub mod fanout;
pub mod memory;
pub mod metered;
pub mod postgres;
pub mod rabbit;
pub mod split;
pub mod tee;

/// Why a broker operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerError {
    /// The broker is unreachable or refused; the operation may be retried.
    Unavailable(String),
    /// The queue is at its configured bound.
    Full(String),
    /// The consumer was closed (shutdown).
    Closed,
}

impl std::fmt::Display for BrokerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BrokerError::Unavailable(m) => write!(f, "broker unavailable: {m}"),
            BrokerError::Full(m) => write!(f, "queue full: {m}"),
            BrokerError::Closed => f.write_str("consumer closed"),
        }
    }
}

impl std::error::Error for BrokerError {}

/// A job id handed to a worker, to be acknowledged once handled.
pub struct Delivery {
    /// The id the message carried: the job to run.
    pub job_id: String,
    /// True when the broker knows this message was delivered before.
    pub redelivered: bool,
    /// The trace context the message carried: the span that enqueued the
    /// job. `None` when it carried none (or one that is not valid).
    pub trace: Option<TraceContext>,
    /// Of a dead letter ([`Broker::consume_dead`]): why the broker
    /// dead-lettered it, as the broker says (`rejected`: a worker could not
    /// process it; RabbitMQ's `delivery_limit`, `expired` and `maxlen`:
    /// the broker gave up delivering it). `None` for a pool's delivery.
    pub dead_reason: Option<String>,
    /// Of a dead letter: when the broker dead-lettered it, in Unix
    /// milliseconds, when the broker says (RabbitMQ's `x-death` time).
    pub died_at: Option<i64>,
    /// When the broker handed its message to this process: RabbitMQ's
    /// `consumer_timeout` runs from then until the message is settled (the
    /// same instant for each id of a message of several).
    pub received: Instant,
    acker: Box<dyn Acker>,
}

impl Delivery {
    /// A delivery of `job_id`, carrying no trace context, settled through
    /// `acker`.
    pub fn new(job_id: String, redelivered: bool, acker: Box<dyn Acker>) -> Self {
        Delivery {
            job_id,
            redelivered,
            trace: None,
            dead_reason: None,
            died_at: None,
            received: Instant::now(),
            acker,
        }
    }

    /// This delivery, dead-lettered at `at`.
    pub fn with_died_at(mut self, at: Option<i64>) -> Self {
        self.died_at = at;
        self
    }

    /// This delivery, a dead letter for `reason`.
    pub fn with_dead_reason(mut self, reason: Option<String>) -> Self {
        self.dead_reason = reason;
        self
    }

    /// This delivery, its message handed to this process at `received`.
    pub fn with_received(mut self, received: Instant) -> Self {
        self.received = received;
        self
    }

    /// This delivery, carrying `trace`.
    pub fn with_trace(mut self, trace: Option<TraceContext>) -> Self {
        self.trace = trace;
        self
    }

    /// The job was handled (settled, retried elsewhere, or not ours to run).
    pub async fn ack(self) -> Result<(), BrokerError> {
        self.acker.ack().await
    }

    /// Give the message back to the queue for another worker (shutdown). A
    /// message of several ids goes back whole once each of them is settled.
    pub async fn requeue(self) -> Result<(), BrokerError> {
        self.acker.requeue().await
    }

    /// The message cannot be processed (not a job id): dead-letter it.
    pub async fn reject(self) -> Result<(), BrokerError> {
        self.acker.reject().await
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("job_id", &self.job_id)
            .field("redelivered", &self.redelivered)
            .field("trace", &self.trace)
            .field("dead_reason", &self.dead_reason)
            .finish()
    }
}

/// Settles one delivery with the broker.
#[async_trait]
pub trait Acker: Send + Sync {
    /// Acknowledges the delivery: the message is done with.
    async fn ack(self: Box<Self>) -> Result<(), BrokerError>;
    /// Gives the message back to the queue, marked redelivered.
    async fn requeue(self: Box<Self>) -> Result<(), BrokerError>;
    /// The message cannot be processed: it is dead-lettered.
    async fn reject(self: Box<Self>) -> Result<(), BrokerError>;
}

/// A stream of deliveries from one pool.
#[async_trait]
pub trait Consumer: Send {
    /// The next delivery; `None` once the consumer is closed.
    async fn next(&mut self) -> Option<Delivery>;
    /// Holds at most `prefetch` unacknowledged messages from now on, or
    /// the prefetch it was opened with where that is more: more are
    /// delivered at once when it grows; when it shrinks, those delivered
    /// already stay in hand, and it never holds more than before (a
    /// broker may go on delivering while those are settled, within its
    /// earlier prefetch). Kept across reconnects.
    fn set_prefetch(&mut self, prefetch: u16);
}

/// Moves job ids to the workers of a pool.
#[async_trait]
pub trait Broker: Send + Sync + 'static {
    /// Checks that the broker answers (readiness).
    async fn ping(&self) -> Result<(), BrokerError>;
    /// Publishes `job_id` to `pool`, its message carrying `trace` (which
    /// its [`Delivery::trace`] gives back; a message that carries several
    /// ids, as RabbitMQ's do under load, carries none, and the worker takes
    /// the trace stored with the job); returns once the broker has it
    /// (confirmed).
    async fn publish_traced(
        &self,
        pool: &str,
        job_id: &str,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError>;
    /// As [`Broker::publish_traced`], after `delay`, without holding a worker.
    async fn publish_delayed_traced(
        &self,
        pool: &str,
        job_id: &str,
        delay: Duration,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError>;
    /// [`Broker::publish_traced`] when `delay` is zero, else
    /// [`Broker::publish_delayed_traced`]: what a caller with a job due now
    /// or later (a scheduled job, a sweep's look ahead) publishes through.
    async fn publish_after_traced(
        &self,
        pool: &str,
        job_id: &str,
        delay: Duration,
        trace: Option<&TraceContext>,
    ) -> Result<(), BrokerError> {
        if delay.is_zero() {
            self.publish_traced(pool, job_id, trace).await
        } else {
            self.publish_delayed_traced(pool, job_id, delay, trace)
                .await
        }
    }
    /// [`Broker::publish_traced`] of a message with no trace context.
    async fn publish(&self, pool: &str, job_id: &str) -> Result<(), BrokerError> {
        self.publish_traced(pool, job_id, None).await
    }
    /// [`Broker::publish_delayed_traced`] of a message with no trace context.
    async fn publish_delayed(
        &self,
        pool: &str,
        job_id: &str,
        delay: Duration,
    ) -> Result<(), BrokerError> {
        self.publish_delayed_traced(pool, job_id, delay, None).await
    }
    /// Consumes `pool` with at most `prefetch` unacknowledged messages. A
    /// broker that puts several job ids in one message under load (RabbitMQ)
    /// hands each out as a delivery of its own, so a consumer may then hold
    /// more deliveries than that.
    async fn consume(&self, pool: &str, prefetch: u16) -> Result<Box<dyn Consumer>, BrokerError>;
    /// Messages waiting in `pool` (ready, not delivered), for metrics; a
    /// message may carry several job ids.
    async fn depth(&self, pool: &str) -> Result<u64, BrokerError>;
    /// Consumes the dead letters of `pool`: the messages a worker rejected
    /// and those the broker gave up delivering, oldest first, each id a
    /// delivery of its own with its [`Delivery::dead_reason`]. An ack takes
    /// one away for good; a requeue keeps it for the next look; a reject
    /// drops it. Several consumers share them, each taking its own.
    async fn consume_dead(&self, pool: &str) -> Result<Box<dyn Consumer>, BrokerError>;
}

/// What an event is about: a job or a ticket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A job (a call of a job or agent tool).
    #[default]
    Job,
    /// A ticket (a question for a person).
    Ticket,
    /// A run (a conversation the runtime keeps).
    Run,
}

impl EventKind {
    /// Its name on the wire: `job` or `ticket`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Job => "job",
            EventKind::Ticket => "ticket",
            EventKind::Run => "run",
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a ticket is: waiting for its answer, or answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TicketState {
    /// Waiting for its answer.
    Open,
    /// Answered; its first answer stands.
    Answered,
}

/// What a run's event announces: a step of its loop, or where it now
/// stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunNotice {
    /// Its transcript grew; it still runs.
    Step,
    /// It parked on jobs and tickets.
    Waiting,
    /// A wait of a run its caller drives held: it runs again.
    Resumed,
    /// The model answered.
    Answered,
    /// It stopped on an error.
    Failed,
    /// It stopped on its budget.
    BudgetExceeded,
    /// It was cancelled.
    Cancelled,
}

impl RunNotice {
    /// Its name after `run.` in a webhook's `event` and an event stream.
    pub fn name(self) -> &'static str {
        match self {
            RunNotice::Step => "step",
            RunNotice::Waiting => "waiting",
            RunNotice::Resumed => "resumed",
            RunNotice::Answered => "answered",
            RunNotice::Failed => "failed",
            RunNotice::BudgetExceeded => "budget_exceeded",
            RunNotice::Cancelled => "cancelled",
        }
    }
}

/// The state an event announces: a job's state as the contract shows it,
/// or a ticket's, or a run's (written `run_` and its name). Written on the wire (and at the end of the events
/// exchange's routing keys) by its name alone: the names of the two kinds
/// never meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventState {
    /// A job's state ([`JobState::shown`]: never `parked`).
    Job(JobState),
    /// A ticket's state.
    Ticket(TicketState),
    /// A run's step or state.
    Run(RunNotice),
}

impl Default for EventState {
    fn default() -> Self {
        EventState::Job(JobState::Queued)
    }
}

impl EventState {
    /// Every state an event can carry: the job states the contract shows,
    /// then `open` and `answered`.
    pub const ALL: [EventState; 16] = [
        EventState::Job(JobState::Queued),
        EventState::Job(JobState::Scheduled),
        EventState::Job(JobState::Running),
        EventState::Job(JobState::Retrying),
        EventState::Job(JobState::Succeeded),
        EventState::Job(JobState::Failed),
        EventState::Job(JobState::Cancelled),
        EventState::Ticket(TicketState::Open),
        EventState::Ticket(TicketState::Answered),
        EventState::Run(RunNotice::Step),
        EventState::Run(RunNotice::Waiting),
        EventState::Run(RunNotice::Resumed),
        EventState::Run(RunNotice::Answered),
        EventState::Run(RunNotice::Failed),
        EventState::Run(RunNotice::BudgetExceeded),
        EventState::Run(RunNotice::Cancelled),
    ];

    /// Its name: a job state's, `open` or `answered`, or `run_` and a
    /// run's ([`RunNotice::name`]).
    pub fn as_str(self) -> &'static str {
        match self {
            EventState::Job(state) => state.as_str(),
            EventState::Ticket(TicketState::Open) => "open",
            EventState::Ticket(TicketState::Answered) => "answered",
            EventState::Run(RunNotice::Step) => "run_step",
            EventState::Run(RunNotice::Waiting) => "run_waiting",
            EventState::Run(RunNotice::Resumed) => "run_resumed",
            EventState::Run(RunNotice::Answered) => "run_answered",
            EventState::Run(RunNotice::Failed) => "run_failed",
            EventState::Run(RunNotice::BudgetExceeded) => "run_budget_exceeded",
            EventState::Run(RunNotice::Cancelled) => "run_cancelled",
        }
    }

    /// The state of the name `text`, one of [`EventState::ALL`].
    pub fn parse(text: &str) -> Option<EventState> {
        EventState::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// True for a settled job's state and an answered ticket's: an
    /// outcome, which nothing follows.
    pub fn is_outcome(self) -> bool {
        match self {
            EventState::Job(state) => state.is_settled(),
            EventState::Ticket(state) => state == TicketState::Answered,
            EventState::Run(notice) => notice != RunNotice::Step,
        }
    }
}

impl std::fmt::Display for EventState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EventState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventState {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        EventState::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("`{text}` is not the state of a job or a ticket"))
        })
    }
}

/// What is announced when a job or ticket changes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// A job or a ticket.
    pub kind: EventKind,
    /// The job's or ticket's id.
    pub id: String,
    /// The tenant it belongs to.
    pub tenant: String,
    /// The user of the tenant who made the job or ticket: its owner, who
    /// (with the tenant's operators) may hear of it.
    #[serde(default)]
    pub user: String,
    /// A scope whose holders in the tenant may hear of it too: for a ticket,
    /// the scope its answerers hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// The tool called.
    pub tool: String,
    /// For jobs, the job state; for tickets, `open` or `answered`.
    pub state: EventState,
    /// The agent run of the call that made it.
    pub run_id: String,
    /// The envelope `get_job` would answer now (or the ticket): shared by
    /// every copy of the event, as each subscriber of a process gets its
    /// own copy and most read only the fields above.
    pub body: Arc<Value>,
    /// The call named a `callback_url`, so a webhook may be due: only then
    /// does a dispatcher look the callback up in the store.
    #[serde(default)]
    pub callback: bool,
    /// Of a job: how often it was put back by a retry when the event was
    /// made (`requeues`), so the notice of each life of the job is its own.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub life: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Event {
    /// The event of a job: who it belongs to (tenant and user), its state,
    /// and the envelope `get_job` answers now.
    pub fn job(
        id: &str,
        (tenant, user): (&str, &str),
        tool: &str,
        state: JobState,
        run_id: &str,
        envelope: &toolfleet_core::Envelope,
    ) -> Event {
        Event {
            kind: EventKind::Job,
            id: id.to_owned(),
            tenant: tenant.to_owned(),
            user: user.to_owned(),
            audience: None,
            tool: tool.to_owned(),
            // As the contract shows it: a parked job is `retrying`.
            state: EventState::Job(state.shown()),
            run_id: run_id.to_owned(),
            body: Arc::new(serde_json::to_value(envelope).unwrap_or_default()),
            callback: false,
            life: 0,
        }
    }

    /// The routing key of the events exchange: `<tenant>.<tool>.<state>`.
    pub fn routing_key(&self) -> String {
        Event::key(&self.tenant, &self.tool, self.state)
    }

    /// The routing key of an event of `tool` of `tenant` in `state`. Made
    /// for every event a job may announce (to ask whether anyone hears
    /// it): joined, as the formatting machinery costs several times more.
    pub fn key(tenant: &str, tool: &str, state: EventState) -> String {
        [tenant, ".", tool, ".", state.as_str()].concat()
    }

    /// True for a job that can no longer change.
    pub fn is_settled_job(&self) -> bool {
        matches!(self.state, EventState::Job(state) if state.is_settled())
    }
}

/// A subscription to events.
#[async_trait]
pub trait Subscription: Send {
    /// The next event; `None` once closed. A subscriber too slow to keep up
    /// skips events rather than holding the publisher back.
    async fn next(&mut self) -> Option<Event>;
}

/// Fans events out to every subscriber, across processes where the
/// implementation spans them.
#[async_trait]
pub trait Notices: Send + Sync + 'static {
    /// Publishes `event` to every subscriber.
    async fn publish(&self, event: &Event) -> Result<(), BrokerError>;
    /// Publishes `events` together, in order. An implementation may carry
    /// several in one message (see [`batches`]); each job's events still
    /// arrive in the order given, while events of different jobs may arrive
    /// interleaved otherwise.
    async fn publish_all(&self, events: &[Event]) -> Result<(), BrokerError> {
        for event in events {
            self.publish(event).await?;
        }
        Ok(())
    }
    /// Every event published from now on.
    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError>;
    /// At least every event of a settled job and of an answered ticket
    /// ([`SETTLED_STATES`]) published from now on: what a subscriber that
    /// waits only for outcomes needs. An implementation may deliver only
    /// those (see [`split::Split`]), so the subscriber still filters; by
    /// default it delivers everything, as [`Notices::subscribe`].
    async fn subscribe_settled(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        self.subscribe().await
    }
    /// Whether an event of routing key `key` ([`Event::key`]) may reach
    /// someone: false only where the notices know nobody listens for it,
    /// and then would not send it, so that it need not be made. True by
    /// default.
    fn hears(&self, key: &str) -> bool {
        let _ = key;
        true
    }
}

/// The states of a settled job, of an answered ticket and of a run's
/// notices (what a run's callback hears), as events carry them and routing
/// keys on the events exchange end.
pub const SETTLED_STATES: [EventState; 10] = [
    EventState::Job(JobState::Succeeded),
    EventState::Job(JobState::Failed),
    EventState::Job(JobState::Cancelled),
    EventState::Ticket(TicketState::Answered),
    EventState::Run(RunNotice::Waiting),
    EventState::Run(RunNotice::Resumed),
    EventState::Run(RunNotice::Answered),
    EventState::Run(RunNotice::Failed),
    EventState::Run(RunNotice::BudgetExceeded),
    EventState::Run(RunNotice::Cancelled),
];

/// Whether an event of routing key `key` ([`Event::key`]: its state last)
/// is an outcome, one of [`SETTLED_STATES`].
pub fn settled_key(key: &str) -> bool {
    let state = key.rsplit('.').next().unwrap_or(key);
    SETTLED_STATES.iter().any(|s| s.as_str() == state)
}

/// Splits `events` into groups that share a routing key, so that each group
/// can travel as one message, without reordering any job's own events: the
/// n-th event of a job in the list goes into the n-th round, rounds come in
/// order, and within a round the groups come in the order their keys first
/// appear. Under load, when many jobs of one tool change state together, a
/// few messages carry hundreds of events.
pub fn batches(events: &[Event]) -> Vec<(String, Vec<&Event>)> {
    use std::collections::HashMap;
    let mut seen: HashMap<(EventKind, &str), usize> = HashMap::new();
    // (round, key) -> index into `groups`.
    let mut placed: HashMap<(usize, String), usize> = HashMap::new();
    let mut groups: Vec<(usize, String, Vec<&Event>)> = Vec::new();
    for event in events {
        let count = seen.entry((event.kind, event.id.as_str())).or_insert(0);
        let round = *count;
        *count += 1;
        let key = event.routing_key();
        match placed.get(&(round, key.clone())) {
            Some(&at) => groups[at].2.push(event),
            None => {
                placed.insert((round, key.clone()), groups.len());
                groups.push((round, key, vec![event]));
            }
        }
    }
    // Stable: within a round, first appearance order stays.
    groups.sort_by_key(|(round, _, _)| *round);
    groups
        .into_iter()
        .map(|(_, key, events)| (key, events))
        .collect()
}

#[cfg(test)]
mod batch_tests {
    use super::*;

    fn event(id: &str, tool: &str, state: &str) -> Event {
        Event {
            kind: crate::EventKind::Job,
            id: id.into(),
            tenant: "t".into(),
            tool: tool.into(),
            state: EventState::parse(state).expect("a state"),
            run_id: "r".into(),
            body: Default::default(),
            callback: false,
            life: 0,
            ..Default::default()
        }
    }

    fn flat(groups: &[(String, Vec<&Event>)]) -> Vec<(String, String)> {
        groups
            .iter()
            .flat_map(|(_, events)| {
                events
                    .iter()
                    .map(|e| (e.id.clone(), e.state.as_str().to_owned()))
            })
            .collect()
    }

    #[test]
    fn events_sharing_a_key_travel_together() {
        let events: Vec<Event> = (0..5)
            .map(|n| event(&format!("j{n}"), "ocr", "succeeded"))
            .collect();
        let groups = batches(&events);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].0, "t.ocr.succeeded");
        assert_eq!(groups[0].1.len(), 5);
    }

    #[test]
    fn a_jobs_own_events_keep_their_order() {
        let events = vec![
            event("a", "ocr", "running"),
            event("b", "ocr", "running"),
            event("a", "ocr", "retrying"),
            event("a", "ocr", "running"),
            event("b", "ocr", "succeeded"),
            event("a", "ocr", "succeeded"),
        ];
        let order = flat(&batches(&events));
        assert_eq!(order.len(), events.len());
        for id in ["a", "b"] {
            let mine: Vec<&str> = order
                .iter()
                .filter(|(i, _)| i == id)
                .map(|(_, s)| s.as_str())
                .collect();
            let given: Vec<&str> = events
                .iter()
                .filter(|e| e.id == id)
                .map(|e| e.state.as_str())
                .collect();
            assert_eq!(mine, given, "job {id}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every job state the contract shows can be announced, heard and
    /// filtered on, by its own name.
    #[test]
    fn every_shown_job_state_is_an_event_state() {
        for state in JobState::SHOWN {
            let event = EventState::Job(state);
            assert!(EventState::ALL.contains(&event), "{state}");
            assert_eq!(EventState::parse(state.as_str()), Some(event));
        }
        assert_eq!(EventState::parse("parked"), None);
    }

    /// A routing key is the tenant, the tool and the state's name, joined
    /// by dots, and an outcome's key is known as one.
    #[test]
    fn a_routing_key_names_tenant_tool_and_state() {
        for state in EventState::ALL {
            let key = Event::key("acme", "receipt_ocr", state);
            assert_eq!(key, format!("acme.receipt_ocr.{state}"));
            assert_eq!(settled_key(&key), SETTLED_STATES.contains(&state));
        }
    }
}
