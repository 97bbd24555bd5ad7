//! Shared vocabulary of the Psych workspace: ids, MCP tool definitions, connections and
//! grants, tool outputs, log records and their handles, and the small traits at the seams
//! between crates.
//!
//! Every other Psych crate depends on this one and, among the core crates, on nothing else
//! of ours. The principal types are [`ToolDefinition`] (one MCP tool, faithful to the
//! 2025-11-25 schema and lossless through serde), [`ToolRef`] (the `(server, tool)` pair),
//! [`ToolOutput`] (a tool result as MCP returns it: ordered [`ContentBlock`]s, structured
//! content, `isError`, `_meta`, with its one [readable text](ToolOutput::readable_text)),
//! [`Record`] with its [`RecordHandle`], and the seam traits [`TokenEstimator`],
//! [`ResultProjector`], [`RecordSource`], [`ToolLister`] and [`ToolHost`].
//!
//! Ids are validated newtypes: a bad name is an [`IdError`] where it enters, never a panic
//! later. JSON the workspace shows or stores as text is written by [`json`], the canonical
//! writer: sorted keys, the same bytes whether or not serde_json's `preserve_order` is on.
//!
//! # Example
//!
//! ```
//! use psych_types::{ToolDefinition, ToolRef, PermissionGrant, ServerId};
//!
//! let tool: ToolDefinition = serde_json::from_str(
//!     r#"{"name":"read_file","description":"Read a file","inputSchema":{"type":"object"},"x-vendor":1}"#,
//! )?;
//! assert_eq!(tool.name.as_str(), "read_file");
//! assert_eq!(tool.extra["x-vendor"], 1); // unknown fields are kept
//!
//! let pair = ToolRef::parse("fs", "read_file")?;
//! let grant = PermissionGrant::none().allow_server(ServerId::new("fs")?);
//! assert!(grant.permits(&pair.server, &pair.tool));
//! assert!(ToolRef::parse("fs", "read file").is_err()); // a typed error, not a panic
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod base64;
mod catalog;
mod connection;
mod history;
mod id;
pub mod json;
mod output;
mod record;
mod seam;
mod tool;

/// The name of the reader tool that reads a stored tool result back by handle. Defined here
/// so that the reader's tool definition and every text that tells the model to call it
/// (elision's guidance) name the same tool.
pub const READ_TOOL_OUTPUT: &str = "read_tool_output";

pub use base64::encode as encode_base64;
pub use catalog::{
    CatalogVersion, Reachability, ServerCatalog, ServerHealth, SyncFailure, SyncStamp, UnixMillis,
};
pub use connection::{ConnectionSpec, PermissionGrant, Preload, ToolScope};
pub use history::{
    History, HistoryEntry, HistoryItem, OutputAccess, SourceError, StoredRef, StoredResult,
    count_line_breaks, load_whole, read_exact_output,
};
pub use id::{IdError, RunId, ServerId, ToolCallId, ToolName, ToolRef};
pub use output::{
    Annotations, BinaryRef, BlobResource, ContentBlock, EmbeddedResource, MediaContent,
    ResourceContents, ResourceLink, TextContent, TextResource, ToolOutput, render_json,
};
pub use record::{
    AssistantMessage, HandleParseError, LoggedRecord, Record, RecordHandle, ToolCall, ToolResult,
    Usage, UserMessage,
};
pub use seam::{
    MemoryRecords, OutputInfo, OutputKind, Projection, RecordSource, ResultProjector, ResultRef,
    TokenEstimator, ToolHost, ToolLister, readable_bytes,
};
pub use tool::{
    Icon, JsonObject, TaskSupport, ToolAnnotations, ToolDefinition, ToolExecution, ToolList,
};
