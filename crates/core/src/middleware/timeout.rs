//! `timeout`: bounds an inline call in time. Every inline call has one; a
//! tool may declare its own, otherwise the runtime's default applies.
//!
//! A command's commit is the exception: the runtime bounds its tool by the
//! same limit in a task of its own and records a timeout as the commit's
//! outcome (see [`crate::shapes::command`]), so that the answer and the
//! record agree; dropping the call here would leave the tool running
//! unrecorded.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::{Call, Layer, Next, Stage};
use crate::envelope::{Envelope, ErrorCode, ToolError};
use crate::shapes::command::is_commit;
use crate::tool::Shape;

/// The timeout layer: an inline call past its limit answers `timeout`.
pub struct Timeout {
    limit: Duration,
}

impl Timeout {
    /// A layer bounding each call by `limit`.
    pub fn new(limit: Duration) -> Self {
        Timeout { limit }
    }
}

impl Layer for Timeout {
    fn stage(&self) -> Stage {
        Stage::Timeout
    }

    fn call<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> BoxFuture<'a, Envelope> {
        if call.tool.shape() == Shape::Command && is_commit(&call.args) {
            return next.run(call);
        }
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
