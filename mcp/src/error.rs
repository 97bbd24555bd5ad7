//! What can go wrong with a live MCP connection, said so that a person can act on it: every
//! variant about a server names it, the call that failed (`initialize`, `tools/list page 2`,
//! `tools/call read_file`) and the reason (exit status, the last lines of the server's
//! stderr, the deadline that passed).

use std::fmt;
use std::time::Duration;

use psych_types::ServerId;

/// Why an MCP operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server is not (or no longer) one of the manager's servers.
    #[error("MCP server \"{server}\" is not configured")]
    UnknownServer {
        /// The name asked for.
        server: ServerId,
    },
    /// A stdio server's command could not be started (not found, not executable, bad `cwd`).
    #[error("MCP server \"{server}\": cannot start {command:?}: {source}")]
    Spawn {
        /// The server.
        server: ServerId,
        /// The command as configured.
        command: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// A stdio server's process exited: at once, during `initialize`, or mid-call.
    #[error(
        "MCP server \"{server}\": {call} failed: the server process {status}{}",
        Stderr(stderr)
    )]
    Exited {
        /// The server.
        server: ServerId,
        /// The call that was in flight.
        call: String,
        /// How it ended (`exited with status 3`, `was killed by signal 9`, or `closed its
        /// output` when it has not exited yet).
        status: String,
        /// The last lines it wrote to stderr (bounded), empty if none.
        stderr: String,
    },
    /// The connection closed with no process exit to report (an HTTP server gone). An HTTP
    /// event stream that ends or breaks before its answer is not this, nor is a POST the
    /// server refuses (a 429; a 5xx, a proxy's page or a 400 when the server still
    /// answers a `ping` on the session): that request fails alone, as
    /// [`McpError::Protocol`] saying what happened, and the session stays.
    #[error("MCP server \"{server}\": {call} failed: the connection closed: {reason}")]
    Closed {
        /// The server.
        server: ServerId,
        /// The call that was in flight.
        call: String,
        /// What the transport said.
        reason: String,
    },
    /// The server did not answer within the deadline. For a call, cancellation was sent to
    /// the server and the connection stays usable.
    #[error(
        "MCP server \"{server}\": {call} got no answer within {after:?}{}",
        Stderr(stderr)
    )]
    Timeout {
        /// The server.
        server: ServerId,
        /// The call that timed out.
        call: String,
        /// The deadline that passed.
        after: Duration,
        /// The last lines the server wrote to stderr (stdio servers), empty if none.
        stderr: String,
    },
    /// The server answered with a JSON-RPC error, or with something that is not the result
    /// the call expects.
    #[error("MCP server \"{server}\": {call} failed: {message}")]
    Protocol {
        /// The server.
        server: ServerId,
        /// The call.
        call: String,
        /// The server's error, or what was wrong with its answer.
        message: String,
    },
    /// The server's answer to a request is longer than psych-mcp reads into memory (over
    /// stdio: an answer whose in-memory part is over 64 MiB, a line over 4 GiB, or a line
    /// over 16 MiB answering a request psych-mcp does not read itself, such as
    /// `initialize`): the request fails as soon as the answer has gone by, and the
    /// connection stays usable.
    #[error(
        "MCP server \"{server}\": {call} failed: its answer of {bytes} bytes is over the \
         {limit} bytes psych-mcp reads into memory"
    )]
    AnswerTooLarge {
        /// The server.
        server: ServerId,
        /// The call the answer was for.
        call: String,
        /// The answer's size.
        bytes: u64,
        /// The limit it is over.
        limit: u64,
    },
    /// The server's answer holds more structural bytes (`[`, `{`, `,`, `:` outside strings)
    /// than psych-mcp parses
    /// ([`MAX_JSON_STRUCTURAL_BYTES`](crate::MAX_JSON_STRUCTURAL_BYTES)), so its parsed form
    /// could take far more memory than its bytes: it was not parsed, the request fails as
    /// soon as the answer has gone by, and the connection stays usable.
    #[error("MCP server \"{server}\": {call} failed: {}", too_complex(*bytes, *limit))]
    AnswerTooComplex {
        /// The server.
        server: ServerId,
        /// The call the answer was for.
        call: String,
        /// The whole answer's size.
        bytes: u64,
        /// The limit ([`MAX_JSON_STRUCTURAL_BYTES`](crate::MAX_JSON_STRUCTURAL_BYTES)).
        limit: u64,
    },
    /// The server's answer was too large for memory, and keeping it in files would have
    /// passed the manager's [`SpillBudget`](crate::SpillBudget): it was not kept (a stdio
    /// line is read past, an HTTP body or event not read further, an answer refused while
    /// its texts were split off dropped), and the request fails at once. The connection
    /// stays usable. When other answers held part of the budget (`others`: calls in flight,
    /// spilled results not yet logged), the call may succeed once they are done; when none
    /// did, the answer alone is too large for the budget (an answer needs about twice its
    /// size while its texts are split off).
    #[error(
        "MCP server \"{server}\": {call} failed: its answer (at least {bytes} bytes) was not \
         kept: keeping it in files would pass the spill budget of {limit} bytes ({held} held \
         for it, {others} by other answers){}",
        if *others == 0 {
            "; the answer alone is too large for the budget (an answer needs about twice \
             its size while its texts are split off)"
        } else {
            ""
        }
    )]
    SpillBudget {
        /// The server.
        server: ServerId,
        /// The call the answer was for.
        call: String,
        /// The answer's bytes read when the budget refused more (at least its length).
        bytes: u64,
        /// The bytes the answer held itself then (its file, its texts so far).
        held: u64,
        /// The bytes other answers held then.
        others: u64,
        /// The budget.
        limit: u64,
    },
    /// The server answered a request with something psych-mcp cannot read (not JSON, or
    /// not a JSON-RPC response): the request fails as soon as the answer arrives, and the
    /// connection stays usable. (Invalid UTF-8 and lone surrogate escapes are not this:
    /// they are replaced by U+FFFD and the result says so in its `_meta`, under
    /// `psych/lossy`.)
    #[error("MCP server \"{server}\": {call} failed: the answer could not be read: {reason}")]
    MalformedAnswer {
        /// The server.
        server: ServerId,
        /// The call the answer was for.
        call: String,
        /// What is wrong, with a bounded quote of the answer.
        reason: String,
    },
    /// A `tools/list` page returned a `nextCursor` already seen in this listing: following
    /// it would loop forever.
    #[error("MCP server \"{server}\": tools/list page {page} repeats the cursor {cursor:?}")]
    RepeatedCursor {
        /// The server.
        server: ServerId,
        /// The page (1-based) that repeated it.
        page: usize,
        /// The repeated cursor.
        cursor: String,
    },
    /// A `tools/list` went past a bound on one listing (its bytes, its pages, a cursor's
    /// length): it is not followed further and the listing fails, as one that loops does.
    #[error("MCP server \"{server}\": tools/list stopped at page {page}: {bound}")]
    ListingTooLarge {
        /// The server.
        server: ServerId,
        /// The page (1-based) that went past the bound.
        page: usize,
        /// Which bound, and by how much.
        bound: crate::ListingBound,
    },
    /// The server answered MCP 2026-07-28's `input_required` (it needs the client's input,
    /// an elicitation say, before the tool runs) to a call that cannot give it:
    /// [`ToolHost::call_tool`](psych_types::ToolHost::call_tool) and
    /// [`McpManager::call_tool_raw`](crate::McpManager::call_tool_raw).
    /// [`ToolHost::call_tool_round`](psych_types::ToolHost::call_tool_round) answers it
    /// as [`HostAnswer::InputRequired`](psych_types::HostAnswer::InputRequired) instead.
    #[error(
        "MCP server \"{server}\": {call} needs input from the client first (an MCP \
         2026-07-28 input_required answer), which this caller cannot give"
    )]
    InputRequired {
        /// The server.
        server: ServerId,
        /// The call.
        call: String,
    },
    /// The server refused the call with JSON-RPC error -32021: it needs a client capability
    /// (elicitation, sampling, roots) the call did not declare.
    /// [`ToolHost::call_tool_round`](psych_types::ToolHost::call_tool_round) answers it
    /// as [`HostAnswer::MissingCapability`](psych_types::HostAnswer::MissingCapability).
    #[error(
        "MCP server \"{server}\": {call} failed: the server needs a client capability the \
         call did not declare: {message}"
    )]
    MissingCapability {
        /// The server.
        server: ServerId,
        /// The call.
        call: String,
        /// The server's error message.
        message: String,
        /// The error's `data` (its `requiredCapabilities`), as sent.
        data: Option<serde_json::Value>,
    },
    /// The server is down; the manager is reconnecting it with backoff.
    #[error("MCP server \"{server}\" is unreachable: {reason}")]
    Unreachable {
        /// The server.
        server: ServerId,
        /// Why it went down, as reported when it did.
        reason: String,
    },
    /// A lazy server's start, which this request waited for, failed
    /// ([`McpManager::add_lazy_server`](crate::McpManager::add_lazy_server)): the start's own
    /// error (a [`Spawn`](Self::Spawn) of a command not found, an
    /// [`Exited`](Self::Exited) with the server's stderr, a [`Timeout`](Self::Timeout)),
    /// shared by every request that waited for the same start. The next request tries
    /// again.
    #[error("{source}")]
    StartFailed {
        /// The server.
        server: ServerId,
        /// Why the start failed.
        source: std::sync::Arc<McpError>,
    },
    /// The manager has been shut down.
    #[error("the MCP connection manager has shut down")]
    ShutDown,
    /// psych-mcp's own work for a call, on a blocking thread (reading a server's answer,
    /// making the HTTP client), did not finish: a bug of psych's (a panic), or the runtime
    /// shutting down. Not the server's doing.
    #[error("MCP server \"{server}\": {call} failed: psych-mcp's own work on it did not finish")]
    Task {
        /// The server.
        server: ServerId,
        /// The call.
        call: String,
        /// The blocking task's failure.
        #[source]
        source: tokio::task::JoinError,
    },
}

impl McpError {
    /// The server the error is about, if it is about one.
    pub fn server(&self) -> Option<&ServerId> {
        match self {
            Self::UnknownServer { server }
            | Self::Spawn { server, .. }
            | Self::Exited { server, .. }
            | Self::Closed { server, .. }
            | Self::Timeout { server, .. }
            | Self::Protocol { server, .. }
            | Self::AnswerTooLarge { server, .. }
            | Self::AnswerTooComplex { server, .. }
            | Self::MalformedAnswer { server, .. }
            | Self::SpillBudget { server, .. }
            | Self::RepeatedCursor { server, .. }
            | Self::ListingTooLarge { server, .. }
            | Self::InputRequired { server, .. }
            | Self::MissingCapability { server, .. }
            | Self::Unreachable { server, .. }
            | Self::StartFailed { server, .. }
            | Self::Task { server, .. } => Some(server),
            Self::ShutDown => None,
        }
    }

    /// Whether the connection itself is lost (the manager then reconnects), as opposed to
    /// one request failing on a connection that stays usable.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, Self::Exited { .. } | Self::Closed { .. })
    }
}

/// Why an answer of `bytes` bytes with more than `limit` structural bytes was not parsed.
pub(crate) fn too_complex(bytes: u64, limit: u64) -> String {
    format!(
        "its answer of {bytes} bytes holds over {limit} brackets, braces, commas and colons \
         (JSON values and keys), more than psych-mcp parses; it was not read"
    )
}

/// Formats the stderr tail after an error message, or nothing.
struct Stderr<'a>(&'a str);

impl fmt::Display for Stderr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return Ok(());
        }
        write!(f, "; its last stderr lines:")?;
        for line in self.0.lines() {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_names_server_call_status_and_stderr() {
        let error = McpError::Exited {
            server: ServerId::new("fs").unwrap(),
            call: "initialize".into(),
            status: "exited with status 3".into(),
            stderr: "error: missing --root\nusage: fs --root DIR".into(),
        };
        assert_eq!(
            error.to_string(),
            "MCP server \"fs\": initialize failed: the server process exited with status 3; \
             its last stderr lines:\n  error: missing --root\n  usage: fs --root DIR"
        );
        assert!(error.is_connection_lost());
        let timeout = McpError::Timeout {
            server: ServerId::new("fs").unwrap(),
            call: "tools/call hang".into(),
            after: Duration::from_millis(200),
            stderr: String::new(),
        };
        assert_eq!(
            timeout.to_string(),
            "MCP server \"fs\": tools/call hang got no answer within 200ms"
        );
        assert!(!timeout.is_connection_lost());
    }
}
