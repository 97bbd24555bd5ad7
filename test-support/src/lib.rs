//! Test helpers shared by the workspace's test crates, instead of `#[path]` includes of one
//! crate's test files into another's: the rule checker of every rule a provider enforces on
//! a request body ([`rules`]), and prompt-assembly's scripted sessions, baseline and cache
//! simulator ([`prompts`]). (The machine's PostgreSQL for the stores' tests and figures is
//! psych-store-conformance's `pg`.) Not published: a test fixture, as rust-analyzer's
//! `test-utils`.

#![forbid(unsafe_code)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail loudly on bad data, as the tests using them do"
)]

pub mod prompts;
pub mod rules;
