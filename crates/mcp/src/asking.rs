//! Tools that ask the client (`asks_client`): a tool's result naming
//! `input_requests` becomes a 2026-07-28 `input_required` result, and the
//! client's retry reaches the tool with its answers.
//!
//! The state a tool hands on (`request_state`) travels through the client,
//! so it goes out signed: an HMAC-SHA256 under the server's key over the
//! tool, the caller and the state. A retry whose state was altered, or made
//! for another tool or caller, is refused (-32602) before the tool runs.
//! Any dispatcher with the same key checks it: nothing is kept between the
//! rounds.
//!
//! A client of the 2025 revisions has no `input_required` result: in a
//! session (or over stdio) it is asked by requests of the server's during
//! the call ([`ask`]), and the tool is called again with the answers, its
//! state never leaving the server.

use hmac::{Hmac, KeyInit, Mac};
use rmcp::model::{ClientCapabilities, InputRequest, InputRequests, ServerRequest};
use rmcp::service::PeerRequestOptions;
use rmcp::{ErrorData, Peer, RoleServer};
use serde_json::{Map, Value, json};
use sha2::Sha256;
use toolfleet_core::Principal;

/// The longest `requestState` accepted back, in bytes.
const MAX_STATE: usize = 64 * 1024;

/// The longest the server waits for a client's answer to one request (a
/// person may be filling in a form).
const ASK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Puts `request` to the client of `peer` and answers its result as JSON,
/// or why it did not answer (it refused, failed, or took past
/// [`ASK_TIMEOUT`]).
pub async fn ask(peer: &Peer<RoleServer>, request: InputRequest) -> Result<Value, String> {
    let request = match request {
        InputRequest::CreateMessage(request) => ServerRequest::CreateMessageRequest(request),
        InputRequest::Elicitation(request) => ServerRequest::ElicitRequest(request),
        InputRequest::ListRoots(request) => ServerRequest::ListRootsRequest(request),
        _ => return Err("it is not a request a client answers".to_owned()),
    };
    let mut options = PeerRequestOptions::no_options();
    options.timeout = Some(ASK_TIMEOUT);
    let answer = peer
        .send_request_with_option(request, options)
        .await
        .map_err(|e| e.to_string())?
        .await_response()
        .await
        .map_err(|e| e.to_string())?;
    serde_json::to_value(answer).map_err(|e| e.to_string())
}

fn mac(key: &[u8; 32], tool: &str, principal: &Principal, payload: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    for part in [
        b"toolfleet mcp request state v1\0".as_slice(),
        tool.as_bytes(),
        b"\0",
        principal.tenant.as_bytes(),
        b"\0",
        principal.user.as_bytes(),
        b"\0",
        payload,
    ] {
        mac.update(part);
    }
    mac
}

/// The key of request states, derived from the fleet's signing key so that
/// it is never that key itself.
pub fn derive_key(signing_key: &[u8; 32]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(signing_key).expect("any key length");
    mac.update(b"toolfleet mcp request state key v1");
    mac.finalize().into_bytes().into()
}

/// `state` as the `requestState` of a question `tool` asks `principal`:
/// the state's JSON in hex, a dot, its tag in hex.
pub fn sign(key: &[u8; 32], tool: &str, principal: &Principal, state: &Value) -> String {
    let payload = state.to_string();
    let tag = mac(key, tool, principal, payload.as_bytes())
        .finalize()
        .into_bytes();
    format!("{}.{}", hex::encode(payload), hex::encode(tag))
}

/// The state a `requestState` carries, when this server signed it for
/// `tool` and `principal`; else -32602.
pub fn verify(
    key: &[u8; 32],
    tool: &str,
    principal: &Principal,
    token: &str,
) -> Result<Value, ErrorData> {
    let refused = || {
        ErrorData::invalid_params(
            "requestState is not one this server gave for this tool and caller (altered or foreign); call again without it",
            None,
        )
    };
    if token.len() > MAX_STATE {
        return Err(refused());
    }
    let (payload, tag) = token.split_once('.').ok_or_else(refused)?;
    let payload = hex::decode(payload).map_err(|_| refused())?;
    let tag = hex::decode(tag).map_err(|_| refused())?;
    mac(key, tool, principal, &payload)
        .verify_slice(&tag)
        .map_err(|_| refused())?;
    serde_json::from_slice(&payload).map_err(|_| refused())
}

/// The capability a client must declare to answer a request of `method`.
fn capability_of(method: &str) -> Option<&'static str> {
    match method {
        "elicitation/create" => Some("elicitation"),
        "sampling/createMessage" => Some("sampling"),
        "roots/list" => Some("roots"),
        _ => None,
    }
}

/// The call a tool that asked hands on: its result
/// `{"call": {"name", "arguments"?}}`.
pub struct HandedOn {
    /// The tool to call.
    pub name: String,
    /// Its arguments (`{}` when absent).
    pub arguments: Value,
}

/// The call `result` hands on, when it names one.
pub fn handed_on(result: &Value) -> Option<HandedOn> {
    let call = result.get("call")?.as_object()?;
    let name = call.get("name")?.as_str()?.to_owned();
    let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
    Some(HandedOn { name, arguments })
}

/// The requests as rmcp's, refused -32021 when one needs a capability the
/// client did not declare (naming them all), and as an internal error when
/// one is not a request a client answers.
pub fn requests(
    requests: &Map<String, Value>,
    declared: Option<&ClientCapabilities>,
) -> Result<InputRequests, ErrorData> {
    let declared = declared
        .and_then(|c| serde_json::to_value(c).ok())
        .unwrap_or_else(|| json!({}));
    let mut missing = Map::new();
    for request in requests.values() {
        let method = request.get("method").and_then(Value::as_str).unwrap_or("");
        match capability_of(method) {
            Some(capability) if declared.get(capability).is_none_or(Value::is_null) => {
                missing.insert(capability.to_owned(), json!({}));
            }
            Some(_) => {}
            None => {
                return Err(ErrorData::internal_error(
                    format!("the tool asked the client an unknown request `{method}`"),
                    None,
                ));
            }
        }
    }
    if !missing.is_empty() {
        let required: ClientCapabilities = serde_json::from_value(Value::Object(missing))
            .map_err(|e| ErrorData::internal_error(format!("capabilities: {e}"), None))?;
        return Err(ErrorData::missing_required_client_capability(required));
    }
    serde_json::from_value(Value::Object(requests.clone())).map_err(|e| {
        ErrorData::internal_error(
            format!("the tool's input requests are not MCP requests: {e}"),
            None,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Principal {
        Principal::new("acme", "alice", ["x"])
    }

    #[test]
    fn a_signed_state_comes_back_only_unaltered_for_its_tool_and_caller() {
        let key = [7u8; 32];
        let state = json!({"round": 2});
        let token = sign(&key, "t", &alice(), &state);
        assert_eq!(verify(&key, "t", &alice(), &token).ok(), Some(state));
        let tampered = format!("{token}-TAMPERED");
        assert!(verify(&key, "t", &alice(), &tampered).is_err());
        assert!(verify(&key, "other", &alice(), &token).is_err());
        let bob = Principal::new("acme", "bob", ["x"]);
        assert!(verify(&key, "t", &bob, &token).is_err());
        assert!(verify(&[8u8; 32], "t", &alice(), &token).is_err());
        assert!(verify(&key, "t", &alice(), "zz.zz").is_err());
    }

    #[test]
    fn a_result_may_hand_the_call_on() {
        let next = handed_on(&json!({"call": {"name": "later", "arguments": {"a": 1}}}))
            .expect("handed on");
        assert_eq!(
            (next.name.as_str(), next.arguments),
            ("later", json!({"a": 1}))
        );
        let bare = handed_on(&json!({"call": {"name": "later"}})).expect("handed on");
        assert_eq!(bare.arguments, json!({}));
        assert!(handed_on(&json!({"call": {"arguments": {}}})).is_none());
        assert!(handed_on(&json!({"text": "done"})).is_none());
    }

    #[test]
    fn a_request_the_client_cannot_answer_is_refused_naming_its_capability() {
        let asked = json!({
            "a": {"method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 5}},
            "b": {"method": "roots/list", "params": {}}
        });
        let asked = asked.as_object().expect("object");
        let caps: ClientCapabilities = serde_json::from_value(json!({"roots": {}})).expect("caps");
        let error = requests(asked, Some(&caps)).expect_err("sampling is missing");
        assert_eq!(error.code.0, -32021);
        let data = error.data.expect("data");
        assert_eq!(data["requiredCapabilities"], json!({"sampling": {}}));
        let both: ClientCapabilities =
            serde_json::from_value(json!({"roots": {}, "sampling": {}})).expect("caps");
        assert_eq!(requests(asked, Some(&both)).expect("answerable").len(), 2);
    }
}
