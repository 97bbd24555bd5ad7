//! The catalogue of MCP tools: a versioned, soft-delete redb store of every server's tools,
//! and a freshener that keeps it current.
//!
//! The principal type is [`Catalog`]. [`Catalog::refresh`] takes the complete list a server
//! just returned and, in one write transaction, makes exactly that list the server's live
//! set: new and changed tools get rows at a new [`CatalogVersion`](psych_types::CatalogVersion),
//! tools no longer listed are marked removed at it, and unchanged tools are not written at
//! all (an unchanged listing takes no version and moves only the sync stamp). Nothing is
//! ever deleted, so any older version still reads as it was ([`Catalog::tools_at`],
//! [`Catalog::diff`]). Reads return `psych-types` data in a deterministic order:
//! [`Catalog::live`] gives a server's [`ServerCatalog`](psych_types::ServerCatalog) (tools
//! ordered by name, its set version, its health: last sync, last error, reachability), which
//! is what disclosure resolves a turn from; its tools are a shared `Arc`, decoded once per
//! change of the server's set and kept in memory, so a read of an unchanged server copies
//! nothing. Reads are redb read transactions: they never wait for a refresh and never see
//! half of one. A file held by another process is
//! [`OpenError::Locked`]; a file of a newer layout is [`OpenError::NewerLayout`]. The layout
//! is in `docs/format.md`.
//!
//! [`Freshener`] keeps a catalogue fresh over any [`ToolLister`](psych_types::ToolLister)
//! with four triggers: sync on connect, a TTL sweep with jitter and per-server timeouts,
//! awaitable on-demand refresh, and coalesced `notifications/tools/list_changed`. A
//! failure keeps the tools the server had, is recorded, and is retried with backoff.
//!
//! It depends on `psych-types`, redb and tokio only: it knows nothing of prompts, disclosure
//! tiers or MCP transports.
//!
//! # What blocks
//!
//! Every [`Catalog`] method is synchronous. The writes ([`Catalog::refresh`],
//! [`Catalog::record_failure`]) commit a redb write transaction, which syncs the file: call
//! them from [`tokio::task::spawn_blocking`] or a thread of your own, never on an async
//! worker. Writes are serialized by redb (one writer at a time); reads never wait for them.
//! Reads of a server whose set has not changed copy an `Arc` from memory; the first read
//! after a change decodes the set from the file. [`Catalog::set_reachability`] only touches
//! memory. The [`Freshener`] does its own writes under `spawn_blocking`, so its methods are
//! safe to call from async code; [`Freshener::start`] needs a tokio runtime.
//!
//! # Errors
//!
//! [`OpenError`] when the file cannot be a catalogue (held by another process, a newer
//! layout, not a catalogue, a value that does not decode): nothing is written to it.
//! [`CatalogError`] from a read or write: a failed write commits nothing, so the server keeps
//! the tools it had (a listing naming a tool twice is refused whole). [`RefreshError`] from
//! the freshener's on-demand refresh: the lister failed or timed out (the failure is also
//! recorded in the server's health and retried with backoff). [`ConfigError`] when a
//! [`FreshenerBuilder`] is given a zero duration, a backoff or debounce window that is
//! inverted, or no runtime to start in.
//!
//! # Configuration
//!
//! [`Catalog::builder`] chooses the clock (the sync stamps; a fixed clock for tests) and the
//! backend (a file, or [`Catalog::in_memory`]). [`FreshenerConfig::builder`] sets the TTL and
//! its jitter, the per-server list timeout, the retry backoff, the `list_changed` quiet period
//! and longest wait, and the jitter's seed, each checked in
//! [`build`](FreshenerBuilder::build); the defaults are on [`FreshenerBuilder`].
//!
//! # Example
//!
//! ```
//! use psych_catalog::Catalog;
//! use psych_types::{CatalogVersion, ServerId, ToolDefinition, ToolName};
//!
//! let catalog = Catalog::in_memory()?;
//! let fs = ServerId::new("fs")?;
//! let tool = |name: &str, description: &str| -> Result<ToolDefinition, psych_types::IdError> {
//!     Ok(ToolDefinition::new(ToolName::new(name)?, description, Default::default()))
//! };
//!
//! let first = catalog.refresh(&fs, &[tool("read_file", "Read")?, tool("write_file", "Write")?])?;
//! assert_eq!(first.version, CatalogVersion(1));
//!
//! // The same list again writes no tool and takes no version.
//! let same = catalog.refresh(&fs, &[tool("write_file", "Write")?, tool("read_file", "Read")?])?;
//! assert!(same.diff.is_empty());
//! assert_eq!(same.version, CatalogVersion(1));
//!
//! // One changed, one removed.
//! let next = catalog.refresh(&fs, &[tool("read_file", "Read a file")?])?;
//! assert_eq!(next.version, CatalogVersion(2));
//! assert_eq!(next.diff.changed[0].as_str(), "read_file");
//! assert_eq!(next.diff.removed[0].as_str(), "write_file");
//!
//! let live = catalog.live(&fs)?;
//! assert_eq!(live.tools.len(), 1);
//! assert!(live.health.last_sync.is_some());
//! // The older version still reads as it was.
//! assert_eq!(catalog.tools_at(&fs, CatalogVersion(1))?.len(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod clock;
mod error;
mod freshener;
mod store;

pub use clock::{Clock, SystemClock};
pub use error::{CatalogError, ConfigError, OpenError, RefreshError};
pub use freshener::{Freshener, FreshenerBuilder, FreshenerConfig, RefreshOutcome};
pub use psych_types::{Diff, Refresh};
pub use store::{Catalog, CatalogBuilder, LAYOUT, Stats};
