//! The worked example of docs/ARCHITECTURE.md, through the core runtime: every shape,
//! the same validation and middleware, no audit, scope or cache code in any
//! executor.

use std::sync::Arc;

use serde_json::{Value, json};
use toolfleet_core::{
    CallCtx, Envelope, ErrorCode, MemoryAuditSink, MemoryFleet, Principal, Runtime,
};
use toolfleet_expenses::{ExpenseBook, tools};

struct Pack {
    runtime: Runtime,
    fleet: Arc<MemoryFleet>,
    audit: Arc<MemoryAuditSink>,
    book: Arc<ExpenseBook>,
}

fn pack() -> Pack {
    let fleet = Arc::new(MemoryFleet::default());
    let audit = Arc::new(MemoryAuditSink::default());
    let book = Arc::new(ExpenseBook::default());
    let mut runtime = Runtime::builder()
        .fleet(fleet.clone())
        .audit_sink(audit.clone())
        .build();
    runtime
        .register_all(tools(book.clone()).expect("the pack loads"))
        .expect("the pack registers");
    Pack {
        runtime,
        fleet,
        audit,
        book,
    }
}

fn alice() -> CallCtx {
    CallCtx::new(Arc::new(Principal::new(
        "acme",
        "alice",
        ["expenses:read", "expenses:submit"],
    )))
}

fn ok(envelope: &Envelope) -> Value {
    match envelope {
        Envelope::Ok { result, .. } => result.to_value(),
        other => panic!("expected ok, got {}", other.to_json()),
    }
}

#[tokio::test]
async fn submit_my_september_expenses() {
    let p = pack();
    let ctx = alice();

    // Two pages: 50 lines and a cursor, then 12 more and no cursor.
    let first = ok(&p
        .runtime
        .invoke("find_expenses", json!({"month": "2026-09"}), &ctx)
        .await);
    assert_eq!(first["lines"].as_array().unwrap().len(), 50);
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();
    let second = ok(&p
        .runtime
        .invoke(
            "find_expenses",
            json!({"month": "2026-09", "cursor": cursor}),
            &ctx,
        )
        .await);
    assert_eq!(second["lines"].as_array().unwrap().len(), 12);
    assert!(second.get("next_cursor").is_none());
    let lines: Vec<Value> = first["lines"]
        .as_array()
        .unwrap()
        .iter()
        .chain(second["lines"].as_array().unwrap())
        .cloned()
        .collect();

    // Six receipts without amounts go to OCR as a job.
    let receipts: Vec<String> = lines
        .iter()
        .filter(|l| l["amount_cents"].is_null())
        .map(|l| l["receipt_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(receipts.len(), 6);
    let job = p
        .runtime
        .invoke("start_receipt_ocr", json!({"receipt_ids": receipts}), &ctx)
        .await;
    let Envelope::Running {
        job_id,
        poll_after_s,
        ..
    } = &job
    else {
        panic!("{}", job.to_json())
    };
    assert_eq!(*poll_after_s, 20);
    // What a worker does with the accepted job.
    let accepted = p
        .fleet
        .job(job_id)
        .expect("the job was handed to the fleet");
    let tool = p
        .runtime
        .registry()
        .get("start_receipt_ocr")
        .unwrap()
        .clone();
    let read = p
        .runtime
        .execute(
            &tool,
            accepted.request.args.clone(),
            accepted.request.ctx.clone(),
        )
        .await
        .unwrap();
    assert_eq!(read.to_value()["receipts"].as_array().unwrap().len(), 6);
    // Pages are written from kept encodings: they must follow the change.
    for offset in [0, 50] {
        let kept = p
            .book
            .find_encoded(&ctx, "2026-09", offset)
            .unwrap()
            .to_value();
        let fresh = serde_json::to_value(p.book.find(&ctx, "2026-09", offset)).unwrap();
        assert_eq!(kept, fresh);
    }
    assert!(
        p.book
            .find(&ctx, "2026-09", 0)
            .lines
            .iter()
            .all(|l| l.amount_cents.is_some())
    );

    // Two ambiguous lines: the run suspends on a question.
    let ambiguous: Vec<String> = lines
        .iter()
        .filter(|l| l["category"].is_null())
        .map(|l| l["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ambiguous.len(), 2);
    let asked = p
        .runtime
        .invoke("ask_user", json!({"question": "Are exp-020 and exp-040 travel or meals?", "options": ["travel", "meals"]}), &ctx)
        .await;
    let Envelope::Suspended {
        ticket, options, ..
    } = &asked
    else {
        panic!("{}", asked.to_json())
    };
    assert_eq!(options, &["travel", "meals"]);
    assert_eq!(p.fleet.tickets()[0].0, *ticket);

    // Dry run: a plan with the total and one policy flag.
    let ids: Vec<&str> = lines.iter().map(|l| l["id"].as_str().unwrap()).collect();
    let categories = json!({&ambiguous[0]: "travel", &ambiguous[1]: "travel"});
    let args = json!({"line_ids": ids, "dry_run": true, "categories": categories});
    let dry = ok(&p.runtime.invoke("submit_report", args.clone(), &ctx).await);
    assert_eq!(dry["plan"]["lines"], 62);
    assert_eq!(dry["plan"]["policy_flags"].as_array().unwrap().len(), 1);
    assert!(
        dry["plan"]["missing_amounts"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let total: i64 = p
        .book
        .find(&ctx, "2026-09", 0)
        .lines
        .iter()
        .chain(&p.book.find(&ctx, "2026-09", 50).lines)
        .map(|l| l.amount_cents.unwrap())
        .sum();
    assert_eq!(dry["plan"]["total_cents"], total);
    assert!(p.book.reports(&ctx).is_empty(), "a dry run submits nothing");

    // The commit needs the token; with it, one report; a retry, the same report.
    let mut commit = args.clone();
    commit["dry_run"] = json!(false);
    let refused = p
        .runtime
        .invoke("submit_report", commit.clone(), &ctx)
        .await;
    assert_eq!(refused.error_code(), Some(ErrorCode::ConfirmRequired));
    commit["confirm_token"] = dry["confirm_token"].clone();
    let report = ok(&p
        .runtime
        .invoke("submit_report", commit.clone(), &ctx)
        .await);
    let retried = ok(&p.runtime.invoke("submit_report", commit, &ctx).await);
    assert_eq!(report["report_id"], retried["report_id"]);
    assert_eq!(p.book.reports(&ctx).len(), 1);
    assert_eq!(report["total_cents"], total);

    // Every call passed the audit layer.
    let audited: Vec<String> = p.audit.records().iter().map(|r| r.tool.clone()).collect();
    assert_eq!(audited.iter().filter(|t| *t == "find_expenses").count(), 2);
    assert_eq!(audited.iter().filter(|t| *t == "submit_report").count(), 4);
    assert!(
        audited.contains(&"start_receipt_ocr".to_owned())
            && audited.contains(&"ask_user".to_owned())
    );
}

#[tokio::test]
async fn scopes_are_the_runtimes_business() {
    let p = pack();
    let reader = CallCtx::new(Arc::new(Principal::new("acme", "bob", ["expenses:read"])));
    let args = json!({"line_ids": ["exp-001"], "dry_run": true});
    let denied = p.runtime.invoke("submit_report", args, &reader).await;
    assert_eq!(denied.error_code(), Some(ErrorCode::Forbidden));
    let nobody = CallCtx::new(Arc::new(Principal::new(
        "acme",
        "carol",
        Vec::<String>::new(),
    )));
    let denied = p
        .runtime
        .invoke("find_expenses", json!({"month": "2026-09"}), &nobody)
        .await;
    assert_eq!(denied.error_code(), Some(ErrorCode::Forbidden));
    assert!(
        denied
            .error_ref()
            .unwrap()
            .message
            .contains("expenses:read")
    );
    // ask_user needs no scope.
    let asked = p
        .runtime
        .invoke("ask_user", json!({"question": "ok?"}), &nobody)
        .await;
    assert_eq!(asked.status(), "suspended");
}

#[tokio::test]
async fn bad_arguments_are_answered_not_run() {
    let p = pack();
    let ctx = alice();
    let bad = p
        .runtime
        .invoke("find_expenses", json!({"month": "Sept", "cursor": 5}), &ctx)
        .await;
    let error = bad.error_ref().unwrap();
    assert_eq!(error.code, ErrorCode::InvalidArguments);
    assert!(
        error.message.contains("/month") && error.message.contains("pattern"),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("/cursor") && error.message.contains("type"),
        "{}",
        error.message
    );
    let unknown = p
        .runtime
        .invoke(
            "submit_report",
            json!({"line_ids": ["nope"], "dry_run": true}),
            &ctx,
        )
        .await;
    assert_eq!(unknown.error_code(), Some(ErrorCode::InvalidArguments));
    let typo = p.runtime.invoke("find_expense", json!({}), &ctx).await;
    assert!(
        typo.error_ref()
            .unwrap()
            .message
            .contains("`find_expenses`")
    );
}
