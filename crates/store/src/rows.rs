//! Stored rows read into records, the same way for every backend: the
//! columns of one row, as a backend's [`Columns`] gives them, decoded into a
//! [`JobRecord`], [`TicketRecord`], [`RunRecord`] or [`AuditRecord`], their
//! JSON, states and integers checked on the way, with errors that name the
//! row; values encoded as the JSON text that is stored; and the paging of
//! the lists, newest first by id. It owns the order in which a record's
//! columns are read and the words of a corrupt row's error. It must
//! never know a backend's SQL or row type, and never panic on what a row
//! holds: a value it cannot decode is a [`StoreError::Unavailable`] naming
//! the row.

use std::borrow::Cow;
use std::fmt::Display;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use toolfleet_core::{AnsweredBy, AuditRecord, ErrorCode, JobState, Json, TraceContext};

use crate::{JobRecord, RunRecord, RunState, StoreError, TicketKind, TicketRecord};

/// Bounds of one page of a list ([`Store::list_jobs`](crate::Store::list_jobs),
/// [`Store::list_tickets`](crate::Store::list_tickets),
/// [`Store::list_runs`](crate::Store::list_runs)).
const MAX_PAGE: u32 = 100;
/// Sorts after every id (ids use the "C" collation on PostgreSQL), so the
/// first page needs no second statement.
const NO_CURSOR: &str = "\u{10FFFF}";

/// One page of a list read newest first by id, paged by "id < cursor": the
/// page's size (bounded), the cursor to read below, and how many rows to
/// fetch (one more than the page tells whether there is a next page).
pub(crate) struct Paging<'a> {
    limit: usize,
    /// The id the page's rows sort below.
    pub(crate) cursor: &'a str,
}

impl<'a> Paging<'a> {
    /// A page of at most `limit` rows (1 to [`MAX_PAGE`]) below `cursor`.
    pub(crate) fn new(limit: u32, cursor: Option<&'a str>) -> Self {
        Paging {
            limit: limit.clamp(1, MAX_PAGE) as usize,
            cursor: cursor.unwrap_or(NO_CURSOR),
        }
    }

    /// How many rows to fetch: one more than the page.
    pub(crate) fn fetch(&self) -> i64 {
        self.limit as i64 + 1
    }

    /// Cuts `rows` (fetched newest first, at most [`Paging::fetch`]) to the
    /// page, answering the cursor of the next page when there is one.
    pub(crate) fn cut<T>(&self, rows: &mut Vec<T>, id: fn(&T) -> &str) -> Option<String> {
        if rows.len() > self.limit {
            rows.truncate(self.limit);
            rows.last().map(|row| id(row).to_owned())
        } else {
            None
        }
    }
}

/// Which row a column is of, for errors: its table and id.
pub(crate) struct RowName {
    pub(crate) table: &'static str,
    pub(crate) id: String,
}

impl RowName {
    pub(crate) fn corrupt(&self, column: &str, e: impl Display) -> StoreError {
        StoreError::Unavailable(format!(
            "corrupt row: {} {} column {column}: {e}",
            self.table, self.id
        ))
    }
}

/// The columns of one row, by name, as a backend reads them; each failed
/// read is an error naming the row ([`RowName::corrupt`]).
pub(crate) trait Columns {
    fn name(&self) -> &RowName;
    /// The id of the record the row holds.
    fn id(&self) -> Result<String, StoreError>;
    /// Text to decode further (JSON, a state, a header), borrowed from the
    /// row where the backend can.
    fn text(&self, column: &str) -> Result<Cow<'_, str>, StoreError>;
    /// [`Columns::text`] of a column that may be NULL.
    fn text_opt(&self, column: &str) -> Result<Option<Cow<'_, str>>, StoreError>;
    fn string(&self, column: &str) -> Result<String, StoreError>;
    fn string_opt(&self, column: &str) -> Result<Option<String>, StoreError>;
    fn integer(&self, column: &str) -> Result<i64, StoreError>;
    fn integer_opt(&self, column: &str) -> Result<Option<i64>, StoreError>;
    /// A small integer (PostgreSQL `smallint`) that may be NULL.
    fn small_opt(&self, column: &str) -> Result<Option<i16>, StoreError> {
        self.integer_opt(column)?
            .map(|n| {
                i16::try_from(n).map_err(|_| self.corrupt(column, format!("{n} is out of range")))
            })
            .transpose()
    }

    fn corrupt(&self, column: &str, e: impl Display) -> StoreError {
        self.name().corrupt(column, e)
    }

    fn int<T: TryFrom<i64>>(&self, column: &str) -> Result<T, StoreError> {
        let n = self.integer(column)?;
        T::try_from(n).map_err(|_| self.corrupt(column, format!("{n} is out of range")))
    }

    fn json<T: DeserializeOwned>(&self, column: &str) -> Result<T, StoreError> {
        let text = self.text(column)?;
        serde_json::from_str(&text).map_err(|e| self.corrupt(column, e))
    }

    /// SQL NULL is `None`; JSON `null` text is a present value.
    fn json_opt<T: DeserializeOwned>(&self, column: &str) -> Result<Option<T>, StoreError> {
        let text = self.text_opt(column)?;
        text.map(|t| serde_json::from_str(&t).map_err(|e| self.corrupt(column, e)))
            .transpose()
    }

    fn raw_json_opt(&self, column: &str) -> Result<Option<Json>, StoreError> {
        let text = self.text_opt(column)?;
        text.map(|t| Json::parse(&t).map_err(|e| self.corrupt(column, e)))
            .transpose()
    }

    fn state(&self) -> Result<JobState, StoreError> {
        let text = self.text("state")?;
        JobState::parse(&text)
            .ok_or_else(|| self.corrupt("state", format!("unknown state {text:?}")))
    }
}

pub(crate) fn job(f: &impl Columns) -> Result<JobRecord, StoreError> {
    Ok(JobRecord {
        id: f.id()?,
        tenant: f.string("tenant")?,
        user: f.string("user")?,
        tool: f.string("tool")?,
        pool: f.string("pool")?,
        args: f.json("args")?,
        state: f.state()?,
        attempts: f.int("attempts")?,
        max_attempts: f.int("max_attempts")?,
        timeout_ms: f.integer("timeout_ms")?,
        run_at: f.integer("run_at")?,
        lease_owner: f.string_opt("lease_owner")?,
        lease_until: f.integer_opt("lease_until")?,
        progress: f.json_opt("progress")?,
        result: f.raw_json_opt("result")?,
        error: f.json_opt("error")?,
        idempotency_key: f.string_opt("idempotency_key")?,
        run_id: f.string("run_id")?,
        call_id: f.string("call_id")?,
        callback_url: f.string_opt("callback_url")?,
        lineage: f.json_opt("lineage")?,
        scopes: f.json_opt("scopes")?.unwrap_or_default(),
        trace: trace_of(
            f.text_opt("traceparent")?.as_deref(),
            f.text_opt("tracestate")?.as_deref(),
        ),
        requeues: f.int("requeues")?,
        priority: f.small_opt("priority")?,
        concurrency_key: f.string_opt("concurrency_key")?,
        fair_rank: f.integer("fair_rank")?,
        concurrency_limit: f
            .integer_opt("concurrency_limit")?
            .map(|n| {
                u32::try_from(n)
                    .map_err(|_| f.corrupt("concurrency_limit", format!("{n} is out of range")))
            })
            .transpose()?,
        started_at: f.integer_opt("started_at")?,
        attempts_log: f.json_opt("attempts_log")?,
        created_at: f.integer("created_at")?,
        updated_at: f.integer("updated_at")?,
    })
}

/// One row of [`crate::queue_stats_sql`], by its columns' names.
pub(crate) fn pool_row(f: &impl Columns) -> Result<crate::PoolRow, StoreError> {
    Ok(crate::PoolRow {
        pool: f.string("pool")?,
        state: f.state()?,
        count: f.int("n")?,
        earliest: f.integer_opt("earliest")?,
        minute: f.integer_opt("minute")?,
        waited: f.int("waited")?,
        wait_total_ms: f.integer("wait_total")?,
        wait_max_ms: f.integer_opt("wait_max")?,
    })
}

/// The trace context of a stored job's `traceparent` and `tracestate`
/// columns: `None` for a job without one, or one no longer valid (it starts
/// a trace of its own rather than failing the read).
fn trace_of(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<TraceContext> {
    traceparent.and_then(|header| TraceContext::parse(header, tracestate))
}

pub(crate) fn ticket(f: &impl Columns) -> Result<TicketRecord, StoreError> {
    Ok(TicketRecord {
        id: f.id()?,
        tenant: f.string("tenant")?,
        user: f.string("user")?,
        tool: f.string("tool")?,
        question: f.string("question")?,
        options: f.json("options")?,
        args: f.json("args")?,
        run_id: f.string("run_id")?,
        call_id: f.string("call_id")?,
        callback_url: f.string_opt("callback_url")?,
        answer: f.json_opt("answer")?,
        answered_by: AnsweredBy::from_scope(f.string_opt("answered_by")?),
        kind: {
            let text = f.text("kind")?;
            TicketKind::parse(&text)
                .ok_or_else(|| f.corrupt("kind", format!("unknown kind {text:?}")))?
        },
        plan: f.json_opt("plan")?,
        scopes: f.json("scopes")?,
        expires_at: f.integer_opt("expires_at")?,
        expired_at: f.integer_opt("expired_at")?,
        outcome: f.json_opt("outcome")?,
        input_requests: f.json_opt("input_requests")?,
        input_responses: f.json_opt("input_responses")?,
        created_at: f.integer("created_at")?,
        answered_at: f.integer_opt("answered_at")?,
    })
}

pub(crate) fn run(f: &impl Columns) -> Result<RunRecord, StoreError> {
    Ok(RunRecord {
        id: f.id()?,
        tenant: f.string("tenant")?,
        user: f.string("user")?,
        agent: f.string_opt("agent")?,
        state: {
            let text = f.text("state")?;
            RunState::parse(&text)
                .ok_or_else(|| f.corrupt("state", format!("unknown state {text:?}")))?
        },
        checkpoint: f.json_opt("checkpoint")?,
        wait: f.json_opt("wait")?,
        resumed: f.json_opt("resumed")?,
        answer: f.string_opt("answer")?,
        error: f.json_opt("error")?,
        usage: f.json_opt("usage")?,
        callback_url: f.string_opt("callback_url")?,
        idempotency_key: f.string_opt("idempotency_key")?,
        scopes: f.json("scopes")?,
        version: f.integer("version")?,
        created_at: f.integer("created_at")?,
        updated_at: f.integer("updated_at")?,
    })
}

pub(crate) fn audit(f: &impl Columns) -> Result<AuditRecord, StoreError> {
    // AuditRecord's status is static text: map back onto the four words.
    let status = match &*f.text("status")? {
        "ok" => "ok",
        "error" => "error",
        "running" => "running",
        "suspended" => "suspended",
        other => return Err(f.corrupt("status", format!("unknown status {other:?}"))),
    };
    let error_code = f
        .string_opt("error_code")?
        .map(|code| serde_json::from_value::<ErrorCode>(Value::String(code)))
        .transpose()
        .map_err(|e| f.corrupt("error_code", e))?;
    Ok(AuditRecord {
        at_ms: f.int("at_ms")?,
        tool: f.string("tool")?,
        tenant: f.string("tenant")?,
        user: f.string("user")?,
        run_id: f.string("run_id")?,
        call_id: f.string("call_id")?,
        parent_run_id: f.string_opt("parent_run_id")?,
        args: f.json("args")?,
        status,
        error_code,
        duration_us: f.int("duration_us")?,
    })
}

/// `value` as the JSON text of a column.
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Unavailable(format!("cannot encode a value to store: {e}")))
}

/// A count or time as a signed column holds it, the largest if it is over.
pub(crate) fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
