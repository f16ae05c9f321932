//! The two-step command, run by the runtime for every command tool.
//!
//! A dry run answers the tool's plan and a confirm token: an HMAC-SHA256,
//! under the runtime's secret, of tenant, user, tool, the digest of the exact
//! arguments and an expiry. The commit must carry it; the token is also the
//! commit's idempotency key, so a repeated commit answers the first outcome
//! without running the tool again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::envelope::{Envelope, ErrorCode, ToolError};
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
    pub tenant: &'a str,
    pub user: &'a str,
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
    pub fn new(key: [u8; 32], ttl: Duration) -> Self {
        ConfirmSigner { key, ttl }
    }

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

/// What [`CommitLog::claim`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// Nobody has committed this token: run the tool, then settle.
    Run,
    /// Committed before: answer this.
    Settled(Envelope),
    /// Another commit of this token is running and did not finish in time.
    Busy,
}

/// Records the outcome of each commit, so a token commits at most once.
pub trait CommitLog: Send + Sync + 'static {
    /// Claims `key` for `lease`; waits a while for a running commit of the same key.
    fn claim<'a>(
        &'a self,
        key: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Claim, ToolError>>;
    /// Records the final outcome, or with `None` releases the claim so the
    /// commit may be tried again (after a retryable failure).
    fn settle<'a>(
        &'a self,
        key: &'a str,
        outcome: Option<&'a Envelope>,
        keep_until_unix: u64,
    ) -> BoxFuture<'a, Result<(), ToolError>>;
}

enum Entry {
    Pending { until: Instant, done: Arc<Notify> },
    Settled { envelope: Envelope, keep_until: u64 },
}

/// A commit log in memory, bounded: settled entries are dropped when their
/// token has expired.
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
        MemoryCommitLog::new(Duration::from_secs(30))
    }
}

impl CommitLog for MemoryCommitLog {
    fn claim<'a>(
        &'a self,
        key: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Claim, ToolError>> {
        Box::pin(async move {
            let give_up = Instant::now() + self.wait;
            loop {
                let notified = {
                    let mut entries = self.lock();
                    let now = Instant::now();
                    if entries.len() > 10_000 {
                        let unix = unix_now();
                        entries.retain(|_, e| match e {
                            Entry::Pending { until, .. } => *until > now,
                            Entry::Settled { keep_until, .. } => *keep_until > unix,
                        });
                    }
                    match entries.get(key) {
                        Some(Entry::Settled { envelope, .. }) => {
                            return Ok(Claim::Settled(envelope.clone()));
                        }
                        Some(Entry::Pending { until, done }) if *until > now => {
                            if now >= give_up {
                                return Ok(Claim::Busy);
                            }
                            // Registered before the lock is released, so a settle cannot slip by.
                            done.clone().notified_owned()
                        }
                        _ => {
                            entries.insert(
                                key.to_owned(),
                                Entry::Pending {
                                    until: now + lease,
                                    done: Arc::new(Notify::new()),
                                },
                            );
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
