//! The errors of a read that are not the model's to fix: a handle this Run never emitted
//! (`invalid_deferred_handle`) and failures of the record source.

use psych_types::{HandleParseError, RecordHandle, RunId};

/// What is wrong with a handle that does not name a tool result of this Run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandleProblem {
    /// The string is not of the form `<run>:<seq>` (forged, truncated, mangled).
    Malformed(HandleParseError),
    /// The handle names another Run: resolving it would be a cross-Run (cross-tenant) read,
    /// so the source is not asked.
    OtherRun {
        /// The Run the handle names.
        named: RunId,
        /// The Run the reader serves.
        serving: RunId,
    },
    /// The handle names this Run, but no record of the log is at that position.
    Unresolved,
    /// The handle names a record of this Run that is not a tool result.
    NotToolResult,
}

/// The `invalid_deferred_handle` corruption error: a read named a tool result this Run never
/// emitted. A model passing such a handle is a protocol violation, never an ordinary mistake,
/// so the caller gets it as an error value rather than as a tool result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid_deferred_handle: {handle:?} {}", describe(.problem))]
pub struct InvalidHandle {
    /// The handle exactly as it was given.
    pub handle: String,
    /// Why it does not resolve.
    pub problem: HandleProblem,
}

impl InvalidHandle {
    /// The error's stable code, `invalid_deferred_handle`.
    pub const CODE: &'static str = "invalid_deferred_handle";
}

fn describe(problem: &HandleProblem) -> String {
    match problem {
        HandleProblem::Malformed(err) => format!("is not a record handle ({err})"),
        HandleProblem::OtherRun { named, serving } => {
            format!(
                "names run {:?}; this reader serves run {:?} only",
                named.as_str(),
                serving.as_str()
            )
        }
        HandleProblem::Unresolved => "names no record of this run".to_owned(),
        HandleProblem::NotToolResult => {
            "names a record of this run that is not a tool result".to_owned()
        }
    }
}

/// Why a call of the reader failed (named apart from `psych_record_log::ReadError`, the
/// error a record log's reads give, which reaches a caller here as [`CallError::Source`]).
/// Never shown to the model as a tool result: the caller decides (the
/// runtime ends the step with the error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError<E> {
    /// The handle does not parse, names another Run, names no record, or names a record that
    /// is not a tool result.
    #[error(transparent)]
    InvalidDeferredHandle(#[from] InvalidHandle),
    /// The record source reported a storage failure.
    #[error("the record source failed: {0}")]
    Source(#[source] E),
    /// The source served fewer bytes than its [`OutputInfo`](psych_types::OutputInfo)
    /// announced: the stored result is shorter than its own header says.
    #[error("the record source ended the result {handle} at byte {at}, but announced {len} bytes")]
    ShortRead {
        /// The result being read.
        handle: RecordHandle,
        /// Where the source stopped serving bytes.
        at: u64,
        /// The length it announced.
        len: u64,
    },
}

impl<E> CallError<E> {
    /// A stable code for the error: `invalid_deferred_handle`, `record_source_failed` or
    /// `record_short_read`.
    pub fn code(&self) -> &'static str {
        match self {
            CallError::InvalidDeferredHandle(_) => InvalidHandle::CODE,
            CallError::Source(_) => "record_source_failed",
            CallError::ShortRead { .. } => "record_short_read",
        }
    }

    /// The handle problem, when this is the `invalid_deferred_handle` error.
    pub fn handle_problem(&self) -> Option<&HandleProblem> {
        match self {
            CallError::InvalidDeferredHandle(err) => Some(&err.problem),
            _ => None,
        }
    }
}
