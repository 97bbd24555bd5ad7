//! Cross-crate tests of the Psych workspace (not published).
//!
//! Not built yet. This crate will hold the properties that span crates (proptest), the
//! byte-stable prompt snapshots (insta) and end-to-end runs against a real MCP server process,
//! under `tests/`.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
