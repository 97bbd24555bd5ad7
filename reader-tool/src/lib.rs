//! `read_tool_output`: page and grep a stored tool result by handle.
//!
//! Not built yet. This crate will own the reader over any `psych_types::RecordSource`, its
//! edge behaviour (foreign or unknown handles, offsets past the end, empty greps, binary
//! content), and the tool's definition and argument parsing.
//!
//! It depends on `psych-types` and memchr only.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
