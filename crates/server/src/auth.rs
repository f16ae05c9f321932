//! Authentication: a bearer token maps to a principal (tenant, user, scopes).
//! Only the SHA-256 of each token is kept; a token is never logged.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use toolfleet_core::{ErrorCode, Principal, ToolError};

/// The hex SHA-256 of a token, as the configuration stores it.
pub fn token_sha256(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A token's SHA-256.
type Digest32 = [u8; 32];

/// The known tokens, by the SHA-256 of each: a call's token is hashed and
/// looked up as bytes, not written out in hex first.
#[derive(Default, Clone)]
pub struct Auth {
    by_hash: HashMap<Digest32, Arc<Principal>>,
}

impl Auth {
    /// Adds a principal under the hex SHA-256 of its token; one that is not
    /// 64 hex digits names no token (the configuration checks it first).
    pub fn insert(&mut self, sha256_hex: &str, principal: Principal) {
        if let Some(digest) = digest_of_hex(sha256_hex) {
            self.by_hash.insert(digest, Arc::new(principal));
        }
    }

    /// True when no token is known.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The principal of the token whose hex SHA-256 is `sha256_hex` (a
    /// console session names its token so): `None` once it is not known.
    pub fn by_sha256(&self, sha256_hex: &str) -> Option<Arc<Principal>> {
        self.by_hash.get(&digest_of_hex(sha256_hex)?).cloned()
    }

    /// The principal of an `Authorization` header value.
    pub fn principal(&self, header: Option<&str>) -> Result<Arc<Principal>, ToolError> {
        let unauthenticated = |m: &str| ToolError::new(ErrorCode::Unauthenticated, m);
        let header =
            header.ok_or_else(|| unauthenticated("send `Authorization: Bearer <token>`"))?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= 512)
            .ok_or_else(|| unauthenticated("the Authorization header must be `Bearer <token>`"))?;
        let digest: Digest32 = Sha256::digest(token.as_bytes()).into();
        self.by_hash
            .get(&digest)
            .cloned()
            .ok_or_else(|| unauthenticated("the bearer token is not known here"))
    }
}

/// The 32 bytes of a hex SHA-256 (either case), if it is one.
fn digest_of_hex(sha256_hex: &str) -> Option<Digest32> {
    let mut digest = [0u8; 32];
    hex::decode_to_slice(sha256_hex, &mut digest).ok()?;
    Some(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_map_to_principals_by_hash() {
        let mut auth = Auth::default();
        auth.insert(
            &token_sha256("s3cret"),
            Principal::new("acme", "alice", ["a"]),
        );
        assert_eq!(
            auth.principal(Some("Bearer s3cret")).unwrap().tenant,
            "acme"
        );
        for bad in [
            None,
            Some("s3cret"),
            Some("Bearer "),
            Some("Bearer nope"),
            Some("Basic s3cret"),
        ] {
            assert_eq!(
                auth.principal(bad).unwrap_err().code,
                ErrorCode::Unauthenticated
            );
        }
    }

    #[test]
    fn a_hash_is_known_in_either_case_and_a_bad_one_names_nothing() {
        let mut auth = Auth::default();
        let hash = token_sha256("s3cret");
        auth.insert(
            &hash.to_ascii_uppercase(),
            Principal::new("acme", "alice", ["a"]),
        );
        auth.insert("not hex", Principal::new("acme", "mallory", ["a"]));
        assert_eq!(auth.by_hash.len(), 1);
        let alice = auth.principal(Some("Bearer s3cret")).expect("known");
        assert_eq!(alice.user, "alice");
        assert_eq!(
            auth.by_sha256(&hash).map(|p| p.user.clone()).as_deref(),
            Some("alice")
        );
        assert!(auth.by_sha256(&hash[..63]).is_none());
        assert!(auth.by_sha256("not hex").is_none());
    }
}
