//! The record log: an append-only, durable, per-Run log of records (user messages,
//! assistant messages with their tool calls, tool results with their full content), the
//! source of truth that elision, transcripts and compaction read from.
//!
//! The principal type is [`RecordLog`], the log of one Run: a file `<dir>/<run>.plog` of
//! CRC-32C-checksummed frames (format in `docs/format.md`), indexed in memory on open, so a
//! read by handle is one lookup and one positional read. Appending returns the record's
//! [`RecordHandle`](psych_types::RecordHandle) (`<run>:<seq>`) only once the record is on disk
//! under the [`SyncPolicy`]; [`RecordLog::append_batch`] commits a caller's batch with one
//! sync. [`SharedRecordLog`] shares one log between threads (`&self` appends) with group
//! commit ([`SyncPolicy::GroupCommit`]): appends arriving together are written by one leader
//! thread and made durable by one `fdatasync`, in a window bounded in time and size, and each
//! appender gets its handle once the group's sync is done; a failed group acknowledges none
//! of its appends.
//!
//! Opening cuts a torn tail back to the last whole record and reports it in a [`Recovery`];
//! damage in the middle is [`OpenError::Corrupt`] naming the offset, and so are records
//! that a completed sync made durable but that are gone from the file (zeroed or cut), which
//! a high-water mark reveals; the end mark each write puts after its last frame tells the
//! log's end from frames zeroed or cut off after it (reported, never a clean shorter log). [`RecordLog::open_read_only`] reads a
//! log without writing, cutting or locking it (a damaged tail is reported, left in place).
//! Past 64 MiB, opening takes the frames an earlier open verified from a checkpoint file
//! instead of checksumming them again (damage there is found when a record is read: each
//! such frame is checked whole on its first content read in the process). A
//! log serves only its own Run: it implements [`RecordSource`](psych_types::RecordSource), and a handle of
//! another Run does not resolve. Tool results store their readable bytes raw and contiguous,
//! so [`read_output`](psych_types::RecordSource::read_output) serves any slice of a huge
//! result without loading it. A result too large to hold in memory is appended from its
//! spill files (`ToolOutput::spilled`), streamed, and stored byte for byte as the same
//! result in memory would be. [`RecordLog::history`] reads a Run's lazy
//! [`History`](psych_types::History) for prompt assembly from the frames' headers and
//! metadata alone (each tool result's length, kind, error flag, stored token estimate and
//! line breaks), so a step's assembly does not read results it does not send whole; a log
//! given an estimator ([`RecordLog::set_estimator`]) stores each result's estimate when
//! it is appended. A result longer than 128 KiB also stores a sparse line index (the line
//! breaks before every 128 KiB, more widely spaced past 256 MiB: at most 16 KiB of
//! metadata), from which [`line_mark`](psych_types::RecordSource::line_mark) answers,
//! so that reading from line `N` of a huge result starts within a stride of it.
//!
//! Unix only (positional reads and writes through `std::os::unix::fs::FileExt`): on any
//! other target the crate does not compile (`compile_error!`).
//!
//! # What blocks
//!
//! Every call does file I/O on the calling thread; none is async. From an async runtime
//! (psych-runtime's is tokio), call the log from `tokio::task::spawn_blocking` or from a
//! writer thread of its own, never from a task directly.
//!
//! - [`RecordLog::append`], [`RecordLog::append_batch`] and [`RecordLog::sync`] end with an
//!   `fdatasync` under [`SyncPolicy::EveryAppend`] and [`SyncPolicy::GroupCommit`]: 0.2 to
//!   2.5 ms each on the SSDs measured (`cargo bench -p psych-record-log --bench append`),
//!   longer on slow disks or under write load; under [`SyncPolicy::OsBuffered`] only
//!   `sync` does.
//! - [`SharedRecordLog::append`] and [`SharedRecordLog::append_batch`] park the thread
//!   until the call's group is durable: up to the [`GroupCommit::max_wait`] window for
//!   company, plus the group's write and `fdatasync` (plus any group ahead of it). Group
//!   commit groups only appenders on different OS threads: an appender's thread is parked
//!   while it waits, so async tasks share a group only when each appends from its own
//!   blocking thread (`spawn_blocking`).
//! - Appending a tool result with spilled text (`ToolOutput::spilled`, a
//!   [`SpilledText`](psych_types::SpilledText) in a file) reads each spill file through
//!   twice, in 1 MiB chunks: once as the record is encoded (UTF-8 check, line index, token
//!   estimate; on the appending thread, under group commit too) and once as its frame is
//!   written (by the appender, or by the group's leader). Its time grows with the text
//!   (about 2.4 s for 1 GiB in a release build, `fdatasync` included), its memory does
//!   not (see `docs/format.md`, "Streamed appends").
//! - [`RecordLog::open`] reads and checksums every frame (past 64 MiB, those after the
//!   last checkpoint): its time grows with the log. Reads by handle are one or two
//!   positional reads; [`RecordLog::record`](psych_types::RecordSource::record) reads the
//!   whole record, however large.
//!
//! # Errors
//!
//! One enum per operation family, all `#[non_exhaustive]`, each variant documented with
//! when it happens: [`OpenError`] (I/O, another opener holding the lock, not a log, another
//! format version ([`FORMAT_VERSION`]) or Run, and [`OpenError::Corrupt`] whose
//! [`LogCorruption`] says what does not check out and leaves the file untouched);
//! [`AppendError`] (nothing of a failed append is acknowledged; [`AppendError::Spill`]
//! with a [`SpillError`] when a spilled text cannot be read whole as UTF-8; `Poisoned` until reopened
//! when the log could not cut a failed write back); [`ReadError`] (a
//! [`RecordCorruption`] when a frame changed on disk since open); [`PolicyError`] when a
//! [`GroupCommit`] is built out of bounds. What opening cut off is not an error: it is the
//! [`Recovery`]'s [`TailLoss`], its [`TailReason`] an enum to match on. Every error names
//! the file and, where there is one, the byte offset.
//!
//! # Configuration
//!
//! The [`SyncPolicy`] given to `open` (default [`SyncPolicy::EveryAppend`]); for group
//! commit a [`GroupCommit`] built by [`GroupCommit::builder`] (a 2 ms window, 64 records,
//! 8 MiB by default), checked when built. [`RecordLog::set_estimator`] stores token
//! estimates with tool results. [`RecordLog::open_with_storage`] takes a [`Storage`], the
//! seam through which every change to the file goes; [`FaultyStorage`] is the test seam
//! that fails chosen operations.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use psych_record_log::{GroupCommit, RecordLog, SharedRecordLog, SyncPolicy};
//! use psych_types::{
//!     Record, RecordSource, RunId, ToolCallId, ToolOutput, ToolResult, UserMessage,
//! };
//!
//! let dir = tempfile::tempdir()?;
//! let run = RunId::new("run-7")?;
//! let (mut log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend)?;
//! assert!(recovery.is_clean());
//!
//! let handle = log.append(&Record::ToolResult(ToolResult {
//!     target: None,
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
//! drop(log);
//!
//! // Parallel tool calls finishing together: one group, one fdatasync.
//! let window = GroupCommit::builder()
//!     .max_wait(Duration::from_millis(2))
//!     .max_records(64)
//!     .build()?;
//! let policy = SyncPolicy::GroupCommit(window);
//! let log = Arc::new(SharedRecordLog::new(RecordLog::open(dir.path(), &run, policy)?.0));
//! let threads: Vec<_> = (0..4)
//!     .map(|i| {
//!         let log = Arc::clone(&log);
//!         std::thread::spawn(move || {
//!             log.append(&Record::User(UserMessage { text: format!("call {i} done") }))
//!         })
//!     })
//!     .collect();
//! for thread in threads {
//!     let handle = thread.join().map_err(|_| "appender panicked")??;
//!     assert!(log.record(&handle)?.is_some());
//! }
//! assert_eq!(log.len(), 5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

// Positional reads and writes (`std::os::unix::fs::FileExt`), the file lock's semantics and
// the checkpoint's device and inode are Unix's; refuse to build elsewhere rather than
// misbehave.
#[cfg(not(unix))]
compile_error!("psych-record-log supports Unix only (it relies on std::os::unix::fs::FileExt)");

mod cause;
mod checkpoint;
mod crc32c;
mod error;
mod format;
mod history;
mod log;
mod policy;
mod recovery;
mod shared;
mod spill;
mod storage;
mod touch;
mod write;

pub use cause::{AfterFrames, FrameDamage, LogCorruption, RecordCorruption, TailReason};
pub use error::{AppendError, Error, OpenError, PolicyError, ReadError, SpillError};
pub use format::FORMAT_VERSION;
pub use log::RecordLog;
pub use policy::{GroupCommit, GroupCommitBuilder, MAX_GROUP_WAIT, SyncPolicy};
pub use recovery::{Recovery, TailLoss};
pub use shared::{GroupStats, SharedRecordLog};
pub use storage::{FaultyStorage, FileStorage, Storage, StorageOp};
