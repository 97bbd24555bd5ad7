//! The Psych runtime: a Run and its turns.
//!
//! Not built yet. This crate will compose the core crates: per-turn resolution of the tool
//! surface from the catalogue, connections and grant; prompt assembly with elision as the
//! projector; and the executor that runs meta tools, the reader and forwarded MCP calls after
//! a call-time permission re-check, logging every result in full.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
