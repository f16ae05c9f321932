//! The console's sessions and CSRF tokens.
//!
//! Signing in exchanges a bearer token, once, for a session cookie:
//! `<token sha256>.<expires, Unix s>.<mac>`, the MAC an HMAC-SHA256 under
//! the console key (derived from the fleet's confirm-token key, so every
//! dispatcher of a fleet reads every session). It names the token by its
//! hash, never the token, and stops working when it expires or when the
//! token leaves the configuration. The cookie is `HttpOnly`,
//! `SameSite=Strict`, scoped to `/console`, and `Secure` when the request
//! came over TLS (a proxy's `X-Forwarded-Proto: https`). Every form that
//! changes something carries the session's CSRF token, an HMAC of the
//! session under the same key, compared in constant time.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The cookie's name.
pub const COOKIE: &str = "toolfleet_console";

/// How long a session lasts: a working day.
pub const SESSION_S: i64 = 8 * 3600;

/// The key of sessions and CSRF tokens.
#[derive(Clone)]
pub struct ConsoleKey([u8; 32]);

impl ConsoleKey {
    /// The console's key, derived from the fleet's signing key so that it
    /// is never the key of confirm tokens itself.
    pub fn derive(signing_key: &[u8; 32]) -> ConsoleKey {
        let mut key = [0u8; 32];
        key.copy_from_slice(&mac(signing_key, &[b"toolfleet console v1"]));
        ConsoleKey(key)
    }

    /// A session for the token of hash `sha256`, from `now_s` on.
    pub fn issue(&self, sha256: &str, now_s: i64) -> String {
        let expires = now_s.saturating_add(SESSION_S);
        let signed = format!("{sha256}.{expires}");
        let tag = hex::encode(mac(&self.0, &[b"session\0", signed.as_bytes()]));
        format!("{signed}.{tag}")
    }

    /// The token hash of `cookie` while it is a session this key issued
    /// and it has not expired at `now_s`.
    pub fn verify(&self, cookie: &str, now_s: i64) -> Option<String> {
        if cookie.len() > 256 {
            return None;
        }
        let (signed, tag) = cookie.rsplit_once('.')?;
        let (sha256, expires) = signed.split_once('.')?;
        let expires: i64 = expires.parse().ok()?;
        let tag = hex::decode(tag).ok()?;
        let mut check = keyed(&self.0);
        check.update(b"session\0");
        check.update(signed.as_bytes());
        check.verify_slice(&tag).ok()?;
        (expires > now_s && sha256.len() == 64).then(|| sha256.to_owned())
    }

    /// The CSRF token of session `cookie`.
    pub fn csrf(&self, cookie: &str) -> String {
        hex::encode(mac(&self.0, &[b"csrf\0", cookie.as_bytes()]))
    }

    /// The signature of a page's notice (`kind` and `text`), so that a
    /// link from elsewhere cannot make the console say what it did not.
    pub fn flash_sig(&self, kind: &str, text: &str) -> String {
        hex::encode(
            &mac(
                &self.0,
                &[b"flash\0", kind.as_bytes(), b"\0", text.as_bytes()],
            )[..16],
        )
    }

    /// True when `sig` is [`ConsoleKey::flash_sig`] of `kind` and `text`.
    pub fn flash_holds(&self, kind: &str, text: &str, sig: &str) -> bool {
        let Ok(sig) = hex::decode(sig) else {
            return false;
        };
        let mut check = keyed(&self.0);
        for part in [
            b"flash\0".as_slice(),
            kind.as_bytes(),
            b"\0",
            text.as_bytes(),
        ] {
            check.update(part);
        }
        check.verify_truncated_left(&sig).is_ok() && sig.len() == 16
    }

    /// True when `token` is the CSRF token of session `cookie`.
    pub fn csrf_holds(&self, cookie: &str, token: &str) -> bool {
        let Ok(token) = hex::decode(token) else {
            return false;
        };
        let mut check = keyed(&self.0);
        check.update(b"csrf\0");
        check.update(cookie.as_bytes());
        check.verify_slice(&token).is_ok()
    }
}

fn keyed(key: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length")
}

fn mac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = keyed(key);
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

/// The `Set-Cookie` value of session `value`, lasting `max_age_s` (0 ends
/// it), `Secure` when the console is served over TLS.
pub fn set_cookie(value: &str, max_age_s: i64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{COOKIE}={value}; Path=/console; Max-Age={max_age_s}; HttpOnly; SameSite=Strict{secure}"
    )
}

/// The session cookie among a request's `Cookie` headers.
pub fn cookie_of<'a>(headers: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    headers
        .flat_map(|header| header.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    #[test]
    fn a_session_holds_until_it_expires_and_only_under_its_key() {
        let key = ConsoleKey::derive(&[7; 32]);
        let cookie = key.issue(SHA, 1_000);
        assert_eq!(key.verify(&cookie, 1_001).as_deref(), Some(SHA));
        assert_eq!(key.verify(&cookie, 1_000 + SESSION_S), None, "expired");
        let other = ConsoleKey::derive(&[8; 32]);
        assert_eq!(other.verify(&cookie, 1_001), None, "another fleet's");
        let (signed, _) = cookie.rsplit_once('.').unwrap();
        let longer = signed.replace(".", ".9");
        let forged = format!("{longer}.{}", cookie.rsplit_once('.').unwrap().1);
        assert_eq!(key.verify(&forged, 1_001), None, "a changed expiry");
        for bad in ["", "x", "a.b.c", "a.1.zz", &"a".repeat(300)] {
            assert_eq!(key.verify(bad, 1_001), None, "{bad}");
        }
    }

    #[test]
    fn a_csrf_token_is_its_sessions_alone() {
        let key = ConsoleKey::derive(&[7; 32]);
        let (one, two) = (key.issue(SHA, 1_000), key.issue(SHA, 2_000));
        let token = key.csrf(&one);
        assert!(key.csrf_holds(&one, &token));
        assert!(!key.csrf_holds(&two, &token));
        assert!(!key.csrf_holds(&one, ""));
        assert!(!key.csrf_holds(&one, "not hex"));
    }

    #[test]
    fn a_notice_shows_only_as_the_console_signed_it() {
        let key = ConsoleKey::derive(&[7; 32]);
        let sig = key.flash_sig("done", "Answered.");
        assert!(key.flash_holds("done", "Answered.", &sig));
        assert!(!key.flash_holds("done", "Paste your token at evil.example", &sig));
        assert!(!key.flash_holds("error", "Answered.", &sig));
        assert!(!key.flash_holds("done", "Answered.", &sig[..8]));
        assert!(!key.flash_holds("done", "Answered.", ""));
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_secure_over_tls() {
        let plain = set_cookie("v", 60, false);
        assert!(plain.contains("HttpOnly") && plain.contains("SameSite=Strict"));
        assert!(!plain.contains("Secure"));
        assert!(set_cookie("v", 60, true).ends_with("; Secure"));
        let headers = ["a=1; toolfleet_console=xyz", "b=2"];
        assert_eq!(cookie_of(headers.into_iter()), Some("xyz"));
        assert_eq!(cookie_of(["a=1"].into_iter()), None);
    }
}
