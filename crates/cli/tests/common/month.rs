//! The worked example's month as a model's script: what the script needs
//! to know of September 2026 (the second page's cursor, the receipts
//! without an amount, the lines with one) and the six replies of the
//! expense assistant's run: both pages, the OCR job and the question in one
//! reply, the dry run, the commit (its token the dry run's), the answer.

use serde_json::{Value, json};
use toolfleet_agent::model::Usage;
use toolfleet_agent::testing::{CONFIRM_TOKEN, Scripted};

use super::Client;

/// The month the example works on.
pub(crate) const MONTH: &str = "2026-09";

/// What one reply of the script costs.
pub(crate) fn usage() -> Usage {
    Usage {
        input_tokens: 300,
        output_tokens: 30,
    }
}

/// A reply calling `calls`, `(tool, arguments)` in order.
pub(crate) fn calls(calls: Vec<(&str, Value)>) -> Scripted {
    Scripted::Calls {
        calls: calls.into_iter().map(|(n, a)| (n.to_owned(), a)).collect(),
        usage: usage(),
    }
}

/// September 2026 as the expense book holds it.
pub(crate) struct Month {
    /// The second page's cursor.
    pub cursor: String,
    /// Every line, both pages.
    pub lines: Vec<Value>,
    /// The receipts of the lines without an amount.
    pub receipts: Vec<String>,
    /// The ids of the lines with an amount.
    pub known: Vec<String>,
}

impl Month {
    /// Reads both pages as `client`. Every process's book starts from the
    /// same seed, so these are any process's lines.
    pub(crate) async fn read(client: &Client) -> Month {
        let first = client.call("find_expenses", json!({"month": MONTH})).await;
        let cursor = first["result"]["next_cursor"].as_str().unwrap().to_owned();
        let second = client
            .call("find_expenses", json!({"month": MONTH, "cursor": cursor}))
            .await;
        let lines: Vec<Value> = [&first, &second]
            .iter()
            .flat_map(|p| p["result"]["lines"].as_array().unwrap().clone())
            .collect();
        let of = |with_amount: bool, field: &str| -> Vec<String> {
            lines
                .iter()
                .filter(|l| l["amount_cents"].is_null() != with_amount)
                .map(|l| l[field].as_str().unwrap().to_owned())
                .collect()
        };
        let (receipts, known) = (of(false, "receipt_id"), of(true, "id"));
        Month {
            cursor,
            lines,
            receipts,
            known,
        }
    }

    /// `submit_report`'s arguments for the lines with an amount (OCR fills
    /// in the others in the book of the process that ran it alone), the
    /// ambiguous lines as travel: the dry run's, and the commit's with the
    /// token its dry run answers.
    pub(crate) fn submit(&self) -> (Value, Value) {
        let submit = json!({"line_ids": self.known, "categories": {"exp-020": "travel", "exp-040": "travel"}});
        let mut dry = submit.clone();
        dry["dry_run"] = json!(true);
        let mut commit = submit;
        commit["dry_run"] = json!(false);
        commit["confirm_token"] = json!(CONFIRM_TOKEN);
        (dry, commit)
    }

    /// The six replies of the run, ending with `answer`.
    pub(crate) fn script(&self, answer: &str) -> Vec<Scripted> {
        let (dry, commit) = self.submit();
        vec![
            calls(vec![("find_expenses", json!({"month": MONTH}))]),
            calls(vec![(
                "find_expenses",
                json!({"month": MONTH, "cursor": self.cursor}),
            )]),
            // Started together, awaited together.
            calls(vec![
                ("start_receipt_ocr", json!({"receipt_ids": self.receipts})),
                (
                    "ask_user",
                    json!({"question": "Are lines exp-020 and exp-040 travel or meals?", "options": ["travel", "meals"]}),
                ),
            ]),
            calls(vec![("submit_report", dry)]),
            calls(vec![("submit_report", commit)]),
            Scripted::Answer {
                text: answer.into(),
                usage: usage(),
            },
        ]
    }
}

/// The commit's arguments as the run made them (its token the one its dry
/// run answered): the last `submit_report` call of the run's transcript.
pub(crate) fn commit_args(run: &Value) -> Value {
    run["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| e["type"] == "tool_call" && e["tool"] == "submit_report")
        .map(|e| e["args"].clone())
        .unwrap_or_default()
}

/// The answered run of [`Month::script`] shows each step in its
/// transcript, and six steps in its usage.
pub(crate) fn assert_steps(done: &Value) {
    let kinds: Vec<String> = done["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let kind = e["type"].as_str().unwrap();
            match e["tool"].as_str() {
                Some(tool) => format!("{kind}:{tool}"),
                None => kind.to_owned(),
            }
        })
        .collect();
    for expected in [
        "user",
        "model",
        "tool_call:find_expenses",
        "tool_call:start_receipt_ocr",
        "tool_call:ask_user",
        "wait",
        "tool_result:start_receipt_ocr",
        "resume",
        "tool_result:ask_user",
        "tool_call:submit_report",
        "tool_result:submit_report",
    ] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "{expected} in {kinds:?}"
        );
    }
    assert_eq!(done["usage"]["steps"], 6, "{done}");
}
