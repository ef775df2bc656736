//! `/openapi.json`: the API described for clients and schema-driven test tools.

use axum::Json;
use serde_json::{Value, json};

pub async fn document() -> Json<Value> {
    Json(spec())
}

fn error_response(description: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
}

/// `/api/audit`, apart: one `json!` for the whole document would pass the macro's
/// recursion limit.
fn audit_path() -> Value {
    json!({"get": {"summary": "The newest tool calls from the audit log (chat, /mcp, CLI), oldest first; `at` in ISO 8601 UTC, secret values masked",
                "parameters": [{"name": "tail", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50}}],
                "responses": {"200": {"description": "Calls", "content": {"application/json": {"schema": {"type": "object", "required": ["calls"], "properties": {"calls": {"type": "array", "items": {"type": "object",
                    "required": ["at", "client", "tool", "args", "outcome", "duration_ms"],
                    "properties": {"at": {"type": "string", "format": "date-time"}, "client": {"type": "string"}, "tool": {"type": "string"}, "args": {},
                                   "outcome": {"type": "string"}, "detail": {"type": "string", "nullable": true}, "duration_ms": {"type": "number"}}}}}}}}},
                              "400": error_response("Malformed or out-of-range tail, or an unknown parameter")}}})
}

/// `/api/clients`, apart for the same reason.
fn clients_path() -> Value {
    json!({"get": {"summary": "The clients with tokens of their own: what each may see, its rate, and its calls among the newest 5,000 audit rows",
                "responses": {"200": {"description": "Clients", "content": {"application/json": {"schema": {"type": "object", "required": ["clients"], "properties": {"clients": {"type": "array", "items": {"type": "object",
                    "required": ["name", "domains", "tools", "read_only", "created", "calls"],
                    "properties": {"name": {"type": "string"}, "domains": {"type": "array", "items": {"type": "string"}}, "tools": {"type": "array", "items": {"type": "string"}},
                                   "rate_per_min": {"type": "integer", "nullable": true}, "read_only": {"type": "boolean"}, "created": {"type": "string", "format": "date-time"},
                                   "calls": {"type": "integer"}, "failed_calls": {"type": "integer"}, "last_call": {"type": "string", "format": "date-time", "nullable": true}}}},
                    "calls_counted_in": {"type": "integer"}}}}}}}}})
}

pub fn spec() -> Value {
    let key_param = json!([{"name": "key", "in": "path", "required": true, "schema": {"type": "string", "pattern": "^[a-z0-9_.]{1,128}$"}}]);
    let id_param = json!([{"name": "id", "in": "path", "required": true, "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}}]);
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Loadout", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Per-message tool routing for chat clients."},
        "paths": {
            "/api/sessions": {"post": {"summary": "Create a session",
                "responses": {"201": {"description": "Created", "content": {"application/json": {"schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}}}}}},
            "/api/sessions/{id}": {"get": {"summary": "A session: messages, tool calls with their results, each turn's selection, domain state",
                "parameters": id_param,
                "responses": {"200": {"description": "The session", "content": {"application/json": {"schema": {"type": "object"}}}},
                              "400": error_response("Malformed id"), "404": error_response("No such session")}}},
            "/api/settings": {"get": {"summary": "Every setting (secret-looking values masked)",
                "responses": {"200": {"description": "Settings", "content": {"application/json": {"schema": {"type": "object"}}}}}}},
            "/api/settings/{key}": {
                "get": {"summary": "One setting", "parameters": key_param,
                    "responses": {"200": {"description": "The setting", "content": {"application/json": {"schema": {"type": "object"}}}}, "400": error_response("Malformed key"), "404": error_response("Not set")}},
                "put": {"summary": "Set a setting", "parameters": key_param,
                    "description": "The operator's write: any key, including those the model's set_setting may not touch. A declared key's value is checked by its validator (400 with the reason).",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "properties": {"value": {"type": "string", "maxLength": 16384,
                        "pattern": "^[^\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f]*$", "description": "One value; no control characters but tab and line feed."}}, "required": ["value"], "additionalProperties": false}}}},
                    "responses": {"200": {"description": "Set", "content": {"application/json": {"schema": {"type": "object"}}}}, "400": error_response("Malformed key or body, or a value the key's validator refuses"), "413": error_response("Body too large")}},
                "delete": {"summary": "Remove a setting", "parameters": key_param,
                    "responses": {"200": {"description": "Removed", "content": {"application/json": {"schema": {"type": "object"}}}}, "400": error_response("Malformed key"), "404": error_response("Not set")}}},
            "/api/route": {"post": {"summary": "The router's selection for a message (no model call)",
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["message"], "additionalProperties": false,
                    "properties": {"session": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, "message": {"type": "string", "minLength": 1, "maxLength": 32768},
                                   "called": {"type": "array", "items": {"type": "string"}, "description": "The tools the client's model called since the session's last turn. None: the model answered with words (a question), and what the last turn was about stays wanted."}, "token_budget": {"type": "integer", "minimum": 0}}}}}},
                "responses": {"200": {"description": "Selection: tools (OpenAI format), hints, per-domain reasons, tokens", "content": {"application/json": {"schema": {"type": "object"}}}},
                              "400": error_response("Empty message, unknown called tool, malformed body"), "403": error_response("The session belongs to another client"), "413": error_response("Message too large"), "503": error_response("State backend unavailable")}}},
            "/api/chat": {"post": {"summary": "Run one chat turn: route, call the model, run its tool calls (meta-tools included), loop until it answers",
                "description": "Needs the settings llm_base_url and llm_model (llm_api_key optional). Only the turn's selected tools run; a call to another tool is refused with directions to load it first. With `Accept: text/event-stream` the steps stream as Server-Sent Events: session, selection, assistant, tool_call, tool_result, then final or error.",
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["message"], "additionalProperties": false,
                    "properties": {"session": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$", "description": "Omitted: a new session, whose id the answer carries."},
                                   "message": {"type": "string", "minLength": 1, "maxLength": 32768}}}}}},
                "responses": {"200": {"description": "The answer and every step's event (JSON), or the event stream",
                                      "content": {"application/json": {"schema": {"type": "object", "required": ["session", "turn", "answer", "steps", "events"],
                                          "properties": {"session": {"type": "string"}, "turn": {"type": "integer"}, "answer": {"type": "string"}, "steps": {"type": "integer"},
                                                         "stopped": {"type": "string", "nullable": true}, "events": {"type": "array", "items": {"type": "object"}}}}},
                                                  "text/event-stream": {"schema": {"type": "string"}}}},
                              "400": error_response("Empty message, malformed session id or body"), "403": error_response("The session belongs to another client"), "409": error_response("No model configured"),
                              "413": error_response("Message too large"), "502": error_response("The model endpoint failed"), "503": error_response("State backend unavailable"),
                              "504": error_response("The turn took longer than its deadline")}}},
            "/": {"get": {"summary": "The dashboard: chat, routing trace, domains and their settings (HTML)",
                "responses": {"200": {"description": "The page", "content": {"text/html": {"schema": {"type": "string"}}}}}}},
            "/api/domains": {"get": {"summary": "Domains: active or not and why, tools, tokens",
                "responses": {"200": {"description": "Domains", "content": {"application/json": {"schema": {"type": "object"}}}}}}},
            "/api/audit": audit_path(),
            "/api/clients": clients_path(),
            "/metrics": {"get": {"summary": "Prometheus text: routing latency by path, tools and tokens per turn, tool calls by tool and outcome, misses repaired, upstream health, learned entries",
                "responses": {"200": {"description": "Text exposition format 0.0.4", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {"summary": "This document",
                "responses": {"200": {"description": "OpenAPI 3 document", "content": {"application/json": {"schema": {"type": "object"}}}}}}},
        },
        "components": {"schemas": {"Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "required": ["kind", "message"], "properties": {"kind": {"type": "string"}, "message": {"type": "string"}}}}}}},
    })
}
