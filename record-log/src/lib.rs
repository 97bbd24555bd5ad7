//! The record log: an append-only, durable, per-Run log of records (user messages,
//! assistant messages with their tool calls, tool results with their full content), the
//! source of truth that elision, transcripts and compaction read from.
//!
//! The principal type is [`RecordLog`], the log of one Run: a file `<dir>/<run>.plog` of
//! CRC-32C-checksummed frames (format in `docs/format.md`), indexed in memory on open, so a
//! read by handle is one lookup and one positional read. Appending returns the record's
//! [`RecordHandle`](psych_types::RecordHandle) (`<run>:<seq>`) only once the record is on disk
//! under the [`SyncPolicy`]; [`RecordLog::append_batch`] commits a group with one sync.
//! Opening cuts a torn tail back to the last whole record and reports it in a [`Recovery`];
//! damage in the middle is [`OpenError::Corrupt`] naming the offset. A log serves only its
//! own Run: it implements [`RecordSource`](psych_types::RecordSource), and a handle of
//! another Run does not resolve. Tool results store their readable bytes raw and contiguous,
//! so [`read_output`](psych_types::RecordSource::read_output) serves any slice of a huge
//! result without loading it.
//!
//! Unix only (positional reads and writes through `std::os::unix::fs::FileExt`).
//!
//! # Example
//!
//! ```
//! use psych_record_log::{RecordLog, SyncPolicy};
//! use psych_types::{Record, RecordSource, RunId, ToolCallId, ToolOutput, ToolResult};
//!
//! let dir = tempfile::tempdir()?;
//! let run = RunId::new("run-7")?;
//! let (mut log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend)?;
//! assert!(recovery.is_clean());
//!
//! let handle = log.append(&Record::ToolResult(ToolResult {
//!     call_id: ToolCallId::new("call_1")?,
//!     name: "read_file".into(),
//!     output: ToolOutput::text("hello, world"),
//! }))?;
//! assert_eq!(handle.to_string(), "run-7:0");
//!
//! let mut buf = [0u8; 5];
//! assert_eq!(log.read_output(&handle, 7, &mut buf)?, 5);
//! assert_eq!(&buf, b"world");
//!
//! drop(log);
//! let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend)?;
//! assert_eq!(recovery.records, 1);
//! assert!(log.record(&handle)?.is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod crc32c;
mod error;
mod format;
mod log;

pub use error::{AppendError, Error, OpenError, ReadError};
pub use log::{RecordLog, Recovery, SyncPolicy, TailLoss};
