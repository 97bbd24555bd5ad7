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
//! [`ResultProjector`], [`RecordSource`], [`ToolLister`] and [`ToolHost`] (whose calls can
//! report progress to a [`ProgressSink`], and go in rounds when the server needs the
//! client's input first: [`InputRound`], [`HostAnswer`]).
//!
//! Ids are validated newtypes: a bad name is an [`IdError`] where it enters, never a panic
//! later. JSON the workspace shows or stores as text is written by [`json`], the canonical
//! writer: sorted keys, the same bytes whether or not serde_json's `preserve_order` is on.
//!
//! # What blocks
//!
//! Nothing in this crate sleeps or takes a lock, and nothing does I/O but a spilled text's
//! reads ([`SpilledText::read_at`] and [`SpilledText::read_to_string`], positional reads of
//! its file: blocking); every other function is pure. The seam
//! traits are as blocking as their implementations: [`RecordSource`] and [`OutputAccess`]
//! are synchronous reads (the record log's read files, so from async code call them, and
//! [`load_whole`] / [`read_exact_output`] which go through them, on `spawn_blocking` or a
//! thread of your own); [`ToolLister`] and [`ToolHost`] are async and must not block.
//! [`MemoryRecords`] never blocks.
//!
//! # Errors
//!
//! - [`IdError`]: an id outside its alphabet (a server, tool, Run or call id), where it
//!   enters: a constructor, a `tools/list` reply, serde. Its text names the id and the rule.
//! - [`HandleParseError`]: text that is not a record handle `<run>:<seq>` (one spelling per
//!   handle: no sign, no leading zero).
//! - [`SourceError`]: a store failed to read a stored tool result, or a handle named none;
//!   it carries the handle and the store's own error as its source.
//! - serde errors: a tool definition or output that is not MCP's JSON shape. A content
//!   block of an unknown type, or with data that is not base64, is kept whole as
//!   [`ContentBlock::Unknown`] rather than refused.
//!
//! # Configuration
//!
//! None: this crate is the vocabulary. [`ConnectionSpec`] (a server's preload flag, eager
//! tools, description) and [`PermissionGrant`] are the configuration other crates read.
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
mod chain;
mod connection;
mod hash;
mod history;
mod id;
pub mod json;
mod limits;
mod output;
mod progress;
mod record;
mod schema;
mod seam;
mod spill;
mod tool;

/// The name of the reader tool that reads a stored tool result back by handle. Defined here
/// so that the reader's tool definition and every text that tells the model to call it
/// (elision's guidance) name the same tool.
pub const READ_TOOL_OUTPUT: &str = "read_tool_output";

/// The name of the client search tool of native deferral (prompt-assembly's
/// `SearchTool::client`; OpenAI Responses names its tool search so whatever it executes).
/// Defined here so that disclosure reserves it: no server's facade takes it, which would
/// give a request two tools of one name.
pub const TOOL_SEARCH: &str = "tool_search";

/// The names Anthropic's server-side tool searches take in a request (regex, then BM25),
/// reserved by disclosure like [`TOOL_SEARCH`].
pub const ANTHROPIC_TOOL_SEARCHES: [&str; 2] = ["tool_search_tool_regex", "tool_search_tool_bm25"];

pub use base64::encode as encode_base64;
pub use catalog::{
    CatalogVersion, Diff, Reachability, Refresh, ServerCatalog, ServerHealth, SyncFailure,
    SyncStamp, UnixMillis,
};
pub use chain::error_chain;
pub use connection::{ConnectionSpec, PermissionGrant, Preload, ToolScope};
pub use hash::fnv1a;
pub use history::{
    BlockLines, History, HistoryEntry, HistoryItem, OutputAccess, SourceError, StoredRef,
    StoredResult, count_line_breaks, load_whole, read_exact_output,
};
pub use id::{IdError, RunId, ServerId, ToolCallId, ToolName, ToolRef};
pub use limits::{
    HINT_CHARS_PER_TOKEN, LimitError, MAX_RESULT_SIZE_CHARS, OutputLimit, OutputLimits,
};
pub use output::{
    Annotations, BinaryRef, BlobResource, ContentBlock, EmbeddedResource, MediaContent,
    ResourceContents, ResourceLink, TextContent, TextResource, ToolOutput, render_json,
};
pub use progress::{MAX_PROGRESS_MESSAGE_BYTES, ProgressSink, ToolProgress};
pub use record::{
    AssistantMessage, HandleParseError, LoggedRecord, Record, RecordHandle, ToolCall, ToolResult,
    Usage, UserMessage,
};
pub use schema::{InputSchemaError, check_input_schema, json_kind, json_whole};
pub use seam::{
    CatalogFailure, CatalogStore, CatalogStoreError, DynCatalogStore, DynRecordStore, Erased,
    HostAnswer, Identities, InputRound, Lease, LeaseGuard, LineMark, MemoryRecords, OutputInfo,
    OutputKind, Projection, RecordFailure, RecordSource, RecordStore, RecordStores,
    ResultProjector, ResultRef, StoreError, SweptRuns, TokenEstimator, ToolHost, ToolLister,
    failure_message, readable_bytes,
};
pub use spill::{SpilledBlock, SpilledText};
pub use tool::{
    Icon, JsonObject, TaskSupport, ToolAnnotations, ToolDefinition, ToolExecution, ToolList,
};
