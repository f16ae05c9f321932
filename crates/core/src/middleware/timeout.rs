//! `timeout`: bounds an inline call in time. Every inline call has one; a
//! tool may declare its own, otherwise the runtime's default applies.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{Call, Layer, Next, Stage};
use crate::envelope::{Envelope, ErrorCode, ToolError};

pub struct Timeout {
    limit: Duration,
}

impl Timeout {
    pub fn new(limit: Duration) -> Self {
        Timeout { limit }
    }
}

impl Layer for Timeout {
    fn stage(&self) -> Stage {
        Stage::Timeout
    }

    fn call<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> BoxFuture<'a, Envelope> {
        let name = call.tool.name();
        Box::pin(async move {
            match tokio::time::timeout(self.limit, next.run(call)).await {
                Ok(envelope) => envelope,
                Err(_) => Envelope::error(ToolError::new(
                    ErrorCode::Timeout,
                    format!(
                        "`{name}` did not answer within {} ms; try again later, or ask for less (a smaller page, a narrower filter)",
                        self.limit.as_millis()
                    ),
                )),
            }
        })
    }
}
