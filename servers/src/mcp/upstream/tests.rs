use std::path::Path;

use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage, RequestId};
use rmcp::transport::streamable_http_client::StreamableHttpPostResponse;
use serde_json::Value;

use super::client::{PostResult, request_id, with_request_id};
use super::config::{ServerConfig, http_headers, tool_name};

#[test]
fn tool_names_stay_valid_and_distinct() {
    assert_eq!(
        tool_name("time", "get_current_time"),
        "time__get_current_time"
    );
    let odd = tool_name("srv", "Read.File");
    assert!(odd.starts_with("srv__read_file_"), "{odd}");
    let camel = tool_name("car", "startEngine");
    assert!(camel.starts_with("car__start_engine_"), "{camel}");
    assert_ne!(camel, tool_name("car", "start_engine"));
    assert!(tool_name("srv", "getURL2Text").starts_with("srv__get_url2_text_"));
    let long = tool_name("srv", &"x".repeat(100));
    assert!(long.len() <= 64, "{long}");
    assert_ne!(tool_name("srv", "a.b"), tool_name("srv", "a_b"));
    for name in [odd, long] {
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        );
    }
}

#[test]
fn config_errors_are_all_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(crate::config::CONFIG_FILE);
    let load_config = |path: &Path, explicit| {
        crate::config::ConfigFile::load(path, explicit).map(|config| config.servers)
    };
    std::fs::write(
        &path,
        r#"
        [servers.good]
        command = "echo"
        [servers."bad name"]
        command = "x"
        [servers.both]
        command = "x"
        url = "http://localhost"
        [servers.neither]
        "#,
    )
    .expect("write");
    let error = format!("{:#}", load_config(&path, true).expect_err("error"));
    assert!(error.contains("servers.bad name"), "{error}");
    assert!(error.contains("servers.both"), "{error}");
    assert!(error.contains("servers.neither"), "{error}");
    assert!(
        load_config(&dir.path().join("missing.toml"), false)
            .expect("ok")
            .is_empty()
    );
    assert!(load_config(&dir.path().join("missing.toml"), true).is_err());

    std::fs::write(
        &path,
        r#"
        [servers.web]
        url = "https://mcp.example.com/mcp"
        headers = { Authorization = "Bearer secret-1" }
        [servers.ftp]
        url = "ftp://example.com/mcp"
        [servers.relative]
        url = "/mcp"
        [servers.mixed]
        url = "http://localhost/mcp"
        args = ["x"]
        [servers.stdio-headers]
        command = "x"
        headers = { Authorization = "Bearer secret-2" }
        [servers.session]
        url = "http://localhost/mcp"
        headers = { "Mcp-Session-Id" = "secret-3", "Bad Name" = "secret-4", X-Ok = "secret\u0001-5" }
        "#,
    )
    .expect("write");
    let error = format!("{:#}", load_config(&path, true).expect_err("error"));
    for expected in [
        "servers.ftp: `url` must be http:// or https://",
        "servers.relative: `url` is not a URL",
        "servers.mixed: `args` only apply to stdio servers",
        "servers.stdio-headers: `headers` are for HTTP servers",
        "servers.session: `headers.Mcp-Session-Id` is set by the MCP transport",
        "servers.session: `headers.Bad Name` is not a valid header name",
        "servers.session: `headers.X-Ok` has a value that is not a valid header value",
    ] {
        assert!(
            error.contains(expected),
            "{expected:?} missing from {error}"
        );
    }
    assert!(!error.contains("servers.web"), "{error}");
    assert!(!error.contains("secret"), "a header value leaked: {error}");
}

#[test]
fn debug_output_hides_header_and_env_values() {
    let config: ServerConfig = toml::from_str(
        r#"
        url = "http://localhost/mcp"
        headers = { Authorization = "Bearer hidden-token" }
        env = { API_KEY = "hidden-key" }
        "#,
    )
    .expect("config");
    let debug = format!("{config:?}");
    assert!(
        debug.contains("Authorization") && debug.contains("API_KEY"),
        "{debug}"
    );
    assert!(!debug.contains("hidden"), "{debug}");
    let headers = http_headers(&config.headers).expect("headers");
    assert!(!format!("{headers:?}").contains("hidden"));
}

#[test]
fn an_id_less_error_answering_a_request_gets_its_id() {
    let request: ClientJsonRpcMessage = serde_json::from_value(serde_json::json!(
        {"jsonrpc": "2.0", "id": 7, "method": "ping"}
    ))
    .expect("request");
    let id = request_id(&request);
    assert!(id.is_some());
    let answer = |body: Value| -> PostResult {
        Ok(StreamableHttpPostResponse::Json(
            serde_json::from_value(body).expect("message"),
            None,
        ))
    };
    let id_of = |response: PostResult| match response {
        Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(error), _)) => error.id,
        other => panic!("not an error: {other:?}"),
    };
    let orphan = serde_json::json!(
        {"jsonrpc": "2.0", "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"}}
    );
    assert_eq!(
        id_of(with_request_id(answer(orphan.clone()), id.clone())),
        id
    );
    // A notification's POST awaits no answer: nothing to match.
    assert_eq!(id_of(with_request_id(answer(orphan), None)), None);
    // An error with its own id keeps it.
    let own = serde_json::json!(
        {"jsonrpc": "2.0", "id": 3, "error": {"code": -32601, "message": "no"}}
    );
    assert_eq!(
        id_of(with_request_id(answer(own), id)),
        Some(RequestId::Number(3))
    );
}
