//! Who may see and touch a job or a ticket inside its tenant, and the audit
//! record of each answer and cancel.
//!
//! A job or ticket belongs to the principal whose call made it: its tenant
//! and user. Its owner reads, lists, streams and cancels it; so do the
//! tenant's operators, by scope: [`FLEET_READ`] reads, lists and streams
//! every job and ticket of the tenant, [`FLEET_OPERATE`] also cancels them
//! and answers tickets. A ticket is answered by whom its tool names
//! ([`AnsweredBy`]), who may also read it. Anyone else gets `not_found`,
//! exactly as for a missing id, so an id proves nothing. Reading a job's
//! result also needs the scopes its tool requires.
//!
//! The store keeps tenants apart; this module keeps users apart within a
//! tenant. It must never widen what the store answers: every rule here
//! only narrows it.
//!
//! [`FLEET_READ`]: toolfleet_core::FLEET_READ
//! [`FLEET_OPERATE`]: toolfleet_core::FLEET_OPERATE

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use toolfleet_broker::Event;
use toolfleet_core::{
    AnsweredBy, AuditRecord, AuditSink, Envelope, ErrorCode, Principal, Registry, ToolError,
};
use toolfleet_store::{JobRecord, TicketRecord};

use crate::bounds::{Held, Holds};

/// True when `principal` may read, list and stream `job`.
pub fn sees_job(principal: &Principal, job: &JobRecord) -> bool {
    job.tenant == principal.tenant && (job.user == principal.user || principal.reads_fleet())
}

/// True when `principal` may cancel `job`.
pub fn operates_job(principal: &Principal, job: &JobRecord) -> bool {
    job.tenant == principal.tenant && (job.user == principal.user || principal.operates_fleet())
}

/// True when `principal` may answer `ticket`: whom its tool names, and the
/// tenant's operators.
pub fn answers_ticket(principal: &Principal, ticket: &TicketRecord) -> bool {
    ticket.tenant == principal.tenant
        && (principal.operates_fleet()
            || match &ticket.answered_by {
                AnsweredBy::Caller => ticket.user == principal.user,
                AnsweredBy::Scope { scope } => principal.has_scope(scope),
            })
}

/// True when `principal` may read `ticket`: its owner, those who may answer
/// it, and the tenant's readers.
pub fn sees_ticket(principal: &Principal, ticket: &TicketRecord) -> bool {
    ticket.tenant == principal.tenant
        && (ticket.user == principal.user
            || principal.reads_fleet()
            || answers_ticket(principal, ticket))
}

/// True when `principal` may hear `event`: by the rules above, from what the
/// event carries (its tenant, owner and audience).
pub fn hears(principal: &Principal, event: &Event) -> bool {
    event.tenant == principal.tenant
        && (event.user == principal.user
            || principal.reads_fleet()
            || event
                .audience
                .as_deref()
                .is_some_and(|scope| principal.has_scope(scope)))
}

/// The user whose jobs `principal` lists: itself, or `None` (every user of
/// the tenant) for the tenant's readers.
pub fn listed_user(principal: &Principal) -> Option<String> {
    (!principal.reads_fleet()).then(|| principal.user.clone())
}

/// What the status API, the events and MCP need beside the store to keep
/// to the rules: the scopes each tool requires (to read a job's result) and
/// where answers and cancels are audited. Shared by every part of a
/// process; the scopes are learned once the tools are registered.
#[derive(Clone)]
pub struct Access {
    scopes: Arc<OnceLock<HashMap<String, Vec<String>>>>,
    audit: Arc<dyn AuditSink>,
    /// The long polls each principal holds now.
    long_polls: Holds,
}

impl Access {
    /// Audits to `audit`, lets each principal hold `long_polls` waits at
    /// once; learns the tools' scopes in [`Access::learn`].
    pub fn new(audit: Arc<dyn AuditSink>, long_polls: usize) -> Self {
        Access {
            scopes: Arc::new(OnceLock::new()),
            audit,
            long_polls: Holds::new(long_polls, usize::MAX),
        }
    }

    /// A long poll of `principal`'s, or the `rate_limited` error of one
    /// past its bound.
    pub fn long_poll(&self, principal: &Principal) -> Result<Held, ToolError> {
        self.long_polls
            .take(principal)
            .map_err(|full| full.error("long polls"))
    }

    /// Takes the scopes every registered tool requires. Until this is
    /// called no job's result can be read: the rules fail closed.
    pub fn learn(&self, registry: &Registry) {
        let scopes = registry
            .tools()
            .map(|tool| (tool.name().to_owned(), tool.required_scopes().to_vec()))
            .collect();
        let _ = self.scopes.set(scopes);
    }

    /// Why `principal` may not read the result of a job of `tool`: a scope
    /// the tool requires that it lacks. A tool no longer registered
    /// requires nothing more; before [`Access::learn`] every result is
    /// refused.
    pub fn result_refused(&self, principal: &Principal, tool: &str) -> Option<ToolError> {
        let Some(scopes) = self.scopes.get() else {
            return Some(ToolError::new(
                ErrorCode::Unavailable,
                "this server is still starting; read the job again in a moment",
            ));
        };
        let missing = scopes
            .get(tool)?
            .iter()
            .find(|scope| !principal.has_scope(scope))?;
        Some(ToolError::new(
            ErrorCode::Forbidden,
            format!(
                "reading the result of a `{tool}` job needs scope `{missing}`, which this caller lacks"
            ),
        ))
    }

    /// `envelope` as `principal` may read it: unchanged, or the refusal of
    /// [`Access::result_refused`] for a job of `tool`.
    pub fn screen(&self, principal: &Principal, tool: &str, envelope: Envelope) -> Envelope {
        match self.result_refused(principal, tool) {
            Some(refusal) => Envelope::error(refusal),
            None => envelope,
        }
    }

    /// Records that `principal` did `action` (`cancel_job`,
    /// `answer_ticket`) with `args`, and how it went, as a tool call's
    /// audit record.
    pub fn audit(&self, principal: &Principal, action: &str, args: Value, outcome: &Envelope) {
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.audit.record(AuditRecord {
            at_ms,
            tool: action.to_owned(),
            tenant: principal.tenant.clone(),
            user: principal.user.clone(),
            run_id: String::new(),
            call_id: toolfleet_core::new_id(),
            parent_run_id: None,
            args,
            status: outcome.status(),
            error_code: outcome.error_code(),
            duration_us: 0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolfleet_core::{FLEET_OPERATE, FLEET_READ, MemoryAuditSink};

    fn job(user: &str) -> JobRecord {
        let new = crate::testing::new_job(None, 1);
        let mut job = crate::testing::record_of(new);
        job.user = user.to_owned();
        job
    }

    fn ticket(user: &str, answered_by: AnsweredBy) -> TicketRecord {
        let mut ticket = crate::testing::ticket_record(crate::testing::new_ticket(None, 1));
        ticket.user = user.to_owned();
        ticket.answered_by = answered_by;
        ticket
    }

    fn who(user: &str, scopes: &[&str]) -> Principal {
        Principal::new(crate::testing::TENANT, user, scopes.iter().copied())
    }

    #[test]
    fn a_job_is_its_owners_and_the_operators() {
        let alices = job("alice");
        assert!(sees_job(&who("alice", &[]), &alices));
        assert!(operates_job(&who("alice", &[]), &alices));
        assert!(!sees_job(&who("bob", &["expenses:read"]), &alices));
        assert!(!operates_job(&who("bob", &[]), &alices));
        assert!(sees_job(&who("ops", &[FLEET_READ]), &alices));
        assert!(!operates_job(&who("ops", &[FLEET_READ]), &alices));
        assert!(sees_job(&who("ops", &[FLEET_OPERATE]), &alices));
        assert!(operates_job(&who("ops", &[FLEET_OPERATE]), &alices));
        let stranger = Principal::new("other-tenant", "alice", [FLEET_OPERATE]);
        assert!(!sees_job(&stranger, &alices));
        assert!(!operates_job(&stranger, &alices));
        assert_eq!(listed_user(&who("bob", &[])), Some("bob".to_owned()));
        assert_eq!(listed_user(&who("ops", &[FLEET_READ])), None);
    }

    #[test]
    fn a_ticket_is_answered_by_whom_its_tool_names() {
        let by_caller = ticket("alice", AnsweredBy::Caller);
        let approve = AnsweredBy::Scope {
            scope: "expenses:approve".to_owned(),
        };
        let by_scope = ticket("alice", approve);
        let alice = who("alice", &[]);
        let bob = who("bob", &[]);
        let approver = who("carol", &["expenses:approve"]);
        let reader = who("ops", &[FLEET_READ]);
        let operator = who("ops", &[FLEET_OPERATE]);
        assert!(answers_ticket(&alice, &by_caller) && sees_ticket(&alice, &by_caller));
        assert!(!answers_ticket(&bob, &by_caller) && !sees_ticket(&bob, &by_caller));
        assert!(!answers_ticket(&approver, &by_caller) && !sees_ticket(&approver, &by_caller));
        assert!(!answers_ticket(&reader, &by_caller) && sees_ticket(&reader, &by_caller));
        assert!(answers_ticket(&operator, &by_caller));
        // The caller of a ticket others approve reads it, and cannot answer.
        assert!(!answers_ticket(&alice, &by_scope) && sees_ticket(&alice, &by_scope));
        assert!(answers_ticket(&approver, &by_scope) && sees_ticket(&approver, &by_scope));
        assert!(!answers_ticket(&bob, &by_scope) && !sees_ticket(&bob, &by_scope));
        assert!(answers_ticket(&operator, &by_scope));
        let stranger = Principal::new("other-tenant", "carol", ["expenses:approve"]);
        assert!(!answers_ticket(&stranger, &by_scope) && !sees_ticket(&stranger, &by_scope));
    }

    #[test]
    fn events_reach_their_owner_audience_and_readers() {
        let mut event = toolfleet_fleet::ticket_event(&ticket(
            "alice",
            AnsweredBy::Scope {
                scope: "expenses:approve".to_owned(),
            },
        ));
        assert!(hears(&who("alice", &[]), &event));
        assert!(hears(&who("carol", &["expenses:approve"]), &event));
        assert!(hears(&who("ops", &[FLEET_READ]), &event));
        assert!(!hears(&who("bob", &["expenses:read"]), &event));
        event.tenant = "other-tenant".to_owned();
        assert!(!hears(&who("alice", &[FLEET_OPERATE]), &event));
        let job_event = toolfleet_fleet::job_event(&job("alice"), crate::status::POLL_AFTER_S);
        assert!(hears(&who("alice", &[]), &job_event));
        assert!(!hears(&who("bob", &[]), &job_event));
    }

    #[test]
    fn results_need_the_tools_scopes_and_fail_closed_until_learned() {
        let access = Access::new(Arc::new(MemoryAuditSink::default()), 4);
        let reader = who("ops", &[FLEET_READ]);
        let refused = access.result_refused(&reader, "find_expenses");
        assert_eq!(refused.map(|e| e.code), Some(ErrorCode::Unavailable));
        let mut runtime = toolfleet_core::Runtime::builder().build();
        runtime
            .register(
                toolfleet_core::ToolDecl::query("find_expenses")
                    .require_scope("expenses:read")
                    .run(|_ctx, _args: Value| async { Ok(serde_json::json!({})) }),
            )
            .expect("register");
        access.learn(runtime.registry());
        let refused = access.result_refused(&reader, "find_expenses");
        let refused = refused.expect("refused without the tool's scope");
        assert_eq!(refused.code, ErrorCode::Forbidden);
        assert!(
            refused.message.contains("expenses:read"),
            "{}",
            refused.message
        );
        let holder = who("ops", &[FLEET_READ, "expenses:read"]);
        assert_eq!(access.result_refused(&holder, "find_expenses"), None);
        assert_eq!(access.result_refused(&reader, "gone_tool"), None);
    }
}
