//! Tool names on the wire.
//!
//! Our names allow 128 characters and dots; OpenAI and Anthropic allow 64
//! characters and no dots, Gemini 64 starting with a letter or underscore. A
//! name a provider would refuse is rewritten deterministically, so the same
//! registry always exports the same names and a call can be mapped back.

use std::borrow::Cow;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::Format;
use crate::registry::{Registry, Tool};

/// The longest function name OpenAI, Anthropic and Gemini accept.
const PROVIDER_MAX: usize = 64;
/// `_` and 8 hex characters.
const SUFFIX_LEN: usize = 9;

/// The name `format` sees for tool `name`: unchanged when the provider
/// accepts it; otherwise the refused characters become `_` and a short hash
/// of the original name is appended, so two names that clean up the same
/// (`a.b`, `a-b`) stay distinct.
pub fn wire_name(format: Format, name: &str) -> Cow<'_, str> {
    let allowed: fn(char) -> bool = match format {
        // Our own names are already valid MCP names (A-Z a-z 0-9 _ - .).
        Format::Neutral | Format::Mcp => return Cow::Borrowed(name),
        Format::OpenAi | Format::OpenAiResponses | Format::Anthropic => {
            |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-')
        }
        Format::Gemini => |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'),
    };
    let bad_start = format == Format::Gemini
        && !name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let valid = !name.is_empty() && name.len() <= PROVIDER_MAX && name.chars().all(allowed);
    if valid && !bad_start {
        return Cow::Borrowed(name);
    }
    let mut cleaned: String = name
        .chars()
        .map(|c| if allowed(c) { c } else { '_' })
        .collect();
    if bad_start {
        cleaned.insert(0, '_');
    }
    // Only ASCII remains, so byte truncation is on a character boundary.
    cleaned.truncate(PROVIDER_MAX - SUFFIX_LEN);
    let digest = Sha256::digest(name.as_bytes());
    Cow::Owned(format!("{cleaned}_{}", hex::encode(&digest[..4])))
}

/// The registered tool a provider called `wire`: the exact registry name
/// first, then the tool whose wire name it is.
pub fn resolve<'r>(format: Format, registry: &'r Registry, wire: &str) -> Option<&'r Arc<Tool>> {
    registry.get(wire).or_else(|| {
        registry
            .tools()
            .find(|t| wire_name(format, t.name()) == wire)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_pass_through_and_others_are_rewritten_stably() {
        assert_eq!(wire_name(Format::OpenAi, "find_expenses"), "find_expenses");
        assert_eq!(wire_name(Format::Gemini, "receipts.ocr"), "receipts.ocr");
        let dotted = wire_name(Format::OpenAi, "receipts.ocr");
        let dashed = wire_name(Format::OpenAi, "receipts-ocr");
        assert!(dotted.starts_with("receipts_ocr_") && dotted.len() == "receipts_ocr_".len() + 8);
        assert_ne!(dotted, wire_name(Format::OpenAi, "receipts_ocr"));
        assert_eq!(dashed, "receipts-ocr");
        assert_eq!(dotted, wire_name(Format::Anthropic, "receipts.ocr"));

        let long = "a".repeat(128);
        let cut = wire_name(Format::Anthropic, &long);
        assert_eq!(cut.len(), PROVIDER_MAX);
        assert_ne!(cut, wire_name(Format::Anthropic, &"a".repeat(127)));

        let digit = wire_name(Format::Gemini, "9lives");
        assert!(digit.starts_with("_9lives_"), "{digit}");
        assert_eq!(wire_name(Format::Mcp, "receipts.ocr"), "receipts.ocr");
    }
}
