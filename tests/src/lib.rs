//! Cross-crate tests of the Psych workspace (not published).
//!
//! The tests live under `tests/`:
//!
//! - `prompt_snapshots.rs`: the complete Anthropic and OpenAI requests that
//!   psych-prompt-assembly renders for a realistic three-turn conversation (a deferred server
//!   with its meta tools, a large result elided by the real `psych_elision::Elider`, a failed
//!   call truncated, a memory added between turns, an image result), pinned as insta
//!   snapshots, with the conversation's cache report. The reader tool among the tools is
//!   psych-reader-tool's own definition.
//! - `end_to_end.rs`: records appended to a real psych-record-log `RecordLog` on disk,
//!   assembled with the real elider, and every elided preview in the rendered requests read
//!   back in full by psych-reader-tool over that log through the handle it shows (paging
//!   rebuilds the stored text exactly); the same handle in another Run's log is the typed
//!   `invalid_deferred_handle` error.
//!
//! - `properties.rs`: the cross-crate properties as proptests, over random multi-turn,
//!   multi-step conversations appended to a real `RecordLog`, read back with its iterator
//!   and assembled with the real elider: within a turn each request's cacheable prefix
//!   starts the next one's cache stream, and rendering is deterministic; after each turn the
//!   log holds every tool result whole (paging it through the reader rebuilds its bytes)
//!   and every handle a preview shows resolves in its own Run only; a result's rendered
//!   bytes change at most once, when its turn ends. Fixed-script tests show each check
//!   catches a broken part. A fourth property assembles every call again from the log's
//!   lazy `History` (psych-prompt-assembly's `StepHistory`, a projection cache kept across
//!   calls) and checks the bytes against the whole-record path.
//! - `preview_offset.rs`: following an elided preview's `offset=K` with the real reader
//!   returns exactly the first omitted line.
//!
//! `benches/lazy_step.rs` measures one step's lazy assembly over a 1,000-record log whose
//! ten earlier results are 2 KB against 256 MiB each; `examples/lazy_step_rss.rs` measures
//! that step's peak resident memory.
//!
//! - `runtime_e2e.rs`: a psych-runtime `Run` against real MCP server processes (the
//!   `psych-e2e-child` binary of this crate serves psych-test-server's server): a scripted
//!   three-turn session over a small eager server, a large deferred one, one over HTTP and
//!   one added mid-Run, every request through the rule checker and the last one pinned for
//!   both providers; faults (crash mid-call, hang, never starts, garbage, HTTP gone); and a
//!   Run killed with SIGKILL mid-step (`psych-e2e-child run`), then resumed.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
