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

/// The known tokens.
#[derive(Default, Clone)]
pub struct Auth {
    by_hash: HashMap<String, Arc<Principal>>,
}

impl Auth {
    /// Adds a principal under the hex SHA-256 of its token.
    pub fn insert(&mut self, sha256_hex: &str, principal: Principal) {
        self.by_hash
            .insert(sha256_hex.to_ascii_lowercase(), Arc::new(principal));
    }

    /// True when no token is known.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// The principal of the token whose hex SHA-256 is `sha256_hex` (a
    /// console session names its token so): `None` once it is not known.
    pub fn by_sha256(&self, sha256_hex: &str) -> Option<Arc<Principal>> {
        self.by_hash.get(sha256_hex).cloned()
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
        self.by_hash
            .get(&token_sha256(token))
            .cloned()
            .ok_or_else(|| unauthenticated("the bearer token is not known here"))
    }
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
}
