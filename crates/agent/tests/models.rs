//! The model clients against the scripted server, over HTTP, in both wire
//! formats: conversations, retries, refusals, timeouts and the API key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolfleet_agent::model::{
    AnthropicModel, ApiKey, Model, ModelError, ModelReply, ModelRequest, OpenAiModel, ToolResult,
    ToolSpec, Turn, Usage, api_key, model_for,
};
use toolfleet_agent::testing::{Scripted, ScriptedModel};
use toolfleet_core::config::{AgentSpec, ModelProvider};

const PROVIDERS: [ModelProvider; 2] = [ModelProvider::Openai, ModelProvider::Anthropic];

fn usage(input_tokens: u64, output_tokens: u64) -> Usage {
    Usage {
        input_tokens,
        output_tokens,
    }
}

fn client() -> reqwest::Client {
    toolfleet_executors::http_client().expect("the HTTP client")
}

/// A client of `model` on the server with fast retries.
fn model(
    server: &ScriptedModel,
    provider: ModelProvider,
    model: &str,
    key: Option<&str>,
    timeout: Duration,
) -> Arc<dyn Model> {
    let key = key.map(ApiKey::new);
    let (retries, delay) = (2, Duration::from_millis(5));
    let url = server.base_url();
    match provider {
        ModelProvider::Openai => {
            let client = OpenAiModel::new(client(), &url, model, key, timeout);
            Arc::new(
                client
                    .expect("an OpenAI client")
                    .with_retries(retries, delay),
            )
        }
        ModelProvider::Anthropic => {
            let client = AnthropicModel::new(client(), &url, model, key, timeout);
            Arc::new(
                client
                    .expect("an Anthropic client")
                    .with_retries(retries, delay),
            )
        }
    }
}

fn quick(server: &ScriptedModel, provider: ModelProvider, name: &str) -> Arc<dyn Model> {
    model(server, provider, name, None, Duration::from_secs(5))
}

fn lookup_tool() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "lookup".into(),
        description: "Looks a thing up.".into(),
        input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
    }]
}

fn task() -> Vec<Turn> {
    vec![Turn::User {
        text: "Find the thing.".into(),
    }]
}

async fn ask(model: &dyn Model, turns: &[Turn]) -> Result<ModelReply, ModelError> {
    let tools = lookup_tool();
    model
        .complete(&ModelRequest {
            system: "You find things.",
            turns,
            tools: &tools,
            max_output_tokens: 128,
        })
        .await
}

fn answer(text: &str) -> Scripted {
    Scripted::Answer {
        text: text.into(),
        usage: usage(1, 1),
    }
}

#[tokio::test]
async fn a_tool_call_then_an_answer_round_trips_in_both_formats() {
    let server = ScriptedModel::start().await;
    for provider in PROVIDERS {
        let name = format!("{provider:?}-two-steps");
        server.script(
            &name,
            vec![
                Scripted::Calls {
                    calls: vec![
                        ("lookup".into(), json!({"q": "a"})),
                        ("lookup".into(), json!({"q": "b"})),
                    ],
                    usage: usage(100, 20),
                },
                Scripted::Answer {
                    text: "Found both.".into(),
                    usage: usage(150, 5),
                },
            ],
        );
        let model = quick(&server, provider, &name);
        let mut turns = task();
        let mut used = Usage::default();

        let first = ask(&*model, &turns).await.expect("the first reply");
        used.add(first.usage);
        assert_eq!(first.text, None, "{provider:?}");
        assert_eq!(first.calls.len(), 2);
        assert_eq!(first.calls[0].name, "lookup");
        assert_eq!(first.calls[0].args, json!({"q": "a"}));
        assert_eq!(first.calls[1].id, "call_0_1");
        let results = first
            .calls
            .iter()
            .map(|call| ToolResult {
                call_id: call.id.clone(),
                name: call.name.clone(),
                content: format!("result of {}", call.args["q"].as_str().unwrap_or("?")),
                is_error: call.args["q"] == "b",
            })
            .collect();
        turns.push(Turn::Assistant {
            text: first.text,
            calls: first.calls,
        });
        turns.push(Turn::Tool { results });

        let second = ask(&*model, &turns).await.expect("the second reply");
        used.add(second.usage);
        assert_eq!(second.text.as_deref(), Some("Found both."));
        assert!(second.calls.is_empty());
        assert_eq!(used, usage(250, 25), "{provider:?}");

        // The server saw the tool offered and both results, the failed one marked.
        let seen = server.requests(&name);
        assert_eq!(seen.len(), 2);
        let shown = seen[1].to_string();
        assert!(shown.contains("result of a"), "{shown}");
        match provider {
            ModelProvider::Openai => {
                assert_eq!(seen[0]["tools"][0]["function"]["name"], "lookup");
                assert_eq!(seen[0]["messages"][0]["role"], "system");
                assert_eq!(seen[1]["messages"][4]["tool_call_id"], "call_0_1");
                let content = seen[1]["messages"][4]["content"].as_str().unwrap_or("");
                assert!(content.starts_with("ERROR: "), "{content}");
            }
            ModelProvider::Anthropic => {
                assert_eq!(seen[0]["tools"][0]["name"], "lookup");
                assert_eq!(seen[0]["system"], "You find things.");
                let results = &seen[1]["messages"][2]["content"];
                assert_eq!(results[1]["tool_use_id"], "call_0_1");
                assert_eq!(results[1]["is_error"], true);
                assert_eq!(results[0]["is_error"], false);
            }
        }

        // Sending the same conversation again gets the same reply.
        let again = ask(&*model, &turns).await.expect("the reply again");
        assert_eq!(again.text.as_deref(), Some("Found both."));
    }
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_retried() {
    let server = ScriptedModel::start().await;
    for provider in PROVIDERS {
        let name = format!("{provider:?}-flaky");
        server.script(&name, vec![answer("at last")]);
        server.fail_next(&name, 429, 1);
        server.fail_next(&name, 500, 1);
        let reply = ask(&*quick(&server, provider, &name), &task()).await;
        assert_eq!(reply.expect("a reply").text.as_deref(), Some("at last"));
        assert_eq!(server.requests(&name).len(), 3, "{provider:?}");

        // Past the retries the model is unavailable.
        server.fail_next(&name, 503, 3);
        let err = ask(&*quick(&server, provider, &name), &task()).await;
        match err {
            Err(ModelError::Unavailable(m)) => {
                assert!(m.contains("503") && m.contains("3 attempts"), "{m}")
            }
            other => panic!("{provider:?}: {other:?}"),
        }
        assert_eq!(server.requests(&name).len(), 6);
    }
}

#[tokio::test]
async fn a_bad_request_is_refused_without_retry() {
    let server = ScriptedModel::start().await;
    for provider in PROVIDERS {
        let name = format!("{provider:?}-refused");
        // No script: the server answers 400 with its reason.
        let err = ask(&*quick(&server, provider, &name), &task()).await;
        match err {
            Err(ModelError::Refused(m)) => {
                assert!(
                    m.contains("400") && m.contains("no reply for step 0"),
                    "{m}"
                )
            }
            other => panic!("{provider:?}: {other:?}"),
        }
        assert_eq!(server.requests(&name).len(), 1, "no retry");

        server.fail_next(&name, 404, 1);
        let err = ask(&*quick(&server, provider, &name), &task()).await;
        assert!(matches!(err, Err(ModelError::Refused(_))), "{err:?}");
        assert_eq!(server.requests(&name).len(), 2, "no retry");
    }
}

#[tokio::test]
async fn a_slow_model_times_out_and_is_unavailable() {
    let server = ScriptedModel::start().await;
    for provider in PROVIDERS {
        let name = format!("{provider:?}-slow");
        let slow = Scripted::Delay(Duration::from_secs(2), Box::new(answer("too late")));
        server.script(&name, vec![slow]);
        let model = model(&server, provider, &name, None, Duration::from_millis(150));
        let started = Instant::now();
        let err = ask(&*model, &task()).await;
        match err {
            Err(ModelError::Unavailable(m)) => {
                assert!(m.contains("did not answer within"), "{m}")
            }
            other => panic!("{provider:?}: {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_millis(1500));
        assert_eq!(server.requests(&name).len(), 3, "two retries");
    }
}

#[tokio::test]
async fn the_key_travels_in_the_right_header_and_nowhere_else() {
    let server = ScriptedModel::start().await;
    server.expect_key("sk-right-key");
    for provider in PROVIDERS {
        let name = format!("{provider:?}-keyed");
        server.script(&name, vec![answer("welcome")]);
        let timeout = Duration::from_secs(5);

        let good = model(&server, provider, &name, Some("sk-right-key"), timeout);
        let reply = ask(&*good, &task()).await.expect("a reply with the key");
        assert_eq!(reply.text.as_deref(), Some("welcome"));

        let wrong = model(&server, provider, &name, Some("sk-wrong-key"), timeout);
        let debug = debug_of(&server, provider, "sk-wrong-key");
        assert!(debug.contains("authorization") || debug.contains("x-api-key"));
        assert!(!debug.contains("sk-wrong-key"), "{debug}");
        let err = ask(&*wrong, &task()).await;
        let text = match &err {
            Err(e @ ModelError::Refused(m)) => {
                assert!(m.contains("401"), "{m}");
                format!("{e} {e:?}")
            }
            other => panic!("{provider:?}: {other:?}"),
        };
        assert!(!text.contains("sk-wrong-key"), "{text}");

        let none = quick(&server, provider, &name);
        let err = ask(&*none, &task()).await;
        assert!(matches!(err, Err(ModelError::Refused(_))), "{err:?}");
        // Refusals are not retried: three requests in all, one for each client.
        assert_eq!(server.requests(&name).len(), 3);
    }
}

/// A client's `Debug`, which lists header names but no values.
fn debug_of(server: &ScriptedModel, provider: ModelProvider, key: &str) -> String {
    let (url, key, timeout) = (
        server.base_url(),
        Some(ApiKey::new(key)),
        Duration::from_secs(1),
    );
    match provider {
        ModelProvider::Openai => {
            format!("{:?}", OpenAiModel::new(client(), &url, "m", key, timeout))
        }
        ModelProvider::Anthropic => {
            format!(
                "{:?}",
                AnthropicModel::new(client(), &url, "m", key, timeout)
            )
        }
    }
}

fn spec(provider: ModelProvider, base_url: &str) -> AgentSpec {
    AgentSpec {
        provider,
        base_url: base_url.into(),
        base_url_env: None,
        model: "m".into(),
        api_key_env: None,
        api_key_file: None,
        system_prompt: "You help.".into(),
        tools: vec![],
        scopes: vec![],
        max_steps: 4,
        max_tokens: 1000,
        max_wall_s: 10.0,
        max_output_tokens: 64,
        timeout_s: 5.0,
    }
}

#[test]
fn api_keys_come_from_the_environment_or_a_file() {
    let mut spec = spec(ModelProvider::Openai, "http://127.0.0.1:9/v1");
    assert_eq!(api_key(&spec), Ok(None));

    // A variable every test process has, so nothing is set while other tests run.
    let path = std::env::var("PATH").expect("PATH is set");
    spec.api_key_env = Some("PATH".into());
    let key = api_key(&spec).expect("a key").expect("some key");
    assert_eq!(format!("{key:?} {key}"), "*** ***");
    assert_eq!(key, ApiKey::new(path.trim()));

    spec.api_key_env = Some("TOOLFLEET_TEST_NO_SUCH_KEY_VARIABLE".into());
    let err = api_key(&spec).unwrap_err();
    assert!(
        err.contains("`TOOLFLEET_TEST_NO_SUCH_KEY_VARIABLE` is not set"),
        "{err}"
    );

    let file = std::env::temp_dir().join(format!("toolfleet-key-{}", std::process::id()));
    std::fs::write(&file, "  sk-from-file\n").expect("the key file");
    spec.api_key_env = None;
    spec.api_key_file = Some(file.display().to_string());
    let key = api_key(&spec).expect("a key").expect("some key");
    assert_eq!(key, ApiKey::new("sk-from-file"));
    std::fs::write(&file, "\n").expect("the key file");
    let err = api_key(&spec).unwrap_err();
    assert!(err.contains("empty") && !err.contains("sk-"), "{err}");
    std::fs::remove_file(&file).expect("the key file removed");
    let err = api_key(&spec).unwrap_err();
    assert!(err.contains("cannot read the API key file"), "{err}");

    spec.api_key_env = Some("PATH".into());
    assert!(api_key(&spec).unwrap_err().contains("not both"));
}

#[tokio::test]
async fn model_for_picks_the_format_and_checks_the_spec() {
    let server = ScriptedModel::start().await;
    server.script("m", vec![answer("hello")]);
    for provider in PROVIDERS {
        let model = model_for(&spec(provider, &server.base_url()), client()).expect("a model");
        let reply = ask(&*model, &task()).await.expect("a reply");
        assert_eq!(reply.text.as_deref(), Some("hello"));
    }
    let routes: Vec<Value> = server.requests("m");
    assert!(routes[0].get("system").is_none() && routes[1]["system"] == "You find things.");

    let good = spec(ModelProvider::Anthropic, &server.base_url());
    for timeout_s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let bad = AgentSpec {
            timeout_s,
            ..good.clone()
        };
        let err = model_for(&bad, client()).err().expect("refused");
        assert!(err.contains("timeout_s"), "{err}");
    }
    for base_url in ["file:///tmp/x", "127.0.0.1:9/v1", "http://x/v1?k=1"] {
        let bad = AgentSpec {
            base_url: base_url.into(),
            ..good.clone()
        };
        let err = model_for(&bad, client()).err().expect("refused");
        assert!(err.contains("base_url"), "{err}");
    }
    let bad = AgentSpec {
        api_key_env: Some("TOOLFLEET_TEST_NO_SUCH_KEY_VARIABLE".into()),
        ..good.clone()
    };
    let err = model_for(&bad, client()).err().expect("refused");
    assert!(err.contains("TOOLFLEET_TEST_NO_SUCH_KEY_VARIABLE"), "{err}");
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    // A port that was free a moment ago; nothing listens there now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let model = OpenAiModel::new(client(), &base_url, "m", None, Duration::from_secs(2))
        .expect("a client")
        .with_retries(1, Duration::from_millis(5));
    let err = ask(&model, &task()).await;
    match err {
        Err(ModelError::Unavailable(m)) => assert!(m.contains("could not connect"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_server_refuses_what_the_real_apis_refuse() {
    let server = ScriptedModel::start().await;
    server.script("strict", vec![answer("fine"), answer("fine")]);
    let http = client();
    let post = |route: &str, body: Value, anthropic_version: bool| {
        let mut request = http
            .post(format!("{}/{route}", server.base_url()))
            .header("content-type", "application/json")
            .body(body.to_string());
        if anthropic_version {
            request = request.header("anthropic-version", "2023-06-01");
        }
        request.send()
    };
    // Anthropic: roles alternate, and the version header is required.
    let two_users = json!({"model": "strict", "max_tokens": 5, "messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]});
    let answer = post("messages", two_users, true).await.expect("an answer");
    assert_eq!(answer.status(), 400);
    let body: Value = serde_json::from_slice(&answer.bytes().await.expect("a body")).expect("JSON");
    assert_eq!(body["type"], "error");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("alternate"), "{body}");
    let fine =
        json!({"model": "strict", "max_tokens": 5, "messages": [{"role": "user", "content": "a"}]});
    let answer = post("messages", fine.clone(), false)
        .await
        .expect("an answer");
    assert_eq!(answer.status(), 400);
    let answer = post("messages", fine, true).await.expect("an answer");
    assert_eq!(answer.status(), 200);

    // OpenAI: a tool message answers a call of the message before it.
    let stray = json!({"model": "strict", "messages": [
        {"role": "user", "content": "a"},
        {"role": "tool", "tool_call_id": "call_9", "content": "x"}]});
    let answer = post("chat/completions", stray, false)
        .await
        .expect("an answer");
    assert_eq!(answer.status(), 400);
    let body: Value = serde_json::from_slice(&answer.bytes().await.expect("a body")).expect("JSON");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("call_9"),
        "{body}"
    );
}
