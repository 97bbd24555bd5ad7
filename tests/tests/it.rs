//! The integration tests of this crate, one module per subject, linked as one test binary
//! (one per file was 78 binaries to link on a 2-core CI; see ARCHITECTURE.md, `xtask/`).
//! A test that needs a process of its own is a `[[test]]` target of its own in `Cargo.toml`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data; the shared modules have no crate root of their own"
)]

mod common;
mod mcp_common;

mod cache_bill;
mod disclosure_surface;
mod end_to_end;
mod mcp_http_faults;
mod mcp_lazy;
mod mcp_live;
mod mcp_modern;
mod mcp_results;
mod mixed_preview;
mod native_deferral;
mod preview_offset;
mod prompt_snapshots;
mod properties;
mod runtime_e2e;
mod runtime_store;
mod synthetic_catalogs;
