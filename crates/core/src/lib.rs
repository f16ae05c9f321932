//! toolfleet's neutral tool layer.
//!
//! A tool is declared once ([`ToolDecl`]: name, description, JSON Schema, one
//! of six [`Shape`]s, hints and middleware), registered in a [`Runtime`]
//! that checks it against its shape, and called through one entry point,
//! [`Runtime::invoke`], which validates, runs the declared middleware in a
//! fixed order and then the shape's contract, and answers an [`Envelope`].
//! [`adapters`] serve the same registry to every model provider and to MCP.
//!
//! This crate owns the contract of a call and must never do I/O of its own:
//! stores, brokers and networks sit behind the traits it defines
//! ([`AuditSink`], [`Fleet`], [`CommitLog`], [`HandleStore`]).
//!
//! ```
//! use std::sync::Arc;
//! use serde_json::json;
//! use toolfleet_core::{CallCtx, Principal, Runtime, ToolDecl, ToolError};
//!
//! # tokio_test();
//! # fn tokio_test() {
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
//! # rt.block_on(async {
//! let mut runtime = Runtime::builder().build();
//! runtime
//!     .register(
//!         ToolDecl::query("greet")
//!             .description("Greet someone by name.")
//!             .input_schema(json!({
//!                 "type": "object",
//!                 "properties": {"name": {"type": "string", "maxLength": 40}},
//!                 "required": ["name"]
//!             }))
//!             .audit()
//!             .run(|_ctx, args: serde_json::Value| async move {
//!                 Ok::<_, ToolError>(json!({"greeting": format!("hello {}", args["name"].as_str().unwrap_or(""))}))
//!             }),
//!     )
//!     .unwrap();
//! let ctx = CallCtx::new(Arc::new(Principal::new("acme", "alice", ["greet"])));
//! let answer = runtime.invoke("greet", json!({"name": "Ada"}), &ctx).await;
//! assert_eq!(answer.result().unwrap().to_value()["greeting"], "hello Ada");
//! # });
//! # }
//! ```

pub mod adapters;
pub mod config;
pub mod envelope;
pub mod forward;
pub mod group;
pub mod lifecycle;
pub mod metrics;
pub mod middleware;
pub mod registry;
mod runtime;
pub mod shapes;
pub mod tool;
pub mod trace;

pub use envelope::{Envelope, ErrorCode, Json, ToolError};
pub use lifecycle::{JobState, Transition};
pub use metrics::Metrics;
pub use middleware::{AuditRecord, AuditSink, MemoryAuditSink, RateLimit};
pub use registry::{RegistrationError, Registry, Tool};
pub use runtime::{Runtime, RuntimeBuilder, RuntimeConfig};
pub use shapes::command::{CommitLog, MemoryCommitLog};
pub use shapes::fleet::{
    Approval, ApprovalRequest, Fleet, JobRequest, MemoryFleet, TicketRequest, approval_question,
    approval_ticket_id,
};
pub use shapes::handle::{
    HANDLE_URI_PREFIX, HandleMeta, HandleStore, Kept, MemoryHandleStore, handle_uri, is_handle_id,
    new_handle_id, read_page,
};
pub use tool::{
    AnsweredBy, Budget, CLIENT_INPUT, CallCtx, CallEvent, CallEvents, Concurrency, CountedBy,
    DEFAULT_POOL, Executor, FLEET_OPERATE, FLEET_READ, Hints, Lineage, LogLevel, MAX_ASKING_ROUNDS,
    MAX_CONCURRENCY, MiddlewareSpec, PRIORITIES, Principal, ResolvedHints, Shape, StartRate,
    ToolDecl, client_requests, executor_fn, executor_value, is_job_id, iso8601, new_id, now_ms,
    priority_of,
};
pub use trace::TraceContext;
