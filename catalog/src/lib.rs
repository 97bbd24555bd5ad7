//! The catalogue of MCP tools, stored in redb.
//!
//! Not built yet. This crate will own the versioned, soft-delete tool table: a refresh writes
//! every tool it saw under a new catalogue version and marks everything older as removed, so
//! nothing is hard-deleted and old versions stay readable; live and historical reads; diffs
//! between versions; and the four freshness triggers (sync on connect, a TTL sweep, refresh on
//! demand, `notifications/tools/list_changed`) over a `psych_types::ToolLister`.
//!
//! It depends on `psych-types`, redb and tokio only: it knows nothing of prompts, disclosure
//! tiers or MCP transports.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
