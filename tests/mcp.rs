//! MCP server tests (being written).
