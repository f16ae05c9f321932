//! Bounds on what a principal holds open in one process: event streams and
//! long polls. A hold is taken before the stream or the wait starts and
//! given back when it ends (its [`Held`] is dropped), so a client that
//! opens streams or waits in a loop meets the bound, never the process's
//! memory or the store's connections.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use toolfleet_core::{ErrorCode, Principal, ToolError};

/// Which bound a hold met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The principal holds as many as one principal may: `429`.
    Principal,
    /// The process holds as many as it may: `503`.
    Process,
}

impl Full {
    /// The error a caller reads, naming `what` is held (`event streams`).
    pub fn error(self, what: &str) -> ToolError {
        let (code, message) = match self {
            Full::Principal => (
                ErrorCode::RateLimited,
                format!(
                    "this caller holds as many {what} open as it may; close one, or wait and try again"
                ),
            ),
            Full::Process => (
                ErrorCode::Unavailable,
                format!("this server holds as many {what} open as it may; try again in a moment"),
            ),
        };
        ToolError::new(code, message)
            .retryable(true)
            .with_retry_after(1)
    }
}

/// Counts the holds of each principal and of the process, within bounds.
#[derive(Clone)]
pub struct Holds {
    counts: Arc<Mutex<Counts>>,
    per_principal: usize,
    total: usize,
}

#[derive(Default)]
struct Counts {
    /// (tenant, user) -> holds; a principal with none has no entry.
    by_principal: HashMap<(String, String), usize>,
    total: usize,
}

impl Holds {
    /// At most `per_principal` holds of one principal (tenant and user),
    /// and `total` in all.
    pub fn new(per_principal: usize, total: usize) -> Self {
        Holds {
            counts: Arc::new(Mutex::new(Counts::default())),
            per_principal,
            total,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        // A panic elsewhere while holding the lock leaves valid counts.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A hold of `principal`'s, or the bound it met.
    pub fn take(&self, principal: &Principal) -> Result<Held, Full> {
        let key = (principal.tenant.clone(), principal.user.clone());
        let mut counts = self.lock();
        if counts.total >= self.total {
            return Err(Full::Process);
        }
        let mine = counts.by_principal.get(&key).copied().unwrap_or(0);
        if mine >= self.per_principal {
            return Err(Full::Principal);
        }
        counts.by_principal.insert(key.clone(), mine + 1);
        counts.total += 1;
        Ok(Held {
            holds: self.clone(),
            key,
        })
    }

    /// Holds taken now, in all.
    pub fn taken(&self) -> usize {
        self.lock().total
    }
}

/// One hold, given back when dropped.
pub struct Held {
    holds: Holds,
    key: (String, String),
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut counts = self.holds.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(mine) = counts.by_principal.get_mut(&self.key) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                counts.by_principal.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_are_bounded_per_principal_and_in_all_and_given_back() {
        let holds = Holds::new(2, 3);
        let alice = Principal::new("acme", "alice", Vec::<String>::new());
        let bob = Principal::new("acme", "bob", Vec::<String>::new());
        let other_alice = Principal::new("globex", "alice", Vec::<String>::new());
        let a1 = holds.take(&alice).expect("first");
        let _a2 = holds.take(&alice).expect("second");
        assert_eq!(holds.take(&alice).err(), Some(Full::Principal));
        let _b1 = holds.take(&bob).expect("bob's own");
        assert_eq!(holds.take(&other_alice).err(), Some(Full::Process));
        drop(a1);
        assert_eq!(holds.taken(), 2);
        let _a3 = holds.take(&alice).expect("given back");
        assert_eq!(
            Full::Principal.error("streams").code,
            ErrorCode::RateLimited
        );
        assert_eq!(Full::Process.error("streams").retry_after_s, Some(1));
    }
}
