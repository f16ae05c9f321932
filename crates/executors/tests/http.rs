//! The HTTP executor against a real server on 127.0.0.1: a hand-written
//! HTTP/1.1 responder that records each request and answers as told.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use toolfleet_core::{CallCtx, ErrorCode, Executor, Principal, ToolError};
use toolfleet_executors::{HttpExecutor, http_client};

/// How the test server answers.
#[derive(Clone)]
enum Reply {
    /// These bytes, then close.
    Bytes(Vec<u8>),
    /// Nothing, ever, with the connection held open.
    Silence,
    /// A 200 head, then body bytes until the client hangs up (bounded).
    Endless { declared_length: Option<u64> },
}

/// One request as the server read it.
struct Seen {
    head: String,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    }
}

/// Starts a server; answers every connection with `reply`.
async fn serve(reply: Reply) -> (String, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/tool", listener.local_addr().unwrap());
    let (seen_tx, seen_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(answer(stream, reply.clone(), seen_tx.clone()));
        }
    });
    (url, seen_rx)
}

async fn answer(mut stream: TcpStream, reply: Reply, seen: mpsc::UnboundedSender<Seen>) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    let _ = seen.send(request);
    match reply {
        Reply::Bytes(bytes) => {
            let _ = stream.write_all(&bytes).await;
        }
        Reply::Silence => tokio::time::sleep(Duration::from_secs(60)).await,
        Reply::Endless { declared_length } => stream_forever(&mut stream, declared_length).await,
    }
}

async fn read_request(stream: &mut TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).await.ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut seen = Seen {
        head,
        body: buf[head_end..].to_vec(),
    };
    let length: usize = seen
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while seen.body.len() < length {
        let n = stream.read(&mut chunk).await.ok().filter(|&n| n > 0)?;
        seen.body.extend_from_slice(&chunk[..n]);
    }
    Some(seen)
}

/// Writes up to 64 MiB, stopping as soon as the client is gone.
async fn stream_forever(stream: &mut TcpStream, declared_length: Option<u64>) {
    let length = declared_length
        .map(|n| format!("Content-Length: {n}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}Connection: close\r\n\r\n"
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let block = vec![b' '; 64 * 1024];
    for _ in 0..1024 {
        if stream.write_all(&block).await.is_err() {
            return;
        }
    }
}

fn response(status: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut text = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    Reply::Bytes(text.into_bytes())
}

fn ctx() -> CallCtx {
    CallCtx::new(Arc::new(Principal::new("acme", "alice", ["x"])))
}

fn executor(url: &str) -> HttpExecutor {
    HttpExecutor::new(http_client().unwrap(), url)
        .unwrap()
        .with_timeout(Duration::from_secs(5))
}

async fn call(executor: &HttpExecutor, args: Value) -> Result<Value, ToolError> {
    executor
        .execute(ctx(), args)
        .await
        .map(|json| json.to_value())
}

#[tokio::test]
async fn a_json_answer_is_the_result() {
    let (url, _) = serve(response(
        "200 OK",
        &[("Content-Type", "application/json")],
        r#"{"pages": 3}"#,
    ))
    .await;
    assert_eq!(
        call(&executor(&url), json!({"id": 1})).await.unwrap(),
        json!({"pages": 3})
    );
}

#[tokio::test]
async fn the_request_carries_the_arguments_and_the_calls_keys() {
    let (url, mut seen) = serve(response("200 OK", &[], "{}")).await;
    let headers = [(
        reqwest::header::AUTHORIZATION,
        reqwest::header::HeaderValue::from_static("Bearer s3cret"),
    )]
    .into_iter()
    .collect();
    let executor = executor(&url).with_headers(headers);
    let ctx = ctx().with_run_id("run-7").with_idempotency_key("key-42");
    executor.execute(ctx, json!({"id": 1})).await.unwrap();
    let request = seen.recv().await.unwrap();
    assert!(
        request.head.starts_with("POST /tool HTTP/1.1"),
        "{}",
        request.head
    );
    assert_eq!(request.header("idempotency-key").as_deref(), Some("key-42"));
    assert_eq!(request.header("toolfleet-run-id").as_deref(), Some("run-7"));
    assert_eq!(request.header("toolfleet-tenant").as_deref(), Some("acme"));
    assert_eq!(
        request.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(
        request.header("authorization").as_deref(),
        Some("Bearer s3cret")
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&request.body).unwrap(),
        json!({"id": 1})
    );
}

#[tokio::test]
async fn without_a_key_the_call_id_is_the_idempotency_key() {
    let (url, mut seen) = serve(response("200 OK", &[], "{}")).await;
    let ctx = ctx();
    let call_id = ctx.call_id.clone();
    executor(&url).execute(ctx, json!({})).await.unwrap();
    assert_eq!(
        seen.recv().await.unwrap().header("idempotency-key"),
        Some(call_id)
    );
}

#[tokio::test]
async fn a_server_error_is_retryable_and_quoted() {
    let (url, _) = serve(response(
        "500 Internal Server Error",
        &[],
        "database is down",
    ))
    .await;
    let err = call(&executor(&url), json!({})).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::ToolFailed);
    assert!(err.retryable);
    assert!(
        err.message.contains("500") && err.message.contains("database is down"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn too_many_requests_is_retryable_after_the_servers_delay() {
    let (url, _) = serve(response(
        "429 Too Many Requests",
        &[("Retry-After", "7")],
        "",
    ))
    .await;
    let err = call(&executor(&url), json!({})).await.unwrap_err();
    assert_eq!(
        (err.code, err.retryable, err.retry_after_s),
        (ErrorCode::ToolFailed, true, Some(7))
    );
    assert!(err.message.contains("429"), "{}", err.message);
}

#[tokio::test]
async fn a_client_error_is_not_retryable() {
    let (url, _) = serve(response("404 Not Found", &[], "no such report")).await;
    let err = call(&executor(&url), json!({})).await.unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::ToolFailed, false));
    assert!(
        err.message.contains("404") && err.message.contains("no such report"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn a_redirect_is_not_followed() {
    let (url, _) = serve(response(
        "302 Found",
        &[("Location", "http://127.0.0.1:1/elsewhere")],
        "",
    ))
    .await;
    let err = call(&executor(&url), json!({})).await.unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::ToolFailed, false));
    assert!(
        err.message.contains("redirects are not followed"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn a_success_that_is_not_json_is_not_retryable() {
    let (url, _) = serve(response("200 OK", &[], "<html>hello</html>")).await;
    let err = call(&executor(&url), json!({})).await.unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::ToolFailed, false));
    assert!(
        err.message
            .contains("answered 200 with a body that is not JSON"),
        "{}",
        err.message
    );
    assert!(err.message.contains("<html>"), "{}", err.message);
}

#[tokio::test]
async fn a_silent_server_times_out() {
    let (url, _) = serve(Reply::Silence).await;
    let executor = executor(&url).with_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let err = call(&executor, json!({})).await.unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::Timeout, true));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_declared_oversized_body_is_refused_unread() {
    let (url, _) = serve(Reply::Endless {
        declared_length: Some(50_000_000),
    })
    .await;
    let executor = executor(&url).with_max_response_bytes(64 * 1024);
    let err = call(&executor, json!({})).await.unwrap_err();
    assert_eq!(
        (err.code, err.retryable),
        (ErrorCode::PayloadTooLarge, false)
    );
    assert!(err.message.contains("50000000"), "{}", err.message);
}

#[tokio::test]
async fn an_endless_body_is_cut_off_at_the_bound() {
    let (url, _) = serve(Reply::Endless {
        declared_length: None,
    })
    .await;
    let executor = executor(&url).with_max_response_bytes(64 * 1024);
    let started = Instant::now();
    let err = call(&executor, json!({})).await.unwrap_err();
    assert_eq!(
        (err.code, err.retryable),
        (ErrorCode::PayloadTooLarge, false)
    );
    assert!(err.message.contains("65536"), "{}", err.message);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_body_exactly_at_the_bound_is_accepted() {
    let body = format!("\"{}\"", "a".repeat(98));
    let (url, _) = serve(response("200 OK", &[], &body)).await;
    let executor = executor(&url).with_max_response_bytes(100);
    assert_eq!(
        call(&executor, json!({})).await.unwrap(),
        json!("a".repeat(98))
    );
}

#[tokio::test]
async fn a_refused_connection_is_retryable() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/tool", listener.local_addr().unwrap());
    drop(listener);
    let err = call(&executor(&url), json!({})).await.unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::ToolFailed, true));
    assert!(err.message.contains("could not connect"), "{}", err.message);
    assert!(
        !err.message.contains(&url),
        "the URL may hold credentials: {}",
        err.message
    );
}

#[tokio::test]
async fn a_key_http_cannot_carry_is_a_bad_request() {
    let (url, _) = serve(response("200 OK", &[], "{}")).await;
    let ctx = ctx().with_idempotency_key("line\nbreak");
    let err = executor(&url).execute(ctx, json!({})).await.unwrap_err();
    assert_eq!((err.code, err.retryable), (ErrorCode::BadRequest, false));
    assert!(err.message.contains("idempotency key"), "{}", err.message);
}

#[test]
fn only_http_and_https_urls_are_accepted() {
    let client = http_client().unwrap();
    assert!(HttpExecutor::new(client.clone(), "https://tools.example/run").is_ok());
    let err = HttpExecutor::new(client.clone(), "ftp://tools.example/run").unwrap_err();
    assert!(err.contains("http://"), "{err}");
    let err = HttpExecutor::new(client, "not a url").unwrap_err();
    assert!(err.contains("not a valid URL"), "{err}");
}
