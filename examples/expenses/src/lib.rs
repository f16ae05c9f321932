//! The expense agent of toolfleet's design, as a tool pack.
//!
//! The tools are declared in `toolfleet.toml` beside this crate; this crate
//! holds their executors (the builtin functions the declarations name) and an
//! in-memory expense book. Every new user starts with 62 expense lines dated
//! 2026-09: six have a receipt but no amount, two are ambiguous between travel
//! and meals, and one meal is over the policy limit. No executor here holds
//! audit, scope or cache code: the runtime adds those from the declarations.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use toolfleet_core::config::{ConfigError, ExecutorSpec, bind_builtin, parse_tools};
use toolfleet_core::{CallCtx, Executor, Json, ToolDecl, ToolError, executor_fn};

/// The pack's declarations, as `toolfleet serve` loads them.
pub const TOOLS_TOML: &str = include_str!("../toolfleet.toml");

/// Lines per page of `find_expenses`.
pub const PAGE: usize = 50;
/// The most a single meal may cost before the plan flags it, in cents.
pub const MEAL_LIMIT_CENTS: i64 = 75_00;
/// The month every new user's lines are dated in.
pub const SEED_MONTH: &str = "2026-09";

/// One expense line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Line {
    /// The line's id, which reports and receipts name.
    pub id: String,
    /// The day of the expense, `YYYY-MM-DD`.
    pub date: String,
    /// Where the money was spent.
    pub merchant: String,
    /// `None` while the category is ambiguous; see `category_options`.
    pub category: Option<String>,
    /// The categories an ambiguous line may take; empty once it has one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub category_options: Vec<String>,
    /// `None` while only the receipt image is known.
    pub amount_cents: Option<i64>,
    /// The currency of the amount (always `EUR`).
    pub currency: &'static str,
    /// The receipt OCR reads the amount from, for a line known only by its image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt_id: Option<String>,
}

/// A submitted report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The report's id, `rpt-` and its number.
    pub report_id: String,
    /// The lines the report claims.
    pub line_ids: Vec<String>,
    /// The sum of the lines' amounts, in cents.
    pub total_cents: i64,
    /// The currency of the total (always `EUR`).
    pub currency: &'static str,
    /// What the expense policy flagged, such as a meal over the limit.
    pub policy_flags: Vec<String>,
}

#[derive(Default)]
struct Ledger {
    lines: Vec<Line>,
    /// Each line's JSON, kept beside it so a page is written without
    /// encoding its lines again: pages are read far more often than changed.
    encoded: Vec<Box<RawValue>>,
    /// Reports by the idempotency key they were submitted with.
    reports: HashMap<String, Report>,
}

fn encode(line: &Line) -> Box<RawValue> {
    // A Line has string keys and finite numbers: encoding cannot fail.
    serde_json::value::to_raw_value(line).expect("a line encodes")
}

impl Ledger {
    fn new(lines: Vec<Line>) -> Self {
        Ledger {
            encoded: lines.iter().map(encode).collect(),
            lines,
            reports: HashMap::new(),
        }
    }

    /// Indices of `month`'s lines from `offset`, at most [`PAGE`], and the cursor of the next page.
    fn page(&self, month: &str, offset: usize) -> (Vec<usize>, Option<String>) {
        let in_month = |(_, l): &(usize, &Line)| {
            l.date.len() > month.len()
                && l.date.starts_with(month)
                && l.date.as_bytes()[month.len()] == b'-'
        };
        let mut matching = self
            .lines
            .iter()
            .enumerate()
            .filter(in_month)
            .map(|(i, _)| i);
        let page: Vec<usize> = matching.by_ref().skip(offset).take(PAGE).collect();
        let next_cursor = matching.next().map(|_| format!("c{}", offset + page.len()));
        (page, next_cursor)
    }
}

/// Every user's expense lines and reports, in memory.
#[derive(Default)]
pub struct ExpenseBook {
    ledgers: Mutex<HashMap<(String, String), Ledger>>,
}

const MERCHANTS: [&str; 5] = [
    "Rail Co",
    "Bistro Nord",
    "Hotel Lumen",
    "Paper & Pen",
    "City Cabs",
];
const CATEGORIES: [&str; 5] = ["travel", "meals", "lodging", "office", "transport"];
/// Lines with a receipt but no amount.
const RECEIPT_ONLY: [usize; 6] = [5, 15, 25, 35, 45, 55];
/// Lines that could be travel or meals.
const AMBIGUOUS: [usize; 2] = [20, 40];
/// The one meal over the limit.
const EXPENSIVE_MEAL: usize = 12;

fn seed() -> Vec<Line> {
    (1..=62)
        .map(|i: usize| {
            let kind = (i - 1) % 5;
            let amount = match kind {
                _ if i == EXPENSIVE_MEAL => 12_850,
                1 => 12_00 + (i as i64 * 311) % 50_00,
                _ => 10_00 + (i as i64 * 737) % 90_00,
            };
            let ambiguous = AMBIGUOUS.contains(&i);
            let receipt_only = RECEIPT_ONLY.contains(&i);
            Line {
                id: format!("exp-{i:03}"),
                date: format!("{SEED_MONTH}-{:02}", 1 + (i - 1) % 30),
                merchant: MERCHANTS[kind].to_owned(),
                category: (!ambiguous).then(|| CATEGORIES[kind].to_owned()),
                category_options: if ambiguous {
                    vec!["travel".to_owned(), "meals".to_owned()]
                } else {
                    Vec::new()
                },
                amount_cents: (!receipt_only).then_some(amount),
                currency: "EUR",
                receipt_id: receipt_only.then(|| format!("rcpt-{i:03}")),
            }
        })
        .collect()
}

/// What OCR reads off a receipt: a fixed amount per receipt.
fn read_receipt(receipt_id: &str) -> i64 {
    let n: i64 = receipt_id.bytes().map(i64::from).sum();
    15_00 + (n * 97) % 30_00
}

impl ExpenseBook {
    fn ledger<'a>(
        guard: &'a mut MutexGuard<'_, HashMap<(String, String), Ledger>>,
        ctx: &CallCtx,
    ) -> &'a mut Ledger {
        guard
            .entry((ctx.tenant().to_owned(), ctx.user().to_owned()))
            .or_insert_with(|| Ledger::new(seed()))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), Ledger>> {
        self.ledgers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The user's lines of `month`, from `offset`, at most [`PAGE`].
    pub fn find(&self, ctx: &CallCtx, month: &str, offset: usize) -> Page {
        let mut guard = self.lock();
        let ledger = Self::ledger(&mut guard, ctx);
        let (page, next_cursor) = ledger.page(month, offset);
        Page {
            lines: page.iter().map(|&i| ledger.lines[i].clone()).collect(),
            next_cursor,
        }
    }

    /// The same page as JSON, written from the kept encodings of its lines.
    pub fn find_encoded(
        &self,
        ctx: &CallCtx,
        month: &str,
        offset: usize,
    ) -> Result<Json, ToolError> {
        let mut guard = self.lock();
        let ledger = Self::ledger(&mut guard, ctx);
        let (page, next_cursor) = ledger.page(month, offset);
        let page = Page {
            lines: page
                .iter()
                .map(|&i| &*ledger.encoded[i])
                .collect::<Vec<&RawValue>>(),
            next_cursor,
        };
        Json::encode(&page)
            .map_err(|e| ToolError::failed(format!("the page could not be encoded: {e}"), false))
    }

    /// Fills in the amounts OCR reads off `receipt_ids`.
    pub fn read_receipts(
        &self,
        ctx: &CallCtx,
        receipt_ids: &[String],
    ) -> Result<Vec<Receipt>, ToolError> {
        let mut guard = self.lock();
        let ledger = Self::ledger(&mut guard, ctx);
        let mut read = Vec::new();
        let mut unknown = Vec::new();
        for receipt_id in receipt_ids {
            match ledger
                .lines
                .iter()
                .position(|l| l.receipt_id.as_ref() == Some(receipt_id))
            {
                Some(i) => {
                    let amount = read_receipt(receipt_id);
                    let line = &mut ledger.lines[i];
                    line.amount_cents = Some(amount);
                    ledger.encoded[i] = encode(line);
                    let line = &ledger.lines[i];
                    read.push(Receipt {
                        receipt_id: receipt_id.clone(),
                        line_id: line.id.clone(),
                        amount_cents: amount,
                    });
                }
                None => unknown.push(receipt_id.as_str()),
            }
        }
        if !unknown.is_empty() {
            return Err(ToolError::invalid_arguments(format!(
                "receipt_ids not found: {}; take receipt ids from find_expenses lines",
                unknown.join(", ")
            )));
        }
        Ok(read)
    }

    /// The plan of a report of `args.line_ids`.
    fn plan(&self, ctx: &CallCtx, args: &SubmitArgs) -> Result<Plan, ToolError> {
        let mut guard = self.lock();
        let ledger = Self::ledger(&mut guard, ctx);
        plan_of(ledger, args)
    }

    fn submit(&self, ctx: &CallCtx, args: &SubmitArgs, key: &str) -> Result<Report, ToolError> {
        let mut guard = self.lock();
        let ledger = Self::ledger(&mut guard, ctx);
        if let Some(report) = ledger.reports.get(key) {
            // The same key submits once, whatever reaches us twice.
            return Ok(report.clone());
        }
        let plan = plan_of(ledger, args)?;
        if !plan.missing_amounts.is_empty() || !plan.needs_category.is_empty() {
            return Err(ToolError::failed(
                format!(
                    "cannot submit: {} lines have no amount (run start_receipt_ocr on their receipts) and {} need a category (pass `categories`)",
                    plan.missing_amounts.len(),
                    plan.needs_category.len()
                ),
                false,
            ));
        }
        let report = Report {
            report_id: format!("rpt-{}", ledger.reports.len() + 1),
            line_ids: args.line_ids.clone(),
            total_cents: plan.total_cents,
            currency: "EUR",
            policy_flags: plan.policy_flags,
        };
        ledger.reports.insert(key.to_owned(), report.clone());
        Ok(report)
    }

    /// The user's submitted reports.
    pub fn reports(&self, ctx: &CallCtx) -> Vec<Report> {
        let mut guard = self.lock();
        let mut reports: Vec<Report> = Self::ledger(&mut guard, ctx)
            .reports
            .values()
            .cloned()
            .collect();
        reports.sort_by(|a, b| a.report_id.cmp(&b.report_id));
        reports
    }
}

fn plan_of(ledger: &Ledger, args: &SubmitArgs) -> Result<Plan, ToolError> {
    let mut plan = Plan {
        currency: "EUR",
        ..Plan::default()
    };
    let mut unknown = Vec::new();
    for id in &args.line_ids {
        let Some(line) = ledger.lines.iter().find(|l| &l.id == id) else {
            unknown.push(id.as_str());
            continue;
        };
        let category = line
            .category
            .clone()
            .or_else(|| args.categories.get(id).cloned());
        match line.amount_cents {
            Some(amount) => plan.total_cents += amount,
            None => plan.missing_amounts.push(id.clone()),
        }
        match category.as_deref() {
            None => plan.needs_category.push(id.clone()),
            Some("meals") if line.amount_cents.unwrap_or(0) > MEAL_LIMIT_CENTS => {
                plan.policy_flags.push(format!(
                    "{id}: meal of {:.2} EUR is over the {:.2} EUR limit",
                    line.amount_cents.unwrap_or(0) as f64 / 100.0,
                    MEAL_LIMIT_CENTS as f64 / 100.0
                ))
            }
            Some(_) => {}
        }
        plan.lines += 1;
    }
    if !unknown.is_empty() {
        return Err(ToolError::invalid_arguments(format!(
            "line_ids not found: {}; take line ids from find_expenses",
            unknown.join(", ")
        )));
    }
    Ok(plan)
}

/// A page of `find_expenses`.
#[derive(Debug, Serialize)]
pub struct Page<L = Line> {
    /// The lines of this page.
    pub lines: Vec<L>,
    /// The cursor of the next page; `None` on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// What OCR read off one receipt.
#[derive(Debug, Clone, Serialize)]
pub struct Receipt {
    /// The receipt read.
    pub receipt_id: String,
    /// The line whose amount it filled in.
    pub line_id: String,
    /// The amount read, in cents.
    pub amount_cents: i64,
}

/// The plan a dry run of `submit_report` shows.
#[derive(Debug, Default, Serialize)]
pub struct Plan {
    /// How many lines the report would claim.
    pub lines: usize,
    /// The sum of the known amounts, in cents.
    pub total_cents: i64,
    /// The currency of the total (always `EUR`).
    pub currency: &'static str,
    /// What the expense policy would flag, such as a meal over the limit.
    pub policy_flags: Vec<String>,
    /// Lines with no amount yet: run OCR on their receipts first.
    pub missing_amounts: Vec<String>,
    /// Lines with no category, neither their own nor one passed in.
    pub needs_category: Vec<String>,
}

#[derive(Deserialize)]
struct FindArgs {
    month: String,
    cursor: Option<String>,
}

#[derive(Deserialize)]
struct SubmitArgs {
    line_ids: Vec<String>,
    dry_run: bool,
    #[serde(default)]
    categories: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct OcrArgs {
    receipt_ids: Vec<String>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum SubmitOutcome {
    Plan(Plan),
    Report(Report),
}

/// The builtin executors the declarations name, working on `book`.
pub fn builtins(book: Arc<ExpenseBook>) -> BTreeMap<String, Arc<dyn Executor>> {
    let mut map: BTreeMap<String, Arc<dyn Executor>> = BTreeMap::new();
    let b = book.clone();
    map.insert(
        "expenses.find".into(),
        executor_fn(move |ctx: CallCtx, args: FindArgs| {
            let book = b.clone();
            async move {
                let offset = match args.cursor.as_deref() {
                    None => 0,
                    Some(c) => c
                        .strip_prefix('c')
                        .and_then(|n| n.parse().ok())
                        .ok_or_else(|| ToolError::invalid_arguments("cursor is not a next_cursor from this tool; start again without it"))?,
                };
                book.find_encoded(&ctx, &args.month, offset)
            }
        }),
    );
    let b = book.clone();
    map.insert(
        "expenses.submit".into(),
        executor_fn(move |ctx: CallCtx, args: SubmitArgs| {
            let book = b.clone();
            async move {
                if args.dry_run {
                    return book.plan(&ctx, &args).map(SubmitOutcome::Plan);
                }
                let key = ctx.idempotency_key.clone().ok_or_else(|| {
                    ToolError::failed(
                        "a commit reached the executor without its confirm token",
                        false,
                    )
                })?;
                book.submit(&ctx, &args, &key).map(SubmitOutcome::Report)
            }
        }),
    );
    map.insert(
        "expenses.ocr".into(),
        executor_fn(move |ctx: CallCtx, args: OcrArgs| {
            let book = book.clone();
            async move {
                let receipts = book.read_receipts(&ctx, &args.receipt_ids)?;
                Ok(serde_json::json!({ "receipts": receipts }))
            }
        }),
    );
    map
}

/// The pack's declarations with their executors bound to `book`, for a
/// runtime in this process. The agent tool (`reconcile_month`) is left out:
/// its loop needs a model, the store and the workers that `toolfleet serve`
/// brings, and it is bound there.
pub fn tools(book: Arc<ExpenseBook>) -> Result<Vec<ToolDecl>, ConfigError> {
    let builtins = builtins(book);
    let inline = |path: &str| {
        Err(format!(
            "the expense pack has its schemas inline, not in {path}"
        ))
    };
    parse_tools(TOOLS_TOML)?
        .into_iter()
        .filter(|tool| !matches!(tool.executor, Some(ExecutorSpec::Agent(_))))
        .map(|tool| bind_builtin(tool, &inline, &builtins))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_matches_the_worked_example() {
        let lines = seed();
        assert_eq!(lines.len(), 62);
        assert!(lines.iter().all(|l| l.date.starts_with("2026-09-")));
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.amount_cents.is_none() && l.receipt_id.is_some())
                .count(),
            6
        );
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.category_options == ["travel", "meals"])
                .count(),
            2
        );
        let over = lines
            .iter()
            .filter(|l| {
                l.category.as_deref() == Some("meals")
                    && l.amount_cents.unwrap_or(0) > MEAL_LIMIT_CENTS
            })
            .count();
        assert_eq!(over, 1);
    }
}
