//! The HTTP server every process runs: its own accept loop over hyper, so
//! that no client can hold it. A process takes at most `max_connections`
//! connections; one more is answered `503` with the contract's envelope and
//! `Retry-After` and closed, while the accept loop goes on. A request's head
//! must arrive within `header_read_timeout`, and a connection idle between
//! requests is closed after the same time (hyper times the wait for each
//! head, the first and every keep-alive one). A request's body must arrive
//! whole within `body_read_timeout` ([`body_deadline`]). On stop, the loop
//! stops accepting and waits for the open connections to finish (streams
//! and long polls end when the server stops).
//!
//! This module never reads what a request asks: it only bounds how long
//! and how many.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body::Frame;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use toolfleet_core::{Envelope, ErrorCode, ToolError};

/// How long and how many, for the connections of one process.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections held at once; one more is refused with 503.
    pub max_connections: usize,
    /// The longest wait for a request's head, and for the next request on
    /// an idle keep-alive connection.
    pub header_read_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

/// Connections refused at once: past this, a refused connection is closed
/// without an answer, so a flood costs no more than these tasks.
const MAX_REFUSING: usize = 256;

/// Serves `router` on `listener` within `limits` until `stopped` turns true,
/// then waits for the open connections to close.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stopped: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let mut stopping = stopped.clone();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopping.wait_for(|stop| *stop) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors, or a connection reset before it was
                // taken: the loop pauses a moment and goes on.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if let Ok(turn) = refusing.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream).await;
                    drop(turn);
                });
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (router, stopped) = (router.clone(), stopped.clone());
        tokio::spawn(async move {
            connection(stream, router, limits.header_read_timeout, stopped).await;
            drop(slot);
        });
    }
    // Every slot back: every connection closed.
    let _ = slots.acquire_many(max as u32).await;
    Ok(())
}

/// Serves one connection until it closes, or shuts it down gracefully once
/// `stopped` turns true.
async fn connection(
    stream: TcpStream,
    router: Router,
    header_read_timeout: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = stopped.wait_for(|stop| *stop) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// Answers a connection past the bound `503` and closes it, within a
/// second whatever the client does.
async fn refuse(mut stream: TcpStream) {
    let body = Envelope::error(
        ToolError::new(
            ErrorCode::Unavailable,
            "this server holds as many connections as it may; try again in a moment",
        )
        .retryable(true),
    )
    .to_json();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent, so closing does not reset the
        // connection before it reads the answer.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// Why a request's body stopped: it did not arrive within
/// `body_read_timeout`.
#[derive(Debug)]
pub struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive in time")
    }
}

impl std::error::Error for BodyTimedOut {}

/// True when `error`, from reading a request body, is (or wraps)
/// [`BodyTimedOut`].
pub fn timed_out(error: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if error.is::<BodyTimedOut>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Middleware: the request's body must arrive whole within `timeout` of the
/// request reaching its handler; after that, reading it fails with
/// [`BodyTimedOut`].
pub async fn body_deadline(timeout: Duration, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let body = Body::new(DeadlineBody {
        deadline: Box::pin(tokio::time::sleep(timeout)),
        inner: body,
    });
    next.run(Request::from_parts(parts, body)).await
}

/// A body that fails once its deadline passes.
struct DeadlineBody {
    deadline: Pin<Box<tokio::time::Sleep>>,
    inner: Body,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use tokio::io::AsyncBufReadExt;

    /// A server of `router` within `limits` on a port of its own.
    async fn start(router: Router, limits: ConnectionLimits) -> (String, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(serve(listener, router, limits, stopped));
        (address, stop)
    }

    /// The status line of what `stream` is answered, or `None` when it is
    /// closed without one.
    async fn status_line(stream: TcpStream) -> Option<String> {
        let mut lines = tokio::io::BufReader::new(stream).lines();
        lines.next_line().await.ok().flatten()
    }

    fn echo() -> Router {
        Router::new()
            .route(
                "/echo",
                post(|body: Bytes| async move { body }).get(|| async { "hello" }),
            )
            .layer(axum::middleware::from_fn(|request, next| {
                body_deadline(Duration::from_millis(300), request, next)
            }))
    }

    #[tokio::test]
    async fn a_connection_past_the_bound_is_answered_503_and_the_loop_goes_on() {
        let limits = ConnectionLimits {
            max_connections: 3,
            header_read_timeout: Duration::from_secs(30),
        };
        let (address, _stop) = start(echo(), limits).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut stream = TcpStream::connect(&address).await.expect("connect");
            stream.write_all(b"GET /ec").await.expect("half a line");
            held.push(stream);
        }
        // The three slots are taken by half-sent requests.
        let mut late = TcpStream::connect(&address).await.expect("connect");
        late.write_all(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("sent");
        let line = status_line(late).await.expect("an answer");
        assert!(line.starts_with("HTTP/1.1 503"), "{line}");
        // A slot freed is taken again.
        held.pop();
        let answered = crate::testing::eventually_get(&address, "/echo").await;
        assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    }

    #[tokio::test]
    async fn a_head_that_never_ends_and_an_idle_connection_are_closed() {
        let limits = ConnectionLimits {
            max_connections: 8,
            header_read_timeout: Duration::from_millis(200),
        };
        let (address, _stop) = start(echo(), limits).await;
        let mut half = TcpStream::connect(&address).await.expect("connect");
        half.write_all(b"GET /echo HTTP/1.1\r\nhost:")
            .await
            .expect("half");
        let mut rest = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(10), half.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "a half-sent head is held open");
        // A keep-alive connection idle after its first answer is closed too.
        let mut idle = TcpStream::connect(&address).await.expect("connect");
        idle.write_all(b"GET /echo HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("sent");
        let mut answer = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(10), idle.read_to_end(&mut answer)).await;
        assert!(closed.is_ok(), "an idle keep-alive connection is held open");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_fails_its_read() {
        let (address, _stop) = start(echo(), ConnectionLimits::default()).await;
        let mut slow = TcpStream::connect(&address).await.expect("connect");
        slow.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nabc")
            .await
            .expect("part of a body");
        let line = tokio::time::timeout(Duration::from_secs(10), status_line(slow))
            .await
            .expect("answered before the test's deadline");
        let line = line.unwrap_or_default();
        assert!(!line.starts_with("HTTP/1.1 200"), "{line}");
        let whole = crate::testing::raw_post(&address, "/echo", "abc").await;
        assert!(whole.starts_with("HTTP/1.1 200"), "{whole}");
    }
}
