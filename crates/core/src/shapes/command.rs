//! The two-step command, run by the runtime for every command tool.
//!
//! A dry run answers the tool's plan and a confirm token: an HMAC-SHA256,
//! under the runtime's secret, of tenant, user, tool, the digest of the exact
//! arguments and an expiry. The commit must carry it; the token is also the
//! commit's idempotency key, so a repeated commit answers the first outcome
//! without running the tool again.
//!
//! A commit runs its tool at most once per token, however it is interrupted:
//!
//! - It claims the token in the [`CommitLog`] for the tool's time limit plus
//!   [`OUTCOME_MARGIN`], then runs the tool in a task of its own, which the
//!   call only awaits: a caller that goes away (a dropped HTTP request)
//!   leaves the commit running to its end and its outcome recorded.
//! - The task bounds the tool by its time limit and records a timeout as the
//!   commit's outcome, like any other answer. Only an answer proving that
//!   the tool did nothing releases the claim so the token may run it again:
//!   `rate_limited` (the tool refused the call before acting). Every other
//!   error, retryable or not, may follow a partial effect, so it is
//!   recorded, marked not retryable, and says to make a new dry run.
//! - A commit of a token whose first commit still runs waits a moment
//!   ([`COMMIT_WAIT`]) for its outcome, then answers `conflict` with
//!   `retry_after_s`; once the first settles, the same token answers its
//!   outcome.
//! - A claim still pending past its lease was left by a process that stopped
//!   mid-commit: its outcome is unknown, and the token answers so (a
//!   `tool_failed` error with `details.outcome = "unknown"`) and never runs
//!   the tool again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::envelope::{Envelope, ErrorCode, Json, ToolError};
use crate::middleware::canonical_json;

const TOKEN_PREFIX: &str = "ct1";

/// Issues and checks confirm tokens.
#[derive(Clone)]
pub struct ConfirmSigner {
    key: [u8; 32],
    ttl: Duration,
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What a token is bound to.
pub struct Binding<'a> {
    /// The caller's tenant.
    pub tenant: &'a str,
    /// The calling user.
    pub user: &'a str,
    /// The command tool called.
    pub tool: &'a str,
    /// The call's arguments; `dry_run` and `confirm_token` are left out of the digest.
    pub args: &'a Value,
}

impl Binding<'_> {
    fn digest(&self) -> String {
        let mut args = self.args.clone();
        if let Some(map) = args.as_object_mut() {
            map.remove("dry_run");
            map.remove("confirm_token");
        }
        let mut h = Sha256::new();
        for part in [self.tenant, self.user, self.tool] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        h.update(canonical_json(&args).as_bytes());
        hex::encode(h.finalize())
    }
}

impl ConfirmSigner {
    /// A signer whose tokens are signed with `key` and valid for `ttl`.
    pub fn new(key: [u8; 32], ttl: Duration) -> Self {
        ConfirmSigner { key, ttl }
    }

    /// How long a confirm token stays valid.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn mac(&self, digest: &str, exp: u64, nonce: &str) -> String {
        // HMAC takes keys of any length.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key).expect("any key length");
        mac.update(format!("{TOKEN_PREFIX}.{exp}.{nonce}.{digest}").as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// A token for `binding`, valid until `now + ttl`.
    pub fn issue(&self, binding: &Binding<'_>, now: u64) -> (String, u64) {
        let exp = now + self.ttl.as_secs();
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let mac = self.mac(&binding.digest(), exp, &nonce);
        (format!("{TOKEN_PREFIX}.{exp}.{nonce}.{mac}"), exp)
    }

    /// Checks `token` against the call; the error says what to do.
    pub fn verify(&self, token: &str, binding: &Binding<'_>, now: u64) -> Result<u64, ToolError> {
        let invalid = |why: &str| {
            ToolError::new(
                ErrorCode::InvalidConfirmToken,
                format!(
                    "confirm_token {why}; call `{}` again with dry_run=true and these exact arguments, then commit with the new confirm_token",
                    binding.tool
                ),
            )
        };
        let mut parts = token.split('.');
        let (Some(TOKEN_PREFIX), Some(exp), Some(nonce), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(invalid("is not a token this runtime issued"));
        };
        let Ok(exp) = exp.parse::<u64>() else {
            return Err(invalid("is not a token this runtime issued"));
        };
        let expected = self.mac(&binding.digest(), exp, nonce);
        if !constant_time_eq(expected.as_bytes(), mac.as_bytes()) {
            return Err(invalid(
                "was issued for other arguments, another user or another tool",
            ));
        }
        if exp <= now {
            return Err(invalid("has expired"));
        }
        Ok(exp)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The key under which a commit's outcome is recorded.
pub fn commit_key(tenant: &str, token: &str) -> String {
    let mut h = Sha256::new();
    h.update((tenant.len() as u64).to_be_bytes());
    h.update(tenant.as_bytes());
    h.update(token.as_bytes());
    hex::encode(h.finalize())
}

/// How long the claim of a commit outlives the tool's time limit: the time
/// its task has to record the outcome. A claim still pending past both was
/// abandoned by a process that stopped mid-commit.
pub const OUTCOME_MARGIN: Duration = Duration::from_secs(30);

/// How long a commit waits for another commit of the same token to settle
/// before it answers `conflict`.
pub const COMMIT_WAIT: Duration = Duration::from_secs(1);

/// The `retry_after_s` of a commit answered `conflict` because another
/// commit of the same token still runs.
pub const COMMIT_RETRY_AFTER_S: u64 = 1;

/// Whether a command call with `args` is a commit (not a dry run).
pub fn is_commit(args: &Value) -> bool {
    args.get("dry_run") != Some(&Value::Bool(true))
}

/// What [`CommitLog::claim`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// Nobody has committed this token: run the tool, then settle.
    Run,
    /// Committed before: answer this.
    Settled(Envelope),
    /// Another commit of this token is running and did not finish in time.
    Busy,
    /// A commit of this token claimed it and never recorded an outcome
    /// within its lease (its process stopped mid-commit): whether the tool
    /// took effect is unknown, and it never runs again for this token.
    Abandoned,
}

/// How a commit claims its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimTerms {
    /// How long the claim holds: the tool's time limit and
    /// [`OUTCOME_MARGIN`]. Past it, a claim with no outcome is
    /// [`Claim::Abandoned`].
    pub lease: Duration,
    /// Until when (Unix seconds) the record of the token is kept, the claim
    /// included: past it, the token has expired and is never presented.
    pub keep_until_unix: u64,
}

/// Records the outcome of each commit, so a token commits at most once.
pub trait CommitLog: Send + Sync + 'static {
    /// Claims `key` on `terms`; waits a short while ([`COMMIT_WAIT`]) for
    /// a running commit of the same key, then answers [`Claim::Busy`]. A
    /// claim left pending past its lease is never taken over: it is
    /// [`Claim::Abandoned`].
    fn claim<'a>(
        &'a self,
        key: &'a str,
        terms: ClaimTerms,
    ) -> BoxFuture<'a, Result<Claim, ToolError>>;
    /// Records the final outcome, or with `None` releases the claim so the
    /// commit may be tried again (after an answer proving the tool did
    /// nothing). A recorded outcome is never replaced.
    fn settle<'a>(
        &'a self,
        key: &'a str,
        outcome: Option<&'a Envelope>,
        keep_until_unix: u64,
    ) -> BoxFuture<'a, Result<(), ToolError>>;
}

enum Entry {
    Pending {
        until: Instant,
        keep_until: u64,
        done: Arc<Notify>,
    },
    Settled {
        envelope: Envelope,
        keep_until: u64,
    },
}

impl Entry {
    fn keep_until(&self) -> u64 {
        match self {
            Entry::Pending { keep_until, .. } | Entry::Settled { keep_until, .. } => *keep_until,
        }
    }
}

/// A commit log in memory, bounded: entries are dropped once their token
/// has expired.
pub struct MemoryCommitLog {
    entries: Mutex<HashMap<String, Entry>>,
    wait: Duration,
}

impl MemoryCommitLog {
    /// `wait` bounds how long a claim waits for a running commit of the same token.
    pub fn new(wait: Duration) -> Self {
        MemoryCommitLog {
            entries: Mutex::new(HashMap::new()),
            wait,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for MemoryCommitLog {
    fn default() -> Self {
        MemoryCommitLog::new(COMMIT_WAIT)
    }
}

impl CommitLog for MemoryCommitLog {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        terms: ClaimTerms,
    ) -> BoxFuture<'a, Result<Claim, ToolError>> {
        Box::pin(async move {
            let give_up = Instant::now() + self.wait;
            loop {
                let notified = {
                    let mut entries = self.lock();
                    let (now, unix) = (Instant::now(), unix_now());
                    if entries.len() > 10_000 {
                        entries.retain(|_, e| e.keep_until() > unix);
                    }
                    match entries.get(key) {
                        Some(entry) if entry.keep_until() > unix => match entry {
                            Entry::Settled { envelope, .. } => {
                                return Ok(Claim::Settled(envelope.clone()));
                            }
                            Entry::Pending { until, .. } if *until <= now => {
                                return Ok(Claim::Abandoned);
                            }
                            Entry::Pending { .. } if now >= give_up => return Ok(Claim::Busy),
                            // Registered before the lock is released, so a
                            // settle cannot slip by.
                            Entry::Pending { done, .. } => done.clone().notified_owned(),
                        },
                        // Absent, or kept past its time (its token expired).
                        _ => {
                            // Kept at least as long as the claim holds.
                            let held = unix.saturating_add(terms.lease.as_secs() + 1);
                            let pending = Entry::Pending {
                                until: now + terms.lease,
                                keep_until: terms.keep_until_unix.max(held),
                                done: Arc::new(Notify::new()),
                            };
                            entries.insert(key.to_owned(), pending);
                            return Ok(Claim::Run);
                        }
                    }
                };
                let _ = tokio::time::timeout(
                    give_up.saturating_duration_since(Instant::now()),
                    notified,
                )
                .await;
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
            let mut entries = self.lock();
            if let Some(Entry::Settled { .. }) = entries.get(key) {
                return Ok(());
            }
            let previous = match outcome {
                Some(envelope) => entries.insert(
                    key.to_owned(),
                    Entry::Settled {
                        envelope: envelope.clone(),
                        keep_until: keep_until_unix,
                    },
                ),
                None => entries.remove(key),
            };
            if let Some(Entry::Pending { done, .. }) = previous {
                done.notify_waiters();
            }
            Ok(())
        })
    }
}

/// Tries at recording a commit's outcome, each bounded by [`RECORD_TRY`]
/// and a second longer apart than the last: all of them fit in
/// [`OUTCOME_MARGIN`].
const RECORD_TRIES: u32 = 3;
const RECORD_TRY: Duration = Duration::from_secs(5);

/// A claimed commit: what its task needs to run the tool to its end and
/// record the outcome, owned, so that the task outlives the call that
/// started it.
pub(crate) struct Commit {
    pub key: String,
    pub tool: String,
    /// The tool's time limit.
    pub limit: Duration,
    pub call_id: String,
    /// Until when (Unix seconds) the outcome is kept.
    pub keep_until_unix: u64,
    pub log: Arc<dyn CommitLog>,
}

impl Commit {
    /// Runs `executor` (the tool's executor, already called) within the
    /// time limit, records what it came to (see [`Commit::outcome`]) and
    /// answers it. An outcome that cannot be recorded is still answered:
    /// the token then reads as busy and, after its lease, abandoned.
    pub(crate) async fn run(
        self,
        executor: BoxFuture<'static, Result<Json, ToolError>>,
    ) -> Envelope {
        let answer = match tokio::time::timeout(self.limit, executor).await {
            Ok(Ok(result)) => Envelope::ok(result, self.call_id.clone()),
            Ok(Err(error)) => Envelope::error(error),
            Err(_) => Envelope::error(self.timed_out()),
        };
        let (answer, recorded) = self.outcome(answer);
        self.record(recorded.then_some(&answer)).await;
        answer
    }

    /// What a commit answers, and whether that is recorded as the token's
    /// outcome (`false`: the claim is released and the token may run the
    /// tool again). Only `rate_limited` proves that the tool did nothing.
    /// Any other error may follow a partial effect: it is recorded, and a
    /// retryable one is marked not retryable (the same token will answer
    /// it again) and says how to try again.
    fn outcome(&self, answer: Envelope) -> (Envelope, bool) {
        match answer {
            Envelope::Error { error, .. } if error.code == ErrorCode::RateLimited => {
                (Envelope::error(error), false)
            }
            Envelope::Error { mut error, state } if error.retryable => {
                error.retryable = false;
                error.message = format!(
                    "{}; this outcome is recorded for this confirm_token: to try again, call `{}` with dry_run=true for a new confirm_token",
                    error.message, self.tool
                );
                (Envelope::Error { error, state }, true)
            }
            other => (other, true),
        }
    }

    fn timed_out(&self) -> ToolError {
        ToolError::new(
            ErrorCode::Timeout,
            format!(
                "`{tool}` did not finish its commit within {ms} ms and was stopped; whether it took effect is unknown, and it will not run again with this confirm_token: check whether it took effect, and if not, call `{tool}` with dry_run=true for a new confirm_token",
                tool = self.tool,
                ms = self.limit.as_millis()
            ),
        )
        .retryable(false)
        .with_details(serde_json::json!({"outcome": "unknown"}))
    }

    /// Records `outcome` (or releases the claim, with `None`), trying a few
    /// times.
    async fn record(&self, outcome: Option<&Envelope>) {
        for n in 0..RECORD_TRIES {
            if n > 0 {
                tokio::time::sleep(Duration::from_secs(u64::from(n))).await;
            }
            let settle = self.log.settle(&self.key, outcome, self.keep_until_unix);
            if let Ok(Ok(())) = tokio::time::timeout(RECORD_TRY, settle).await {
                return;
            }
        }
    }
}

/// The answer to a commit whose token another commit still runs.
pub(crate) fn in_flight(tool: &str) -> ToolError {
    ToolError::new(
        ErrorCode::Conflict,
        format!(
            "a commit of `{tool}` with this confirm_token is still running; call again with the same confirm_token in {COMMIT_RETRY_AFTER_S} s to get its outcome"
        ),
    )
    .retryable(true)
    .with_retry_after(COMMIT_RETRY_AFTER_S)
}

/// The answer to a commit whose token was claimed by a commit that never
/// recorded its outcome.
pub(crate) fn abandoned(tool: &str) -> ToolError {
    ToolError::failed(
        format!(
            "a commit of `{tool}` with this confirm_token was interrupted before its outcome was recorded (the process running it stopped); whether it took effect is unknown, and it will not run again with this confirm_token: check whether it took effect, and if not, call `{tool}` with dry_run=true for a new confirm_token"
        ),
        false,
    )
    .with_details(serde_json::json!({"outcome": "unknown"}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn binding<'a>(user: &'a str, args: &'a Value) -> Binding<'a> {
        Binding {
            tenant: "acme",
            user,
            tool: "submit_report",
            args,
        }
    }

    /// The in-memory log keeps the store's rules: a running claim makes
    /// others wait and then answers busy, a release lets the token run
    /// again, a recorded outcome is never replaced, a claim past its lease
    /// is abandoned, and a record past its keep_until is forgotten.
    #[tokio::test]
    async fn the_memory_log_claims_waits_settles_and_abandons() {
        let log = MemoryCommitLog::new(Duration::from_millis(20));
        let unix = unix_now();
        let held = ClaimTerms {
            lease: Duration::from_secs(60),
            keep_until_unix: unix + 600,
        };
        assert_eq!(log.claim("k", held).await, Ok(Claim::Run));
        assert_eq!(log.claim("k", held).await, Ok(Claim::Busy));
        log.settle("k", None, unix + 600).await.expect("released");
        assert_eq!(log.claim("k", held).await, Ok(Claim::Run));
        let first = Envelope::error(ToolError::new(ErrorCode::Timeout, "first"));
        let late = Envelope::error(ToolError::new(ErrorCode::Timeout, "late"));
        log.settle("k", Some(&first), unix + 600)
            .await
            .expect("settled");
        log.settle("k", Some(&late), unix + 600)
            .await
            .expect("ignored");
        log.settle("k", None, unix + 600).await.expect("ignored");
        assert_eq!(log.claim("k", held).await, Ok(Claim::Settled(first)));

        let brief = ClaimTerms {
            lease: Duration::from_millis(1),
            keep_until_unix: unix + 600,
        };
        assert_eq!(log.claim("gone", brief).await, Ok(Claim::Run));
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(log.claim("gone", held).await, Ok(Claim::Abandoned));

        let expired = Envelope::error(ToolError::new(ErrorCode::Timeout, "old"));
        log.settle("old", Some(&expired), unix - 1)
            .await
            .expect("settled");
        assert_eq!(log.claim("old", held).await, Ok(Claim::Run));
    }

    #[test]
    fn tokens_bind_user_arguments_and_expiry() {
        let signer = ConfirmSigner::new([7; 32], Duration::from_secs(60));
        let args = json!({"line_ids": ["a"], "dry_run": true});
        let (token, exp) = signer.issue(&binding("alice", &args), 1000);
        assert_eq!(exp, 1060);
        let commit = json!({"line_ids": ["a"], "dry_run": false, "confirm_token": token});
        assert!(
            signer
                .verify(&token, &binding("alice", &commit), 1001)
                .is_ok()
        );
        let other = json!({"line_ids": ["b"], "dry_run": false});
        let e = signer
            .verify(&token, &binding("alice", &other), 1001)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfirmToken);
        assert!(
            signer
                .verify(&token, &binding("bob", &commit), 1001)
                .is_err()
        );
        let e = signer
            .verify(&token, &binding("alice", &commit), 1060)
            .unwrap_err();
        assert!(e.message.contains("expired"), "{}", e.message);
        let other_key = ConfirmSigner::new([8; 32], Duration::from_secs(60));
        assert!(
            other_key
                .verify(&token, &binding("alice", &commit), 1001)
                .is_err()
        );
        for garbage in ["", "ct1", "ct1.x.y.z", "ct1.1.2.3.4", "💥.1.2.3"] {
            assert!(
                signer
                    .verify(garbage, &binding("alice", &commit), 1001)
                    .is_err()
            );
        }
    }
}
