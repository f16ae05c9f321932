//! Announcing only what someone listens for. Events go to the events
//! exchange `mandatory`: RabbitMQ returns one that no subscriber's binding
//! takes, and its routing key is then [`Unheard`] for a while, so the
//! events of that key are not sent at all (a job's `queued` and `running`
//! cost nothing while nobody follows every event). A subscription, as soon
//! as its queue is bound, publishes a [`LISTENING_KEY`] notice that every
//! process's subscriptions hear: each forgets what it marked unheard, so a
//! new listener misses at most what is published while its notice travels.
//! It must never keep a key unheard past [`UNHEARD_FOR`], nor let the
//! return of a publish made before a notice mark a key after it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::lock;

/// The routing key of a subscription's notice that it listens. Not an
/// event's (`<tenant>.<tool>.<state>` ends in a state).
pub const LISTENING_KEY: &str = "toolfleet.listening";

/// How long a key stays unheard without a notice, by default: the most a
/// listener whose notice was lost (its process reconnecting) misses.
pub const UNHEARD_FOR: Duration = Duration::from_secs(1);

/// The most keys held unheard; past it, no more are marked.
const MAX_UNHEARD: usize = 4_096;

/// Routing keys nobody listened for when last published, until when.
#[derive(Debug)]
pub(super) struct Unheard {
    inner: Mutex<Keys>,
    /// How long a key stays unheard.
    hold: Duration,
    /// What this connection's notices carry, so that it does not forget
    /// again on hearing its own.
    pub(super) me: String,
}

#[derive(Debug, Default)]
struct Keys {
    until: HashMap<String, Instant>,
    /// Counts the notices heard: a return is marked only if none came
    /// since its publish began.
    epoch: u64,
}

impl Unheard {
    /// Keys held back for `hold` each.
    pub(super) fn new(hold: Duration) -> Self {
        Unheard {
            inner: Mutex::default(),
            hold,
            me: toolfleet_core::new_id(),
        }
    }

    /// Whether events of `key` are to be sent: nobody was found missing
    /// for it lately.
    pub(super) fn is_heard(&self, key: &str) -> bool {
        let mut keys = lock(&self.inner);
        match keys.until.get(key) {
            Some(until) if *until > Instant::now() => false,
            Some(_) => {
                keys.until.remove(key);
                true
            }
            None => true,
        }
    }

    /// The epoch a publish begins in, to give [`Unheard::mark`].
    pub(super) fn epoch(&self) -> u64 {
        lock(&self.inner).epoch
    }

    /// RabbitMQ returned a message of `key` published in `epoch`: nobody
    /// listens, unless a notice came since.
    pub(super) fn mark(&self, key: &str, epoch: u64) {
        let mut keys = lock(&self.inner);
        if keys.epoch != epoch {
            return;
        }
        let now = Instant::now();
        if keys.until.len() >= MAX_UNHEARD {
            keys.until.retain(|_, until| *until > now);
            if keys.until.len() >= MAX_UNHEARD {
                return;
            }
        }
        keys.until.insert(key.to_owned(), now + self.hold);
    }

    /// A subscription listens now (this connection's, or the one whose
    /// notice is `from`): every key is heard again.
    pub(super) fn heard_from(&self, from: &[u8]) {
        if from != self.me.as_bytes() {
            self.forget();
        }
    }

    /// A subscription of this connection listens now: every key is heard
    /// again.
    pub(super) fn forget(&self) {
        let mut keys = lock(&self.inner);
        keys.until.clear();
        keys.epoch = keys.epoch.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_key_is_unheard_until_a_notice() {
        let unheard = Unheard::new(UNHEARD_FOR);
        assert!(unheard.is_heard("t.x.queued"));
        unheard.mark("t.x.queued", unheard.epoch());
        assert!(!unheard.is_heard("t.x.queued"));
        assert!(unheard.is_heard("t.x.running"), "only the returned key");
        unheard.heard_from(unheard.me.as_bytes());
        assert!(!unheard.is_heard("t.x.queued"), "its own notice is no news");
        unheard.heard_from(b"another");
        assert!(unheard.is_heard("t.x.queued"));
    }

    #[test]
    fn a_return_of_a_publish_begun_before_a_notice_marks_nothing() {
        let unheard = Unheard::new(UNHEARD_FOR);
        let begun = unheard.epoch();
        unheard.forget();
        unheard.mark("t.x.queued", begun);
        assert!(unheard.is_heard("t.x.queued"));
    }

    #[test]
    fn a_key_is_heard_again_once_its_time_is_up() {
        let unheard = Unheard::new(UNHEARD_FOR);
        lock(&unheard.inner).until.insert(
            "t.x.queued".into(),
            Instant::now() - Duration::from_millis(1),
        );
        assert!(unheard.is_heard("t.x.queued"));
        assert!(lock(&unheard.inner).until.is_empty(), "an expired key goes");
    }

    #[test]
    fn past_the_bound_no_key_is_marked() {
        let unheard = Unheard::new(UNHEARD_FOR);
        for n in 0..MAX_UNHEARD + 10 {
            unheard.mark(&format!("t.{n}.queued"), unheard.epoch());
        }
        assert_eq!(lock(&unheard.inner).until.len(), MAX_UNHEARD);
        assert!(unheard.is_heard(&format!("t.{}.queued", MAX_UNHEARD + 5)));
    }
}
