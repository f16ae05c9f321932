//! Outcomes on a feed of their own: [`Split`] hands
//! [`Notices::subscribe_settled`] to notices that hear only settled jobs
//! and answered tickets, and everything else to notices that hear every
//! event. On RabbitMQ the two are the same exchange seen through two
//! bindings, so a dispatcher whose subscribers all wait for outcomes
//! (webhooks, `get_job` long polls, event streams asking for outcomes)
//! has only those routed to it: each job's `queued` and `running` cost it
//! no delivery while no subscriber asks for every event (a [`Fanout`]
//! ends its shared subscription once nobody in the process listens).
//!
//! Publishing goes to the notices of every event; the settled ones must
//! hear what those publish (two views of one exchange), which is what makes
//! a split of two unrelated notices wrong.
//!
//! [`Fanout`]: crate::fanout::Fanout

use std::sync::Arc;

use async_trait::async_trait;

use crate::{BrokerError, Event, Notices, Subscription};

/// Every event from `all`, outcomes alone from `settled`.
pub struct Split {
    all: Arc<dyn Notices>,
    settled: Arc<dyn Notices>,
}

impl Split {
    /// `settled` must hear what `all` publishes, or at least its settled
    /// jobs and answered tickets (see [`crate::SETTLED_STATES`]).
    pub fn new(all: Arc<dyn Notices>, settled: Arc<dyn Notices>) -> Self {
        Split { all, settled }
    }
}

#[async_trait]
impl Notices for Split {
    async fn publish(&self, event: &Event) -> Result<(), BrokerError> {
        self.all.publish(event).await
    }

    async fn publish_all(&self, events: &[Event]) -> Result<(), BrokerError> {
        self.all.publish_all(events).await
    }

    fn hears(&self, key: &str) -> bool {
        self.all.hears(key)
    }

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        self.all.subscribe().await
    }

    async fn subscribe_settled(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        self.settled.subscribe().await
    }
}
