//! The runtime's errors: narrow per operation, with `From` into [`RunError`].

use psych_reader_tool::InvalidHandle;
use psych_types::ToolCallId;

/// Why one step's calls could not all be executed and logged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecuteError {
    /// A `read_tool_output` call or a result reference named a result this Run never
    /// emitted (forged, another Run's, not a tool result): a protocol violation, reported
    /// to the caller. The call is logged with the step's other results as a failed result
    /// saying it was refused and nothing was run, which a Run that goes on shows the model.
    #[error(transparent)]
    InvalidDeferredHandle(#[from] InvalidHandle),
    /// The log refused the step's results (I/O, a poisoned group); none of them is
    /// acknowledged.
    #[error("logging the step's results")]
    Append(#[from] psych_record_log::AppendError),
    /// A record store other than the record log (the PostgreSQL store) refused the step's
    /// results (unreachable, failed); none of them is acknowledged.
    #[error("logging the step's results")]
    Store(#[source] psych_types::StoreError),
    /// The task running one call (a forwarded call, a read) panicked or was cancelled: a
    /// bug in the host or in psych. The call is logged as a failed result saying so, with
    /// the step's other results.
    #[error("the call {call} ({name}) did not finish")]
    Panicked {
        /// The call.
        call: ToolCallId,
        /// The tool it named.
        name: String,
        /// What tokio said.
        #[source]
        source: tokio::task::JoinError,
    },
    /// Several calls of the step failed as above (refused reads, panicked calls): each
    /// error, in call order. Every other result of the step is logged.
    #[error("{} calls of the step failed: {}", .0.len(), joined(.0))]
    Calls(Vec<ExecuteError>),
    /// The blocking task writing the step's results panicked or was cancelled; none of them
    /// is acknowledged. The source is what tokio said.
    #[error("the task logging the step's results did not finish")]
    Task(#[from] tokio::task::JoinError),
}

impl From<psych_types::StoreError> for ExecuteError {
    /// The record log's own error comes back as [`ExecuteError::Append`] (as before stores
    /// were erased); any other store's as [`ExecuteError::Store`], still downcastable
    /// through [`StoreError::get_ref`](psych_types::StoreError::get_ref).
    fn from(error: psych_types::StoreError) -> Self {
        match error.downcast::<psych_record_log::AppendError>() {
            Ok(append) => ExecuteError::Append(append),
            Err(other) => ExecuteError::Store(other),
        }
    }
}

impl From<psych_types::StoreError> for RunError {
    /// The record log's own errors come back as [`RunError::Read`] and
    /// [`RunError::Append`] (as before stores were erased); any other store's as
    /// [`RunError::Store`].
    fn from(error: psych_types::StoreError) -> Self {
        let error = match error.downcast::<psych_record_log::ReadError>() {
            Ok(read) => return RunError::Read(read),
            Err(other) => other,
        };
        match error.downcast::<psych_record_log::AppendError>() {
            Ok(append) => RunError::Append(append),
            Err(other) => RunError::Store(other),
        }
    }
}

/// `errors` on one line, each with its sources, `; ` between them.
fn joined(errors: &[ExecuteError]) -> String {
    errors
        .iter()
        .map(|error| psych_types::error_chain(error))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Any error of a [`Run`](crate::Run).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The Run's log could not be opened (see the record log's `OpenError`).
    #[error("opening the run's log")]
    Open(#[from] psych_record_log::OpenError),
    /// A record of the reopened log could not be read back.
    #[error("reading the run's log")]
    Read(#[from] psych_record_log::ReadError),
    /// A user message, an assistant message, usage or a repair result could not be logged.
    #[error("appending to the run's log")]
    Append(#[from] psych_record_log::AppendError),
    /// A record store other than the record log ([`RunBuilder::records_in`](crate::RunBuilder::records_in))
    /// failed to open the Run, read it back or log to it.
    #[error("the run's record store")]
    Store(#[source] psych_types::StoreError),
    /// The catalogue could not be read when the turn was resolved or a call re-checked.
    #[error("reading the catalogue")]
    Catalog(#[from] psych_catalog::CatalogError),
    /// The settings leave no room in the tool cap for the tools the Run adds to every
    /// Surface ([`EXECUTOR_TOOLS`](crate::EXECUTOR_TOOLS), reserved on top of the caller's
    /// own reservation): the cap less the reserved tools is below the fixed tools.
    #[error("the settings leave no room for the run's own tools")]
    Settings(#[from] psych_disclosure::SettingsError),
    /// Disclosure refused the turn's inputs (two connections for one server, a catalogue
    /// listing a tool twice).
    #[error("resolving the tool surface")]
    Resolve(#[from] psych_disclosure::ResolveError),
    /// What the Run fixes when it first opens (its learned pins,
    /// [`RunBuilder::learned_pinning`](crate::RunBuilder::learned_pinning), and its servers'
    /// output-limit hints) could not be kept in, or read back from, its file beside the log.
    #[error("keeping what the run fixed when it opened in {}", path.display())]
    Pins {
        /// The file (`<dir>/<run>.opened.json`).
        path: std::path::PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// An output limit set for a server or tool passes the elider's per-batch threshold
    /// ([`RunBuilder::output_limits`](crate::RunBuilder::output_limits)).
    #[error("the run's output limits")]
    Limits(#[from] psych_types::LimitError),
    /// The history could not be assembled, or the prompt rendered for the provider chosen
    /// (a log no real Run writes, a surface the provider refuses).
    #[error("assembling the request")]
    Assemble(#[from] psych_prompt_assembly::Error),
    /// A step's calls could not be executed and logged (see [`ExecuteError`]).
    #[error(transparent)]
    Execute(#[from] ExecuteError),
    /// The call came at the wrong moment for the Run's turn, which is as [`TurnState`]
    /// says: a user message while a request awaits the model's reply, or a reply when no
    /// request awaits one. Nothing was logged.
    #[error("out of turn: {0}")]
    OutOfTurn(TurnState),
    /// A blocking task (a catalogue read, the history read from the log, the step's reads
    /// for assembly) panicked or was cancelled; the source is what tokio said.
    #[error("a blocking task of the run did not finish")]
    Task(#[from] tokio::task::JoinError),
}

/// Where a [`Run`](crate::Run) stood when a call came out of turn
/// ([`RunError::OutOfTurn`]), so a caller can tell what it must do first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TurnState {
    /// A request was handed out and the model's reply to it is awaited: hand it to
    /// [`Run::reply`](crate::Run::reply) before starting another turn with
    /// [`Run::user`](crate::Run::user).
    AwaitingReply,
    /// No request awaits a reply (none was handed out, or its reply was already given):
    /// [`Run::reply`](crate::Run::reply) has nothing to answer; start a turn with
    /// [`Run::user`](crate::Run::user) or get the request with
    /// [`Run::request`](crate::Run::request).
    NoRequestWaiting,
}

impl std::fmt::Display for TurnState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TurnState::AwaitingReply => "a request is waiting for the model's reply",
            TurnState::NoRequestWaiting => "no request is waiting for a reply",
        })
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// A `JoinError` of a task that panicked saying `message`.
    async fn join_error(message: &'static str) -> tokio::task::JoinError {
        match tokio::spawn(async move { std::panic::panic_any(message) }).await {
            Err(error) => error,
            Ok(()) => unreachable!("the task panics"),
        }
    }

    #[tokio::test]
    async fn task_errors_keep_the_join_error_as_their_source() {
        let run = RunError::Task(join_error("the catalogue read broke").await);
        let step = ExecuteError::Task(join_error("the log write broke").await);
        for (error, said) in [
            (&run as &dyn std::error::Error, "the catalogue read broke"),
            (&step, "the log write broke"),
        ] {
            let source = error.source().map(ToString::to_string).unwrap_or_default();
            assert!(source.contains(said), "{source}");
            // Printed with its chain, the cause is said once.
            assert!(!error.to_string().contains(said), "{error}");
        }
        assert!(matches!(
            run.source().and_then(|s| s.downcast_ref::<tokio::task::JoinError>()),
            Some(join) if join.is_panic()
        ));
    }

    #[test]
    fn a_store_error_is_the_record_logs_append_error_or_a_store_failure_kept_whole() {
        use psych_types::{RecordFailure, StoreError};

        let encode = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let logs = StoreError::new(
            RecordFailure::Store,
            psych_record_log::AppendError::Encode(encode),
        );
        assert!(matches!(
            ExecuteError::from(logs),
            ExecuteError::Append(psych_record_log::AppendError::Encode(_))
        ));
        let other = StoreError::new(
            RecordFailure::Unavailable,
            std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "the database went away",
            ),
        );
        let ExecuteError::Store(kept) = ExecuteError::from(other) else {
            panic!("another store's failure is ExecuteError::Store");
        };
        assert_eq!(kept.kind(), RecordFailure::Unavailable);
        assert_eq!(kept.to_string(), "the database went away");
        assert!(kept.get_ref().downcast_ref::<std::io::Error>().is_some());
    }
}
