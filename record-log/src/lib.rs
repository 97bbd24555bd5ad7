//! The record log: an append-only, durable, per-Run log of records.
//!
//! Not built yet. This crate will own appending records (user messages, assistant messages
//! with tool calls, full tool results) under an explicit fsync policy, handles, reading by
//! handle, Run isolation and crash recovery, and will implement `psych_types::RecordSource`.
//!
//! It depends on `psych-types` only among our crates.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
