//! Input that never becomes an MCP message, answered as JSON-RPC says, on stdio and
//! HTTP alike: unparsable JSON is -32700, JSON that is no message is -32600, both
//! with the request's id when it can be read and `null` otherwise.
//!
//! rmcp cannot answer these itself: its stdio transport ignores unparsable lines and
//! drops oversized ones without a word, its HTTP service answers 415 with a plain-text
//! body, and its error type leaves out an id it does not know (JSON-RPC wants
//! `"id": null`). So both transports classify each message here first and write the
//! error replies as JSON of their own.

use rmcp::model::ClientJsonRpcMessage;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde_json::{Value, json};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const INVALID_PARAMS: i64 = -32602;

/// The requests a client sends in MCP 2026-07-28 (rmcp's list, which it keeps
/// private). A request for one of them that rmcp cannot read has bad params.
const STANDARD_REQUESTS: [&str; 15] = [
    "initialize",
    "ping",
    "server/discover",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/templates/list",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "completion/complete",
    "logging/setLevel",
];

pub fn is_standard_request(method: &str) -> bool {
    STANDARD_REQUESTS.contains(&method)
}

/// What one incoming message is.
#[derive(Debug)]
pub enum Incoming {
    Message(Box<ClientJsonRpcMessage>),
    /// A notification rmcp does not know (another protocol's, or a future one):
    /// JSON-RPC gives notifications no reply, so it is dropped.
    Ignored,
    /// Not a message: the error to send back.
    Reply(Value),
}

/// Classifies one message's bytes (a stdio line without its newline, or an HTTP body).
pub fn classify(bytes: &[u8]) -> Incoming {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let error = match serde_json::from_slice::<ClientJsonRpcMessage>(bytes) {
        Ok(message) => return Incoming::Message(Box::new(message)),
        Err(e) => e,
    };
    // Only a message that failed is parsed again, to tell why.
    let value: Value = match serde_json::from_slice(bytes) {
        Ok(value) => value,
        Err(e) => return Incoming::Reply(self::error(Value::Null, PARSE_ERROR, parse_message(&e))),
    };
    let is_notification = value.get("method").is_some() && value.get("id").is_none();
    if value.is_object() && is_notification {
        return Incoming::Ignored;
    }
    let id = usable_id(value.get("id"));
    // A message of another JSON-RPC version (or none) is no request at all, whatever
    // its method: its params are not what is wrong.
    if value.is_object() && value.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Incoming::Reply(self::error(
            id,
            INVALID_REQUEST,
            "Invalid Request: `jsonrpc` must be \"2.0\"",
        ));
    }
    // Most bad params still make a message (rmcp reads it as a request of its own,
    // which the handler answers); params that are no object do not.
    if let Some(method) = value.get("method").and_then(Value::as_str)
        && is_standard_request(method)
        && !id.is_null()
    {
        return Incoming::Reply(self::error(
            id,
            INVALID_PARAMS,
            format!("invalid params for `{method}`: {error}"),
        ));
    }
    Incoming::Reply(self::error(
        id,
        INVALID_REQUEST,
        format!("Invalid Request: not a JSON-RPC 2.0 request, notification or response ({error})"),
    ))
}

/// The reply to a message too long to read: -32600, with the id if its first or
/// last bytes name one (SDKs write `id` first, or last).
pub fn oversized(head: &[u8], tail: &[u8], limit: usize) -> Value {
    let id = leading_id(head)
        .or_else(|| trailing_id(tail))
        .unwrap_or(Value::Null);
    error(
        id,
        INVALID_REQUEST,
        format!("Invalid Request: message longer than {limit} bytes"),
    )
}

/// A JSON-RPC error response.
pub fn error(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

fn parse_message(e: &serde_json::Error) -> String {
    format!("Parse error: {e}")
}

/// A request id as JSON-RPC allows it (a string or a number), else `null`.
fn usable_id(id: Option<&Value>) -> Value {
    match id {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        _ => Value::Null,
    }
}

/// The top-level `id` of a JSON object cut short: read member by member until `id`,
/// which keeps what was found although the cut input then fails to parse.
fn leading_id(head: &[u8]) -> Option<Value> {
    struct IdSeeker<'a>(&'a mut Option<Value>);
    impl<'de> Visitor<'de> for IdSeeker<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON-RPC message")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                if key == "id" {
                    *self.0 = Some(map.next_value::<Value>()?);
                    return Ok(());
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let head = head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head);
    let mut found = None;
    let mut deserializer = serde_json::Deserializer::from_slice(head);
    // Fails on the cut (or after `id`, at a map left unfinished); `found` holds the id.
    let _ = serde::Deserializer::deserialize_map(&mut deserializer, IdSeeker(&mut found));
    match usable_id(found.as_ref()) {
        Value::Null => None,
        id => Some(id),
    }
}

/// The id of an object whose last member is `"id": <number or string>`, from its
/// last bytes (`…,"id":7}`). A nested object's `id` ends in `}}` and is not taken.
fn trailing_id(tail: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(tail).ok().or_else(|| {
        // The cut may fall inside a UTF-8 sequence: skip to the next character.
        (1..4).find_map(|skip| std::str::from_utf8(tail.get(skip..)?).ok())
    })?;
    let body = text.trim_end().strip_suffix('}')?.trim_end();
    let (value_text, before) = if let Some(rest) = body.strip_suffix('"') {
        let open = rest.rfind('"')?;
        (&body[open..], &rest[..open])
    } else {
        let start = body
            .rfind(|c: char| !(c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E')))
            .map_or(0, |i| i + 1);
        (&body[start..], &body[..start])
    };
    let before = before.trim_end().strip_suffix(':')?.trim_end();
    let before = before.strip_suffix("\"id\"")?.trim_end();
    if !(before.ends_with(',') || before.ends_with('{')) {
        return None;
    }
    match serde_json::from_str::<Value>(value_text).ok()? {
        id @ (Value::String(_) | Value::Number(_)) => Some(id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply_to(bytes: &[u8]) -> Value {
        match classify(bytes) {
            Incoming::Reply(value) => value,
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    /// N7 of issue 36: `"jsonrpc": "1.0"`, or none, on a standard request was
    /// answered -32602 (bad params).
    #[test]
    fn another_jsonrpc_version_is_an_invalid_request() {
        for input in [
            r#"{"jsonrpc":"1.0","id":1,"method":"initialize","params":{}}"#,
            r#"{"id":2,"method":"tools/list"}"#,
            r#"{"jsonrpc":2.0,"id":3,"method":"ping"}"#,
        ] {
            let reply = reply_to(input.as_bytes());
            assert_eq!(reply["error"]["code"], INVALID_REQUEST, "{input}: {reply}");
            assert!(reply["id"].is_number(), "{input}: {reply}");
        }
    }

    #[test]
    fn unparsable_input_is_a_parse_error_with_a_null_id() {
        for input in [
            &b"{bad"[..],
            b"",
            b"\xff\xfe",
            b"{\"jsonrpc\":\"2.0\",\"id\":1",
        ] {
            let reply = reply_to(input);
            assert_eq!(reply["error"]["code"], json!(PARSE_ERROR), "{reply}");
            assert_eq!(reply["id"], Value::Null);
            assert!(reply.as_object().is_some_and(|o| o.contains_key("id")));
        }
    }

    #[test]
    fn json_that_is_no_message_is_an_invalid_request_with_its_id() {
        let reply = reply_to(br#"{"jsonrpc":"2.0","id":7}"#);
        assert_eq!(reply["error"]["code"], json!(INVALID_REQUEST));
        assert_eq!(reply["id"], json!(7));
        let reply = reply_to(br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#);
        assert_eq!(
            (reply["error"]["code"].clone(), reply["id"].clone()),
            (json!(INVALID_REQUEST), Value::Null)
        );
        let reply = reply_to(br#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#);
        assert_eq!(reply["id"], Value::Null);
        let reply = reply_to(br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":"1+1"}"#);
        assert_eq!(
            (reply["error"]["code"].clone(), reply["id"].clone()),
            (json!(INVALID_PARAMS), json!("a"))
        );
    }

    #[test]
    fn messages_pass_and_unknown_notifications_are_dropped() {
        assert!(matches!(
            classify(b"\xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}"),
            Incoming::Message(_)
        ));
        // A malformed tools/call is still a message: the handler answers -32602.
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":null}"#),
            Incoming::Message(_)
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"$/cancelRequest","params":5}"#),
            Incoming::Message(_) | Incoming::Ignored
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"x","params":"oops"}"#),
            Incoming::Message(_) | Incoming::Ignored
        ));
    }

    #[test]
    fn an_oversized_message_keeps_its_id_when_it_comes_first_or_last() {
        let head = br#"{"jsonrpc":"2.0","id":"req-9","method":"tools/call","params":{"name":"x","arguments":{"text":"aaaa"#;
        assert_eq!(oversized(head, b"aaa", 10)["id"], json!("req-9"));
        let head = br#"{"method":"tools/call","params":{"id":3,"arguments":{"text":"aaaa"#;
        let tail = br#"aaaa"}},"jsonrpc":"2.0","id":42}"#;
        let reply = oversized(head, tail, 10);
        assert_eq!(reply["id"], json!(42));
        assert_eq!(reply["error"]["code"], json!(INVALID_REQUEST));
        assert!(
            reply["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("10 bytes"))
        );
        // A nested `id` at the end, or none: null.
        assert_eq!(
            oversized(
                b"{\"method\":\"x\",\"params\":{\"text\":\"aa",
                br#"aa","id":5}}"#,
                10
            )["id"],
            Value::Null
        );
        assert_eq!(oversized(b"[1,2", br#"\"id\":5}"#, 10)["id"], Value::Null);
        assert_eq!(oversized(b"", br#""id":"a\"b"}"#, 10)["id"], Value::Null);
    }
}
