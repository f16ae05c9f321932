//! `require_scope`: refuses a caller that lacks any declared scope.

use futures_util::future::BoxFuture;

use super::{Call, Layer, Next, Stage};
use crate::envelope::{Envelope, ErrorCode, ToolError};

/// The scope layer: a caller lacking any of the scopes answers `forbidden`.
pub struct RequireScopes {
    scopes: Vec<String>,
}

impl RequireScopes {
    /// A layer requiring every one of `scopes`.
    pub fn new(scopes: Vec<String>) -> Self {
        RequireScopes { scopes }
    }
}

impl Layer for RequireScopes {
    fn stage(&self) -> Stage {
        Stage::Authorise
    }

    fn call<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> BoxFuture<'a, Envelope> {
        let principal = &call.ctx.principal;
        let missing: Vec<&str> = self
            .scopes
            .iter()
            .filter(|s| !principal.has_scope(s))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            return next.run(call);
        }
        let message = format!(
            "`{}` needs scope {}, which this caller does not have; ask the user to grant it, or use another tool",
            call.tool.name(),
            missing
                .iter()
                .map(|s| format!("`{s}`"))
                .collect::<Vec<_>>()
                .join(" and ")
        );
        Box::pin(async move { Envelope::error(ToolError::new(ErrorCode::Forbidden, message)) })
    }
}
