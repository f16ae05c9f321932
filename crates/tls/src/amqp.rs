//! RabbitMQ over TLS: what an `amqps://` URL asks for.
//!
//! An `amqps://` URL is always verified in full, the chain and the host
//! name, against its `cacertfile` query parameter (as RabbitMQ's URI spec
//! names it), else the CA file the caller gives (toolfleet's
//! `broker_ca_file`), else the platform's roots. `verify=verify_none` and
//! client certificates (`certfile`, `keyfile`) are refused rather than
//! ignored, and so is a CA file with a plaintext `amqp://` URL, which
//! usually means the `s` was forgotten. The transport itself is lapin's,
//! and lives with the broker.

use std::path::{Path, PathBuf};

use rustls::ClientConfig;

use crate::{Advice, Roots, Verify, client_config, query_pairs};

/// What a failed handshake with RabbitMQ points to.
pub const ADVICE: Advice = Advice {
    ca: "broker_ca_file or cacertfile in broker_url",
    name: "connect by a host name the certificate holds",
};

/// The TLS configuration `url` needs: `None` for `amqp://`, and for
/// `amqps://` one that checks the chain and the host name. Reads the CA
/// file now, so a missing or unreadable one is refused here.
pub fn tls_config(url: &str, ca_file: Option<&Path>) -> Result<Option<ClientConfig>, String> {
    let mut cacertfile = None;
    for (_, key, value) in query_pairs(url, "the broker URL")? {
        match key.as_str() {
            "cacertfile" => cacertfile = Some(PathBuf::from(value)),
            "certfile" | "keyfile" => {
                return Err(format!(
                    "{key} in the broker URL: client certificates are not supported"
                ));
            }
            "verify" if value != "verify_peer" => {
                return Err(
                    "verify in the broker URL: toolfleet always verifies RabbitMQ's certificate \
                     (verify_peer); name its CA in broker_ca_file or cacertfile"
                        .to_owned(),
                );
            }
            _ => {}
        }
    }
    let ca = cacertfile.or_else(|| ca_file.map(Path::to_path_buf));
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if !scheme.is_some_and(|s| s.eq_ignore_ascii_case("amqps")) {
        return match ca {
            Some(_) => Err(
                "a CA file is set (broker_ca_file or cacertfile) but broker_url is not \
                 amqps://: use amqps:// (port 5671 by default) to reach RabbitMQ over TLS"
                    .to_owned(),
            ),
            None => Ok(None),
        };
    }
    let roots = ca.map_or(Roots::Platform, Roots::File);
    client_config(&Verify::Full(roots), &[])
        .map(Some)
        .map_err(|e| format!("TLS to RabbitMQ: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_urls_need_no_tls_and_refuse_a_ca_file() {
        assert!(
            tls_config("amqp://guest:guest@127.0.0.1:5672/%2f", None)
                .unwrap()
                .is_none()
        );
        let ca = tls_config("amqp://h/%2f", Some(Path::new("/etc/ca.pem"))).unwrap_err();
        assert!(ca.contains("amqps://"), "{ca}");
        let ca = tls_config("amqp://h/%2f?cacertfile=%2Fetc%2Fca.pem", None).unwrap_err();
        assert!(ca.contains("amqps://"), "{ca}");
    }

    #[test]
    fn amqps_urls_verify_against_their_ca_and_refuse_what_is_not_supported() {
        assert!(tls_config("amqps://h/%2f", None).unwrap().is_some());
        assert!(
            tls_config("AMQPS://h/%2f?verify=verify_peer", None)
                .unwrap()
                .is_some()
        );
        let missing =
            tls_config("amqps://h/%2f?cacertfile=%2Fnonexistent%2Fca.pem", None).unwrap_err();
        assert!(missing.contains("/nonexistent/ca.pem"), "{missing}");
        let missing = tls_config("amqps://h/%2f", Some(Path::new("/nonexistent/b.pem")));
        assert!(missing.unwrap_err().contains("/nonexistent/b.pem"));
        let none = tls_config("amqps://h/%2f?verify=verify_none", None).unwrap_err();
        assert!(none.contains("verify_peer"), "{none}");
        let client = tls_config("amqps://h/%2f?certfile=%2Fc.pem", None).unwrap_err();
        assert!(client.contains("client certificates"), "{client}");
    }
}
