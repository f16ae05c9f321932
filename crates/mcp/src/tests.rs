use std::sync::Arc;

use serde_json::{Value, json};
use toolfleet_core::{Principal, Runtime, ToolDecl, ToolError};

use super::{Options, ToolServer};

fn runtime() -> Arc<Runtime> {
    let mut runtime = Runtime::builder().build();
    for name in ["a_one", "b_two", "c_three"] {
        runtime
            .register(
                ToolDecl::query(name)
                    .title(format!("Tool {name}"))
                    .description("Echo a month.")
                    .input_schema(json!({
                        "type": "object",
                        "properties": {"month": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}},
                        "required": ["month"],
                        "additionalProperties": false
                    }))
                    .require_scope("read")
                    .run(|_ctx, args: Value| async move {
                        Ok::<_, ToolError>(json!({"month": args["month"].clone()}))
                    }),
            )
            .unwrap();
    }
    runtime
        .register(
            ToolDecl::query("secret")
                .description("Only for admins.")
                .input_schema(json!({"type": "object"}))
                .require_scope("admin")
                .run(|_ctx, _args: Value| async move { Ok::<_, ToolError>(json!({})) }),
        )
        .unwrap();
    Arc::new(runtime)
}

fn server(page_size: usize) -> ToolServer {
    ToolServer::new(
        runtime(),
        None,
        Options {
            page_size,
            ..Options::default()
        },
    )
}

fn reader() -> Arc<Principal> {
    Arc::new(Principal::new("acme", "alice", ["read"]))
}

#[test]
fn lists_pages_of_the_tools_a_principal_may_call() {
    let paged = server(2);
    let first = paged.list(&reader(), None).unwrap();
    let names: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    // `read_handle` is the runtime's own, in every registry.
    assert_eq!(names, ["read_handle", "a_one"]);
    let cursor = first["nextCursor"].as_str().unwrap();
    let second = paged.list(&reader(), Some(cursor)).unwrap();
    assert_eq!(second["tools"][0]["name"], "b_two");
    assert_eq!(second["tools"][1]["name"], "c_three");
    // `secret` needs a scope alice lacks: the list ends without it.
    assert_eq!(second["tools"].as_array().unwrap().len(), 2);
    assert!(second.get("nextCursor").is_none());

    let admin = Principal::new("acme", "root", ["read", "admin"]);
    let all = server(10).list(&admin, None).unwrap();
    assert_eq!(all["tools"].as_array().unwrap().len(), 5);
}

#[test]
fn tools_carry_title_schema_and_read_only_annotations() {
    let page = server(10).list(&reader(), None).unwrap();
    let tool = &page["tools"][1];
    assert_eq!(tool["title"], "Tool a_one");
    assert_eq!(tool["inputSchema"]["required"][0], "month");
    assert_eq!(tool["annotations"]["readOnlyHint"], true);
    assert_eq!(tool["annotations"]["idempotentHint"], true);
    assert_eq!(tool["annotations"]["destructiveHint"], false);
    // What rmcp reads is what we wrote.
    let parsed: Vec<rmcp::model::Tool> = serde_json::from_value(page["tools"].clone()).unwrap();
    assert_eq!(parsed.len(), 4);
    assert_eq!(
        parsed[1]
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint),
        Some(true)
    );
}

#[test]
fn foreign_and_oversized_cursors_are_refused() {
    let server = server(2);
    for bad in ["abc", "-1", "99999999999999999999999", ""] {
        assert!(server.list(&reader(), Some(bad)).is_err(), "{bad}");
    }
    // A cursor past the end is an empty last page, not a panic.
    let past = server.list(&reader(), Some("400")).unwrap();
    assert_eq!(past["tools"], json!([]));
}

#[tokio::test]
async fn calls_answer_structured_content_and_its_json_as_text() {
    let server = server(10);
    let result = server
        .call(
            reader(),
            &json!({"name": "a_one", "arguments": {"month": "2026-09"}}),
        )
        .await;
    assert_eq!(result["isError"], false);
    assert_eq!(result["structuredContent"], json!({"month": "2026-09"}));
    let text = result["content"][0]["text"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(text).unwrap(),
        json!({"month": "2026-09"})
    );
    let parsed: rmcp::model::CallToolResult = serde_json::from_value(result).unwrap();
    assert_eq!(parsed.is_error, Some(false));
}

#[tokio::test]
async fn bad_arguments_unknown_tools_and_missing_scopes_are_error_results() {
    let server = server(10);
    let bad = server
        .call(
            reader(),
            &json!({"name": "a_one", "arguments": {"month": "Sept"}}),
        )
        .await;
    assert_eq!(bad["isError"], true);
    let text = bad["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("invalid_arguments") && text.contains("month"),
        "{text}"
    );

    let unknown = server
        .call(reader(), &json!({"name": "a_onee", "arguments": {}}))
        .await;
    assert_eq!(unknown["isError"], true);
    assert!(
        unknown["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("unknown_tool")
    );

    let forbidden = server
        .call(reader(), &json!({"name": "secret", "arguments": {}}))
        .await;
    assert_eq!(forbidden["isError"], true);
    assert!(
        forbidden["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("forbidden")
    );

    let not_object = server
        .call(reader(), &json!({"name": "a_one", "arguments": [1]}))
        .await;
    assert_eq!(not_object["isError"], true);
}

#[tokio::test]
async fn calls_the_runtime_never_ran_are_reported_to_the_hook() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let server = ToolServer::new(
        runtime(),
        None,
        Options {
            on_call: Some(Arc::new(move |tool, envelope| {
                if let Ok(mut seen) = sink.lock() {
                    seen.push(format!("{tool}:{}", envelope.status()));
                }
            })),
            ..Options::default()
        },
    );
    server
        .call(
            reader(),
            &json!({"name": "a_one", "arguments": {"month": "2026-09"}}),
        )
        .await;
    server
        .call(reader(), &json!({"name": "nope", "arguments": {}}))
        .await;
    server
        .call(
            reader(),
            &json!({"name": "a_one", "arguments": "not an object"}),
        )
        .await;
    // The runtime counts the call it ran; the hook hears only those that
    // never reached it: an unknown tool, arguments that are not an object.
    assert_eq!(*seen.lock().unwrap(), ["unknown:error", "a_one:error"]);
}

#[test]
fn speaks_the_three_revisions() {
    use rmcp::ServerHandler;
    let versions = server(1).supported_protocol_versions();
    let names: Vec<&str> = versions.iter().map(|v| v.as_str()).collect();
    assert_eq!(names, super::PROTOCOL_VERSIONS);
}

mod tasks {
    use std::time::Duration;

    use rmcp::model::TaskStatus;
    use serde_json::{Value, json};
    use toolfleet_core::{Envelope, ErrorCode, JobState, Principal, ToolError};

    use crate::jobs::{BoxFuture, JobView, Jobs, iso8601, plausible, task_of, task_status};

    const ID: &str = "01a00000-0000-7000-8000-000000000001";

    fn job(state: JobState, envelope: Envelope) -> JobView {
        JobView {
            id: ID.into(),
            tool: "ocr".into(),
            state,
            envelope,
            progress: Some(json!({"done": 1})),
            created_at: 1_764_066_600_000,
            updated_at: 1_764_066_601_234,
            input_requests: None,
        }
    }

    #[test]
    fn a_job_waiting_for_its_clients_input_is_an_input_required_task() {
        let asked = json!({"confirm": {"method": "elicitation/create",
            "params": {"message": "Delete?", "requestedSchema": {"type": "object", "properties": {}}}}});
        let waiting = JobView {
            input_requests: asked.as_object().cloned(),
            ..job(JobState::Retrying, Envelope::running(ID, 1))
        };
        let task = serde_json::to_value(task_of(&waiting, 1, None)).expect("json");
        assert_eq!(task["status"], "input_required");
        assert_eq!(
            task["inputRequests"]["confirm"]["method"],
            "elicitation/create"
        );
        // Settled, or nothing pending: no input asked.
        let done = JobView {
            input_requests: asked.as_object().cloned(),
            ..job(JobState::Cancelled, Envelope::running(ID, 1))
        };
        let task = serde_json::to_value(task_of(&done, 1, None)).expect("json");
        assert_eq!(task["status"], "cancelled");
        assert!(task.get("inputRequests").is_none());
        let none = JobView {
            input_requests: Some(serde_json::Map::new()),
            ..job(JobState::Retrying, Envelope::running(ID, 1))
        };
        let task = serde_json::to_value(task_of(&none, 1, None)).expect("json");
        assert_eq!(task["status"], "working");
    }

    #[test]
    fn job_states_map_to_task_statuses() {
        for (state, status) in [
            (JobState::Queued, TaskStatus::Working),
            (JobState::Running, TaskStatus::Working),
            (JobState::Retrying, TaskStatus::Working),
            (JobState::Succeeded, TaskStatus::Completed),
            (JobState::Failed, TaskStatus::Failed),
            (JobState::Cancelled, TaskStatus::Cancelled),
        ] {
            assert_eq!(task_status(state), status, "{state}");
        }
    }

    #[test]
    fn tasks_carry_the_poll_hint_times_and_result() {
        let running = Envelope::running(ID, 20);
        let task = task_of(&job(JobState::Running, running), 20, None);
        let wire = serde_json::to_value(&task).unwrap();
        assert_eq!(wire["taskId"], ID);
        assert_eq!(wire["status"], "working");
        assert_eq!(wire["pollIntervalMs"], 20_000);
        assert_eq!(wire["createdAt"], "2025-11-25T10:30:00.000Z");
        assert_eq!(wire["lastUpdatedAt"], "2025-11-25T10:30:01.234Z");
        assert!(wire["statusMessage"].as_str().unwrap().contains("running"));

        let result = json!({"content": [], "isError": false});
        let done = task_of(
            &job(JobState::Succeeded, Envelope::ok(json!({}).into(), "c")),
            20,
            result.as_object().cloned(),
        );
        assert_eq!(serde_json::to_value(&done).unwrap()["result"], result);

        let failed = task_of(
            &job(
                JobState::Failed,
                Envelope::error(ToolError::not_found("gone")),
            ),
            20,
            None,
        );
        let wire = serde_json::to_value(&failed).unwrap();
        assert_eq!(wire["status"], "failed");
        assert_eq!(wire["error"]["message"], "gone");

        // The tool answered an error: completed, with its error result.
        let result = json!({"content": [{"type": "text", "text": "no"}], "isError": true});
        let answered = task_of(
            &job(
                JobState::Failed,
                Envelope::error(ToolError::failed("no", false)),
            ),
            20,
            result.as_object().cloned(),
        );
        let wire = serde_json::to_value(&answered).unwrap();
        assert_eq!(wire["status"], "completed");
        assert_eq!(wire["result"], result);
        assert!(wire.get("error").is_none());
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert!(plausible(ID) && !plausible("nope") && !plausible(&"a".repeat(37)));
    }

    /// One tenant's job, in memory, queued; a cancel finds it settled in
    /// the given state (`Cancelled`: the cancel took).
    struct OneJob(JobState);

    /// The usual one: a cancel takes.
    const ONE_JOB: OneJob = OneJob(JobState::Cancelled);

    impl Jobs for OneJob {
        fn job<'a>(
            &'a self,
            principal: &'a Principal,
            id: &'a str,
        ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>> {
            Box::pin(async move {
                Ok((principal.tenant == "acme" && id == ID)
                    .then(|| job(JobState::Queued, Envelope::running(ID, 5))))
            })
        }
        fn wait<'a>(
            &'a self,
            principal: &'a Principal,
            id: &'a str,
            _since: i64,
            wait: Duration,
        ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>> {
            // Nothing changes here: a wait lasts (a little of) its time.
            Box::pin(async move {
                tokio::time::sleep(wait.min(Duration::from_millis(20))).await;
                self.job(principal, id).await
            })
        }
        fn cancel<'a>(
            &'a self,
            principal: &'a Principal,
            id: &'a str,
        ) -> BoxFuture<'a, Result<Option<JobView>, ToolError>> {
            Box::pin(async move {
                let envelope = match self.0 {
                    JobState::Succeeded => Envelope::ok(json!({}).into(), "c"),
                    _ => Envelope::error(ToolError::new(ErrorCode::Cancelled, "cancelled")),
                };
                Ok((principal.tenant == "acme" && id == ID).then(|| job(self.0, envelope)))
            })
        }
        fn list<'a>(
            &'a self,
            principal: &'a Principal,
            _cursor: Option<&'a str>,
            _limit: u32,
        ) -> BoxFuture<'a, Result<crate::JobList, ToolError>> {
            Box::pin(async move {
                let jobs = self.job(principal, ID).await?;
                Ok(crate::JobList {
                    jobs: jobs.into_iter().collect(),
                    next_cursor: None,
                })
            })
        }
        fn answer<'a>(
            &'a self,
            _principal: &'a Principal,
            _ticket: &'a str,
            answer: Value,
        ) -> BoxFuture<'a, Envelope> {
            Box::pin(async move { Envelope::ok(answer.into(), "c") })
        }
    }

    #[tokio::test]
    async fn tasks_are_found_only_within_the_tenant() {
        let server = crate::ToolServer::new(
            super::runtime(),
            None,
            crate::Options {
                jobs: Some(std::sync::Arc::new(ONE_JOB)),
                ..crate::Options::default()
            },
        );
        let of = |tenant: &str| Principal::new(tenant, "alice", Vec::<String>::new());
        assert!(server.job(&of("acme"), ID).await.is_ok());
        for (tenant, id) in [("globex", ID), ("acme", "not-a-uuid")] {
            let error = server.job(&of(tenant), id).await.unwrap_err();
            assert!(error.message.contains("no task"), "{tenant} {id}");
        }
        use rmcp::ServerHandler;
        assert!(server.get_info().capabilities.supports_tasks());
        assert!(
            !super::server(1).get_info().capabilities.supports_tasks(),
            "no tasks without jobs"
        );
    }

    fn with_jobs(
        principal: Option<std::sync::Arc<toolfleet_core::Principal>>,
    ) -> crate::ToolServer {
        crate::ToolServer::new(
            super::runtime(),
            principal,
            crate::Options {
                jobs: Some(std::sync::Arc::new(ONE_JOB)),
                ..crate::Options::default()
            },
        )
    }

    #[test]
    fn only_2025_11_25_task_requests_are_answered_beside_rmcp() {
        use crate::core_tasks::{Route, route};
        let request = |method: &str, params: Value| json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let init = |v: &str| request("initialize", json!({"protocolVersion": v}));
        assert_eq!(route(&init("2025-11-25"), false), Route::PatchInitialize);
        assert_eq!(route(&init("2025-06-18"), false), Route::Pass);
        let task_call = request("tools/call", json!({"name": "x", "task": {}}));
        assert_eq!(route(&task_call, true), Route::Answer);
        // Another revision's messages are rmcp's, tasks/get included.
        assert_eq!(route(&task_call, false), Route::Pass);
        for method in ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"] {
            assert_eq!(route(&request(method, json!({})), true), Route::Answer);
            assert_eq!(route(&request(method, json!({})), false), Route::Pass);
        }
        assert_eq!(
            route(&request("tools/call", json!({"name": "x"})), true),
            Route::Pass
        );
        assert_eq!(
            route(&request("tools/list", json!({})), true),
            Route::PatchToolsList
        );
        // A notification is never answered.
        let note = json!({"jsonrpc": "2.0", "method": "tasks/get", "params": {}});
        assert_eq!(route(&note, true), Route::Pass);
    }

    /// A job that settles on its own between the read and the cancel is
    /// refused as a settled one is, not answered as if cancelled.
    #[tokio::test]
    async fn a_task_that_completes_while_being_cancelled_is_refused() {
        let acme = std::sync::Arc::new(toolfleet_core::Principal::new("acme", "a", ["read"]));
        let cancel =
            json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/cancel", "params": {"taskId": ID}});
        for (finds, refused) in [(JobState::Succeeded, true), (JobState::Cancelled, false)] {
            let server = crate::ToolServer::new(
                super::runtime(),
                None,
                crate::Options {
                    jobs: Some(std::sync::Arc::new(OneJob(finds))),
                    ..crate::Options::default()
                },
            );
            let answer = server
                .answer_core_task(acme.clone(), &cancel, None, None)
                .await;
            if refused {
                assert_eq!(answer["error"]["code"], -32602, "{answer}");
                let message = answer["error"]["message"].as_str().unwrap_or_default();
                assert!(message.contains("cannot be cancelled"), "{answer}");
            } else {
                assert_eq!(answer["result"]["status"], "cancelled", "{answer}");
            }
        }
    }

    #[tokio::test]
    async fn a_2025_11_25_task_is_its_job_within_the_tenant() {
        let server = with_jobs(None);
        let acme = std::sync::Arc::new(toolfleet_core::Principal::new("acme", "a", ["read"]));
        let get =
            json!({"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"taskId": ID}});
        let answer = server
            .answer_core_task(acme.clone(), &get, None, None)
            .await;
        assert_eq!(answer["id"], 7);
        let task = &answer["result"];
        assert_eq!(task["taskId"], ID);
        assert_eq!(task["status"], "working");
        assert_eq!(task["ttl"], Value::Null);
        assert_eq!(task["pollInterval"], 5000);
        assert_eq!(task["createdAt"], "2025-11-25T10:30:00.000Z");
        let listed = server
            .answer_core_task(
                acme.clone(),
                &json!({"jsonrpc": "2.0", "id": 8, "method": "tasks/list"}),
                None,
                None,
            )
            .await;
        assert_eq!(listed["result"]["tasks"][0]["taskId"], ID);
        let globex = std::sync::Arc::new(toolfleet_core::Principal::new("globex", "m", ["read"]));
        let theirs = server.answer_core_task(globex, &get, None, None).await;
        assert!(
            theirs["error"]["message"]
                .as_str()
                .unwrap()
                .contains("no task"),
            "{theirs}"
        );
        let no_id = json!({"jsonrpc": "2.0", "id": 9, "method": "tasks/result", "params": {}});
        let refused = server.answer_core_task(acme, &no_id, None, None).await;
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
    }

    #[tokio::test]
    async fn a_query_called_as_a_task_is_refused_and_a_stop_ends_a_result_wait() {
        let acme = std::sync::Arc::new(toolfleet_core::Principal::new("acme", "a", ["read"]));
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "a_one", "arguments": {"month": "2026-09"}, "task": {}}});
        let refused = with_jobs(None)
            .answer_core_task(acme.clone(), &call, None, None)
            .await;
        assert_eq!(refused["error"]["code"], -32601, "{refused}");
        // The job never settles; the process stops: the wait ends.
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let server = crate::ToolServer::new(
            super::runtime(),
            None,
            crate::Options {
                jobs: Some(std::sync::Arc::new(ONE_JOB)),
                stop: Some(stopping),
                ..crate::Options::default()
            },
        );
        let result = json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/result",
            "params": {"taskId": ID}});
        let waiting =
            tokio::spawn(async move { server.answer_core_task(acme, &result, None, None).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "tasks/result answered an unsettled task"
        );
        stop.send(true).unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the stop ends the wait")
            .unwrap();
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("stopping"),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn stdio_adds_the_2025_11_25_tasks_around_rmcp() {
        use rmcp::ServiceExt;
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let principal = std::sync::Arc::new(toolfleet_core::Principal::new("acme", "a", ["read"]));
        let server = with_jobs(Some(principal.clone()));
        let (mut to_server, server_in) = tokio::io::duplex(64 * 1024);
        let (server_out, from_server) = tokio::io::duplex(64 * 1024);
        let (transport, writing) =
            crate::core_tasks::stdio(server.clone(), principal, server_in, server_out, 4096);
        tokio::spawn(async move {
            if let Ok(running) = server.serve(transport).await {
                let _ = running.waiting().await;
            }
        });
        let mut lines = BufReader::new(from_server).lines();
        let mut send = async move |message: Value| {
            to_server
                .write_all(format!("{message}\n").as_bytes())
                .await
                .unwrap();
        };
        send(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"}}}),
        )
        .await;
        let init: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(init["result"]["protocolVersion"], "2025-11-25");
        assert_eq!(
            init["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"],
            json!({})
        );
        send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        send(json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"taskId": ID}}))
            .await;
        let got: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(got["id"], 2);
        assert_eq!(got["result"]["taskId"], ID);
        send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})).await;
        let listed: Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        let tools = listed["result"]["tools"].as_array().unwrap();
        assert!(!tools.is_empty());
        // Queries may not run as tasks: nothing is added to them.
        assert!(
            tools.iter().all(|t| t.get("execution").is_none()),
            "{listed}"
        );
        // An over-long line is refused, and the session goes on.
        send(json!({"jsonrpc": "2.0", "id": 4, "method": "ping", "params": {"pad": "x".repeat(5000)}}))
            .await;
        let refused: Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(refused["error"]["code"], -32700, "{refused}");
        send(json!({"jsonrpc": "2.0", "id": 5, "method": "ping"})).await;
        let pong: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(pong["id"], 5, "{pong}");
        drop(send);
        // The client closes its side: the session ends, and its writer with it.
        tokio::time::timeout(std::time::Duration::from_secs(10), writing)
            .await
            .expect("the writer ends")
            .unwrap();
    }

    #[tokio::test]
    async fn an_accepted_elicitation_answers_the_ticket_and_a_decline_does_not() {
        let acme = Principal::new("acme", "alice", Vec::<String>::new());
        let accept: rmcp::model::ElicitResult =
            serde_json::from_value(json!({"action": "accept", "content": {"answer": "travel"}}))
                .unwrap();
        let answered = crate::answered(&ONE_JOB, &acme, "t1", accept).await;
        assert_eq!(answered.status(), "ok");
        let decline: rmcp::model::ElicitResult =
            serde_json::from_value(json!({"action": "decline"})).unwrap();
        let declined = crate::answered(&ONE_JOB, &acme, "t1", decline).await;
        let Envelope::Error { error, .. } = declined else {
            panic!("a decline answered the ticket");
        };
        assert!(error.message.contains("declined") && error.message.contains("t1"));
    }

    #[test]
    fn the_question_is_a_form_with_the_options_as_an_enum() {
        let params =
            crate::elicit_params("Which?", &["travel".to_owned(), "meals".to_owned()]).unwrap();
        let wire = serde_json::to_value(&params).unwrap();
        assert_eq!(wire["mode"], "form");
        assert_eq!(wire["message"], "Which?");
        assert_eq!(
            wire["requestedSchema"]["properties"]["answer"]["enum"],
            json!(["travel", "meals"])
        );
    }
}

#[test]
fn every_log_level_is_an_mcp_level() {
    use toolfleet_core::LogLevel::*;
    for level in [
        Debug, Info, Notice, Warning, Error, Critical, Alert, Emergency,
    ] {
        let note = super::log_message(level, "t", "m".into()).expect("an MCP level");
        assert_eq!(
            serde_json::to_value(&note).unwrap()["level"],
            serde_json::to_value(level).unwrap()
        );
    }
}
