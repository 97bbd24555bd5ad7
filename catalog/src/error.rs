//! The catalogue's errors: opening a file, reading and writing the store, and refreshing a
//! server through the freshener.

use std::path::PathBuf;
use std::time::Duration;

use psych_types::{CatalogVersion, ServerId, ToolName};

/// Opening a catalogue failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Another process (or another open handle in this one) holds the file. redb locks the
    /// whole file for its writer, so the catalogue is refused rather than shared or waited on.
    #[error("the catalogue {path} is held by another process (or another open handle)")]
    Locked {
        /// The file that is held.
        path: PathBuf,
    },
    /// The file was written by a later layout of this crate than this build knows; it is
    /// refused rather than misread.
    #[error(
        "the catalogue {path} has layout {found}, newer than the layout {supported} this build reads; upgrade psych-catalog"
    )]
    NewerLayout {
        /// The file (`<memory>` for the in-memory backend).
        path: PathBuf,
        /// The layout stored in the file.
        found: u64,
        /// The newest layout this build reads and writes.
        supported: u64,
    },
    /// The file is not a catalogue: it is a redb file without the catalogue's tables, or not
    /// a redb file at all, or redb could not open or repair it.
    #[error("cannot open the catalogue {path}: {source}")]
    Storage {
        /// The file.
        path: PathBuf,
        /// What redb said.
        #[source]
        source: redb::Error,
    },
    /// The file opened but a stored value could not be decoded.
    #[error("the catalogue {path} is damaged: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Which value, and why.
        #[source]
        source: CatalogError,
    },
}

/// Reading or writing the store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// redb failed (I/O, a full disk, a transaction it could not begin or commit). A failed
    /// refresh commits nothing: the previous live set stays.
    #[error("catalogue storage: {0}")]
    Storage(#[source] redb::Error),
    /// A listing named the same tool twice. The listing is refused whole and the server keeps
    /// its current tools.
    #[error("{server} listed the tool {name} more than once")]
    DuplicateTool {
        /// The server whose listing it was.
        server: ServerId,
        /// The repeated name.
        name: ToolName,
    },
    /// A read asked for a version the catalogue has not reached yet.
    #[error("version {asked} is ahead of the catalogue, which is at {current}")]
    VersionAhead {
        /// The version asked for.
        asked: CatalogVersion,
        /// The catalogue's current version.
        current: CatalogVersion,
    },
    /// A stored key or value did not decode (a damaged file, or one written by a buggy
    /// build). Nothing is rewritten because of it.
    #[error("damaged {what}: {reason}")]
    Corrupt {
        /// Which table and key.
        what: String,
        /// Why it did not decode.
        reason: String,
    },
    /// Serializing a tool definition failed (a definition serde cannot write, which the
    /// types of `psych-types` do not produce).
    #[error("cannot serialize the tool {name}: {source}")]
    Serialize {
        /// The tool.
        name: ToolName,
        /// What serde_json said.
        #[source]
        source: serde_json::Error,
    },
    /// The store a shared catalogue ([`Catalog::shared`](crate::Catalog::shared)) keeps its
    /// tools in failed or refused the request (its kind tells which:
    /// [`CatalogStoreError::kind`](psych_types::CatalogStoreError::kind)).
    #[error(transparent)]
    Shared(psych_types::CatalogStoreError),
    /// What only the redb catalogue answers ([`Catalog::stats`](crate::Catalog::stats)) was
    /// asked of a shared one.
    #[error("{0} is read from a redb catalogue only, and this one is shared")]
    NotLocal(&'static str),
}

/// Turns any redb error into [`CatalogError::Storage`].
pub(crate) fn storage(error: impl Into<redb::Error>) -> CatalogError {
    CatalogError::Storage(error.into())
}

/// The freshener's configuration was refused by [`FreshenerBuilder::build`](crate::FreshenerBuilder::build).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A duration that must be positive was zero (`ttl`, `list_timeout`,
    /// `backoff_initial`).
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// The first retry delay is longer than the longest one.
    #[error("backoff_initial ({initial:?}) is longer than backoff_max ({max:?})")]
    Backoff {
        /// The first retry delay.
        initial: Duration,
        /// The longest retry delay.
        max: Duration,
    },
    /// [`Freshener::start`](crate::Freshener::start) was called outside a tokio runtime.
    #[error("the freshener must be started from within a tokio runtime")]
    NoRuntime,
    /// The quiet period of `list_changed` coalescing is longer than the longest it may wait.
    #[error("debounce_quiet ({quiet:?}) is longer than debounce_max ({max:?})")]
    Debounce {
        /// How long notifications must stop before a refresh starts.
        quiet: Duration,
        /// The longest a notification waits for its refresh.
        max: Duration,
    },
}

/// A refresh through the [`Freshener`](crate::Freshener) failed. The server keeps the tools
/// it had; the failure is recorded in its health and retried with backoff.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RefreshError {
    /// The lister (the MCP connection) failed.
    #[error("tools/list on {server} failed: {source}")]
    Lister {
        /// The server.
        server: ServerId,
        /// What the lister said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The lister did not answer within the per-server timeout.
    #[error("tools/list on {server} did not answer within {after:?}")]
    TimedOut {
        /// The server.
        server: ServerId,
        /// The timeout.
        after: Duration,
    },
    /// The listing arrived but could not be stored.
    #[error("storing the tools of {server}: {source}")]
    Store {
        /// The server.
        server: ServerId,
        /// Why.
        #[source]
        source: CatalogError,
    },
    /// The catalogue is shared and another process held the server's refresh lease (was
    /// listing it) for longer than the freshener waits. Not recorded as the server's
    /// failure: the server was not asked.
    #[error("another process held the refresh lease of {server} for over {after:?}")]
    LeaseBusy {
        /// The server.
        server: ServerId,
        /// How long the lease was waited for.
        after: Duration,
    },
    /// The catalogue is shared and the server's refresh lease could not be taken: the
    /// shared store failed (out of connections, restarting). Not recorded as the server's
    /// failure: the server was not asked.
    #[error("taking the refresh lease of {server}: {source}")]
    Lease {
        /// The server.
        server: ServerId,
        /// Why.
        #[source]
        source: CatalogError,
    },
    /// The freshener shut down before the refresh finished.
    #[error("the freshener shut down before refreshing {server}")]
    ShutDown {
        /// The server.
        server: ServerId,
    },
    /// The blocking write task panicked or was cancelled (a bug, reported rather than
    /// propagated).
    #[error("the write task for {server} did not finish: {reason}")]
    Task {
        /// The server.
        server: ServerId,
        /// What tokio said.
        reason: String,
    },
    /// The refresh failed (`failure`: the lister's error, a timeout…), and recording that
    /// failure in the server's health failed too (`recording`). `failure` is why the refresh
    /// failed, and this error's source.
    #[error("{failure} (recording the failure failed too: {recording})")]
    Unrecorded {
        /// Why the refresh failed.
        #[source]
        failure: Box<RefreshError>,
        /// Why the failure could not be recorded.
        recording: CatalogError,
    },
}

impl RefreshError {
    /// Why the refresh failed: this error, or for [`RefreshError::Unrecorded`] the failure
    /// that could not be recorded.
    pub fn failure(&self) -> &RefreshError {
        match self {
            Self::Unrecorded { failure, .. } => failure,
            other => other,
        }
    }
}
