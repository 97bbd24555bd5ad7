//! Live MCP connections for Psych, through rmcp.
//!
//! This crate will own stdio and HTTP server connections, paginated `tools/list`,
//! `notifications/tools/list_changed` and `tools/call`, implementing
//! `psych_types::ToolLister` and `psych_types::ToolHost`. Built so far: the configuration
//! those connections start from, [`McpConfig`], read from the `mcpServers` file MCP users
//! already have (Claude Desktop, Claude Code and Cursor write the same shape), with Psych's
//! own optional keys per server (`preload`, `eagerTools`, `description`) and `${VAR}`
//! expansion from the environment.
//!
//! # Example
//!
//! ```
//! use psych_mcp::{McpConfig, Transport};
//! use psych_types::{Preload, ServerId};
//!
//! let config = McpConfig::parse(
//!     r#"{"mcpServers": {"github": {
//!         "type": "http", "url": "https://example.invalid/mcp",
//!         "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"},
//!         "preload": false}}}"#,
//!     |name| (name == "GITHUB_TOKEN").then(|| "t0ken".to_owned()),
//! )?;
//! let github = &config.servers[&ServerId::new("github")?];
//! assert_eq!(github.connection.preload, Preload::Deferred);
//! let Transport::Http { headers, .. } = &github.transport else { unreachable!() };
//! assert_eq!(headers["Authorization"], "Bearer t0ken");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod config;

pub use config::{ConfigError, McpConfig, ServerConfig, Transport};
