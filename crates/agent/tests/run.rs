//! The agent loop in one process, against the scripted model server over
//! HTTP in both wire formats: answers with evidence, each budget, the tool
//! subset, narrowed scopes, nesting, and the audit trail of its steps.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_agent::model::Usage;
use toolfleet_agent::testing::{Scripted, ScriptedModel};
use toolfleet_agent::{AgentEnv, Agents};
use toolfleet_broker::memory::MemoryNotices;
use toolfleet_core::config::{AgentSpec, ModelProvider};
use toolfleet_core::{CallCtx, MemoryAuditSink, Principal, Runtime, ToolDecl};
use toolfleet_executors::AgentFactory;
use toolfleet_store::sqlite::SqliteStore;

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
    }
}

fn spec(model: &ScriptedModel, provider: ModelProvider, name: &str, tools: &[&str]) -> AgentSpec {
    AgentSpec {
        provider,
        base_url: model.base_url(),
        base_url_env: None,
        model: name.to_owned(),
        api_key_env: None,
        api_key_file: None,
        system_prompt: "You keep the ledger.".to_owned(),
        tools: tools.iter().map(|t| (*t).to_owned()).collect(),
        scopes: vec!["ledger:read".to_owned()],
        max_steps: 8,
        max_tokens: 10_000,
        max_wall_s: 20.0,
        max_output_tokens: 256,
        timeout_s: 5.0,
    }
}

/// A runtime with a ledger lookup (read scope, audited), a wipe (write
/// scope) and the agent tools of `agents`, bound as the CLI binds them.
struct Rig {
    runtime: Arc<Runtime>,
    audit: Arc<MemoryAuditSink>,
}

async fn make_rig(agents: Vec<(&str, AgentSpec)>, max_depth: u32) -> Rig {
    let store = Arc::new(SqliteStore::open_in_memory().await.expect("store"));
    let env = AgentEnv::with_max_depth(store, Arc::new(MemoryNotices::new()), max_depth);
    let audit = Arc::new(MemoryAuditSink::new(1000));
    let mut runtime = Runtime::builder().audit_sink(audit.clone()).build();
    let lookup = ToolDecl::query("lookup")
        .description("The ledger's total for a month.")
        .input_schema(json!({"type": "object", "required": ["month"], "properties": {"month": {"type": "string"}}}))
        .audit()
        .require_scope("ledger:read")
        .run(|_: CallCtx, args: Value| async move {
            Ok::<_, toolfleet_core::ToolError>(json!({"month": args["month"], "total_cents": 4200}))
        });
    let wipe = ToolDecl::query("wipe")
        .description("Wipes the ledger.")
        .input_schema(json!({"type": "object"}))
        .audit()
        .require_scope("ledger:write")
        .run(|_: CallCtx, _: Value| async move {
            Ok::<_, toolfleet_core::ToolError>(json!({"wiped": true}))
        });
    runtime.register_all(vec![lookup, wipe]).expect("tools");
    let binder = Agents::new(
        env.clone(),
        toolfleet_executors::http_client().expect("client"),
    );
    for (name, spec) in agents {
        let executor = binder.bind(name, &spec).expect("agent binds");
        let decl = ToolDecl::agent(name)
            .description("A ledger agent.")
            .input_schema(json!({"type": "object", "required": ["task"], "properties": {"task": {"type": "string"}}}))
            .executor(executor);
        runtime.register(decl).expect("agent tool");
    }
    let runtime = Arc::new(runtime);
    env.set_runtime(&runtime);
    Rig { runtime, audit }
}

fn caller(scopes: &[&str]) -> CallCtx {
    CallCtx::new(Arc::new(Principal::new("acme", "alice", scopes.to_vec())))
        .with_run_id("run-parent")
}

/// Runs agent `name` as a worker would, and reads its result.
async fn run(rig: &Rig, name: &str, ctx: CallCtx) -> Value {
    let tool = rig
        .runtime
        .registry()
        .get(name)
        .expect("registered")
        .clone();
    let result = rig
        .runtime
        .execute(&tool, json!({"task": "What did September cost?"}), ctx)
        .await
        .expect("the agent answers a result");
    serde_json::from_str(result.get()).expect("JSON")
}

#[tokio::test]
async fn a_two_step_answer_carries_evidence_and_usage_in_both_wire_formats() {
    let model = ScriptedModel::start().await;
    for (provider, name) in [
        (ModelProvider::Openai, "gpt-test"),
        (ModelProvider::Anthropic, "claude-test"),
    ] {
        model.script(
            name,
            vec![
                Scripted::Calls {
                    calls: vec![("lookup".into(), json!({"month": "2026-09"}))],
                    usage: usage(100, 20),
                },
                Scripted::Answer {
                    text: "September cost 42.00.".into(),
                    usage: usage(150, 10),
                },
            ],
        );
        let rig = make_rig(
            vec![("ledger_agent", spec(&model, provider, name, &["lookup"]))],
            3,
        )
        .await;
        let out = run(&rig, "ledger_agent", caller(&["ledger:read"])).await;
        assert_eq!(out["status"], "answered", "{out}");
        assert_eq!(out["answer"], "September cost 42.00.");
        assert_eq!(out["evidence"][0]["tool"], "lookup");
        assert_eq!(out["evidence"][0]["args"], json!({"month": "2026-09"}));
        assert!(
            out["evidence"][0]["excerpt"]
                .as_str()
                .unwrap()
                .contains("4200"),
            "{out}"
        );
        assert_eq!(
            (
                out["usage"]["steps"].as_u64(),
                out["usage"]["input_tokens"].as_u64(),
                out["usage"]["output_tokens"].as_u64()
            ),
            (Some(2), Some(250), Some(30))
        );
        // The model saw the tool's result in the second request.
        let seen = model.requests(name);
        assert_eq!(seen.len(), 2);
        assert!(seen[1].to_string().contains("4200"), "{}", seen[1]);

        // Every step is audited under the agent's own run, beside its parent's.
        let records = rig.audit.records();
        let step = records
            .iter()
            .find(|r| r.tool == "lookup")
            .expect("the lookup was audited");
        assert_eq!(step.run_id, out["run_id"].as_str().unwrap());
        assert_ne!(step.run_id, "run-parent");
        assert_eq!(step.parent_run_id.as_deref(), Some("run-parent"));

        // Run inline (no job), its steps and tokens count under its own name.
        let text = rig.runtime.metrics().render();
        for (series, value) in [
            (r#"toolfleet_agent_steps_total{tool="ledger_agent"}"#, 2.0),
            (
                r#"toolfleet_agent_tokens_total{tool="ledger_agent",kind="input"}"#,
                250.0,
            ),
            (
                r#"toolfleet_agent_tokens_total{tool="ledger_agent",kind="output"}"#,
                30.0,
            ),
        ] {
            let sample = text.lines().find_map(|l| {
                l.strip_prefix(series)?
                    .strip_prefix(' ')?
                    .parse::<f64>()
                    .ok()
            });
            assert_eq!(sample, Some(value), "{series} in\n{text}");
        }
        assert!(!text.contains(r#"tool="unknown""#), "{text}");
    }
}

#[tokio::test]
async fn each_budget_stops_the_loop_and_the_result_says_which() {
    let model = ScriptedModel::start().await;
    let again = || Scripted::Calls {
        calls: vec![("lookup".into(), json!({"month": "2026-09"}))],
        usage: usage(10, 10),
    };
    // Steps: two model calls allowed, the model never stops calling tools.
    model.script("steps", (0..5).map(|_| again()).collect());
    let mut steps = spec(&model, ModelProvider::Openai, "steps", &["lookup"]);
    steps.max_steps = 2;
    // Tokens: the first reply reports more than the budget.
    model.script(
        "tokens",
        vec![
            Scripted::Calls {
                calls: vec![("lookup".into(), json!({"month": "2026-09"}))],
                usage: usage(900, 200),
            },
            again(),
        ],
    );
    let mut tokens = spec(&model, ModelProvider::Anthropic, "tokens", &["lookup"]);
    tokens.max_tokens = 1000;
    // Wall time: the model takes longer than the agent may.
    model.script(
        "slow",
        vec![Scripted::Delay(Duration::from_secs(3), Box::new(again()))],
    );
    let mut slow = spec(&model, ModelProvider::Openai, "slow", &["lookup"]);
    slow.max_wall_s = 0.5;
    let rig = make_rig(
        vec![
            ("by_steps", steps),
            ("by_tokens", tokens),
            ("by_wall", slow),
        ],
        3,
    )
    .await;

    let out = run(&rig, "by_steps", caller(&["ledger:read"])).await;
    assert_eq!(
        (out["status"].as_str(), out["exceeded"].as_str()),
        (Some("budget_exceeded"), Some("steps")),
        "{out}"
    );
    assert_eq!(out["usage"]["steps"], 2);
    assert_eq!(
        model.requests("steps").len(),
        2,
        "no model call past the budget"
    );

    let out = run(&rig, "by_tokens", caller(&["ledger:read"])).await;
    assert_eq!(
        (out["status"].as_str(), out["exceeded"].as_str()),
        (Some("budget_exceeded"), Some("tokens")),
        "{out}"
    );
    assert_eq!(out["usage"]["total_tokens"], 1100);
    assert!(
        out["evidence"].as_array().unwrap().is_empty(),
        "no tool runs once the tokens are spent"
    );

    let began = std::time::Instant::now();
    let out = run(&rig, "by_wall", caller(&["ledger:read"])).await;
    assert_eq!(
        (out["status"].as_str(), out["exceeded"].as_str()),
        (Some("budget_exceeded"), Some("wall_time")),
        "{out}"
    );
    assert!(
        began.elapsed() < Duration::from_secs(3),
        "the loop stopped at its wall time"
    );
}

#[tokio::test]
async fn a_tool_outside_the_subset_and_a_scope_not_given_are_refused() {
    let model = ScriptedModel::start().await;
    model.script(
        "greedy",
        vec![
            Scripted::Calls {
                calls: vec![
                    ("wipe".into(), json!({})),
                    ("lookup".into(), json!({"month": "2026-09"})),
                ],
                usage: usage(10, 10),
            },
            Scripted::Answer {
                text: "done".into(),
                usage: usage(10, 10),
            },
        ],
    );
    // `wipe` is registered but not the agent's; the agent may look up.
    let rig = make_rig(
        vec![(
            "greedy_agent",
            spec(&model, ModelProvider::Openai, "greedy", &["lookup"]),
        )],
        3,
    )
    .await;
    let out = run(
        &rig,
        "greedy_agent",
        caller(&["ledger:read", "ledger:write"]),
    )
    .await;
    assert_eq!(out["status"], "answered", "{out}");
    let shown = model.requests("greedy")[1].to_string();
    assert!(
        shown.contains("is not one of this agent's tools"),
        "{shown}"
    );
    assert_eq!(
        out["evidence"].as_array().unwrap().len(),
        1,
        "only the lookup is evidence"
    );
    assert!(
        rig.audit.records().iter().all(|r| r.tool != "wipe"),
        "wipe never ran"
    );

    // A caller without ledger:read: the agent's own scope does not widen it.
    model.script(
        "narrow",
        vec![
            Scripted::Calls {
                calls: vec![("lookup".into(), json!({"month": "2026-09"}))],
                usage: usage(10, 10),
            },
            Scripted::Answer {
                text: "could not".into(),
                usage: usage(10, 10),
            },
        ],
    );
    let rig = make_rig(
        vec![(
            "narrow_agent",
            spec(&model, ModelProvider::Anthropic, "narrow", &["lookup"]),
        )],
        3,
    )
    .await;
    let out = run(&rig, "narrow_agent", caller(&["other:scope"])).await;
    assert_eq!(out["status"], "answered", "{out}");
    assert!(out["evidence"].as_array().unwrap().is_empty(), "{out}");
    let shown = model.requests("narrow")[1].to_string();
    assert!(
        shown.contains("forbidden"),
        "the model is told the call was denied: {shown}"
    );
    let denied = rig.audit.records();
    let denied = denied
        .iter()
        .find(|r| r.tool == "lookup")
        .expect("the denial is audited");
    assert_eq!(denied.status, "error");
}

#[tokio::test]
async fn nesting_past_the_depth_limit_is_refused() {
    let model = ScriptedModel::start().await;
    model.script(
        "outer",
        vec![
            Scripted::Calls {
                calls: vec![("inner_agent".into(), json!({"task": "help"}))],
                usage: usage(10, 10),
            },
            Scripted::Answer {
                text: "alone".into(),
                usage: usage(10, 10),
            },
        ],
    );
    let outer = spec(&model, ModelProvider::Openai, "outer", &["inner_agent"]);
    let inner = spec(&model, ModelProvider::Openai, "inner", &["lookup"]);
    // Depth 1: an agent a client called may not call another.
    let rig = make_rig(vec![("outer_agent", outer), ("inner_agent", inner)], 1).await;
    let out = run(&rig, "outer_agent", caller(&["ledger:read"])).await;
    assert_eq!(out["status"], "answered", "{out}");
    let shown = model.requests("outer")[1].to_string();
    assert!(shown.contains("nest at most 1 deep"), "{shown}");
    assert!(
        model.requests("inner").is_empty(),
        "the inner agent never ran"
    );

    // A job of an agent already at the limit refuses to start.
    let mut deep = caller(&["ledger:read"]);
    deep.lineage = Some(toolfleet_core::Lineage {
        parent_run_id: "run-grandparent".into(),
        depth: 1,
        budget: toolfleet_core::Budget {
            max_steps: 10,
            max_tokens: 10_000,
            max_wall_ms: 60_000,
        },
    });
    let tool = rig.runtime.registry().get("inner_agent").unwrap().clone();
    let refused = rig.runtime.execute(&tool, json!({"task": "x"}), deep).await;
    let error = refused.expect_err("refused past the depth");
    assert!(
        error.message.contains("nest at most 1 deep"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn a_childs_budget_comes_out_of_its_parents() {
    let model = ScriptedModel::start().await;
    model.script(
        "capped",
        (0..10)
            .map(|_| Scripted::Calls {
                calls: vec![("lookup".into(), json!({"month": "2026-09"}))],
                usage: usage(10, 10),
            })
            .collect(),
    );
    let rig = make_rig(
        vec![(
            "capped_agent",
            spec(&model, ModelProvider::Openai, "capped", &["lookup"]),
        )],
        3,
    )
    .await;
    // Called by an agent with three steps left: it gets no more than three.
    let mut ctx = caller(&["ledger:read"]);
    ctx.lineage = Some(toolfleet_core::Lineage {
        parent_run_id: "run-parent".into(),
        depth: 1,
        budget: toolfleet_core::Budget {
            max_steps: 3,
            max_tokens: 10_000,
            max_wall_ms: 60_000,
        },
    });
    let out = run(&rig, "capped_agent", ctx).await;
    assert_eq!(
        (out["status"].as_str(), out["exceeded"].as_str()),
        (Some("budget_exceeded"), Some("steps")),
        "{out}"
    );
    assert_eq!(out["usage"]["steps"], 3);
    assert_eq!(out["usage"]["budget"]["max_steps"], 3);
}
