//! The registry: every tool, checked once when it is registered.
//!
//! Registration refuses a declaration that contradicts its shape, with a
//! message that names the tool and the rule. What it accepts is compiled
//! once (the argument validator, the middleware stack) and never again.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::envelope::{ErrorCode, ToolError};
use crate::middleware::{self, Layer, LayerServices};
use crate::tool::{
    CountedBy, Executor, MAX_CONCURRENCY, MiddlewareSpec, PRIORITIES, ResolvedHints, Shape,
    ToolDecl,
};

/// The longest tool name; names are `A-Z a-z 0-9 _ . -`.
pub const MAX_NAME_LEN: usize = 128;
/// At most this many schema violations are listed in one answer.
const MAX_VIOLATIONS: usize = 10;

/// A declaration that registration refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationError {
    /// The tool refused.
    pub tool: String,
    /// The rule it broke, in a word (`unique_name`).
    pub rule: &'static str,
    /// Why, and what to change.
    pub message: String,
}

impl RegistrationError {
    fn new(tool: &str, rule: &'static str, message: impl Into<String>) -> Self {
        RegistrationError {
            tool: tool.to_owned(),
            rule,
            message: message.into(),
        }
    }
}

impl fmt::Display for RegistrationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tool `{}` refused ({}): {}",
            self.tool, self.rule, self.message
        )
    }
}

impl std::error::Error for RegistrationError {}

/// A registered tool: its declaration, resolved hints, compiled validator and stack.
pub struct Tool {
    decl: ToolDecl,
    hints: ResolvedHints,
    validator: jsonschema::Validator,
    stack: Vec<Arc<dyn Layer>>,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.decl.name)
            .field("shape", &self.decl.shape)
            .field("hints", &self.hints)
            .finish_non_exhaustive()
    }
}

impl Tool {
    /// The name clients call the tool by.
    pub fn name(&self) -> &str {
        &self.decl.name
    }
    /// The human-readable title, if declared.
    pub fn title(&self) -> Option<&str> {
        self.decl.title.as_deref()
    }
    /// What the tool does, for the model.
    pub fn description(&self) -> &str {
        &self.decl.description
    }
    /// The tool's shape.
    pub fn shape(&self) -> Shape {
        self.decl.shape
    }
    /// The input schema as served to models (for commands, with `confirm_token` added).
    pub fn input_schema(&self) -> &Value {
        &self.decl.input_schema
    }
    /// The JSON Schema of the result, if declared.
    pub fn output_schema(&self) -> Option<&Value> {
        self.decl.output_schema.as_ref()
    }
    /// The hints after the shape's defaults.
    pub fn hints(&self) -> ResolvedHints {
        self.hints
    }
    /// The middleware the tool declares.
    pub fn middleware(&self) -> &MiddlewareSpec {
        &self.decl.middleware
    }
    /// Scopes a caller needs to call this tool.
    pub fn required_scopes(&self) -> &[String] {
        &self.decl.middleware.scopes
    }
    /// The executor that runs the tool; human tools have none.
    pub fn executor(&self) -> Option<&Arc<dyn Executor>> {
        self.decl.executor.as_ref()
    }
    /// The declaration as registered.
    pub fn declaration(&self) -> &ToolDecl {
        &self.decl
    }
    pub(crate) fn stack(&self) -> &[Arc<dyn Layer>] {
        &self.stack
    }
    /// The stages of the composed stack, outermost first.
    pub fn stages(&self) -> Vec<middleware::Stage> {
        self.stack.iter().map(|layer| layer.stage()).collect()
    }

    /// Checks arguments against the compiled schema; the error lists every
    /// violation (up to a bound) with its JSON path and rule.
    pub fn validate(&self, args: &Value) -> Result<(), ToolError> {
        if self.validator.is_valid(args) {
            return Ok(());
        }
        let mut violations = Vec::new();
        let mut total = 0usize;
        for error in self.validator.iter_errors(args) {
            total += 1;
            if violations.len() < MAX_VIOLATIONS {
                let path = error.instance_path().to_string();
                violations.push(json!({
                    "path": if path.is_empty() { "/".to_owned() } else { path },
                    "rule": error.kind().keyword(),
                    "message": truncate(&error.to_string(), 200),
                }));
            }
        }
        let mut message = format!("arguments of `{}` do not match its schema: ", self.name());
        for (i, v) in violations.iter().enumerate() {
            if i > 0 {
                message.push_str("; ");
            }
            message.push_str(&format!(
                "at {} ({}): {}",
                v["path"].as_str().unwrap_or("/"),
                v["rule"].as_str().unwrap_or(""),
                v["message"].as_str().unwrap_or("")
            ));
        }
        if total > violations.len() {
            message.push_str(&format!("; and {} more", total - violations.len()));
        }
        message.push_str(". Fix these fields and call again.");
        Err(ToolError::invalid_arguments(message).with_details(json!({ "violations": violations })))
    }
}

/// Cuts `text` to at most `max` characters, marking the cut.
pub fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}…", &text[..at]),
    }
}

/// Every registered tool, in registration order.
#[derive(Default)]
pub struct Registry {
    by_name: HashMap<String, Arc<Tool>>,
    order: Vec<Arc<Tool>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.order.iter().map(|t| t.name()))
            .finish()
    }
}

impl Registry {
    /// The tool registered as `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Tool>> {
        self.by_name.get(name)
    }

    /// The tools in registration order.
    pub fn tools(&self) -> impl Iterator<Item = &Arc<Tool>> {
        self.order.iter()
    }

    /// How many tools are registered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The `unknown_tool` error for `name`, suggesting the closest names. A
    /// name longer than any tool's may be ([`MAX_NAME_LEN`]) is refused
    /// before any suggestion is computed: comparing it costs its length
    /// times each name's.
    pub fn unknown(&self, name: &str) -> ToolError {
        if name.len() > MAX_NAME_LEN {
            return ToolError::new(
                ErrorCode::UnknownTool,
                format!(
                    "there is no tool named `{}…`: a tool name is at most {MAX_NAME_LEN} characters; list the tools and pick one of them",
                    truncate(name, 64)
                ),
            )
            .with_details(json!({ "suggestions": [] }));
        }
        let mut scored: Vec<(f64, &str)> = self
            .order
            .iter()
            .map(|t| {
                let candidate = t.name();
                let mut score =
                    strsim::normalized_levenshtein(&name.to_lowercase(), &candidate.to_lowercase());
                if candidate.contains(name) || name.contains(candidate) {
                    score += 0.5;
                }
                (score, candidate)
            })
            .filter(|(score, _)| *score >= 0.3)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        let suggestions: Vec<&str> = scored.iter().take(3).map(|(_, n)| *n).collect();
        let shown = truncate(name, 64);
        let message = if suggestions.is_empty() {
            format!("there is no tool named `{shown}`; list the tools and pick one of them")
        } else {
            format!(
                "there is no tool named `{shown}`; did you mean {}?",
                suggestions
                    .iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        ToolError::new(ErrorCode::UnknownTool, message)
            .with_details(json!({ "suggestions": suggestions }))
    }

    /// Checks and registers `decl`, compiling its validator and stack.
    pub(crate) fn register(
        &mut self,
        mut decl: ToolDecl,
        services: &LayerServices,
        default_timeout: Duration,
    ) -> Result<Arc<Tool>, RegistrationError> {
        check_name(&decl.name)?;
        let name = decl.name.clone();
        if self.by_name.contains_key(&name) {
            return Err(RegistrationError::new(
                &name,
                "unique_name",
                "a tool with this name is already registered",
            ));
        }
        let hints = decl.hints.resolve(decl.shape);
        check_hints(&name, decl.shape, hints, &decl.middleware)?;
        check_flow(&name, &decl)?;
        if decl.shape == Shape::Command {
            add_confirm_token(&name, &mut decl.input_schema)?;
        }
        let validator = compile(&name, &decl.input_schema, "input_schema")?;
        if let Some(output) = &decl.output_schema {
            compile(&name, output, "output_schema")?;
        }
        if decl.executor.is_none() && decl.shape != Shape::Human {
            return Err(RegistrationError::new(
                &name,
                "executor",
                format!("a {} tool needs an executor that does its work", decl.shape),
            ));
        }
        let stack = middleware::build_stack(&decl.middleware, default_timeout, services);
        let tool = Arc::new(Tool {
            decl,
            hints,
            validator,
            stack,
        });
        self.by_name.insert(name, tool.clone());
        self.order.push(tool.clone());
        Ok(tool)
    }
}

fn check_name(name: &str) -> Result<(), RegistrationError> {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if name.is_empty() || name.len() > MAX_NAME_LEN || !ok_chars {
        return Err(RegistrationError::new(
            &truncate(name, MAX_NAME_LEN),
            "name",
            format!("a tool name is 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 _ . -"),
        ));
    }
    Ok(())
}

/// A priority and a concurrency limit only for job and agent tools, the
/// priority within [`PRIORITIES`], the limit within [`MAX_CONCURRENCY`]
/// and its key's pointer into the arguments the schema declares.
fn check_flow(name: &str, decl: &ToolDecl) -> Result<(), RegistrationError> {
    let queued = matches!(decl.shape, Shape::Job | Shape::Agent);
    if let Some(concurrency) = &decl.concurrency {
        let refused = |why: String| Err(RegistrationError::new(name, "concurrency", why));
        if !queued {
            return refused(format!(
                "a {} tool runs when called; concurrency is for job and agent tools",
                decl.shape
            ));
        }
        if !(1..=MAX_CONCURRENCY).contains(&concurrency.limit) {
            return refused(format!(
                "concurrency.limit must be 1 to {MAX_CONCURRENCY}, not {}",
                concurrency.limit
            ));
        }
        if let Some(why) = points_into_nothing(decl, &concurrency.key) {
            return refused(format!("concurrency.key {why}"));
        }
    }
    if let Some(start) = &decl.start_rate {
        let refused = |why: String| Err(RegistrationError::new(name, "start_rate", why));
        if !queued {
            return refused(format!(
                "a {} tool runs when called; start_rate is for job and agent tools (a rate limit \
                 is middleware.rate_limit)",
                decl.shape
            ));
        }
        if start.limit.max == 0 || start.limit.per.is_zero() {
            return refused("start_rate needs max and per_s above 0".to_owned());
        }
        if let Some(why) = points_into_nothing(decl, &start.by) {
            return refused(format!("start_rate.key {why}"));
        }
    }
    if decl.middleware.rate_limit.is_some()
        && let Some(why) = points_into_nothing(decl, &decl.middleware.rate_limit_by)
    {
        return Err(RegistrationError::new(
            name,
            "rate_limit",
            format!("rate_limit.key {why}"),
        ));
    }
    let Some(priority) = decl.priority else {
        return Ok(());
    };
    if !queued {
        return Err(RegistrationError::new(
            name,
            "priority",
            format!(
                "a {} tool runs when called; priority is for job and agent tools",
                decl.shape
            ),
        ));
    }
    if !PRIORITIES.contains(&priority) {
        return Err(RegistrationError::new(
            name,
            "priority",
            format!(
                "priority {priority} is outside {} to {}",
                PRIORITIES.start(),
                PRIORITIES.end()
            ),
        ));
    }
    Ok(())
}

/// Why the pointer of `by` points into nothing the input schema of `decl`
/// declares (its first step names no property), if it does.
fn points_into_nothing(decl: &ToolDecl, by: &CountedBy) -> Option<String> {
    let CountedBy::Pointer(pointer) = by else {
        return None;
    };
    let properties = decl.input_schema.get("properties")?.as_object()?;
    let first = pointer
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default()
        .replace("~1", "/")
        .replace("~0", "~");
    (!properties.contains_key(&first)).then(|| {
        format!("`{pointer}` points into nothing: the input schema has no property `{first}`")
    })
}

fn check_hints(
    name: &str,
    shape: Shape,
    hints: ResolvedHints,
    middleware: &MiddlewareSpec,
) -> Result<(), RegistrationError> {
    match shape {
        Shape::Query | Shape::Handle if !hints.read_only => {
            return Err(RegistrationError::new(
                name,
                "shape_hints",
                format!(
                    "a {shape} tool only reads, so it cannot be declared read_only = false; make it a command or a job"
                ),
            ));
        }
        Shape::Query | Shape::Handle if hints.destructive => {
            return Err(RegistrationError::new(
                name,
                "shape_hints",
                format!("a {shape} tool only reads, so it cannot be declared destructive"),
            ));
        }
        Shape::Command if hints.read_only => {
            return Err(RegistrationError::new(
                name,
                "shape_hints",
                "a command changes something, so it cannot be declared read_only; make it a query",
            ));
        }
        Shape::Human if !hints.open_world => {
            return Err(RegistrationError::new(
                name,
                "shape_hints",
                "a human tool reaches a person outside the system, so it cannot be declared open_world = false",
            ));
        }
        _ => {}
    }
    if middleware.cache_ttl.is_some() && !hints.read_only {
        return Err(RegistrationError::new(
            name,
            "cache_read_only",
            "cache_reads may only wrap a read-only tool: caching a tool with side effects would skip them",
        ));
    }
    Ok(())
}

fn compile(
    name: &str,
    schema: &Value,
    which: &str,
) -> Result<jsonschema::Validator, RegistrationError> {
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(RegistrationError::new(
            name,
            "schema_root",
            format!("{which} must have `type: \"object\"` at its root"),
        ));
    }
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .map_err(|e| {
            RegistrationError::new(
                name,
                "schema_compiles",
                format!(
                    "{which} does not compile: {}",
                    truncate(&e.to_string(), 300)
                ),
            )
        })
}

/// A command's schema must require a boolean `dry_run`; the runtime adds the
/// `confirm_token` property its commits carry.
fn add_confirm_token(name: &str, schema: &mut Value) -> Result<(), RegistrationError> {
    let refuse = |msg: &str| RegistrationError::new(name, "command_dry_run", msg);
    let dry_run_is_bool = schema
        .pointer("/properties/dry_run/type")
        .and_then(Value::as_str)
        == Some("boolean");
    let required = schema
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(|r| r.iter().any(|v| v == "dry_run"));
    if !dry_run_is_bool || !required {
        return Err(refuse(
            "a command's input schema must have a boolean property `dry_run` listed in `required`, so a model cannot skip the dry run by leaving it out",
        ));
    }
    let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return Err(refuse("a command's input schema must have `properties`"));
    };
    match properties.get("confirm_token") {
        None => {
            let mut token = Map::new();
            token.insert("type".into(), json!("string"));
            token.insert("maxLength".into(), json!(512));
            token.insert(
                "description".into(),
                json!("The confirm_token from the dry run; required when dry_run is false."),
            );
            properties.insert("confirm_token".into(), Value::Object(token));
            Ok(())
        }
        Some(existing) if existing.get("type").and_then(Value::as_str) == Some("string") => Ok(()),
        Some(_) => Err(RegistrationError::new(
            name,
            "command_confirm_token",
            "`confirm_token` is reserved for the runtime's confirm token and must be a string",
        )),
    }
}
