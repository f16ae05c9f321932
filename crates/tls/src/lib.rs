//! TLS to the servers toolfleet uses, PostgreSQL and RabbitMQ, through rustls
//! with the `ring` provider (as the HTTP executors build it).
//!
//! This crate owns how a server's certificate is checked ([`Verify`]), where
//! the trusted roots come from ([`Roots`]: a CA file in PEM, else the
//! platform's store through rustls-platform-verifier), and how a failed
//! handshake is explained ([`explain`]), so that each error says what to
//! check: the CA file, the mode, the host name. [`postgres`] reads libpq's
//! `sslmode` and `sslrootcert`, which tokio-postgres does not know beyond
//! `require`, and connects through tokio-rustls; [`amqp`] reads what an
//! `amqps://` URL asks for (the broker owns the transport, which is lapin's).
//!
//! It never installs a process-wide crypto provider, and it accepts a
//! certificate unchecked only where it was told to: [`Verify::Nothing`] is
//! libpq's `sslmode=prefer`, and `sslmode=require` without a root
//! certificate. Even then the handshake's signatures are verified, so the
//! session is encrypted to whoever holds the presented certificate's key;
//! but unchecked, that may be anyone on the path.

use std::error::Error as StdError;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

pub mod amqp;
pub mod postgres;

/// Which certificates a server may present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verify {
    /// Any: the connection is encrypted but the server is not checked.
    Nothing,
    /// One whose chain leads to one of `Roots`, whatever host it names
    /// (libpq's `verify-ca`).
    Chain(Roots),
    /// One whose chain leads to one of `Roots` and that names the host
    /// connected to (libpq's `verify-full`; always for `amqps://`).
    Full(Roots),
}

/// The certificates a chain must lead to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Roots {
    /// The platform's trust store.
    Platform,
    /// The certificates of a PEM file, and nothing else.
    File(PathBuf),
}

/// Where a failed handshake's explanation points, per server.
#[derive(Clone, Copy, Debug)]
pub struct Advice {
    /// The settings that name a CA file ("database_ca_file or sslrootcert").
    pub ca: &'static str,
    /// What to do when the certificate names another host.
    pub name: &'static str,
}

/// A client configuration checking what `verify` says, offering the ALPN
/// protocols `alpn`.
pub fn client_config(verify: &Verify, alpn: &[&[u8]]) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match verify {
        Verify::Nothing => Arc::new(AnyCertificate(Arc::clone(&provider))),
        Verify::Chain(roots) => Arc::new(ChainOnly(roots_verifier(roots, &provider)?)),
        Verify::Full(roots) => roots_verifier(roots, &provider)?,
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS could not be configured: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

fn roots_verifier(
    roots: &Roots,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, String> {
    match roots {
        Roots::Platform => rustls_platform_verifier::Verifier::new(Arc::clone(provider))
            .map(|v| Arc::new(v) as Arc<dyn ServerCertVerifier>)
            .map_err(|e| format!("the platform's certificate store could not be read: {e}")),
        Roots::File(path) => {
            let mut store = RootCertStore::empty();
            for cert in read_certificates(path)? {
                store.add(cert).map_err(|e| {
                    format!(
                        "the CA file {} holds a certificate that cannot be a root: {e}",
                        path.display()
                    )
                })?;
            }
            WebPkiServerVerifier::builder_with_provider(Arc::new(store), Arc::clone(provider))
                .build()
                .map(|v| v as Arc<dyn ServerCertVerifier>)
                .map_err(|e| format!("the CA file {} cannot be used: {e}", path.display()))
        }
    }
}

/// The certificates of the PEM file at `path`: at least one.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let text = std::fs::read(path)
        .map_err(|e| format!("cannot read the CA file {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the CA file {} is not valid PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "the CA file {} holds no certificate (a PEM file of `BEGIN CERTIFICATE` blocks)",
            path.display()
        ));
    }
    Ok(certs)
}

/// What went wrong in a handshake that failed with `error`, and what to
/// check.
pub fn explain(error: &rustls::Error, advice: Advice) -> String {
    let hint = match error {
        rustls::Error::InvalidCertificate(reason) => match reason {
            CertificateError::UnknownIssuer => format!(
                "the server's certificate is not signed by a CA toolfleet trusts: name the CA \
                 that signed it in {}; without one, the platform's roots are trusted",
                advice.ca
            ),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!(
                    "the server's certificate does not name the host connected to: {}",
                    advice.name
                )
            }
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => {
                "the server's certificate is outside its validity dates: renew it, or check \
                 this machine's clock"
                    .to_owned()
            }
            _ => format!(
                "the server's certificate was refused: check it and the CA in {}",
                advice.ca
            ),
        },
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "the server did not answer in TLS: is this its TLS port, and is TLS enabled on it?"
                .to_owned()
        }
        _ => "check the server's TLS configuration".to_owned(),
    };
    format!("{error} ({hint})")
}

/// The rustls error somewhere in `error`'s chain of sources (tokio-rustls
/// carries it inside an `io::Error`).
pub fn find_rustls_error<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(found) = error.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(found) = inner.downcast_ref::<rustls::Error>()
        {
            return Some(found);
        }
        next = error.source();
    }
    None
}

/// Checks the chain alone: a certificate valid for another name passes.
/// rustls's verifiers (and the platform's on Linux) check the chain first
/// and the name last, so a name error means the chain was good.
#[derive(Debug)]
struct ChainOnly(Arc<dyn ServerCertVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// Accepts any certificate, but verifies the handshake's signatures with
/// the provider's algorithms. Only for [`Verify::Nothing`].
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `%XX` escapes of a URL component decoded; an invalid escape or UTF-8
/// is an error naming `what`.
pub(crate) fn percent_decode(text: &str, what: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("{what} has an invalid %-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{what} is not UTF-8 once %-decoded"))
}

/// The query parameters of `url` (after its first `?`), each as its
/// byte range in `url`, its decoded key and its decoded value.
pub(crate) fn query_pairs(
    url: &str,
    what: &str,
) -> Result<Vec<(std::ops::Range<usize>, String, String)>, String> {
    let Some(start) = url.find('?') else {
        return Ok(Vec::new());
    };
    let end = url.find('#').filter(|&h| h > start).unwrap_or(url.len());
    let mut pairs = Vec::new();
    let mut at = start + 1;
    for part in url[start + 1..end].split('&') {
        let range = at..at + part.len();
        at = range.end + 1;
        if part.is_empty() {
            continue;
        }
        let (key, value) = part.split_once('=').unwrap_or((part, ""));
        let key = percent_decode(key, what)?;
        let value = percent_decode(value, &format!("{what}'s {key}"))?;
        pairs.push((range, key, value));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_escapes_decode_and_bad_ones_are_refused() {
        assert_eq!(
            percent_decode("%2Fetc%2fca.pem", "x").as_deref(),
            Ok("/etc/ca.pem")
        );
        assert!(percent_decode("%2", "x").is_err());
        assert!(percent_decode("%zz", "x").is_err());
        assert!(percent_decode("%ff", "x").is_err());
    }

    #[test]
    fn query_pairs_carry_their_place() {
        let url = "amqps://h/%2f?heartbeat=10&cacertfile=%2Ftmp%2Fca.pem&&x";
        let pairs = query_pairs(url, "the URL").unwrap();
        let keys: Vec<_> = pairs
            .iter()
            .map(|(_, k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("heartbeat", "10"),
                ("cacertfile", "/tmp/ca.pem"),
                ("x", "")
            ]
        );
        assert_eq!(&url[pairs[1].0.clone()], "cacertfile=%2Ftmp%2Fca.pem");
        assert!(
            query_pairs("postgres://h/db", "the URL")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_refused_with_its_name() {
        let missing = read_certificates(Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(missing.contains("/nonexistent/ca.pem"), "{missing}");
        let dir = std::env::temp_dir().join(format!("toolfleet-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let error = read_certificates(&empty).unwrap_err();
        assert!(error.contains("holds no certificate"), "{error}");
        let config = client_config(&Verify::Full(Roots::File(empty)), &[]).unwrap_err();
        assert!(config.contains("holds no certificate"), "{config}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_verification_builds_a_configuration() {
        for verify in [
            Verify::Nothing,
            Verify::Chain(Roots::Platform),
            Verify::Full(Roots::Platform),
        ] {
            let config = client_config(&verify, &[b"postgresql"]).unwrap();
            assert_eq!(config.alpn_protocols, [b"postgresql".to_vec()]);
        }
    }

    #[test]
    fn explanations_say_what_to_check() {
        let advice = Advice {
            ca: "database_ca_file",
            name: "use the name in the certificate",
        };
        let unknown = explain(
            &rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
            advice,
        );
        assert!(unknown.contains("database_ca_file"), "{unknown}");
        let name = explain(
            &rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
            advice,
        );
        assert!(name.contains("use the name in the certificate"), "{name}");
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::Expired),
        );
        let found = find_rustls_error(&io).unwrap();
        assert!(explain(found, advice).contains("validity dates"));
    }
}
