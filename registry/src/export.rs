//! Tool definitions in the three wire formats clients expect. Only JSON values cross
//! this boundary: the servers map them onto their own protocol types.

use serde_json::{Value, json};

use crate::Tool;

/// MCP `Tool`: `name`, `title`, `description`, `inputSchema`, `annotations`.
pub fn mcp(tool: &Tool) -> Value {
    let mut value = json!({
        "name": tool.name,
        "description": tool.description,
        "inputSchema": *tool.input_schema,
    });
    if let Some(title) = &tool.title {
        value["title"] = json!(title);
    }
    if !tool.annotations.is_empty() {
        value["annotations"] = json!(tool.annotations);
    }
    value
}

/// OpenAI function calling: `{"type":"function","function":{name, description, parameters}}`.
pub fn openai(tool: &Tool) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": *tool.input_schema,
        }
    })
}

/// Anthropic Messages API: `name`, `description`, `input_schema`.
pub fn anthropic(tool: &Tool) -> Value {
    json!({
        "name": tool.name,
        "description": tool.description,
        "input_schema": *tool.input_schema,
    })
}

/// The compact line shown for a tool whose definition is not sent.
pub fn hint(tool: &Tool) -> Value {
    json!({"name": tool.name, "domain": tool.domain, "hint": tool.hint})
}

/// Which format to export in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Mcp,
    OpenAi,
    Anthropic,
}

impl Format {
    pub fn export(self, tool: &Tool) -> Value {
        match self {
            Format::Mcp => mcp(tool),
            Format::OpenAi => openai(tool),
            Format::Anthropic => anthropic(tool),
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "mcp" => Ok(Format::Mcp),
            "openai" => Ok(Format::OpenAi),
            "anthropic" => Ok(Format::Anthropic),
            other => Err(format!(
                "unknown format `{other}`: use mcp, openai or anthropic"
            )),
        }
    }
}
