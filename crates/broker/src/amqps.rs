//! `amqps://` for lapin, through tokio-rustls.
//!
//! lapin opens TLS through tcp-stream, whose rustls support also builds
//! PKCS#12 and a second family of RustCrypto hashes. Instead, a connection
//! to an `amqps://` URL goes through [`connect`], which hands lapin the
//! socket itself: lapin's low-level `Connection::connector` takes a
//! closure that opens the transport, typed by the runtime's TCP stream, so
//! the runtime given is [`TlsTokio`], lapin's own tokio runtime in every
//! respect but that type, which may carry a TLS session ([`Transport`]).
//!
//! What the server's certificate must be (its chain, its host name) is
//! decided by `toolfleet_tls::amqp`; this module only connects, and says
//! what to check when the handshake fails.

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_compat::Compat;
use async_rs::traits::{Executor, Reactor, RuntimeKit};
use async_rs::util::Task;
use async_rs::{Runtime, Tokio};
use futures_io::{AsyncRead, AsyncWrite};
use futures_util::Stream;
use lapin::uri::AMQPUri;
use lapin::{AsyncTcpStream, Connection, ConnectionProperties};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::ReadBuf;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use toolfleet_tls::{explain, find_rustls_error};

/// Connects to the `amqps://` URL `url` over TLS configured by `tls`.
pub(crate) async fn connect(
    url: &str,
    tls: Arc<ClientConfig>,
    properties: ConnectionProperties,
) -> lapin::Result<Connection> {
    let uri: AMQPUri = url.parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the broker URL is not valid: {e}"),
        )
    })?;
    let runtime = Runtime::new(TlsTokio(Tokio::current()));
    let open = async move |uri: AMQPUri, _: Runtime<TlsTokio>| {
        let transport = handshake(&uri, &tls).await?;
        Ok(AsyncTcpStream::Plain(Compat::new(transport)))
    };
    Connection::connector(uri, runtime, open, properties).await
}

/// A TCP connection to the URL's host and port, then the TLS handshake
/// with it, bounded by the URL's `connection_timeout` if it has one.
async fn handshake(uri: &AMQPUri, tls: &Arc<ClientConfig>) -> io::Result<Transport> {
    let host = uri
        .authority
        .host
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = uri.authority.port;
    let name = ServerName::try_from(host.to_owned()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host:?} is no host name a certificate can be checked against"),
        )
    })?;
    let open = async {
        let tcp = TcpStream::connect((host, port)).await?;
        tcp.set_nodelay(true)?;
        TlsConnector::from(Arc::clone(tls))
            .connect(name, tcp)
            .await
            .map_err(|e| {
                let text = match find_rustls_error(&e) {
                    Some(tls) => explain(tls, toolfleet_tls::amqp::ADVICE),
                    None => e.to_string(),
                };
                io::Error::new(e.kind(), format!("TLS with {host}:{port}: {text}"))
            })
    };
    let stream = match uri.query.connection_timeout {
        Some(ms) => tokio::time::timeout(Duration::from_millis(ms), open)
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no TLS session with {host}:{port} within {ms} ms"),
                )
            })??,
        None => open.await?,
    };
    Ok(Transport::Tls(Box::new(stream)))
}

/// A connection to RabbitMQ: TLS, or plain TCP where lapin connects by
/// itself through [`Reactor::tcp_connect_addr`].
pub(crate) enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl tokio::io::AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// lapin's tokio runtime (async-rs's [`Tokio`]), whose TCP stream is a
/// [`Transport`].
#[derive(Clone, Debug)]
pub(crate) struct TlsTokio(Tokio);

impl RuntimeKit for TlsTokio {}

impl Executor for TlsTokio {
    type Task<T: Send + 'static> = <Tokio as Executor>::Task<T>;

    fn block_on<T, F: Future<Output = T>>(&self, f: F) -> T {
        self.0.block_on(f)
    }

    fn spawn<T: Send + 'static, F: Future<Output = T> + Send + 'static>(
        &self,
        f: F,
    ) -> Task<Self::Task<T>> {
        self.0.spawn(f)
    }

    fn spawn_blocking<T: Send + 'static, F: FnOnce() -> T + Send + 'static>(
        &self,
        f: F,
    ) -> Task<Self::Task<T>> {
        self.0.spawn_blocking(f)
    }
}

impl Reactor for TlsTokio {
    type TcpStream = Compat<Transport>;
    type Sleep = <Tokio as Reactor>::Sleep;

    // async-rs bounds `H` by a trait of its own that it does not export,
    // implemented for every type with these two.
    #[cfg(unix)]
    fn register<H>(
        &self,
        socket: H,
    ) -> io::Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static>
    where
        H: Read + Write + std::os::fd::AsFd + std::os::fd::AsRawFd + Send + 'static,
    {
        self.0.register(socket)
    }

    #[cfg(windows)]
    fn register<H>(
        &self,
        socket: H,
    ) -> io::Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static>
    where
        H: Read
            + Write
            + std::os::windows::io::AsSocket
            + std::os::windows::io::AsRawSocket
            + Send
            + 'static,
    {
        self.0.register(socket)
    }

    fn sleep(&self, dur: Duration) -> Self::Sleep {
        self.0.sleep(dur)
    }

    fn interval(&self, dur: Duration) -> impl Stream<Item = Instant> + Send + 'static {
        self.0.interval(dur)
    }

    fn tcp_connect_addr(
        &self,
        addr: SocketAddr,
    ) -> impl Future<Output = io::Result<Self::TcpStream>> + Send + 'static {
        let connect = self.0.tcp_connect_addr(addr);
        async move {
            let stream = connect.await?.into_inner();
            Ok(Compat::new(Transport::Plain(stream)))
        }
    }
}
