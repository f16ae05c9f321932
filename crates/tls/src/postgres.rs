//! PostgreSQL over TLS, as libpq reads a connection string.
//!
//! tokio-postgres knows `sslmode` only up to `require` and no
//! `sslrootcert`, so [`target`] takes both out of the string (a
//! `postgres://` URL's query or a `key=value` string), hands tokio-postgres
//! the rest, and builds the matching rustls configuration:
//!
//! | `sslmode` | TLS | the server's certificate |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` | if the server offers it, else plaintext | not checked (as libpq) |
//! | `require` | always | checked against the CA file if one is given (as libpq's `verify-ca`), else not checked: encrypted, but not authenticated |
//! | `verify-ca` | always | its chain must lead to the CA file (else the platform's roots) |
//! | `verify-full` | always | as `verify-ca`, and it must name the host connected to |
//!
//! The CA file is `sslrootcert=/path` in the string, else the one the caller
//! gives (toolfleet's `database_ca_file`). Without `sslmode`, the mode is
//! `prefer` (libpq's default), or `verify-full` when a CA file is given, so
//! that naming a CA is never silently ignored. A server on the loopback
//! (every host `localhost`, a loopback address or a socket directory) and
//! no `sslmode` is reached in plaintext first, as libpq's `allow` does,
//! and over TLS only where it refuses plaintext ([`PgConnector`]): what
//! never leaves the machine is not worth encrypting on every round trip of
//! every job, on both ends. `sslrootcert=system` trusts
//! the platform's roots and, as in libpq, needs `verify-full`. Unlike libpq,
//! `verify-ca` and `verify-full` without a CA file trust the platform's roots,
//! not `~/.postgresql/root.crt`. Client certificates are not supported.
//!
//! Connections offer the ALPN protocol `postgresql` (so that
//! `sslnegotiation=direct` works with PostgreSQL 17), and give SCRAM channel
//! binding (`tls-server-end-point`) the server certificate's hash, so that
//! with password authentication a server that presented a certificate it
//! does not hold a session to is caught even where the certificate is not
//! checked.
//!
//! [`describe`] names the place a configuration connects to, for the
//! messages of every PostgreSQL client (the store's and the notices'),
//! never with the password.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use sha2::{Digest, Sha256, Sha384, Sha512};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::Host;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_postgres::{Client, Config, Connection, Socket};
use tokio_rustls::TlsConnector;

use crate::{Advice, Roots, Verify, client_config, explain, find_rustls_error};

/// What a failed handshake with PostgreSQL points to.
pub const ADVICE: Advice = Advice {
    ca: "database_ca_file or sslrootcert in database_url",
    name: "connect by a host name the certificate holds, or use sslmode=verify-ca to check \
           the chain alone",
};

/// libpq's `sslmode`, all of it but `allow`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS when the server offers it, else plain; the certificate is not checked.
    Prefer,
    /// TLS always; the chain is checked only when a CA file is given.
    Require,
    /// TLS, with the certificate's chain checked against the trusted roots.
    VerifyCa,
    /// TLS, with the chain checked and the host name matched against the certificate.
    VerifyFull,
}

impl FromStr for SslMode {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            "allow" => Err(
                "sslmode=allow is not supported: use disable, prefer, require, \
                 verify-ca or verify-full"
                    .to_owned(),
            ),
            other => Err(format!(
                "sslmode={:?} is not known: use disable, prefer, require, verify-ca or verify-full",
                other.chars().take(32).collect::<String>()
            )),
        }
    }
}

/// Where and how to connect: tokio-postgres's configuration, with its
/// `ssl_mode` set, and the connector for it.
#[derive(Clone)]
pub struct PgTarget {
    /// tokio-postgres's configuration, its `ssl_mode` set from `mode`.
    pub config: Config,
    /// Connects with a configuration such as `config`.
    pub connector: PgConnector,
    /// The `sslmode` the URL asked for (`prefer` where it named none).
    pub mode: SslMode,
}

/// A connection to PostgreSQL as toolfleet makes it, over TLS or not.
pub type PgConnection = Connection<Socket, RustlsStream<Socket>>;

/// Opens connections as a target's `sslmode` says: with the TLS connector
/// for the server's certificate, and, for a server on the loopback without
/// `sslmode`, in plaintext first.
#[derive(Clone)]
pub struct PgConnector {
    tls: MakeRustlsConnect,
    /// Plaintext first (a loopback server, no `sslmode`): set once the
    /// server refused a plaintext connection, after which every connection
    /// takes the configuration's mode (`prefer`) at once.
    plain_first: Option<Arc<AtomicBool>>,
}

impl PgConnector {
    /// Connects with `config` (the target's, with settings of the
    /// caller's own added): in plaintext first where the target says so,
    /// and then, if the server refused that for want of encryption, as
    /// `config` says.
    pub async fn connect(
        &self,
        config: &Config,
    ) -> Result<(Client, PgConnection), tokio_postgres::Error> {
        if let Some(refused) = &self.plain_first
            && !refused.load(Ordering::Relaxed)
        {
            let mut plain = config.clone();
            plain.ssl_mode(tokio_postgres::config::SslMode::Disable);
            match plain.connect(self.tls.clone()).await {
                Err(e) if refuses_plaintext(&e) => refused.store(true, Ordering::Relaxed),
                answered => return answered,
            }
        }
        config.connect(self.tls.clone()).await
    }
}

/// Whether `error` is the server refusing a connection without TLS
/// (pg_hba.conf has only `hostssl` lines for this client).
fn refuses_plaintext(error: &tokio_postgres::Error) -> bool {
    error
        .as_db_error()
        .is_some_and(|db| db.code().code() == "28000" && db.message().contains("no encryption"))
}

/// Whether every place `config` connects to is on this machine: its
/// `hostaddr`s where it names any, else its hosts (`localhost`, a loopback
/// address, a socket directory).
fn on_loopback(config: &Config) -> bool {
    let addrs = config.get_hostaddrs();
    if !addrs.is_empty() {
        return addrs.iter().all(IpAddr::is_loopback);
    }
    let hosts = config.get_hosts();
    !hosts.is_empty()
        && hosts.iter().all(|host| match host {
            Host::Tcp(name) => {
                name.eq_ignore_ascii_case("localhost")
                    || name
                        .trim_matches(['[', ']'])
                        .parse::<IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
            #[cfg(unix)]
            Host::Unix(_) => true,
        })
}

/// Reads `url` (a `postgres://` URL or a `key=value` string) with its
/// `sslmode` and `sslrootcert`; `ca_file` is the CA file to use when the
/// string names none. Reads the CA file now, so a missing or unreadable
/// one is refused here.
pub fn target(url: &str, ca_file: Option<&Path>) -> Result<PgTarget, String> {
    let taken = take_tls_params(url)?;
    let system = taken.sslrootcert.as_deref() == Some("system");
    let ca: Option<PathBuf> = match taken.sslrootcert {
        _ if system => None,
        Some(path) => Some(PathBuf::from(path)),
        None => ca_file.map(Path::to_path_buf),
    };
    let mode = match taken.sslmode.as_deref() {
        Some(given) => given.parse()?,
        None if system || ca.is_some() => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if system && mode != SslMode::VerifyFull {
        return Err(
            "sslrootcert=system trusts the platform's roots and needs sslmode=verify-full \
             (as libpq does)"
                .to_owned(),
        );
    }
    let verify = match (mode, ca) {
        (SslMode::Disable, _) => None,
        (SslMode::Prefer, _) | (SslMode::Require, None) => Some(Verify::Nothing),
        (SslMode::Require | SslMode::VerifyCa, Some(ca)) => Some(Verify::Chain(Roots::File(ca))),
        (SslMode::VerifyCa, None) => Some(Verify::Chain(Roots::Platform)),
        (SslMode::VerifyFull, Some(ca)) => Some(Verify::Full(Roots::File(ca))),
        (SslMode::VerifyFull, None) => Some(Verify::Full(Roots::Platform)),
    };
    let mut config: Config = taken
        .rest
        .parse()
        .map_err(|e| format!("the database URL is not valid: {e}"))?;
    config.ssl_mode(match mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    let tls = match verify {
        Some(verify) => Some(Arc::new(
            client_config(&verify, &[b"postgresql"])
                .map_err(|e| format!("TLS to PostgreSQL: {e}"))?,
        )),
        None => None,
    };
    let plain_first = (taken.sslmode.is_none() && mode == SslMode::Prefer && on_loopback(&config))
        .then(|| Arc::new(AtomicBool::new(false)));
    Ok(PgTarget {
        config,
        connector: PgConnector {
            tls: MakeRustlsConnect { config: tls },
            plain_first,
        },
        mode,
    })
}

/// "db on host:port": the database (else the user, else `postgres`) and
/// the first host and port of `config`, for messages; never the password.
pub fn describe(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(name)) => name.clone(),
        #[cfg(unix)]
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let database = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    format!("{database} on {host}:{port}")
}

/// What to check when `error` is the server refusing what `sslmode` asked
/// for (a TLS handshake's own failure already says).
pub fn hint(error: &tokio_postgres::Error) -> Option<&'static str> {
    if refuses_plaintext(error) {
        return Some(
            "the server accepts only encrypted connections here: set sslmode=require, \
             verify-ca or verify-full in database_url",
        );
    }
    if error.as_db_error().is_some() {
        return None;
    }
    let cause = std::error::Error::source(error).map(ToString::to_string);
    if cause.as_deref() == Some("server does not support TLS") {
        return Some(
            "sslmode asks for TLS but the server does not offer it: turn ssl on in the server, \
             or use sslmode=prefer or disable",
        );
    }
    None
}

/// The libpq parameters tokio-postgres does not know, and the rest.
#[derive(Debug, PartialEq, Eq)]
struct Taken {
    rest: String,
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

/// Takes `sslmode` and `sslrootcert` out of a connection string; refuses
/// client certificates with a message of its own.
fn take_tls_params(url: &str) -> Result<Taken, String> {
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let pairs = if is_url {
        crate::query_pairs(url, "the database URL")?
    } else {
        key_value_pairs(url)?
    };
    let mut taken = Taken {
        rest: String::new(),
        sslmode: None,
        sslrootcert: None,
    };
    let mut keep = Vec::new();
    for (range, key, value) in pairs {
        match key.as_str() {
            "sslmode" => taken.sslmode = Some(value),
            "sslrootcert" => taken.sslrootcert = Some(value),
            "sslcert" | "sslkey" | "sslpassword" => {
                return Err(format!(
                    "{key} in the database URL: client certificates are not supported; \
                     authenticate with a password"
                ));
            }
            _ => keep.push(range),
        }
    }
    taken.rest = if is_url {
        match url.find('?') {
            Some(query) => {
                let kept: Vec<&str> = keep.into_iter().map(|r| &url[r]).collect();
                if kept.is_empty() {
                    url[..query].to_owned()
                } else {
                    format!("{}?{}", &url[..query], kept.join("&"))
                }
            }
            None => url.to_owned(),
        }
    } else {
        keep.into_iter()
            .map(|r| &url[r])
            .collect::<Vec<_>>()
            .join(" ")
    };
    Ok(taken)
}

/// The pairs of a libpq `key=value` string, as tokio-postgres reads them,
/// each with its byte range.
fn key_value_pairs(s: &str) -> Result<Vec<(std::ops::Range<usize>, String, String)>, String> {
    let invalid = |why: &str| format!("the database URL is not valid: {why}");
    let mut it = s.char_indices().peekable();
    let mut pairs = Vec::new();
    let skip_ws = |it: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_ws(&mut it);
        let Some(&(start, _)) = it.peek() else {
            return Ok(pairs);
        };
        let mut key = String::new();
        while let Some((_, c)) = it.next_if(|(_, c)| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        skip_ws(&mut it);
        if it.next_if(|(_, c)| *c == '=').is_none() {
            return Err(invalid(&format!("expected `=` after `{key}`")));
        }
        skip_ws(&mut it);
        let mut value = String::new();
        if it.next_if(|(_, c)| *c == '\'').is_some() {
            loop {
                match it.next() {
                    Some((_, '\'')) => break,
                    Some((_, '\\')) => value.extend(it.next().map(|(_, c)| c)),
                    Some((_, c)) => value.push(c),
                    None => return Err(invalid(&format!("the value of `{key}` is not closed"))),
                }
            }
        } else {
            while let Some((_, c)) = it.next_if(|(_, c)| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(it.next().map(|(_, c)| c));
                } else {
                    value.push(c);
                }
            }
        }
        let end = it.peek().map_or(s.len(), |&(i, _)| i);
        pairs.push((start..end, key, value));
    }
}

/// tokio-postgres's TLS connector over tokio-rustls (`None`: TLS disabled).
#[derive(Clone)]
pub struct MakeRustlsConnect {
    config: Option<Arc<ClientConfig>>,
}

impl<S> MakeTlsConnect<S> for MakeRustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    /// Never fails: a name that cannot be verified (a Unix socket's, which
    /// never reaches TLS) fails the handshake instead.
    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        Ok(RustlsConnect {
            config: self.config.clone(),
            name: ServerName::try_from(domain.to_owned()).ok(),
        })
    }
}

/// The TLS handshake with one host.
pub struct RustlsConnect {
    config: Option<Arc<ClientConfig>>,
    name: Option<ServerName<'static>>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let config = self
                .config
                .ok_or_else(|| io::Error::other("TLS is off (sslmode=disable)"))?;
            let name = self.name.ok_or_else(|| {
                io::Error::other("no host name to check the server's certificate against")
            })?;
            match TlsConnector::from(config).connect(name, stream).await {
                Ok(stream) => Ok(RustlsStream(stream)),
                Err(e) => Err(match find_rustls_error(&e) {
                    Some(tls) => io::Error::new(e.kind(), explain(tls, ADVICE)),
                    None => e,
                }),
            }
        })
    }
}

/// A TLS connection to PostgreSQL.
pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.0.get_ref();
        session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|cert| end_point_hash(cert))
            .map_or_else(ChannelBinding::none, ChannelBinding::tls_server_end_point)
    }
}

/// RFC 5929's `tls-server-end-point`: the certificate hashed with its
/// signature's hash, SHA-256 for MD5 and SHA-1. `None` for signatures
/// without one hash (RSA-PSS, Ed25519): SCRAM then goes without channel
/// binding (unless `channel_binding=require` asked for it).
fn end_point_hash(cert: &[u8]) -> Option<Vec<u8>> {
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
    let oid = signature_algorithm(cert)?;
    let hash = match oid.strip_prefix(RSA) {
        // md5, sha1, sha256, sha384, sha512 WithRSAEncryption.
        Some([4 | 5 | 11]) => Sha256::digest(cert).to_vec(),
        Some([12]) => Sha384::digest(cert).to_vec(),
        Some([13]) => Sha512::digest(cert).to_vec(),
        Some(_) => return None,
        None => match oid.strip_prefix(ECDSA)? {
            // ecdsa-with-SHA1, ecdsa-with-SHA256, -SHA384, -SHA512.
            [1] | [3, 2] => Sha256::digest(cert).to_vec(),
            [3, 3] => Sha384::digest(cert).to_vec(),
            [3, 4] => Sha512::digest(cert).to_vec(),
            _ => return None,
        },
    };
    Some(hash)
}

/// The OID (its content octets) of a DER certificate's
/// `signatureAlgorithm`: `SEQUENCE { tbsCertificate, SEQUENCE { OID, ..},
/// signature }`.
fn signature_algorithm(der: &[u8]) -> Option<&[u8]> {
    let (0x30, certificate, _) = read_tlv(der)? else {
        return None;
    };
    let (_, _, rest) = read_tlv(certificate)?;
    let (0x30, algorithm, _) = read_tlv(rest)? else {
        return None;
    };
    let (0x06, oid, _) = read_tlv(algorithm)? else {
        return None;
    };
    Some(oid)
}

/// One DER tag, its contents, and what follows.
fn read_tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, rest) = rest.split_at(count);
        let length = bytes
            .iter()
            .fold(0usize, |length, &b| (length << 8) | usize::from(b));
        (length, rest)
    };
    if rest.len() < length {
        return None;
    }
    let (contents, rest) = rest.split_at(length);
    Some((tag, contents, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(url: &str) -> Taken {
        take_tls_params(url).unwrap()
    }

    #[test]
    fn url_parameters_of_tls_are_taken_and_the_rest_kept() {
        let t = taken(
            "postgres://u:p%40ss@db:5432/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(t.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(t.sslrootcert.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(t.rest, "postgres://u:p%40ss@db:5432/app?application_name=x");
        let t = taken("postgresql://db/app?sslmode=require");
        assert_eq!(t.rest, "postgresql://db/app");
        let t = taken("postgres://db/app");
        assert_eq!((t.rest.as_str(), t.sslmode), ("postgres://db/app", None));
    }

    #[test]
    fn key_value_parameters_of_tls_are_taken_and_quoting_is_kept() {
        let t = taken(
            "host=db  sslmode = 'verify-ca' password='it\\'s' sslrootcert='/a b/ca.pem' user=u\\ v",
        );
        assert_eq!(t.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(t.sslrootcert.as_deref(), Some("/a b/ca.pem"));
        assert_eq!(t.rest, "host=db password='it\\'s' user=u\\ v");
        let config: Config = t.rest.parse().unwrap();
        assert_eq!(config.get_user(), Some("u v"));
        assert_eq!(config.get_password(), Some(&b"it's"[..]));
        assert!(take_tls_params("host=db sslmode='open").is_err());
        assert!(take_tls_params("host").is_err());
    }

    #[test]
    fn modes_follow_libpq_and_a_named_ca_is_never_ignored() {
        let mode = |url: &str, ca: Option<&str>| target(url, ca.map(Path::new)).map(|t| t.mode);
        let plain = "postgres://db/app";
        assert_eq!(mode(plain, None), Ok(SslMode::Prefer));
        assert_eq!(
            mode("postgres://db/app?sslmode=disable", None),
            Ok(SslMode::Disable)
        );
        assert_eq!(
            mode("postgres://db/app?sslmode=require", None),
            Ok(SslMode::Require)
        );
        assert_eq!(
            mode("postgres://db/app?sslmode=verify-full", None),
            Ok(SslMode::VerifyFull)
        );
        assert_eq!(
            mode("postgres://db/app?sslrootcert=system", None),
            Ok(SslMode::VerifyFull)
        );
        let system = mode("postgres://db/app?sslrootcert=system&sslmode=require", None);
        assert!(system.unwrap_err().contains("verify-full"));
        let allow = mode("host=db sslmode=allow", None).unwrap_err();
        assert!(allow.contains("not supported"), "{allow}");
        let unknown = mode("host=db sslmode=strict", None).unwrap_err();
        assert!(unknown.contains("verify-full"), "{unknown}");
        // A CA file is read when the target is made: a missing one says so,
        // whether the URL or the caller names it.
        let missing = mode(plain, Some("/nonexistent/ca.pem")).unwrap_err();
        assert!(missing.contains("/nonexistent/ca.pem"), "{missing}");
        let missing = mode("postgres://db/app?sslrootcert=/nonexistent/root.pem", None);
        assert!(missing.unwrap_err().contains("/nonexistent/root.pem"));
        // With sslmode=disable, no CA is read at all.
        assert_eq!(
            mode("host=db sslmode=disable", Some("/nonexistent/ca.pem")),
            Ok(SslMode::Disable)
        );
        let client = mode("host=db sslcert=/c.pem", None).unwrap_err();
        assert!(client.contains("client certificates"), "{client}");
        let ssl_mode = |url: &str| target(url, None).unwrap().config.get_ssl_mode();
        assert_eq!(
            ssl_mode("host=db sslmode=verify-ca"),
            tokio_postgres::config::SslMode::Require
        );
        assert_eq!(ssl_mode("host=db"), tokio_postgres::config::SslMode::Prefer);
    }

    #[test]
    fn only_a_loopback_server_without_sslmode_is_tried_in_plaintext_first() {
        let plain_first = |url: &str| {
            let target = target(url, None).unwrap();
            target.connector.plain_first.is_some()
        };
        for local in [
            "postgres://u@127.0.0.1:5432/db",
            "postgres://u@127.8.0.1/db",
            "postgres://u@localhost/db",
            "postgres://u@[::1]:5432/db",
            "host=localhost,127.0.0.1 dbname=db",
            "host=/var/run/postgresql dbname=db",
            "host=db.example hostaddr=127.0.0.1 dbname=db",
        ] {
            assert!(plain_first(local), "{local}");
        }
        for elsewhere in [
            // Another machine, or one of several hosts elsewhere.
            "postgres://u@db.example/db",
            "postgres://u@10.0.0.5/db",
            "host=localhost,db.example dbname=db",
            "host=localhost hostaddr=10.0.0.5 dbname=db",
            // The mode named, whatever it is: as it says.
            "postgres://u@127.0.0.1/db?sslmode=prefer",
            "postgres://u@127.0.0.1/db?sslmode=require",
            "postgres://u@127.0.0.1/db?sslmode=disable",
        ] {
            assert!(!plain_first(elsewhere), "{elsewhere}");
        }
    }

    #[test]
    fn the_place_names_database_host_and_port_and_never_the_password() {
        let place = |url: &str| describe(&target(url, None).unwrap().config);
        assert_eq!(place("postgres://u:secret@db:6543/app"), "app on db:6543");
        assert_eq!(place("host=db user=u password=secret"), "u on db:5432");
        assert_eq!(place("postgres://db"), "postgres on db:5432");
        assert_eq!(place("dbname=app"), "app on localhost:5432");
        #[cfg(unix)]
        assert_eq!(
            place("host=/run/postgresql dbname=app"),
            "app on /run/postgresql:5432"
        );
    }

    #[test]
    fn the_end_point_hash_follows_the_signature_algorithm() {
        // SEQUENCE { SEQUENCE {} (tbs), SEQUENCE { OID ecdsa-with-SHA384 }, BIT STRING }.
        let ecdsa_sha384 = [
            0x30, 0x10, 0x30, 0x00, 0x30, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04,
            0x03, 0x03, 0x03, 0x02, 0x00, 0x00,
        ];
        assert_eq!(end_point_hash(&ecdsa_sha384).map(|h| h.len()), Some(48));
        let mut sha1_rsa = vec![0x30, 0x11, 0x30, 0x00, 0x30, 0x0b, 0x06, 0x09];
        sha1_rsa.extend([0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05]);
        sha1_rsa.extend([0x03, 0x02, 0x00, 0x00]);
        assert_eq!(end_point_hash(&sha1_rsa).map(|h| h.len()), Some(32));
        // Ed25519 (1.3.101.112) has no hash of its own.
        let ed25519 = [
            0x30, 0x0b, 0x30, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x02, 0x00,
            0x00,
        ];
        assert_eq!(end_point_hash(&ed25519), None);
        assert_eq!(end_point_hash(&[0x30, 0x84, 0xff]), None);
        assert_eq!(end_point_hash(&[]), None);
    }
}
