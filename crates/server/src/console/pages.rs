//! The console's pages, rendered from the API's answers. maud escapes
//! every value it is given, so a question, an argument or a model's answer
//! shows as the text it is; nothing here marks a value as HTML.

use std::collections::BTreeMap;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};
use serde_json::Value;
use toolfleet_core::JobState;
use toolfleet_core::adapters::Format;

use super::{Session, segment};

/// How the action that led to a page went.
#[derive(Default)]
pub(crate) struct Flash {
    /// It worked: what was done.
    pub done: Option<String>,
    /// It did not: the API's message.
    pub error: Option<String>,
}

/// The job list's filter as the page shows it.
pub(crate) struct JobFilter {
    /// A state, or empty.
    pub state: String,
    /// A tool, or empty.
    pub tool: String,
    /// Made from this time (UTC, `YYYY-MM-DDTHH:MM`), or empty.
    pub from: String,
    /// Made before this time, or empty.
    pub to: String,
}

fn html_response(status: StatusCode, markup: Markup) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

/// A whole page: the header with the navigation and the signed-in
/// principal (and sign out), then `body`.
fn layout(title: &str, session: Option<&Session>, flash: &Flash, body: Markup) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · toolfleet" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/console.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to the content" }
                header {
                    a.brand href="/console" { "toolfleet" }
                    @if let Some(session) = session {
                        nav aria-label="Console" {
                            a href="/console/inbox" { "Inbox" }
                            a href="/console/runs" { "Runs" }
                            a href="/console/jobs" { "Jobs" }
                            a href="/console/queues" { "Queues" }
                            a href="/console/tools" { "Tools" }
                        }
                        form.signout method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(session.csrf);
                            span.who {
                                (session.principal.user) " · " (session.principal.tenant)
                            }
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main id="main" data-live=[session.map(|_| "1")] {
                    @if let Some(done) = &flash.done {
                        p.flash.done role="status" { (done) }
                    }
                    @if let Some(error) = &flash.error {
                        p.flash.error role="alert" { (error) }
                    }
                    (body)
                }
            }
        }
    };
    html_response(StatusCode::OK, markup)
}

/// A page saying why a request was refused.
pub(crate) fn refused(status: StatusCode, message: &str) -> Response {
    let mut page = layout(
        "Refused",
        None,
        &Flash::default(),
        html! {
            h1 { "Not done" }
            p { (message) }
            p { a href="/console" { "Back to the console" } }
        },
    );
    *page.status_mut() = status;
    page
}

/// The sign-in page.
pub(crate) fn login(error: Option<&str>) -> Response {
    let flash = Flash {
        done: None,
        error: error.map(str::to_owned),
    };
    layout(
        "Sign in",
        None,
        &flash,
        html! {
            h1 { "Sign in" }
            p { "Paste the bearer token you call toolfleet's API with. It is checked once; the console then keeps a session for eight hours." }
            form.stack method="post" action="/console/login" {
                label for="token" { "Token" }
                input id="token" name="token" type="password" autocomplete="current-password" required;
                button type="submit" { "Sign in" }
            }
        },
    )
}

/// A time in Unix milliseconds, in UTC; the script shows it in the
/// viewer's zone.
fn time(ms: &Value) -> Markup {
    match ms.as_i64() {
        Some(ms) => {
            let iso = toolfleet_core::iso8601(ms);
            html! { time datetime=(iso) { (iso) } }
        }
        None => html! { "—" },
    }
}

/// A JSON value, folded when it is long.
fn json_block(label: &str, value: &Value) -> Markup {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    let long = text.lines().count() > 12 || text.len() > 800;
    html! {
        @if long {
            details {
                summary { (label) " (" (text.lines().count()) " lines)" }
                pre { code { (text) } }
            }
        } @else {
            pre aria-label=(label) { code { (text) } }
        }
    }
}

/// The text of `value` when it is a string, else its JSON.
fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn csrf(session: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(session.csrf); }
}

fn api_error(answer: &Value) -> Option<Markup> {
    (answer["status"] == "error").then(|| {
        html! {
            p.flash.error role="alert" {
                (text(&answer["error"]["code"])) ": " (text(&answer["error"]["message"]))
            }
        }
    })
}

/// The front page: what waits for the person, and where to look.
pub(crate) fn front(session: &Session, tickets: &Value, failed: &Value, runs: &Value) -> Response {
    let open = tickets["result"]["tickets"].as_array().map_or(0, Vec::len);
    let failed_jobs = failed["jobs"].as_array().map_or(0, Vec::len);
    let more = if failed["next_cursor"].is_string() {
        "+"
    } else {
        ""
    };
    let running = runs["result"]["runs"].as_array().map_or(0, |r| {
        r.iter()
            .filter(|r| r["state"] == "running" || r["state"] == "waiting")
            .count()
    });
    layout(
        "Console",
        Some(session),
        &Flash::default(),
        html! {
            h1 { "Console" }
            ul.cards {
                li { a href="/console/inbox" { strong { (open) } " open tickets" } " waiting for an answer" }
                li { a href="/console/jobs?state=failed" { strong { (failed_jobs) (more) } " failed jobs" } ", dead letters among them" }
                li { a href="/console/runs" { strong { (running) } " runs" } " running or waiting" }
                li { a href="/console/tools" { "Tools" } " and their specs in every provider format" }
            }
        },
    )
}

/// The inbox: open tickets to answer, then those answered lately.
pub(crate) fn inbox(session: &Session, open: &Value, answered: &Value, flash: &Flash) -> Response {
    let empty = Vec::new();
    let tickets = open["result"]["tickets"].as_array().unwrap_or(&empty);
    let done = answered["result"]["tickets"].as_array().unwrap_or(&empty);
    layout(
        "Inbox",
        Some(session),
        flash,
        html! {
            h1 { "Inbox" }
            @if let Some(error) = api_error(open) { (error) }
            @if tickets.is_empty() {
                p.empty { "Nothing waits for you. Tickets that a run raises for you (a question, or a plan to approve) appear here as they come." }
            }
            @for ticket in tickets {
                (ticket_card(session, ticket))
            }
            @if !done.is_empty() {
                h2 { "Answered" }
                table {
                    thead { tr { th { "Ticket" } th { "Question" } th { "Answer" } th { "By" } th { "When" } } }
                    tbody {
                        @for ticket in done {
                            tr {
                                td { code { (text(&ticket["ticket"])) } }
                                td { (text(&ticket["question"])) }
                                td { (outcome(ticket)) }
                                td { (text(&ticket["answered_by"])) }
                                td { (time(&ticket["answered_at"])) }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// How an answered ticket came out: its answer, else its outcome.
fn outcome(ticket: &Value) -> String {
    if !ticket["answer"].is_null() {
        return text(&ticket["answer"]);
    }
    match ticket["outcome"]["status"].as_str() {
        Some("ok") => "approved".to_owned(),
        Some("error") => text(&ticket["outcome"]["error"]["code"]),
        _ => text(&ticket["state"]),
    }
}

fn ticket_card(session: &Session, ticket: &Value) -> Markup {
    let id = text(&ticket["ticket"]);
    let action = |what: &str| format!("/console/tickets/{}/{what}", segment(&id));
    let field = format!("answer-{id}");
    let reason = format!("reason-{id}");
    let options = ticket["options"].as_array().filter(|o| !o.is_empty());
    html! {
        article.ticket aria-labelledby=(format!("q-{id}")) {
            h2 id=(format!("q-{id}")) { (text(&ticket["question"])) }
            p.meta {
                (text(&ticket["tool"])) " · asked " (time(&ticket["created_at"]))
                @if ticket["expires_at"].is_i64() { " · expires " (time(&ticket["expires_at"])) }
                @if let Some(run) = ticket["run_id"].as_str().filter(|r| r.starts_with("run_")) {
                    " · " a href=(format!("/console/runs/{}", segment(run))) { "its run" }
                }
            }
            @if ticket["kind"] == "approval" {
                (plan(&ticket["plan"]))
                div.actions {
                    form method="post" action=(action("approve")) {
                        (csrf(session))
                        button.primary type="submit" { "Approve" }
                    }
                    form.stack method="post" action=(action("reject")) {
                        (csrf(session))
                        label for=(reason) { "Reason for rejecting (optional)" }
                        textarea id=(reason) name="reason" rows="2" maxlength="2000" {}
                        button.danger type="submit" { "Reject" }
                    }
                }
            } @else if ticket["kind"] == "input" {
                // What a job asks its caller's MCP client: that client
                // answers it (tasks/update), not a person here.
                p { "Waiting for the answers of the MCP client whose call started this job." }
            } @else if let Some(options) = options {
                form.actions method="post" action=(action("answer")) {
                    (csrf(session))
                    @for option in options {
                        button type="submit" name="answer" value=(text(option)) { (text(option)) }
                    }
                }
            } @else {
                form.stack method="post" action=(action("answer")) {
                    (csrf(session))
                    label for=(field) { "Your answer" }
                    textarea id=(field) name="answer" rows="3" required {}
                    button.primary type="submit" { "Answer" }
                }
            }
        }
    }
}

/// An approval's plan as its dry run answered it: each field listed, a
/// list of records (its lines) as a table, a list of words (its policy
/// flags) as a list.
fn plan(plan: &Value) -> Markup {
    let fields: Vec<(String, &Value)> = match plan {
        Value::Object(fields) => fields.iter().map(|(k, v)| (k.clone(), v)).collect(),
        Value::Null => Vec::new(),
        other => vec![("plan".to_owned(), other)],
    };
    html! {
        dl.plan {
            @for (key, value) in &fields {
                dt { (key.replace('_', " ")) }
                dd { (plan_value(key, value)) }
            }
        }
    }
}

fn plan_value(key: &str, value: &Value) -> Markup {
    let Some(items) = value.as_array() else {
        return match value {
            Value::Object(_) => json_block(key, value),
            other => html! { (text(other)) },
        };
    };
    if items.is_empty() {
        return html! { span.empty { "none" } };
    }
    if !items.iter().all(Value::is_object) {
        return html! { ul.flags { @for item in items { li { (text(item)) } } } };
    }
    let mut columns: Vec<&String> = Vec::new();
    for item in items {
        for column in item.as_object().into_iter().flat_map(|o| o.keys()) {
            if !columns.contains(&column) {
                columns.push(column);
            }
        }
    }
    html! {
        table.plan {
            thead { tr { @for c in &columns { th scope="col" { (c.replace('_', " ")) } } } }
            tbody {
                @for item in items {
                    tr { @for c in &columns { td { (text(&item[c.as_str()])) } } }
                }
            }
        }
    }
}

/// The job list and its filter.
pub(crate) fn jobs(session: &Session, list: &Value, filter: &JobFilter, flash: &Flash) -> Response {
    let empty = Vec::new();
    let jobs = list["jobs"].as_array().unwrap_or(&empty);
    let next = list["next_cursor"].as_str();
    let next_link = next.map(|cursor| {
        super::query(&[
            ("state", Some(filter.state.as_str())),
            ("tool", Some(filter.tool.as_str())),
            ("from", Some(filter.from.as_str())),
            ("to", Some(filter.to.as_str())),
            ("cursor", Some(cursor)),
        ])
    });
    layout(
        "Jobs",
        Some(session),
        flash,
        html! {
            h1 { "Jobs" }
            form.filters method="get" action="/console/jobs" {
                div {
                    label for="state" { "State" }
                    select id="state" name="state" {
                        option value="" { "any" }
                        @for s in JobState::SHOWN.iter().map(|s| s.as_str()) {
                            option value=(s) selected[filter.state == s] { (s) }
                        }
                    }
                }
                div {
                    label for="tool" { "Tool" }
                    input id="tool" name="tool" value=(filter.tool) maxlength="128";
                }
                div {
                    label for="from" { "Made from (UTC)" }
                    input id="from" name="from" type="datetime-local" value=(filter.from);
                }
                div {
                    label for="to" { "Made before (UTC)" }
                    input id="to" name="to" type="datetime-local" value=(filter.to);
                }
                div {
                    label for="id" { "Job id" }
                    input id="id" name="id" maxlength="64" placeholder="find one job";
                }
                button type="submit" { "Show" }
            }
            @if let Some(error) = api_error(list) { (error) }
            @if jobs.is_empty() {
                p.empty { "No job matches. Jobs appear when a job or agent tool is called; clear the filter to see them all." }
            } @else {
                table {
                    thead { tr { th { "Job" } th { "Tool" } th { "State" } th { "Attempts" } th { "Made" } th { "Changed" } } }
                    tbody {
                        @for job in jobs {
                            @let id = text(&job["job_id"]);
                            tr {
                                td { a href=(format!("/console/jobs/{}", segment(&id))) { code { (id) } } }
                                td { (text(&job["tool"])) }
                                td { span class=(format!("state {}", text(&job["state"]))) { (text(&job["state"])) } }
                                td { (text(&job["attempts"])) }
                                td { (time(&job["created_at"])) }
                                td { (time(&job["updated_at"])) }
                            }
                        }
                    }
                }
            }
            @if let Some(link) = next_link {
                p { a href=(format!("/console/jobs{link}")) { "Older jobs" } }
            }
        },
    )
}

/// One job: its record (arguments, attempts, run, trace, times) and its
/// outcome, with cancel and retry.
pub(crate) fn job(session: &Session, id: &str, answer: &Value, flash: &Flash) -> Response {
    let record = &answer["result"];
    let envelope = &record["outcome"];
    let state = text(&record["state"]);
    let settled = matches!(state.as_str(), "succeeded" | "failed" | "cancelled");
    let action = |what: &str| format!("/console/jobs/{}/{what}", segment(id));
    layout(
        "Job",
        Some(session),
        flash,
        html! {
            h1 { "Job " code { (id) } }
            @if answer["error"]["code"] == "not_found" {
                p.empty { "No such job for you. A job of another user or tenant reads as missing; check the id." }
            } @else if answer["status"] == "error" {
                (api_error(answer).unwrap_or_default())
            } @else {
                dl.facts {
                    dt { "Tool" } dd { code { (text(&record["tool"])) } }
                    dt { "State" } dd { span class=(format!("state {state}")) { (state) } }
                    dt { "Attempts" } dd { (text(&record["attempts"])) " of " (text(&record["max_attempts"])) }
                    @if record["requeues"].as_u64().is_some_and(|n| n > 0) { dt { "Put back" } dd { (text(&record["requeues"])) " times" } }
                    dt { "Pool" } dd { (text(&record["pool"])) }
                    dt { "Caller" } dd { (text(&record["user"])) }
                    @if let Some(run) = record["run_id"].as_str().filter(|r| r.starts_with("run_")) {
                        dt { "Run" } dd { a href=(format!("/console/runs/{}", segment(run))) { code { (run) } } }
                    }
                    @if record["trace_id"].is_string() { dt { "Trace" } dd { code { (text(&record["trace_id"])) } } }
                    @if !record["priority"].is_null() { dt { "Priority" } dd { (text(&record["priority"])) } }
                    @if envelope["waiting_for"].is_string() { dt { "Waiting for" } dd { (text(&envelope["waiting_for"])) } }
                    dt { "Made" } dd { (time(&record["created_at"])) }
                    dt { "Due" } dd { (time(&record["run_at"])) }
                    dt { "Changed" } dd { (time(&record["updated_at"])) }
                }
                h2 { "Arguments" }
                (json_block("Arguments", &record["args"]))
                (attempts(record))
                @if !envelope["progress"].is_null() { h2 { "Progress" } (json_block("Progress", &envelope["progress"])) }
                @if envelope["status"] == "ok" { h2 { "Result" } (json_block("Result", &envelope["result"])) }
                @if envelope["status"] == "error" {
                    h2 { "Error" }
                    p.error-code { code { (text(&envelope["error"]["code"])) } }
                    p { (text(&envelope["error"]["message"])) }
                    @if !envelope["error"]["details"].is_null() { (json_block("Details", &envelope["error"]["details"])) }
                }
                div.actions {
                    @if !settled {
                        form method="post" action=(action("cancel")) {
                            (csrf(session))
                            button.danger type="submit" { "Cancel" }
                        }
                    }
                    @if state == "failed" || state == "cancelled" {
                        form method="post" action=(action("retry")) {
                            (csrf(session))
                            button.primary type="submit" { "Retry" }
                        }
                    }
                }
            }
            p { a href="/console/jobs" { "All jobs" } }
        },
    )
}

/// A job's attempts: those that failed, each with its times and error,
/// then the running one.
fn attempts(record: &Value) -> Markup {
    let empty = Vec::new();
    let failed = record["attempts_log"].as_array().unwrap_or(&empty);
    let running = record["state"] == "running";
    html! {
        @if !failed.is_empty() || running {
            h2 { "Attempts" }
            table.attempts {
                thead { tr { th { "Attempt" } th { "Started" } th { "Ended" } th { "Error" } } }
                tbody {
                    @for attempt in failed {
                        tr {
                            td { (text(&attempt["attempt"])) }
                            td { (time(&attempt["started_at"])) }
                            td { (time(&attempt["ended_at"])) }
                            td {
                                code { (text(&attempt["error"]["code"])) } " "
                                (text(&attempt["error"]["message"]))
                            }
                        }
                    }
                    @if running {
                        tr {
                            td { (text(&record["attempts"])) }
                            td { (time(&record["started_at"])) }
                            td { "running" }
                            td {}
                        }
                    }
                }
            }
        }
    }
}

/// The caller's runs.
pub(crate) fn runs(session: &Session, list: &Value) -> Response {
    let empty = Vec::new();
    let runs = list["result"]["runs"].as_array().unwrap_or(&empty);
    layout(
        "Runs",
        Some(session),
        &Flash::default(),
        html! {
            h1 { "Runs" }
            @if let Some(error) = api_error(list) { (error) }
            @if runs.is_empty() {
                p.empty { "No run yet. A run starts with POST /v1/runs (an assistant's conversation) or with a job tool's call." }
            } @else {
                table {
                    thead { tr { th { "Run" } th { "Assistant" } th { "State" } th { "Started" } th { "Changed" } } }
                    tbody {
                        @for run in runs {
                            @let id = text(&run["run_id"]);
                            tr {
                                td { a href=(format!("/console/runs/{}", segment(&id))) { code { (id) } } }
                                td { (text(&run["agent"])) }
                                td { span class=(format!("state {}", text(&run["state"]))) { (text(&run["state"])) } }
                                td { (time(&run["created_at"])) }
                                td { (time(&run["updated_at"])) }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// One run: its state, answer, wait and transcript as a timeline.
pub(crate) fn run(session: &Session, id: &str, envelope: &Value, flash: &Flash) -> Response {
    let run = &envelope["result"];
    let state = text(&run["state"]);
    let empty = Vec::new();
    let transcript = run["transcript"].as_array().unwrap_or(&empty);
    let live = matches!(state.as_str(), "running" | "waiting");
    layout(
        "Run",
        Some(session),
        flash,
        html! {
            h1 { "Run " code { (id) } }
            @if envelope["status"] == "error" {
                p.empty { (text(&envelope["error"]["message"])) }
            } @else {
                dl.facts {
                    dt { "State" } dd { span class=(format!("state {state}")) { (state) } }
                    @if run["agent"].is_string() { dt { "Assistant" } dd { (text(&run["agent"])) } }
                    dt { "Started" } dd { (time(&run["created_at"])) }
                    dt { "Changed" } dd { (time(&run["updated_at"])) }
                }
                @if !run["wait"].is_null() { h2 { "Waiting on" } (json_block("Wait", &run["wait"])) }
                @if !run["answer"].is_null() { h2 { "Answer" } div.answer { (text(&run["answer"])) } }
                @if !run["error"].is_null() { h2 { "Error" } (json_block("Error", &run["error"])) }
                @if !run["usage"].is_null() { h2 { "Usage" } (json_block("Usage", &run["usage"])) }
                @if live {
                    form method="post" action=(format!("/console/runs/{}/cancel", segment(id))) {
                        (csrf(session))
                        button.danger type="submit" { "Cancel the run" }
                    }
                }
                h2 { "Transcript" }
                @if transcript.is_empty() {
                    p.empty { "Nothing in the transcript yet." }
                } @else {
                    ol.timeline {
                        @for entry in transcript { (entry_item(entry)) }
                    }
                }
            }
        },
    )
}

/// One entry of a transcript: a message, a model's reply and its calls, a
/// tool call with its arguments and envelope, a wait or a resume.
fn entry_item(entry: &Value) -> Markup {
    let kind = text(&entry["type"]);
    let heading = match kind.as_str() {
        "user" => "The user".to_owned(),
        "model" => "The model".to_owned(),
        "tool_call" | "tool_result" => {
            format!("{} {}", kind.replace('_', " "), text(&entry["tool"]))
        }
        other => other.replace('_', " "),
    };
    let shown = [
        "type", "at", "content", "text", "calls", "tool", "args", "envelope",
    ];
    html! {
        li class=(format!("entry {kind}")) {
            p.kind { (heading) " · " (time(&entry["at"])) }
            @if let Some(words) = entry["content"].as_str().or(entry["text"].as_str()) {
                div.content { (words) }
            }
            @if let Some(calls) = entry["calls"].as_array() {
                ul.calls {
                    @for call in calls {
                        li { "calls " code { (text(&call["name"])) } " with " code { (call["args"].to_string()) } }
                    }
                }
            }
            @if let Some(args) = entry["args"].as_object() {
                @if kind == "tool_call" {
                    dl.args {
                        @for (key, value) in args {
                            dt { (key) } dd { (text(value)) }
                        }
                    }
                }
            }
            @if !entry["envelope"].is_null() { (json_block("Envelope", &entry["envelope"])) }
            dl.args {
                @for (key, value) in entry.as_object().into_iter().flat_map(|o| o.iter()) {
                    @if !shown.contains(&key.as_str()) && !value.is_null() {
                        dt { (key.replace('_', " ")) }
                        dd {
                            @if value.is_object() { (json_block(key, value)) }
                            @else if let Some(items) = value.as_array() {
                                @if items.is_empty() { "none" }
                                @for item in items { code { (text(item)) } " " }
                            } @else { (text(value)) }
                        }
                    }
                }
            }
        }
    }
}

/// The tenant's queues: per pool, what waits and what settled in the
/// last hour, with a chart of it minute by minute.
pub(crate) fn queues(session: &Session, stats: &Value) -> Response {
    let empty = Vec::new();
    let pools = stats["result"]["pools"].as_array().unwrap_or(&empty);
    let since = stats["result"]["since"].as_i64().unwrap_or(0);
    layout(
        "Queues",
        Some(session),
        &Flash::default(),
        html! {
            h1 { "Queues" }
            @if stats["error"]["code"] == "forbidden" {
                p.empty { "The queues are for your tenant's operators: a token with scope fleet:read or fleet:operate sees them." }
            } @else if let Some(error) = api_error(stats) {
                (error)
            } @else if pools.is_empty() {
                p.empty { "No job in the last hour and none waiting. Pools appear here once a job or agent tool is called." }
            } @else {
                table {
                    thead { tr {
                        th { "Pool" } th { "Queued" } th { "Scheduled" } th { "Running" } th { "Retrying" }
                        th { "Waiting since" } th { "Succeeded (1 h)" } th { "Failed (1 h)" }
                        th { "Wait (1 h), average / longest" } th { "Per minute" }
                    } }
                    tbody {
                        @for pool in pools {
                            tr {
                                td { code { (text(&pool["pool"])) } }
                                td { (text(&pool["queued"])) }
                                td { (text(&pool["scheduled"])) }
                                td { (text(&pool["running"])) }
                                td { (text(&pool["retrying"])) }
                                td { (time(&pool["earliest_due"])) }
                                td { (text(&pool["settled"]["succeeded"])) }
                                td {
                                    a href=(format!("/console/jobs?state=failed")) { (text(&pool["settled"]["failed"])) }
                                }
                                td {
                                    (millis(&pool["wait_avg_ms"])) " / " (millis(&pool["wait_max_ms"]))
                                    br;
                                    (wait_chart(&pool["per_minute"], since))
                                }
                                td { (chart(&pool["per_minute"], since)) }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// The settled jobs' average wait per minute over the hour from `since`.
fn wait_chart(minutes: &Value, since: i64) -> Markup {
    let empty = Vec::new();
    let minutes = minutes.as_array().unwrap_or(&empty);
    let wait = |m: &Value| m["wait_avg_ms"].as_i64().unwrap_or(0).max(0);
    let most = minutes.iter().map(wait).max().unwrap_or(0).max(1);
    let label = format!(
        "the average wait per minute, at most {}",
        millis(&most.into())
    );
    html! {
        svg.chart.wait width="120" height="20" viewBox="0 0 120 20" role="img" aria-label=(label) {
            title { (label) }
            @for m in minutes {
                @let slot = ((m["at"].as_i64().unwrap_or(since) - since) / 60_000).clamp(0, 59);
                @let height = (wait(m) * 20 / most).max(1);
                rect x=(slot * 2) y=(20 - height) width="2" height=(height) fill="#8a5a00" {}
            }
        }
    }
}

/// A duration in milliseconds as people read it.
fn millis(ms: &Value) -> String {
    match ms.as_i64() {
        None => "—".to_owned(),
        Some(ms) if ms < 1_000 => format!("{ms} ms"),
        Some(ms) if ms < 120_000 => format!("{:.1} s", ms as f64 / 1000.0),
        Some(ms) => format!("{} min", ms / 60_000),
    }
}

/// Jobs settled per minute over the hour from `since`: a bar a minute,
/// failures in their own colour. Drawn with attributes alone (the
/// Content-Security-Policy allows no inline style).
fn chart(minutes: &Value, since: i64) -> Markup {
    let empty = Vec::new();
    let minutes = minutes.as_array().unwrap_or(&empty);
    let total = |m: &Value| {
        ["succeeded", "failed", "cancelled"]
            .iter()
            .map(|k| m[*k].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    let most = minutes.iter().map(total).max().unwrap_or(0).max(1);
    let sum: u64 = minutes.iter().map(total).sum();
    let label = format!("{sum} jobs settled in the hour, at most {most} in a minute");
    html! {
        svg.chart width="120" height="30" viewBox="0 0 120 30" role="img" aria-label=(label) {
            title { (label) }
            @for m in minutes {
                @let slot = ((m["at"].as_i64().unwrap_or(since) - since) / 60_000).clamp(0, 59);
                @let all = total(m);
                @let failed = m["failed"].as_u64().unwrap_or(0);
                @let height = all * 30 / most;
                @let bad = failed * 30 / most;
                rect x=(slot * 2) y=(30 - height) width="2" height=(height) fill="#1f5fbf" {}
                @if bad > 0 {
                    rect x=(slot * 2) y=(30 - bad) width="2" height=(bad) fill="#b3261e" {}
                }
            }
        }
    }
}

/// The tools the principal may call, each in every provider format.
pub(crate) fn tools(session: &Session, specs: &BTreeMap<&str, Value>) -> Response {
    let empty = Vec::new();
    let neutral = specs
        .get("neutral")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    layout(
        "Tools",
        Some(session),
        &Flash::default(),
        html! {
            h1 { "Tools" }
            @if neutral.is_empty() {
                p.empty { "No tool you may call. Tools come from the configuration's [[tools]]; a tool's required scopes decide who sees it." }
            }
            @for (n, tool) in neutral.iter().enumerate() {
                article.tool {
                    h2 { code { (text(&tool["name"])) } }
                    p { (text(&tool["description"])) }
                    dl.facts {
                        @if tool["shape"].is_string() { dt { "Shape" } dd { (text(&tool["shape"])) } }
                        @if let Some(scopes) = tool["scopes"].as_array().filter(|s| !s.is_empty()) {
                            dt { "Scopes" } dd { @for s in scopes { code { (text(s)) } " " } }
                        }
                    }
                    @for format in Format::ALL.map(Format::as_str) {
                        @let spec = match format {
                            "gemini" => specs.get(format).cloned().unwrap_or_default(),
                            _ => specs.get(format).and_then(|s| s.get(n)).cloned().unwrap_or_default(),
                        };
                        details {
                            summary { (format) }
                            pre { code { (serde_json::to_string_pretty(&spec).unwrap_or_default()) } }
                        }
                    }
                }
            }
        },
    )
}
