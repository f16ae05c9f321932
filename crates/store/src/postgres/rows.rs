//! PostgreSQL's rows read into records, and records bound as statements'
//! parameters: [`Fields`] gives a row's columns to the decoders that every
//! backend shares (`crate::rows`), and [`Insert`] and [`AuditColumns`] hold
//! what a statement writes, encoded. It must never run a statement, and
//! never panic on what a row holds: a value it cannot decode is an error
//! naming the row.

use std::borrow::Cow;
use std::cell::Cell;

use tokio_postgres::Row;
use tokio_postgres::types::FromSql;
use toolfleet_core::middleware::canonical_json;
use toolfleet_core::{AuditRecord, ErrorCode, TraceContext};

use crate::rows::{Columns, RowName, encode, to_i64};
use crate::{JobRecord, NewJob, RunRecord, StoreError, TicketRecord};

/// The columns of one row, with errors that name the row.
pub(super) struct Fields<'a> {
    row: &'a Row,
    name: RowName,
    /// Where the next column read is looked for first: decoders read a
    /// row's columns in the order its statement returns them, so each is
    /// found at once rather than by comparing every name before it.
    next: Cell<usize>,
}

impl<'a> Fields<'a> {
    /// `id_column` only labels errors, so reading it never fails here.
    pub(super) fn new(row: &'a Row, table: &'static str, id_column: &str) -> Self {
        let id = row
            .try_get::<_, String>(id_column)
            .or_else(|_| row.try_get::<_, i64>(id_column).map(|n| n.to_string()))
            .unwrap_or_default();
        Self::with_name(row, RowName { table, id })
    }

    /// For a row without its id among the columns.
    pub(super) fn named(row: &'a Row, table: &'static str, id: &str) -> Self {
        let id = id.to_owned();
        Self::with_name(row, RowName { table, id })
    }

    fn with_name(row: &'a Row, name: RowName) -> Self {
        Fields {
            row,
            name,
            next: Cell::new(0),
        }
    }

    /// The place of `column` among the row's columns: the one after the
    /// last read, if it is that, else the first of that name.
    fn place(&self, column: &str) -> Option<usize> {
        let columns = self.row.columns();
        let guess = self.next.get();
        let at = match columns.get(guess) {
            Some(found) if found.name() == column => guess,
            _ => columns.iter().position(|c| c.name() == column)?,
        };
        self.next.set(at + 1);
        Some(at)
    }

    pub(super) fn get<T: FromSql<'a>>(&self, column: &str) -> Result<T, StoreError> {
        let read = match self.place(column) {
            Some(at) => self.row.try_get(at),
            // Not among them: tokio-postgres's own error says so.
            None => self.row.try_get(column),
        };
        read.map_err(|e| self.corrupt(column, e))
    }
}

impl Columns for Fields<'_> {
    fn name(&self) -> &RowName {
        &self.name
    }

    fn id(&self) -> Result<String, StoreError> {
        self.get("id")
    }

    fn text(&self, column: &str) -> Result<Cow<'_, str>, StoreError> {
        self.get::<&str>(column).map(Cow::Borrowed)
    }

    fn text_opt(&self, column: &str) -> Result<Option<Cow<'_, str>>, StoreError> {
        Ok(self.get::<Option<&str>>(column)?.map(Cow::Borrowed))
    }

    fn string(&self, column: &str) -> Result<String, StoreError> {
        self.get(column)
    }

    fn string_opt(&self, column: &str) -> Result<Option<String>, StoreError> {
        self.get(column)
    }

    fn integer(&self, column: &str) -> Result<i64, StoreError> {
        self.get(column)
    }

    fn integer_opt(&self, column: &str) -> Result<Option<i64>, StoreError> {
        self.get(column)
    }

    fn small_opt(&self, column: &str) -> Result<Option<i16>, StoreError> {
        self.get(column)
    }
}

pub(super) fn job_from_row(row: &Row) -> Result<JobRecord, StoreError> {
    crate::rows::job(&Fields::new(row, "job", "id"))
}

pub(super) fn ticket_from_row(row: &Row) -> Result<TicketRecord, StoreError> {
    crate::rows::ticket(&Fields::new(row, "ticket", "id"))
}

pub(super) fn run_from_row(row: &Row) -> Result<RunRecord, StoreError> {
    crate::rows::run(&Fields::new(row, "run", "id"))
}

pub(super) fn audit_from_row(row: &Row) -> Result<AuditRecord, StoreError> {
    crate::rows::audit(&Fields::new(row, "audit", "seq"))
}

/// A job to record, its JSON columns encoded before it joins a group, so a
/// value that cannot be encoded fails its own call and no other.
pub(super) struct Insert {
    pub(super) job: NewJob,
    /// Canonical, as the idempotency check compares it.
    pub(super) args: String,
    pub(super) lineage: Option<String>,
    /// JSON array; `None` for no scopes.
    pub(super) scopes: Option<String>,
    /// The trace context's two headers.
    pub(super) traceparent: Option<String>,
    pub(super) tracestate: Option<String>,
    /// `queued` or `scheduled`, and when it is due ([`NewJob::start`]).
    pub(super) state: &'static str,
    pub(super) run_at: i64,
}

impl Insert {
    pub(super) fn of(job: NewJob) -> Result<Insert, StoreError> {
        let (state, run_at) = job.start();
        Ok(Insert {
            state: state.as_str(),
            run_at,
            args: canonical_json(&job.args),
            lineage: job.lineage.as_ref().map(encode).transpose()?,
            scopes: (!job.scopes.is_empty())
                .then(|| encode(&job.scopes))
                .transpose()?,
            traceparent: job.trace.as_ref().map(TraceContext::traceparent),
            tracestate: job
                .trace
                .as_ref()
                .and_then(TraceContext::tracestate)
                .map(str::to_owned),
            job,
        })
    }
}

/// The records as columns, for one `INSERT ... SELECT FROM UNNEST`.
#[derive(Default)]
pub(super) struct AuditColumns {
    pub(super) at_ms: Vec<i64>,
    pub(super) tenant: Vec<String>,
    pub(super) user: Vec<String>,
    pub(super) tool: Vec<String>,
    pub(super) run_id: Vec<String>,
    pub(super) call_id: Vec<String>,
    pub(super) args: Vec<String>,
    pub(super) status: Vec<&'static str>,
    pub(super) error_code: Vec<Option<&'static str>>,
    pub(super) duration_us: Vec<i64>,
    pub(super) parent_run_id: Vec<Option<String>>,
}

impl AuditColumns {
    pub(super) fn of(records: &[AuditRecord]) -> Result<AuditColumns, StoreError> {
        let mut cols = AuditColumns::default();
        for r in records {
            cols.at_ms.push(to_i64(r.at_ms));
            cols.tenant.push(r.tenant.clone());
            cols.user.push(r.user.clone());
            cols.tool.push(r.tool.clone());
            cols.run_id.push(r.run_id.clone());
            cols.call_id.push(r.call_id.clone());
            cols.args.push(encode(&r.args)?);
            cols.status.push(r.status);
            cols.error_code.push(r.error_code.map(ErrorCode::as_str));
            cols.duration_us.push(to_i64(r.duration_us));
            cols.parent_run_id.push(r.parent_run_id.clone());
        }
        Ok(cols)
    }
}
