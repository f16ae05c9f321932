//! The secrets a process holds and who may call it: the known tokens
//! (`[[auth.tokens]]`, or the development token `serve` makes on a loopback
//! address, and the refusal to serve the HTTP API without either), the
//! confirm-token key, and every tenant's webhook settings and key. Each
//! secret comes from the configuration or the environment, else is kept
//! owner-only in the data directory ([`crate::files`]); none is ever
//! logged or handed to a tool.

use std::collections::BTreeSet;

use toolfleet_core::metrics::Role;
use toolfleet_core::{Principal, Runtime};
use toolfleet_server::webhooks::{HookSettings, Webhooks};
use toolfleet_server::{Auth, token_sha256};

use crate::config::Config;
use crate::files::kept_secret;
use crate::serve::Roles;

/// The development token's file in the data directory.
pub(crate) const DEV_TOKEN_FILE: &str = "dev-token";

fn random_hex(bytes: usize) -> String {
    let mut out = String::new();
    while out.len() < bytes * 2 {
        out.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    out.truncate(bytes * 2);
    out
}

/// The key of confirm tokens: `confirm_secret` (shared by every dispatcher
/// of a fleet), else one kept in the data directory.
pub(crate) fn signing_key(config: &Config) -> Result<[u8; 32], String> {
    let dir = &config.data_dir;
    let text = match &config.confirm_secret {
        Some(secret) => secret.clone(),
        None => kept_secret(dir, "secret", || random_hex(32))?.0,
    };
    let wrong = || {
        format!(
            "the confirm-token key (confirm_secret, or {}/secret) must be 64 hex characters; delete the file to make a new one",
            dir.display()
        )
    };
    let bytes = hex::decode(text.trim()).map_err(|_| wrong())?;
    bytes.try_into().map_err(|_| wrong())
}

/// Whether `listen` names a loopback address: 127.0.0.0/8, ::1 or `localhost`.
fn is_loopback(listen: &str) -> bool {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(address) => address.ip().to_canonical().is_loopback(),
        Err(_) => listen
            .rsplit_once(':')
            .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost")),
    }
}

/// Where and how to add a token, for the messages that ask for one.
const HOW_TO_ADD_A_TOKEN: &str = r#"the configuration file (toolfleet.toml, --config or TOOLFLEET_CONFIG):

  [[auth.tokens]]
  sha256 = "..."      # printf %s "$TOKEN" | sha256sum
  tenant = "acme"
  user = "alice"
  scopes = ["expenses:read", "expenses:submit"]

where TOKEN is a long random secret (TOKEN=tf_$(openssl rand -hex 24), say) that clients send as `Authorization: Bearer $TOKEN`; the file holds only its SHA-256."#;

/// A process serving the HTTP API needs a configured token, but for
/// `serve` on a loopback address, which makes a development token;
/// `toolfleet mcp` (stdio) may use that token, and workers need none.
pub(crate) fn check_tokens(config: &Config, roles: &Roles) -> Result<(), String> {
    if !roles.dispatcher || !roles.http || !config.auth.tokens.is_empty() {
        return Ok(());
    }
    match roles.metrics_role() {
        Role::Serve if is_loopback(&config.listen) => Ok(()),
        Role::Serve => Err(format!(
            "serve makes a development token only when it listens on a loopback address (127.0.0.1, ::1, localhost), and listen (or TOOLFLEET_LISTEN) is {}, with no [[auth.tokens]] configured. Listen on 127.0.0.1, or add a token to {HOW_TO_ADD_A_TOKEN}",
            config.listen
        )),
        _ => Err(format!(
            "the dispatcher needs at least one token in [[auth.tokens]] (it makes no development token). Add one to {HOW_TO_ADD_A_TOKEN}"
        )),
    }
}

/// The principals of the configuration, or a development token (`serve`
/// on a loopback address and `toolfleet mcp` only, see [`check_tokens`]).
pub(crate) fn authentication(config: &Config, runtime: &Runtime) -> Result<Auth, String> {
    let mut auth = Auth::default();
    for token in &config.auth.tokens {
        if token.sha256.len() != 64 || hex::decode(&token.sha256).is_err() {
            return Err(format!(
                "auth.tokens: sha256 of `{}` must be 64 hex characters",
                token.user
            ));
        }
        auth.insert(
            &token.sha256,
            Principal::new(&token.tenant, &token.user, token.scopes.iter().cloned()),
        );
    }
    if auth.is_empty() {
        let (token, made) = kept_secret(&config.data_dir, DEV_TOKEN_FILE, || {
            format!("tf_dev_{}", random_hex(24))
        })?;
        // The newcomer can try every tool, so the token holds every scope.
        let scopes: BTreeSet<String> = runtime
            .registry()
            .tools()
            .flat_map(|t| t.required_scopes().to_vec())
            .collect();
        auth.insert(&token_sha256(&token), Principal::new("dev", "dev", scopes));
        let file = config.data_dir.join(DEV_TOKEN_FILE);
        eprintln!(
            "{} development token (kept in {}):\n  export TOOLFLEET_TOKEN={token}\n  curl -H \"Authorization: Bearer $TOOLFLEET_TOKEN\" http://{}/v1/tools",
            if made { "made a" } else { "using the" },
            file.display(),
            config.listen
        );
    }
    Ok(auth)
}

/// Every tenant's webhook settings: `[webhooks]` (its key, when absent,
/// kept in `data_dir`), and for each `[tenants.<name>.webhooks]` its own
/// `allow` and `secret`, each one left out being the global one.
pub(crate) fn webhooks(config: &Config) -> Result<Webhooks, String> {
    let key = match &config.webhooks.secret {
        Some(secret) => secret.clone(),
        None => kept_secret(&config.data_dir, "webhook-secret", || random_hex(32))?.0,
    };
    let global = HookSettings {
        allow: config.webhooks.allow.clone().into(),
        key: key.into_bytes().into(),
    };
    let mut webhooks = Webhooks::new(global.clone());
    for (tenant, settings) in &config.tenants {
        let Some(own) = &settings.webhooks else {
            continue;
        };
        if !config.auth.tokens.is_empty() && !config.auth.tokens.iter().any(|t| &t.tenant == tenant)
        {
            tracing::warn!(%tenant, "[tenants.{tenant}.webhooks] names a tenant no token of [[auth.tokens]] has");
        }
        let settings = HookSettings {
            allow: match &own.allow {
                Some(allow) => allow.clone().into(),
                None => global.allow.clone(),
            },
            key: match &own.secret {
                Some(secret) => secret.as_bytes().into(),
                None => global.key.clone(),
            },
        };
        webhooks = webhooks.with_tenant(tenant.clone(), settings);
    }
    Ok(webhooks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        Config::parse(text, std::path::Path::new("toolfleet.toml")).expect("a configuration")
    }

    #[test]
    fn a_tenant_takes_each_webhook_setting_it_leaves_out_from_webhooks() {
        let global_key = "g".repeat(32);
        let own_key = "o".repeat(32);
        let config = parse(&format!(
            r#"
[webhooks]
allow = ["127.0.0.1:*"]
secret = "{global_key}"

[tenants.keyed.webhooks]
secret = "{own_key}"

[tenants.listed.webhooks]
allow = ["hooks.listed.example"]

[tenants.closed.webhooks]
allow = []

[tenants.bare]
"#
        ));
        let webhooks = webhooks(&config).expect("settings");
        let allow = |tenant: &str| -> Vec<String> {
            webhooks
                .of(tenant)
                .allow
                .iter()
                .map(|r| r.to_string())
                .collect()
        };
        let key = |tenant: &str| webhooks.of(tenant).key.to_vec();
        assert_eq!(allow("keyed"), ["127.0.0.1:*"]);
        assert_eq!(key("keyed"), own_key.as_bytes());
        assert_eq!(allow("listed"), ["hooks.listed.example"]);
        assert_eq!(key("listed"), global_key.as_bytes());
        assert!(allow("closed").is_empty());
        for other in ["bare", "anyone"] {
            assert_eq!(allow(other), ["127.0.0.1:*"]);
            assert_eq!(key(other), global_key.as_bytes());
        }
    }

    /// Only the HTTP API needs a token; `serve` makes one on loopback only.
    #[test]
    fn the_http_api_without_tokens_is_refused_but_serve_on_loopback() {
        let dispatcher = Roles {
            no_workers: true,
            ..Roles::all()
        };
        let worker = Roles {
            dispatcher: false,
            http: false,
            ..Roles::all()
        };
        let mcp = Roles {
            http: false,
            ..Roles::all()
        };
        let open = parse("listen = \"0.0.0.0:8080\"");
        let local = parse("listen = \"127.0.0.1:8080\"");
        let token = "\n[[auth.tokens]]\nsha256 = \"ab\"\ntenant = \"t\"\nuser = \"u\"\n";
        let open_with_token = parse(&format!("listen = \"0.0.0.0:8080\"{token}"));

        assert_eq!(check_tokens(&local, &Roles::all()), Ok(()));
        let serve = check_tokens(&open, &Roles::all()).unwrap_err();
        assert!(
            serve.contains("0.0.0.0:8080") && serve.contains("sha256sum"),
            "{serve}"
        );
        assert_eq!(check_tokens(&open_with_token, &Roles::all()), Ok(()));

        for config in [&local, &open] {
            let refused = check_tokens(config, &dispatcher).unwrap_err();
            assert!(refused.contains("[[auth.tokens]]"), "{refused}");
            assert_eq!(
                check_tokens(config, &worker),
                Ok(()),
                "workers serve no API"
            );
            assert_eq!(check_tokens(config, &mcp), Ok(()), "mcp speaks on stdio");
        }
        assert_eq!(check_tokens(&open_with_token, &dispatcher), Ok(()));
    }

    #[test]
    fn loopback_means_127_0_0_0_8_the_ipv6_loopback_and_localhost() {
        for listen in [
            "127.0.0.1:8080",
            "127.1.2.3:0",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:80",
            "localhost:8080",
            "LocalHost:0",
        ] {
            assert!(is_loopback(listen), "{listen}");
        }
        for listen in [
            "0.0.0.0:8080",
            "[::]:8080",
            "10.0.0.1:8080",
            "example.com:8080",
            "localhost.example.com:80",
            "localhost",
        ] {
            assert!(!is_loopback(listen), "{listen}");
        }
    }
}
