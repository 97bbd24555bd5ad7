//! The integration tests of this crate, one module per subject, linked as one test binary
//! (one per file was 78 binaries to link on a 2-core CI; see ARCHITECTURE.md, `xtask/`).
//! A test that needs a process of its own is a `[[test]]` target of its own in `Cargo.toml`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data; the shared modules have no crate root of their own"
)]

mod cli;
mod demo;
mod read_live_log;
mod serve;
mod serve_clients;
mod serve_faults;
mod serve_fixtures;
mod serve_http;
mod serve_huge;
mod serve_identities;
mod serve_lazy;
mod serve_limits;
mod serve_mrtr;
mod serve_pinning;
mod serve_replicas;
mod serve_stress;
mod support;
