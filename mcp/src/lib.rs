//! Live MCP connections for Psych, through rmcp.
//!
//! The main type is [`McpManager`]: built from the `mcpServers` file MCP users already
//! have ([`McpConfig`]; Claude Desktop, Claude Code and Cursor write the same shape, and
//! Psych adds optional `preload`, `eagerTools` and `description` keys per server), it starts
//! each stdio server in its own process group or reaches it over streamable HTTP, lists its
//! tools page by page (validating each tool by itself, so one malformed tool does not hide
//! the others), calls tools with a deadline and cancellation, forwards
//! `notifications/tools/list_changed` and reachability changes as [`McpEvent`]s, reconnects
//! lost servers with [`Backoff`], and stops every process it started on shutdown. Every
//! deadline is in [`Timeouts`]; every failure is an [`McpError`] that names the server, the
//! call and the reason (exit status, the last stderr lines).
//!
//! It implements [`psych_types::ToolLister`] and [`psych_types::ToolHost`]: a `tools/call`
//! result is read from the JSON the server sent into a [`psych_types::ToolOutput`], block
//! by block, with nothing dropped: rmcp's typed result drops fields and block types it
//! does not model, so psych-mcp keeps the raw answer, through its own stdio transport and
//! through a wrapper of rmcp's streamable HTTP client that sees every server-sent event and
//! every single JSON body before rmcp parses it.
//! [`McpManager::call_tool_raw`] returns rmcp's typed `CallToolResult` instead (the one
//! place rmcp shows in the API: the crate is re-exported as [`rmcp`]).
//!
//! A stdio answer too large to hold in memory (a line over [`SPILL_AT`]) is kept in files
//! rather than refused: its long texts reach the caller as
//! [`psych_types::ToolOutput::spilled`] blocks, each an unnamed file, while psych-mcp's
//! memory stays at a few MiB; caps remain for what stays in memory and for the whole
//! ([`MAX_SPILLED_ANSWER`]), and what the files of every answer hold at once is bounded by
//! a [`SpillBudget`] (10 GiB by default; [`McpManagerBuilder::spill_budget`]): an answer
//! past it fails its call with [`McpError::SpillBudget`] and the connection goes on.
//!
//! What else a server controls is bounded too: a message with more than
//! [`MAX_JSON_STRUCTURAL_BYTES`] brackets, braces, commas and colons is not parsed (parsed,
//! 64 MiB of tiny values would take gigabytes), and an answer of that kind fails its request
//! with [`McpError::AnswerTooComplex`] (an HTTP answer that rmcp reads itself, such as
//! `initialize`'s, is refused over 2 MiB instead: [`MAX_JSON_BODY_BYTES`]); a listing holds
//! about
//! [`DEFAULT_MAX_LISTING_BYTES`] at most ([`McpManagerBuilder::max_listing_bytes`]) over
//! at most [`MAX_LISTING_PAGES`] pages with cursors of at most [`MAX_CURSOR_BYTES`], else
//! it fails with [`McpError::ListingTooLarge`] (twice that while a listing of several
//! pages is walked again, because the server announced a change of its tools during
//! the walk: [`McpManager::list`]); and at most [`MAX_PEER_REQUESTS`] of a
//! server's own requests (`ping`, sampling, roots), over stdio or HTTP, are in flight at
//! once, unanswered or their answers being sent ([`InFlight`]), the rest dropped (as is
//! one whose string id is over [`MAX_REQUEST_ID_BYTES`], which its answer would echo), so
//! one that never reads its stdin, or never responds to the answering POSTs, cannot pile
//! up answers.
//!
//! A server can also be added **lazily** ([`McpManager::add_lazy_server`]): nothing is
//! started until a call or a listing needs it (one start for concurrent first calls), and
//! it is stopped again, its whole process group, after an idle time without a request
//! (never while one is in flight, nor under a request waiting to take the session a start
//! gave it). A failed start fails the calls that waited for it with the start's own error
//! ([`McpError::StartFailed`]); the next call tries again. A start is made for a request
//! once: a server that exits right after it starts fails the request that needed it.
//!
//! # MCP revisions
//!
//! Upstream, psych-mcp speaks MCP 2026-07-28 and, with servers from before it, 2025-11-25:
//! each connection starts with `server/discover` for 2026-07-28 (rmcp's `Auto` lifecycle)
//! and falls back to `initialize` at 2025-11-25 on the same connection when the server
//! answers it with an error, as every earlier server does (one more round trip; a server
//! that never answers `server/discover` costs rmcp's 10-second probe first). With a server
//! of 2026-07-28, `list_changed` comes on a `subscriptions/listen` stream opened just
//! before the first listing (so no change falls between the two), kept open, and reopened with a bounded backoff when it ends, each reopening an
//! [`McpEvent::ToolsChanged`] with [`ChangeCause::Resubscribed`]. Results are kept raw,
//! `resultType` included. 2026-07-28's multi-round-trip results (`InputRequiredResult`) go
//! through [`ToolHost::call_tool_round`](psych_types::ToolHost::call_tool_round): the
//! retry's `inputResponses` and `requestState` (echoed byte for byte) in the params and
//! the client's capabilities in the request's `_meta`; the answer comes back raw as
//! [`HostAnswer::InputRequired`](psych_types::HostAnswer::InputRequired), and a -32021
//! refusal as [`HostAnswer::MissingCapability`](psych_types::HostAnswer::MissingCapability).
//! The plain calls declare no capability and fail with [`McpError::InputRequired`] if a
//! server asks them for input anyway; an unknown `resultType` is a protocol error.
//!
//! The MCP server its tests run against is the workspace's `psych-test-server` crate (not
//! published): nothing of it ships with this one.
//!
//! # Example
//!
//! ```
//! use psych_mcp::{McpConfig, McpManager, Timeouts, Transport};
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
//!
//! // Nothing is started until `connect_all` (inside a Tokio runtime).
//! let manager = McpManager::builder(config).timeouts(Timeouts::default()).build()?;
//! assert!(manager.servers().is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod budget;
mod config;
mod connection;
mod ending;
mod error;
mod events;
mod in_flight;
mod lazy;
mod listing;
mod manager;
mod post;
mod progress;
mod remote;
mod server_requests;
mod spill;
mod sse;
mod stdio;
mod tap;
mod timeouts;
pub mod wire;

pub use budget::{DEFAULT_SPILL_BUDGET, SpillBudget};
pub use config::{
    ALLOW_TOOLS, ConfigError, DISABLED, IDLE_SECS, LAZY, LISTING_TTL_SECS, MAX_CONFIG_BYTES,
    McpConfig, OUTPUT, ServerConfig, StartPolicy, Transport, read_config_text,
};
pub use error::McpError;
pub use events::{ChangeCause, MAX_QUEUED_PER_SERVER, McpEvent, McpEvents};
pub use in_flight::{
    AnswerHold, Answering, InFlight, Kept, MAX_PEER_REQUESTS, MAX_REQUEST_ID_BYTES, Refusal,
};
pub use listing::{
    DEFAULT_MAX_LISTING_BYTES, ENTRY_COST, Listing, ListingBound, MALFORMED_COST, MAX_CURSOR_BYTES,
    MAX_LISTING_PAGES, MalformedTool, NODE_COST,
};
pub use manager::{BuildError, ConnectError, McpManager, McpManagerBuilder};
pub use remote::{MAX_JSON_BODY_BYTES, MAX_SSE_EVENT_BYTES};
pub use spill::{MAX_SPILLED_ANSWER, MAX_SPILLED_TEXTS, SPILL_AT, SPILL_TEXT_AT};
pub use timeouts::{Backoff, Timeouts};
pub use wire::MAX_JSON_STRUCTURAL_BYTES;

/// The rmcp crate psych-mcp is built on, whose
/// [`CallToolResult`](rmcp::model::CallToolResult) [`McpManager::call_tool_raw`] returns:
/// name it as `psych_mcp::rmcp::model::CallToolResult` to get the same version. It is a
/// public dependency through that one method, so an rmcp release that breaks it is a
/// breaking release of psych-mcp; every other item of this crate speaks psych-types
/// ([`ToolHost::call_tool`](psych_types::ToolHost::call_tool) returns the same result,
/// whole, as a [`ToolOutput`](psych_types::ToolOutput)).
pub use rmcp;
