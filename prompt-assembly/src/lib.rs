//! Prompt assembly in four cache-stable zones.
//!
//! Not built yet. This crate will own the zones (static system sections, the dynamic system
//! tail, the history, one transient message), the elision boundary (results strictly before
//! the last user message go through a `psych_types::ResultProjector`), deterministic bytes,
//! and renderers to the Anthropic Messages and OpenAI Chat Completions request formats with
//! cache breakpoints.
//!
//! It is pure (no I/O, no clock) and depends on `psych-types` only.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
