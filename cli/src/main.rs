//! The `psych` command.
//!
//! Not built yet: `psych budget` (the prompt cost of an MCP setup), `psych demo` (a scripted
//! Run) and `psych read` (reading a stored result back) arrive with later issues. Until then
//! the command says so and exits with a failure status rather than pretend.

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "psych: no commands are built yet; `budget`, `demo` and `read` arrive with later issues"
    );
    ExitCode::FAILURE
}
