//! Live MCP connections for Psych, through rmcp.
//!
//! Not built yet. This crate will own stdio and HTTP server connections from an `mcpServers`
//! configuration, paginated `tools/list`, `notifications/tools/list_changed` and `tools/call`,
//! implementing `psych_types::ToolLister` and `psych_types::ToolHost`.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
