//! The errors of the record log, one enum per operation family and an umbrella [`Error`].

use std::path::PathBuf;
use std::time::Duration;

use crate::cause::{LogCorruption, RecordCorruption};
use crate::format::FORMAT_VERSION;

/// Why [`GroupCommitBuilder::build`](crate::GroupCommitBuilder::build) refused a group-commit
/// policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// `max_records` is 0: no group could ever hold a record.
    #[error("group commit max_records must be at least 1")]
    ZeroMaxRecords,
    /// `max_bytes` is 0: no group could ever hold a frame.
    #[error("group commit max_bytes must be at least 1")]
    ZeroMaxBytes,
    /// `max_wait` is longer than the log allows
    /// ([`MAX_GROUP_WAIT`](crate::MAX_GROUP_WAIT)).
    #[error("group commit max_wait of {max_wait:?} exceeds the limit of {limit:?}")]
    MaxWaitTooLong {
        /// The window asked for.
        max_wait: Duration,
        /// The longest window allowed.
        limit: Duration,
    },
}

/// Why a Run's log could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The directory or file could not be created, read, locked, cut or synced.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Another open log (in this process or another) holds the file's lock.
    #[error("{path} is open elsewhere; a Run's log has one writer at a time")]
    Locked {
        /// The log file.
        path: PathBuf,
    },
    /// The file does not start with the log's magic bytes: it is not a record log.
    #[error("{path} is not a record log (no PSYCHLOG magic)")]
    NotALog {
        /// The file.
        path: PathBuf,
    },
    /// The file is a record log of a format version this build does not read: it reads
    /// [`FORMAT_VERSION`](crate::FORMAT_VERSION) only.
    #[error("{path} is format version {version}; this build reads version {FORMAT_VERSION}")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version its header names.
        version: u16,
    },
    /// The file's header names another Run (a renamed or copied file, or two Run ids that
    /// collide on a case-insensitive file system). Nothing of it is served.
    #[error("{path} holds the log of run {found:?}, not of run {expected:?}")]
    RunMismatch {
        /// The file.
        path: PathBuf,
        /// The Run that was asked for.
        expected: String,
        /// The Run its header names.
        found: String,
    },
    /// A damaged frame (or file header) is followed by whole frames that are not the rest of
    /// a torn last write (`docs/format.md`, "Recovery on open"): the damage is not a torn
    /// tail, so cutting there could drop acknowledged records. Also: the file holds fewer
    /// whole records than its high-water mark says a completed sync made durable (frames
    /// zeroed or cut since), the mark disagrees with the frames, or neither of the mark's
    /// slots is valid. The file is left as it is.
    #[error("{path}: corrupt log at byte {offset}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte offset of the first damaged frame (0 for the file header).
        offset: u64,
        /// What is wrong there.
        reason: LogCorruption,
    },
}

/// Why an append was not acknowledged. No handle was issued for it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// Writing or syncing failed. The log cut the partial frame off again when it could;
    /// otherwise it is poisoned (see [`AppendError::Poisoned`]). Under group commit every
    /// append of the failed group gets this error and none of the group is acknowledged;
    /// `offset` is where the group started, and each append's `source` is the group's one
    /// error: the same OS error (kind, `raw_os_error`, text) for an operating system
    /// error, else an error of the same kind and text whose inner error (`get_ref`) is the
    /// original, an `Arc<std::io::Error>` shared by the group.
    #[error("appending to {path} at byte {offset}: {source}")]
    Io {
        /// The log file.
        path: PathBuf,
        /// Where the frame was being written.
        offset: u64,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A record's metadata is larger than a frame can describe (4 GiB).
    #[error("record metadata of {len} bytes exceeds the 4 GiB frame limit")]
    TooLarge {
        /// The metadata's length.
        len: usize,
    },
    /// The record could not be serialized (a JSON value serde refuses).
    #[error("record could not be encoded: {0}")]
    Encode(#[source] serde_json::Error),
    /// An earlier write or sync failed and could not be undone, so what is on disk is
    /// uncertain; the log takes no more appends. Reopen it to recover.
    #[error("{path} refused the append: an earlier failure left it in an unknown state; reopen it")]
    Poisoned {
        /// The log file.
        path: PathBuf,
    },
    /// A tool result's spilled text (`ToolOutput::spilled`,
    /// [`SpilledText`](psych_types::SpilledText)) could not be stored: the output names a
    /// block that is not one of its text blocks, or the spill file could not be read
    /// whole as the UTF-8 text it should hold. Nothing of the append is acknowledged and
    /// whatever of its frame was written is cut back off the file.
    #[error("the spilled text of content block {block} ({len} bytes) could not be stored: {cause}")]
    Spill {
        /// The content block whose text is spilled.
        block: usize,
        /// The spilled text's length in bytes ([`SpilledText::len`](psych_types::SpilledText::len)).
        len: u64,
        /// What went wrong.
        #[source]
        cause: SpillError,
    },
    /// The record's JSON (its metadata, or a tool result's structured content) nests
    /// deeper than the log reads back ([`psych_types::json::MAX_DEPTH`], counted with the
    /// log's own wrapping): it is refused rather than kept unreadable. Nothing of the
    /// append is acknowledged.
    #[error("the record nests JSON {depth} levels deep; the log reads back at most {max}")]
    TooDeep {
        /// How deep the encoded record nests.
        depth: usize,
        /// The deepest the log reads back.
        max: usize,
    },
    /// The log was opened with [`RecordLog::open_read_only`](crate::RecordLog::open_read_only):
    /// it never writes, so appends and syncs are refused.
    #[error("{path} was opened read-only; it takes no appends")]
    ReadOnly {
        /// The log file.
        path: PathBuf,
    },
}

/// Why a spilled text could not be stored ([`AppendError::Spill`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpillError {
    /// `ToolOutput::spilled` names a block that is not a text block of the output's
    /// content, or names blocks out of order or one twice.
    #[error("the output's content has no such text block (or it is named twice, or out of order)")]
    NotATextBlock,
    /// Reading the spill file failed.
    #[error("reading the spill file at byte {offset}: {source}")]
    Read {
        /// Where in the text the read started.
        offset: u64,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The spill file ends before the text's length.
    #[error("the spill file ends at byte {at}, before the text's end")]
    Short {
        /// Where the file ended.
        at: u64,
    },
    /// The spill file's bytes are not UTF-8.
    #[error("the text is not UTF-8 at byte {at}")]
    NotUtf8 {
        /// The first byte that is not part of a valid UTF-8 sequence.
        at: u64,
    },
    /// The spill file no longer holds the text it held when the record was encoded (its
    /// line breaks differ): it changed between the two reads of an append.
    #[error("the spill file changed while it was being appended")]
    Changed,
}

/// Why a read by handle failed. A handle that does not resolve is not an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The positional read failed.
    #[error("reading {path} at byte {offset}: {source}")]
    Io {
        /// The log file.
        path: PathBuf,
        /// Where the read started.
        offset: u64,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The frame no longer checks out (changed on disk after the log was opened), or its
    /// metadata does not decode.
    #[error("{path}: corrupt record at byte {offset}: {reason}")]
    Corrupt {
        /// The log file.
        path: PathBuf,
        /// Byte offset of the frame.
        offset: u64,
        /// What is wrong there.
        reason: RecordCorruption,
    },
}

/// Any error of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Opening a log failed.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// An append failed.
    #[error(transparent)]
    Append(#[from] AppendError),
    /// A read failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A group-commit policy was refused when it was built.
    #[error(transparent)]
    Policy(#[from] PolicyError),
}
