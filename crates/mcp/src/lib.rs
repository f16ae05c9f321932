//! toolfleet over the Model Context Protocol: the one registry as MCP
//! `tools/list` and `tools/call`, over Streamable HTTP ([`HttpEndpoint`],
//! mounted at `/mcp` by the server) and over stdio ([`serve_stdio`], for
//! `toolfleet mcp`).
//!
//! MCP adds no second path to a tool: a `tools/call` is read, invoked and
//! rendered by the same [`adapters`](toolfleet_core::adapters) as
//! `POST /v1/calls` with `format=mcp`, so validation, middleware, scopes and
//! the fleet behave exactly as there. Validation failures and tool errors are
//! results with `isError: true` and the envelope's message; a job answers its
//! `running` envelope (as `structuredContent` and as text) and `get_job`, a
//! registered tool, polls it; a human tool answers its `suspended` envelope
//! with the ticket.
//!
//! Authentication is not done here: the HTTP endpoint is handed the principal
//! its caller authenticated (the server checks the bearer token first), and
//! stdio runs as the one principal of its token. Each principal lists only the
//! tools its scopes allow and calls go through the runtime's scope check.
//!
//! # Why rmcp
//!
//! The protocol itself is the official Rust SDK, `rmcp`, pinned to one
//! version and kept behind this module: only this crate names its types. It
//! implements the three revisions we speak (2025-06-18 and 2025-11-25 with the
//! `initialize` handshake, 2026-07-28 with per-request `_meta` and
//! `server/discover`) and their negotiation, Streamable HTTP as a tower service
//! that mounts under our own axum routes and auth, and stdio. Its cost is
//! schemars (its `server` feature needs it) and a second sha2 0.11 and rand
//! 0.10 beside the workspace's; writing the 2026-07-28 lifecycle ourselves
//! would cost more and drift from the clients that follow the SDKs.

use std::borrow::Cow;
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ErrorCode, Implementation,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ResultType, ServerCapabilities,
    ServerConfig, Tool as McpTool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};
use toolfleet_core::adapters::{Format, ProviderCall, parse_call, render_result, tool_specs};
use toolfleet_core::{CallCtx, Envelope, Principal, Runtime, Tool};

/// The protocol revisions this server speaks, oldest first.
pub const PROTOCOL_VERSIONS: [&str; 3] = ["2025-06-18", "2025-11-25", "2026-07-28"];

const SUPPORTED: [ProtocolVersion; 3] = [
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

/// Tools per `tools/list` page unless configured.
pub const DEFAULT_PAGE_SIZE: usize = 50;
/// The largest page a configuration may ask for.
pub const MAX_PAGE_SIZE: usize = 500;
/// A cursor is a decimal offset: anything longer was not made here.
const MAX_CURSOR_LEN: usize = 20;

/// Told of every call answered, with the tool name (or `unknown`) and the
/// envelope: the server counts MCP calls in its metrics with it.
pub type CallHook = Arc<dyn Fn(&str, &Envelope) + Send + Sync>;

/// How the MCP server behaves.
#[derive(Clone)]
pub struct Options {
    /// Tools per `tools/list` page, 1 to [`MAX_PAGE_SIZE`].
    pub page_size: usize,
    /// Largest request body over HTTP, in bytes.
    pub max_body: usize,
    pub on_call: Option<CallHook>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            page_size: DEFAULT_PAGE_SIZE,
            max_body: 1024 * 1024,
            on_call: None,
        }
    }
}

/// The principal an HTTP request was authenticated as, put in the request's
/// extensions by whoever checked its credentials.
#[derive(Clone, Debug)]
pub struct Authenticated(pub Arc<Principal>);

/// The MCP server of one runtime: answers `tools/list` and `tools/call`.
#[derive(Clone)]
pub struct ToolServer {
    runtime: Arc<Runtime>,
    /// The principal of every request (stdio); `None`: each HTTP request's own.
    principal: Option<Arc<Principal>>,
    options: Options,
}

impl ToolServer {
    pub fn new(runtime: Arc<Runtime>, principal: Option<Arc<Principal>>, options: Options) -> Self {
        let page_size = options.page_size.clamp(1, MAX_PAGE_SIZE);
        ToolServer {
            runtime,
            principal,
            options: Options {
                page_size,
                ..options
            },
        }
    }

    fn principal(&self, context: &RequestContext<RoleServer>) -> Result<Arc<Principal>, ErrorData> {
        if let Some(principal) = &self.principal {
            return Ok(principal.clone());
        }
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Authenticated>())
            .map(|a| a.0.clone())
            .ok_or_else(|| {
                ErrorData::new(
                    ErrorCode::INVALID_REQUEST,
                    "unauthenticated: send `Authorization: Bearer <token>`",
                    None,
                )
            })
    }

    /// One page of the tools `principal` may call, from `cursor`.
    pub fn list(&self, principal: &Principal, cursor: Option<&str>) -> Result<Value, ErrorData> {
        let start = match cursor {
            None => 0,
            Some(cursor) => cursor
                .parse::<usize>()
                .ok()
                .filter(|_| cursor.len() <= MAX_CURSOR_LEN)
                .ok_or_else(|| {
                    ErrorData::invalid_params(
                        "the cursor is not one this server gave; list again without a cursor",
                        None,
                    )
                })?,
        };
        let visible: Vec<&Arc<Tool>> = self
            .runtime
            .registry()
            .tools()
            .filter(|t| t.required_scopes().iter().all(|s| principal.has_scope(s)))
            .collect();
        let end = start
            .saturating_add(self.options.page_size)
            .min(visible.len());
        let page = visible.get(start..end).unwrap_or_default();
        let mut out = Map::new();
        out.insert(
            "tools".into(),
            tool_specs(Format::Mcp, page.iter().copied()),
        );
        if end < visible.len() {
            out.insert("nextCursor".into(), json!(end.to_string()));
        }
        Ok(Value::Object(out))
    }

    /// Answers one `tools/call` (its `params`) as a `CallToolResult`: the
    /// same path as `POST /v1/calls`, rendered by the MCP adapter.
    pub async fn call(&self, principal: Arc<Principal>, params: &Value) -> Value {
        let raw = serde_json::to_vec(params).unwrap_or_default();
        let registry = self.runtime.registry();
        let (call, envelope) = match parse_call(Format::Mcp, registry, &raw) {
            Ok(call) => {
                let envelope = match &call.args {
                    Ok(args) => {
                        let ctx = CallCtx::new(principal);
                        self.runtime.invoke(&call.name, args.clone(), &ctx).await
                    }
                    Err(error) => Envelope::error(error.clone()),
                };
                (call, envelope)
            }
            Err(error) => {
                let call = ProviderCall {
                    id: None,
                    name: String::new(),
                    wire_name: String::new(),
                    tool: None,
                    args: Err(error.clone()),
                };
                (call, Envelope::error(error))
            }
        };
        if let Some(hook) = &self.options.on_call {
            let label = if call.tool.is_some() {
                call.name.as_str()
            } else {
                "unknown"
            };
            hook(label, &envelope);
        }
        render_result(Format::Mcp, &call, &envelope)
    }
}

fn internal(what: &str, error: impl std::fmt::Display) -> ErrorData {
    tracing::error!(%error, "mcp: {what}");
    ErrorData::internal_error(format!("{what} failed on the server"), None)
}

impl ServerHandler for ToolServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = Implementation::new("toolfleet", env!("CARGO_PKG_VERSION"));
        info.title = Some("toolfleet".into());
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(info)
            .with_instructions(
                "Every tool answers a JSON envelope whose `status` is ok, error, running or suspended. \
                 `running` carries a `job_id`: call `get_job` with it after `poll_after_s` seconds \
                 until the status is ok or error. `suspended` carries a `ticket` a person answers.",
            )
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(&SUPPORTED)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let principal = self.principal(&context)?;
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        let page = self.list(&principal, cursor)?;
        let tools: Vec<McpTool> = match page.get("tools") {
            Some(tools) => serde_json::from_value(tools.clone())
                .map_err(|e| internal("rendering the tool list", e))?,
            None => Vec::new(),
        };
        let mut result = ListToolsResult::with_all_items(tools)
            .with_ttl_ms(0)
            // Each principal sees its own list.
            .with_cache_scope(CacheScope::Private);
        result.next_cursor = page
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let principal = self.principal(&context)?;
        let params = json!({
            "name": request.name,
            "arguments": request.arguments.map(Value::Object),
        });
        let result = self.call(principal, &params).await;
        let mut result: CallToolResult =
            serde_json::from_value(result).map_err(|e| internal("rendering a tool result", e))?;
        // 2026-07-28 requires it; rmcp drops it for older peers.
        result.result_type = Some(ResultType::COMPLETE);
        Ok(CallToolResponse::Complete(result))
    }
}

/// `/mcp`: MCP over Streamable HTTP for requests whose caller is already
/// authenticated. Stateless: no session outlives a request, so any number of
/// dispatchers serve the same clients; answers are JSON, GET is 405.
#[derive(Clone)]
pub struct HttpEndpoint {
    service: StreamableHttpService<ToolServer, NeverSessionManager>,
}

impl HttpEndpoint {
    pub fn new(runtime: Arc<Runtime>, options: Options) -> Self {
        let max_body = options.max_body;
        let server = ToolServer::new(runtime, None, options);
        // Host and Origin are checked by the server before a request gets
        // here, against its own address and configured origins.
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_sse_keep_alive(None)
            .with_max_request_body_bytes(max_body)
            .disable_allowed_hosts()
            .disable_allowed_origins();
        let service = StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        );
        HttpEndpoint { service }
    }

    /// Answers one HTTP request to `/mcp` as `principal`.
    pub async fn handle(&self, mut request: Request<Body>, principal: Arc<Principal>) -> Response {
        use tower_service::Service;
        request.extensions_mut().insert(Authenticated(principal));
        let mut service = self.service.clone();
        match service.call(request).await {
            Ok(response) => response.into_response(),
            Err(never) => match never {},
        }
    }
}

/// MCP over stdin and stdout as `principal`, until the client closes stdin.
pub async fn serve_stdio(
    runtime: Arc<Runtime>,
    principal: Arc<Principal>,
    options: Options,
) -> Result<(), String> {
    let server = ToolServer::new(runtime, Some(principal), options);
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("MCP over stdio could not start: {e}"))?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| format!("MCP over stdio stopped: {e}"))
}

#[cfg(test)]
mod tests;
