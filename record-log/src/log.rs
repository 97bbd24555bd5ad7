//! [`RecordLog`]: one Run's log file, its in-memory index, appends under a [`SyncPolicy`],
//! recovery on open, and reads by handle.

use std::borrow::Cow;
use std::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use psych_types::{
    ContentBlock, LoggedRecord, OutputInfo, Record, RecordHandle, RecordSource, RunId,
    TokenEstimator,
};

use crate::checkpoint::{self, CHECKPOINT_AFTER, Identity};
use crate::crc32c::Crc32c;
use crate::error::{AppendError, OpenError, PolicyError, ReadError};
use crate::format::{
    self, FILE_EXTENSION, FRAME_HEADER_LEN, FRAME_MAGIC, FRAME_TRAILER_LEN, FrameHeader,
    HeaderFault, KIND_TOOL_RESULT, MARK_LEN, MARK_SLOTS, Mark,
};

/// Content larger than this is written straight from the record instead of being copied
/// into the frame buffer first.
const COPY_LIMIT: usize = 1 << 20;
/// The frame buffer is shrunk back to this after a batch of large records.
const SCRATCH_KEEP: usize = 4 << 20;
/// Read size when scanning and checksumming on open.
const SCAN_CHUNK: usize = 1 << 20;
/// The file is extended with zeros this far past the last frame, ahead of appends, so that
/// an append overwrites blocks that already exist and its `fdatasync` flushes data only,
/// not the file's size and extents (see `docs/format.md`, "Preallocation").
const PREALLOC: u64 = 1 << 20;
/// Writes (one append, one batch, one group) larger than this do not trigger
/// preallocation: they grow the file themselves. It is `PREALLOC / 2`, the least room
/// preallocation leaves past the last frame, so every write that triggers it also lands in
/// preallocated space: a group of 64 records of 4 KiB (266 KiB) included, which under the
/// earlier limit of 128 KiB grew the file on every group past the first MiB. Zeros cost
/// bandwidth (every byte is written twice) but only on the sync that writes them, about one
/// in `PREALLOC / 2` bytes appended; the syncs in between flush data only (see
/// `docs/format.md`, "Preallocation").
const PREALLOC_MAX_WRITE: u64 = PREALLOC / 2;

/// Ends the reason of a tail that [`RecordLog::open_read_only`] found and left in place.
const READ_ONLY_NOTE: &str = "left in place: opened read-only";

/// The longest [`SyncPolicy::GroupCommit::max_wait`] a log accepts: an appender blocked
/// longer than this for company is a misconfiguration, not a tuning choice.
pub const MAX_GROUP_WAIT: Duration = Duration::from_secs(1);

/// When an append is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SyncPolicy {
    /// Every [`RecordLog::append`] and every [`RecordLog::append_batch`] ends with one
    /// `fdatasync` (`File::sync_data`); handles are returned only after it succeeded, so an
    /// acknowledged record survives a process kill, an OS crash and a power loss.
    /// `append_batch` commits the caller's batch with one sync. Through a
    /// [`SharedRecordLog`](crate::SharedRecordLog), concurrent appends are still synced one
    /// call at a time (groups of one call, no waiting).
    #[default]
    EveryAppend,
    /// Group commit with a bounded window, for a log shared by concurrent appenders
    /// ([`SharedRecordLog`](crate::SharedRecordLog)): appends arriving together are written
    /// by one leader thread in one write and made durable by ONE `fdatasync`, and each
    /// appender gets its handle only after that sync, so the durability promise is the one
    /// of [`SyncPolicy::EveryAppend`]. A group closes when it holds `max_records` records or
    /// `max_bytes` bytes of frames, or when its oldest append has waited `max_wait`,
    /// whichever comes first; a call's records are never split between groups (a call
    /// larger than a bound forms a group of its own).
    ///
    /// On a [`RecordLog`] used directly (one appender, `&mut self`) there is nobody to group
    /// with: each call is synced at once, as under [`SyncPolicy::EveryAppend`].
    ///
    /// Checked when the log is opened ([`SyncPolicy::validate`]).
    GroupCommit {
        /// How long a group stays open for more appends, counted from its oldest append's
        /// arrival: the most an appender waits for company. At most [`MAX_GROUP_WAIT`];
        /// zero groups only what queued up while the previous group was being synced.
        max_wait: Duration,
        /// Most records in one group (at least 1).
        max_records: usize,
        /// Most bytes of frames in one group (at least 1).
        max_bytes: u64,
    },
    /// No sync on append: records reach the OS page cache (they survive the process being
    /// killed, not an OS crash or power loss) and are durable only after
    /// [`RecordLog::sync`]. For bulk loading and tests.
    OsBuffered,
}

impl SyncPolicy {
    /// Checks the policy's bounds; returns it unchanged when they hold.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] for a [`SyncPolicy::GroupCommit`] with `max_records` or `max_bytes`
    /// of zero, or `max_wait` above [`MAX_GROUP_WAIT`].
    pub fn validate(self) -> Result<Self, PolicyError> {
        if let SyncPolicy::GroupCommit {
            max_wait,
            max_records,
            max_bytes,
        } = self
        {
            if max_records == 0 {
                return Err(PolicyError::ZeroMaxRecords);
            }
            if max_bytes == 0 {
                return Err(PolicyError::ZeroMaxBytes);
            }
            if max_wait > MAX_GROUP_WAIT {
                return Err(PolicyError::MaxWaitTooLong {
                    max_wait,
                    limit: MAX_GROUP_WAIT,
                });
            }
        }
        Ok(self)
    }

    /// Whether an append under this policy ends with an `fdatasync`.
    pub(crate) fn syncs(self) -> bool {
        !matches!(self, SyncPolicy::OsBuffered)
    }
}

/// What opening a log found and repaired. Opening never drops data silently: anything cut
/// off is described here, and records that the file's high-water mark says a completed sync
/// made durable but that are missing make `open` fail with [`OpenError::Corrupt`] instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Whole records in the log after opening.
    pub records: u64,
    /// The torn or damaged tail that was cut off, or the last sync's records found
    /// missing, if any.
    pub tail: Option<TailLoss>,
}

impl Recovery {
    /// Whether the log opened with nothing cut off and no record found missing.
    pub fn is_clean(&self) -> bool {
        self.tail.is_none()
    }
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} whole records", self.records)?;
        if let Some(tail) = &self.tail {
            write!(
                f,
                "; cut {} bytes of damaged tail at byte {} ({})",
                tail.bytes, tail.offset, tail.reason
            )?;
        }
        Ok(())
    }
}

/// A tail that was cut off on open: the bytes of a frame whose write was torn (the process
/// died mid-append) or damaged, with no whole frame after it; or the part of the last write
/// from its first damaged frame on, when a power loss left that unsynced write's pages on
/// disk out of order (whole frames of the same write after the damage, none of them ever
/// acknowledged: `reason` then starts with `torn write`); or zeros (or nothing) where the
/// frames of the last sync belong (`reason` then starts with `last write missing`): a crash
/// before that sync returned, or frames lost after it, which the log cannot tell apart, so
/// it says so rather than taking the zeros for free space. When the last sync's records are
/// among those cut, `reason` names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailLoss {
    /// Byte offset the file was cut back to: the end of the last whole record.
    pub offset: u64,
    /// How many bytes were cut off.
    pub bytes: u64,
    /// What was wrong with the first bad frame.
    pub reason: String,
}

/// Where one record's frame is, with its checked header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub(crate) offset: u64,
    pub(crate) header: FrameHeader,
}

/// The append-only, durable log of one Run: a file `<dir>/<run>.plog` of checksummed
/// frames, one per record, with an in-memory index from position to frame built on open.
///
/// It is the [`RecordSource`] of its Run: reads by handle are one index lookup and one or
/// two positional reads; a handle of another Run, or one never issued, does not resolve.
/// Appends take `&mut self` (one writer; share one between threads, with group commit,
/// through [`SharedRecordLog`](crate::SharedRecordLog)); the file is locked against a second
/// opener.
/// Reads take `&self` and use positional reads, so several threads may read at once.
pub struct RecordLog {
    pub(crate) run: RunId,
    pub(crate) path: PathBuf,
    pub(crate) file: File,
    pub(crate) sync: SyncPolicy,
    pub(crate) index: Vec<Entry>,
    /// Byte length of the whole frames (where the next frame goes).
    pub(crate) end: u64,
    /// The file's length: `end` plus preallocated zeros.
    pub(crate) allocated: u64,
    /// Byte offset of the high-water mark's first slot (right after the file header).
    marks_at: u64,
    /// The current high-water mark: the last one written by a sync that returned, or the
    /// one read on open.
    mark: Mark,
    /// Records a sync that returned has made durable (all of them when the policy syncs),
    /// and the byte offset where they end.
    durable_records: u64,
    durable_end: u64,
    pub(crate) poisoned: bool,
    /// Opened by [`RecordLog::open_read_only`]: nothing is ever written, cut or synced.
    pub(crate) read_only: bool,
    scratch: Vec<u8>,
    recovery: Recovery,
    /// Estimates each tool result's tokens at append time, stored in its metadata.
    pub(crate) estimator: Option<Estimator>,
    /// The frames taken from the open checkpoint, each checked whole on its first content
    /// read in this process (`touch.rs`).
    pub(crate) first_touch: crate::touch::FirstTouch,
}

/// A token estimator a log can share with its appending threads.
pub(crate) type Estimator = std::sync::Arc<dyn TokenEstimator + Send + Sync>;

impl fmt::Debug for RecordLog {
    /// The log's identity and size, not its index or buffers.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordLog")
            .field("run", &self.run)
            .field("path", &self.path)
            .field("sync", &self.sync)
            .field("records", &self.index.len())
            .field("size_bytes", &self.end)
            .field("poisoned", &self.poisoned)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

fn open_io(path: &Path) -> impl FnOnce(std::io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl RecordLog {
    /// The file that holds `run`'s log under `dir`.
    pub fn path_for(dir: impl AsRef<Path>, run: &RunId) -> PathBuf {
        dir.as_ref().join(format!("{run}.{FILE_EXTENSION}"))
    }

    /// Opens (creating it and `dir` if needed) the log of `run` under `dir`, checks every
    /// frame, cuts a torn or damaged tail back to the last whole record, and says what it
    /// found in the returned [`Recovery`].
    ///
    /// # Errors
    ///
    /// [`OpenError`]: I/O failures, a file locked by another open log, a file that is not a
    /// log or belongs to another Run, damage followed by whole frames that are not the
    /// rest of a torn last write, records the high-water mark counts durable missing from
    /// the file, or a high-water mark with no valid slot ([`OpenError::Corrupt`], which
    /// names the offset and leaves the file untouched).
    pub fn open(
        dir: impl AsRef<Path>,
        run: &RunId,
        sync: SyncPolicy,
    ) -> Result<(Self, Recovery), OpenError> {
        let sync = sync.validate()?;
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(open_io(dir))?;
        let path = Self::path_for(dir, run);
        let (file, created) = Self::open_file(&path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(OpenError::Locked { path }),
            Err(TryLockError::Error(err)) => return Err(open_io(&path)(err)),
        }
        let mut log = Self::unopened(run, path, file, sync, false);
        let (header_loss, header_written) = log.check_header()?;
        if created || header_written {
            // The file's directory entry must be as durable as its header.
            sync_dir(dir).map_err(open_io(dir))?;
        }
        log.finish_open(header_loss)
    }

    /// Opens the existing log of `run` under `dir` for reading only: the file is opened
    /// without write access, not locked (a writer may hold it open meanwhile), and never
    /// written, cut or synced. Every frame is checked as [`RecordLog::open`] checks it and
    /// the same damage is an error; a torn or damaged tail that `open` would cut is left in
    /// place, reported in [`Recovery::tail`] (its reason ending in `(left in place: opened
    /// read-only)`), and the log serves the whole records before it. A file whose creation
    /// was torn reads as an empty log, its tail reported the same way. Appends and syncs
    /// are refused with [`AppendError::ReadOnly`].
    ///
    /// A log being appended to while it is open read-only may show a frame still being
    /// written as a torn tail; records appended after the open are not seen.
    ///
    /// # Errors
    ///
    /// [`OpenError`] as for [`RecordLog::open`] (no file is [`OpenError::Io`], and
    /// [`OpenError::Locked`] never happens).
    pub fn open_read_only(
        dir: impl AsRef<Path>,
        run: &RunId,
    ) -> Result<(Self, Recovery), OpenError> {
        let path = Self::path_for(dir, run);
        let file = File::open(&path).map_err(open_io(&path))?;
        let mut log = Self::unopened(run, path, file, SyncPolicy::OsBuffered, true);
        let (header_loss, _) = log.check_header()?;
        log.finish_open(header_loss)
    }

    /// A log on `file` before its header and frames are read.
    fn unopened(run: &RunId, path: PathBuf, file: File, sync: SyncPolicy, read_only: bool) -> Self {
        Self {
            run: run.clone(),
            path,
            file,
            sync,
            index: Vec::new(),
            end: 0,
            allocated: 0,
            marks_at: 0,
            mark: Mark::initial(0),
            durable_records: 0,
            durable_end: 0,
            poisoned: false,
            read_only,
            scratch: Vec::new(),
            estimator: None,
            first_touch: crate::touch::FirstTouch::default(),
            recovery: Recovery {
                records: 0,
                tail: None,
            },
        }
    }

    /// Scans the frames (unless the header check already reported a loss) and records
    /// what opening found.
    fn finish_open(mut self, header_loss: Option<TailLoss>) -> Result<(Self, Recovery), OpenError> {
        let tail = match header_loss {
            Some(loss) => Some(loss),
            None => {
                let covered = self.load_checkpoint()?;
                let tail = self.scan()?;
                if !self.read_only && self.end.saturating_sub(covered) >= CHECKPOINT_AFTER {
                    // Best effort: a checkpoint is a cache, and without one the next open
                    // verifies every frame, as it would have.
                    let _ = self.write_checkpoint();
                }
                tail
            }
        };
        self.recovery = Recovery {
            records: self.index.len() as u64,
            tail,
        };
        let recovery = self.recovery.clone();
        Ok((self, recovery))
    }

    /// Opens `path` for reading and writing, creating it if needed; says whether it was
    /// created.
    fn open_file(path: &Path) -> Result<(File, bool), OpenError> {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(file) => Ok((file, true)),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok((
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .map_err(open_io(path))?,
                false,
            )),
            Err(err) => Err(open_io(path)(err)),
        }
    }

    /// Checks the file header and reads the high-water mark; writes both when the file is
    /// new or its creation was torn. Returns the loss to report, and whether the header was
    /// written.
    fn check_header(&mut self) -> Result<(Option<TailLoss>, bool), OpenError> {
        let header = format::file_header(&self.run);
        let initial = format::initial_file_start(&self.run);
        let len = self.file_len()?;
        let want = initial.len() as u64;
        let mut head = vec![0u8; len.min(want) as usize];
        self.file
            .read_exact_at(&mut head, 0)
            .map_err(open_io(&self.path))?;
        self.marks_at = header.len() as u64;
        if len >= want && head.starts_with(&header) {
            let Some(mark) = Mark::newest(&head[header.len()..]) else {
                return Err(OpenError::Corrupt {
                    path: self.path.clone(),
                    offset: self.marks_at,
                    reason: "high-water mark damaged: neither of its slots checks out, so \
                             whether records that were made durable are missing cannot be told"
                        .into(),
                });
            };
            self.end = want;
            self.allocated = len;
            self.set_mark(mark);
            return Ok((None, false));
        }
        if len < want && initial.starts_with(&head) && self.read_only {
            // Creation cut short (or under way): no record yet, and nothing is rewritten.
            self.end = len;
            self.allocated = len;
            self.set_mark(Mark::initial(want));
            let loss = (len > 0).then(|| TailLoss {
                offset: 0,
                bytes: len,
                reason: format!("file header torn during creation; {READ_ONLY_NOTE}"),
            });
            return Ok((loss, false));
        }
        if len < want && initial.starts_with(&head) {
            // A new file, or one whose creation was cut short before any record.
            self.file.set_len(0).map_err(open_io(&self.path))?;
            self.file
                .write_all_at(&initial, 0)
                .map_err(open_io(&self.path))?;
            self.file.sync_data().map_err(open_io(&self.path))?;
            self.end = want;
            self.allocated = want;
            self.set_mark(Mark::initial(want));
            let loss = (len > 0).then(|| TailLoss {
                offset: 0,
                bytes: len,
                reason: "file header torn during creation; rewritten".into(),
            });
            return Ok((loss, true));
        }
        if head.starts_with(&header) {
            return Err(OpenError::Corrupt {
                path: self.path.clone(),
                offset: self.marks_at,
                reason: "the file ends inside the high-water mark".into(),
            });
        }
        // Not our header: read enough to say why (the longest possible header).
        let mut bytes = vec![0u8; len.min(format::FILE_HEADER_FIXED as u64 + 0xFFFF + 4) as usize];
        self.file
            .read_exact_at(&mut bytes, 0)
            .map_err(open_io(&self.path))?;
        let path = self.path.clone();
        Err(match format::header_fault(&bytes) {
            HeaderFault::NotALog => OpenError::NotALog { path },
            HeaderFault::Version(version) => OpenError::UnsupportedVersion { path, version },
            HeaderFault::OtherRun(found) => OpenError::RunMismatch {
                path,
                expected: self.run.to_string(),
                found,
            },
            HeaderFault::Damaged => OpenError::Corrupt {
                path,
                offset: 0,
                reason: "file header checksum mismatch".into(),
            },
        })
    }

    /// Takes `mark` as the current high-water mark read from the file: only what it says
    /// was durable before its sync is known durable (that sync may not have returned).
    fn set_mark(&mut self, mark: Mark) {
        self.mark = mark;
        self.durable_records = mark.durable_records;
        self.durable_end = mark.durable_end;
    }

    /// The mark the next sync writes when the file will then hold `written_records`
    /// records: the next generation, counting durable only what a sync that returned made
    /// so, never the frames that sync is about to flush.
    pub(crate) fn next_mark(&self, written_records: u64) -> Mark {
        Mark {
            generation: self.mark.generation.saturating_add(1),
            durable_records: self.durable_records,
            durable_end: self.durable_end,
            written_records,
        }
    }

    /// Writes `mark` into its slot, unsynced: the sync that follows makes it durable with
    /// the frames it counts.
    pub(crate) fn write_mark(&self, mark: &Mark) -> std::io::Result<()> {
        let at = self.marks_at + (mark.slot() * MARK_LEN) as u64;
        self.file.write_all_at(&mark.encode(), at)
    }

    /// After a sync that returned: every frame in the file is durable, and `mark`, when one
    /// was written before the sync, is the current one. A failed write or sync never gets
    /// here, so the next mark reuses the failed one's generation and slot.
    pub(crate) fn synced(&mut self, mark: Option<Mark>) {
        if let Some(mark) = mark {
            self.mark = mark;
        }
        self.durable_records = self.len();
        self.durable_end = self.end;
    }

    /// The identity a checkpoint of this log must carry.
    fn identity(&self) -> std::io::Result<Identity> {
        let header = format::file_header(&self.run);
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&header[header.len() - 4..]);
        Identity::of(
            &self.file,
            u32::from_le_bytes(crc),
            self.marks_at + (MARK_SLOTS * MARK_LEN) as u64,
        )
    }

    /// Takes the frames an earlier open verified from the log's checkpoint, if it has one
    /// that checks out against this file (`docs/format.md`, "Open checkpoint"), as the
    /// start of the index; the scan goes on from their end. A checkpoint refused is
    /// removed (unless read-only). Returns where the covered frames end.
    fn load_checkpoint(&mut self) -> Result<u64, OpenError> {
        let start = self.end;
        let Some(bytes) = checkpoint::read(&self.path).map_err(open_io(&self.path))? else {
            return Ok(start);
        };
        let identity = self.identity().map_err(open_io(&self.path))?;
        let len = self.file_len()?;
        let entries = checkpoint::decode(&bytes, &identity, len).ok();
        // Its last frame must still be there and whole: zeros or a cut from any frame it
        // covers to the end of the file leave that frame damaged or gone.
        let entries = match entries {
            Some(entries) => match entries.last() {
                Some(last) if self.whole_frame_at(last.offset, len)? != Some(last.header) => None,
                _ => Some(entries),
            },
            None => None,
        };
        let Some(entries) = entries else {
            if !self.read_only {
                let path = checkpoint::path_for(&self.path);
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(err) => return Err(open_io(&path)(err)),
                }
            }
            return Ok(start);
        };
        if let Some(last) = entries.last() {
            self.end = last.offset + last.header.frame_len();
        }
        self.first_touch = crate::touch::FirstTouch::covering(entries.len());
        self.index = entries;
        Ok(self.end)
    }

    /// Writes a checkpoint of every frame in the index: each was verified by this open's
    /// scan or by an earlier one's (the checkpoint this open took them from).
    fn write_checkpoint(&self) -> std::io::Result<()> {
        checkpoint::write(&self.path, &self.identity()?, &self.index)
    }

    fn file_len(&self) -> Result<u64, OpenError> {
        Ok(self.file.metadata().map_err(open_io(&self.path))?.len())
    }

    /// Reads every frame after the header, checking both checksums, and builds the index.
    /// On the first bad frame, decides torn tail (cut, reported) or mid-file damage (error).
    fn scan(&mut self) -> Result<Option<TailLoss>, OpenError> {
        let len = self.file_len()?;
        let mut pos = self.end;
        let mut reader = BufReader::with_capacity(SCAN_CHUNK, &self.file);
        reader
            .seek(SeekFrom::Start(pos))
            .map_err(open_io(&self.path))?;
        // (reason, where to look for whole frames after the damage, if anywhere)
        let fault: Option<(String, Option<u64>)> = loop {
            if pos == len {
                break None;
            }
            if len - pos < FRAME_HEADER_LEN as u64 {
                break Some(("incomplete frame header".into(), Some(pos + 1)));
            }
            let mut raw = [0u8; FRAME_HEADER_LEN];
            reader.read_exact(&mut raw).map_err(open_io(&self.path))?;
            let header = match FrameHeader::decode(&raw) {
                Ok(header) => header,
                Err(fault) => break Some((fault.describe().into(), Some(pos + 1))),
            };
            let expected = self.index.len() as u64;
            if header.seq != expected {
                break Some((
                    format!("frame holds record {} where {expected} belongs", header.seq),
                    Some(pos + 1),
                ));
            }
            let frame_len = header.frame_len();
            if frame_len > len - pos {
                // The header is whole and says the frame runs past the end: a torn write.
                break Some(("frame cut short".into(), None));
            }
            // The body is checksummed where it lies in the reader's buffer, not copied out.
            let mut crc = Crc32c::new();
            let mut left = frame_len - (FRAME_HEADER_LEN + FRAME_TRAILER_LEN) as u64;
            while left > 0 {
                let buffered = reader.fill_buf().map_err(open_io(&self.path))?;
                if buffered.is_empty() {
                    // The length was checked above: the file shrank under us.
                    return Err(open_io(&self.path)(
                        std::io::ErrorKind::UnexpectedEof.into(),
                    ));
                }
                let take = left.min(buffered.len() as u64) as usize;
                crc.update(&buffered[..take]);
                reader.consume(take);
                left -= take as u64;
            }
            let mut stored = [0u8; FRAME_TRAILER_LEN];
            reader
                .read_exact(&mut stored)
                .map_err(open_io(&self.path))?;
            if crc.finish() != u32::from_le_bytes(stored) {
                break Some(("frame body checksum mismatch".into(), Some(pos + frame_len)));
            }
            self.index.push(Entry {
                offset: pos,
                header,
            });
            pos += frame_len;
        };
        drop(reader);
        self.end = pos;
        self.allocated = len;
        let records = self.index.len() as u64;
        // What follows the last whole frame, as a reason to cut it: nothing when the file
        // ends there or only zeros follow (preallocated space, or frames zeroed since).
        let damage = match fault {
            Some((reason, search_from)) if !self.all_zero(pos, len)? => {
                Some(self.damage_reason(reason, search_from, pos, len)?)
            }
            _ => None,
        };
        self.check_mark(records, pos, len, damage.as_deref())?;
        let written = self.mark.written_records;
        let reason = match damage {
            Some(reason) if records < written => Some(format!(
                "{reason}; the last sync wrote records up to {}",
                written - 1
            )),
            Some(reason) => Some(reason),
            None if records < written => Some(format!(
                "last write missing: records {records}..={} of the last sync are not in the \
                 file ({} from byte {pos}): a crash before that sync returned, or lost since",
                written - 1,
                if pos == len { "it ends" } else { "zeros" }
            )),
            None => None,
        };
        if self.read_only {
            return Ok(reason.map(|reason| TailLoss {
                offset: pos,
                bytes: len - pos,
                reason: format!("{reason}; {READ_ONLY_NOTE}"),
            }));
        }
        let Some(reason) = reason else {
            if self.sync.syncs() && records > self.durable_records {
                // Frames the mark does not prove durable (their sync may not have returned
                // before a crash): made durable now, so the next mark counts them.
                self.file.sync_data().map_err(open_io(&self.path))?;
                self.synced(None);
            }
            return Ok(None);
        };
        self.file.set_len(pos).map_err(open_io(&self.path))?;
        // A mark naming the lost records would report them again on every open.
        let mark = (records < written).then(|| self.next_mark(records));
        if let Some(mark) = &mark {
            self.write_mark(mark).map_err(open_io(&self.path))?;
        }
        self.file.sync_data().map_err(open_io(&self.path))?;
        self.allocated = pos;
        self.synced(mark);
        Ok(Some(TailLoss {
            offset: pos,
            bytes: len - pos,
            reason,
        }))
    }

    /// Damage at `pos` (record `self.len()`), not zeros only: decides whether it is a torn
    /// tail (returns why, to cut it) or is followed by whole frames that are not the rest of
    /// a torn last write ([`OpenError::Corrupt`]). `search_from` is where whole frames may
    /// start after it, if anywhere.
    fn damage_reason(
        &self,
        reason: String,
        search_from: Option<u64>,
        pos: u64,
        len: u64,
    ) -> Result<String, OpenError> {
        let Some(at) = search_from
            .map(|from| self.find_whole_frame(from, len))
            .transpose()?
            .flatten()
        else {
            return Ok(reason);
        };
        let damaged = self.index.len() as u64;
        let Some(last) = self.torn_write_end(at, damaged, len)? else {
            return Err(OpenError::Corrupt {
                path: self.path.clone(),
                offset: pos,
                reason: format!("{reason}; a whole frame follows at byte {at}"),
            });
        };
        Ok(format!(
            "torn write: records {damaged}..={last} of the last write were not all on \
             disk ({reason} at byte {pos}; whole frames of the same write follow from \
             byte {at})"
        ))
    }

    /// Checks the `records` whole frames found (ending at `pos`; the file is `len` bytes)
    /// against the high-water mark: every record it says a returned sync made durable must
    /// be there and end where it says. What follows the frames is `damage`, or nothing or
    /// zeros.
    fn check_mark(
        &self,
        records: u64,
        pos: u64,
        len: u64,
        damage: Option<&str>,
    ) -> Result<(), OpenError> {
        let mark = self.mark;
        let corrupt = |offset, reason| OpenError::Corrupt {
            path: self.path.clone(),
            offset,
            reason,
        };
        if records < mark.durable_records {
            let follows = match damage {
                Some(reason) => reason,
                None if pos == len => "the file ends there",
                None => "zeros from there to the end of the file",
            };
            return Err(corrupt(
                pos,
                format!(
                    "records {records}..={} were made durable but are missing (the \
                     high-water mark counts {} durable records, ending at byte {}); {follows}",
                    mark.durable_records - 1,
                    mark.durable_records,
                    mark.durable_end
                ),
            ));
        }
        let frames_start = self.marks_at + (MARK_SLOTS * MARK_LEN) as u64;
        let boundary = match mark.durable_records.checked_sub(1) {
            None => Some(frames_start),
            Some(last) => usize::try_from(last)
                .ok()
                .and_then(|last| self.index.get(last))
                .map(|entry| entry.offset + entry.header.frame_len()),
        };
        if boundary != Some(mark.durable_end) {
            return Err(corrupt(
                self.marks_at,
                format!(
                    "the high-water mark says its {} durable records end at byte {}, but \
                     they end at byte {}",
                    mark.durable_records,
                    mark.durable_end,
                    boundary.unwrap_or(pos)
                ),
            ));
        }
        Ok(())
    }

    /// Whether every byte in `from..len` is zero.
    fn all_zero(&self, from: u64, len: u64) -> Result<bool, OpenError> {
        let mut buf = vec![0u8; (len - from).min(SCAN_CHUNK as u64) as usize];
        let mut pos = from;
        while pos < len {
            let take = (len - pos).min(buf.len() as u64) as usize;
            self.file
                .read_exact_at(&mut buf[..take], pos)
                .map_err(open_io(&self.path))?;
            if buf[..take].iter().any(|&b| b != 0) {
                return Ok(false);
            }
            pos += take as u64;
        }
        Ok(true)
    }

    /// The offset of the first whole, checksummed frame starting in `from..len` whose
    /// position is at least the next expected one, if any.
    fn find_whole_frame(&self, from: u64, len: u64) -> Result<Option<u64>, OpenError> {
        let finder = memchr::memmem::Finder::new(&FRAME_MAGIC);
        let mut buf = vec![0u8; SCAN_CHUNK];
        let mut start = from;
        while start + FRAME_MAGIC.len() as u64 <= len {
            let take = (len - start).min(buf.len() as u64) as usize;
            self.file
                .read_exact_at(&mut buf[..take], start)
                .map_err(open_io(&self.path))?;
            for hit in finder.find_iter(&buf[..take]) {
                let at = start + hit as u64;
                if self.is_whole_frame(at, len)? {
                    return Ok(Some(at));
                }
            }
            if start + take as u64 >= len {
                break;
            }
            // Overlap so a magic split across chunks is still found.
            start += (take - (FRAME_MAGIC.len() - 1)) as u64;
        }
        Ok(None)
    }

    /// Damage at record `damaged` is followed by the whole frame at `at`. Decides whether
    /// the damage is the tearing of the last write (its pages reached the disk out of order
    /// before a power loss), and returns that write's last record if so: when the frame's
    /// write began at or before the damaged record (its `seq` minus its write index is at
    /// most `damaged`; a capped index only makes that start look later, never earlier) and
    /// every frame after it is whole and of the same write (next `seq`, next write index)
    /// up to the end of the file or to zeros only. Anything else may be damage in a write
    /// that was synced, so `None`: corruption.
    fn torn_write_end(&self, at: u64, damaged: u64, len: u64) -> Result<Option<u64>, OpenError> {
        let Some(mut frame) = self.whole_frame_at(at, len)? else {
            return Ok(None);
        };
        let began = frame.seq.checked_sub(u64::from(frame.write_index));
        if frame.seq < damaged || began.is_none_or(|began| began > damaged) {
            return Ok(None);
        }
        let mut pos = at + frame.frame_len();
        loop {
            if pos == len || self.all_zero(pos, len)? {
                return Ok(Some(frame.seq));
            }
            let Some(next) = self.whole_frame_at(pos, len)? else {
                return Ok(None);
            };
            let same_write = Some(next.seq) == frame.seq.checked_add(1)
                && next.write_index == frame.write_index.saturating_add(1);
            if !same_write {
                return Ok(None);
            }
            pos += next.frame_len();
            frame = next;
        }
    }

    /// Whether a whole frame at `at` holds a position at least the next expected one.
    fn is_whole_frame(&self, at: u64, len: u64) -> Result<bool, OpenError> {
        Ok(self
            .whole_frame_at(at, len)?
            .is_some_and(|header| header.seq >= self.index.len() as u64))
    }

    /// The header of the frame at `at` if the frame is whole: its header checks out, it
    /// ends within `len`, and its body checksum holds.
    fn whole_frame_at(&self, at: u64, len: u64) -> Result<Option<FrameHeader>, OpenError> {
        if len - at < FRAME_HEADER_LEN as u64 {
            return Ok(None);
        }
        let mut raw = [0u8; FRAME_HEADER_LEN];
        self.file
            .read_exact_at(&mut raw, at)
            .map_err(open_io(&self.path))?;
        let Ok(header) = FrameHeader::decode(&raw) else {
            return Ok(None);
        };
        if header.frame_len() > len - at {
            return Ok(None);
        }
        let mut crc = Crc32c::new();
        let mut pos = at + FRAME_HEADER_LEN as u64;
        let body_end = at + header.frame_len() - FRAME_TRAILER_LEN as u64;
        let mut buf = vec![0u8; (body_end - pos).min(SCAN_CHUNK as u64) as usize];
        while pos < body_end {
            let take = (body_end - pos).min(buf.len() as u64) as usize;
            self.file
                .read_exact_at(&mut buf[..take], pos)
                .map_err(open_io(&self.path))?;
            crc.update(&buf[..take]);
            pos += take as u64;
        }
        let mut stored = [0u8; FRAME_TRAILER_LEN];
        self.file
            .read_exact_at(&mut stored, body_end)
            .map_err(open_io(&self.path))?;
        Ok((crc.finish() == u32::from_le_bytes(stored)).then_some(header))
    }

    /// Appends one record and returns its handle once it is durable under the log's
    /// [`SyncPolicy`].
    ///
    /// # Errors
    ///
    /// [`AppendError`]; no handle is issued and the record is not in the log's index.
    pub fn append(&mut self, record: &Record) -> Result<RecordHandle, AppendError> {
        let seq = self.write_frames(std::slice::from_ref(record))?;
        Ok(RecordHandle::new(self.run.clone(), seq))
    }

    /// Appends records in order with a single write and (under
    /// [`SyncPolicy::EveryAppend`]) a single `fdatasync`: group commit. All handles are
    /// returned after that one sync; on error none is issued.
    ///
    /// # Errors
    ///
    /// [`AppendError`]; the log cuts whatever of the batch it wrote.
    pub fn append_batch(&mut self, records: &[Record]) -> Result<Vec<RecordHandle>, AppendError> {
        let first = self.write_frames(records)?;
        Ok((first..first + records.len() as u64)
            .map(|seq| RecordHandle::new(self.run.clone(), seq))
            .collect())
    }

    /// Makes every record appended so far durable (`fdatasync`). Needed only under
    /// [`SyncPolicy::OsBuffered`].
    ///
    /// # Errors
    ///
    /// [`AppendError::Io`] when the sync fails (the log is then poisoned: after a failed
    /// `fdatasync` the OS may have dropped the dirty pages); [`AppendError::ReadOnly`] on a
    /// log opened read-only.
    pub fn sync(&mut self) -> Result<(), AppendError> {
        if self.read_only {
            return Err(AppendError::ReadOnly {
                path: self.path.clone(),
            });
        }
        if self.poisoned {
            return Err(AppendError::Poisoned {
                path: self.path.clone(),
            });
        }
        // Records appended since the last sync (under `OsBuffered`) get a high-water mark.
        let mark = (self.durable_records < self.len()).then(|| self.next_mark(self.len()));
        let result = match &mark {
            Some(mark) => self.write_mark(mark),
            None => Ok(()),
        };
        result
            .and_then(|()| self.file.sync_data())
            .map_err(|source| {
                self.poisoned = true;
                AppendError::Io {
                    path: self.path.clone(),
                    offset: self.end,
                    source,
                }
            })?;
        self.synced(mark);
        Ok(())
    }

    /// Writes `records` as frames after the last whole one, syncs per policy, and indexes
    /// them. Returns the first one's position.
    fn write_frames(&mut self, records: &[Record]) -> Result<u64, AppendError> {
        if self.read_only {
            return Err(AppendError::ReadOnly {
                path: self.path.clone(),
            });
        }
        if self.poisoned {
            return Err(AppendError::Poisoned {
                path: self.path.clone(),
            });
        }
        let first = self.index.len() as u64;
        let mut entries = Vec::with_capacity(records.len());
        let result = self.write_unsynced(records, first, &mut entries);
        if result.is_ok() {
            let new_end = entries
                .last()
                .map_or(self.end, |last| last.offset + last.header.frame_len());
            self.preallocate(new_end);
        }
        // The high-water mark goes to disk with the frames, under their one sync.
        let mark = (self.sync.syncs() && !records.is_empty())
            .then(|| self.next_mark(first + records.len() as u64));
        let result = result.and_then(|()| {
            if let Some(mark) = &mark {
                self.write_mark(mark)?;
            }
            if self.sync.syncs() {
                self.file.sync_data().map_err(WriteFailure::Io)
            } else {
                Ok(())
            }
        });
        if self.scratch.capacity() > SCRATCH_KEEP {
            self.scratch = Vec::new();
        }
        match result {
            Ok(()) => {
                if let Some(last) = entries.last() {
                    self.end = last.offset + last.header.frame_len();
                    self.allocated = self.allocated.max(self.end);
                }
                self.index.extend(entries);
                if self.sync.syncs() {
                    self.synced(mark);
                }
                Ok(first)
            }
            Err(WriteFailure::Encode(err)) => {
                self.undo();
                Err(err)
            }
            Err(WriteFailure::Io(source)) => {
                self.undo();
                Err(AppendError::Io {
                    path: self.path.clone(),
                    offset: self.end,
                    source,
                })
            }
        }
    }

    /// Cuts the file back to its last whole frame after a failed append; poisons the log
    /// if that fails too.
    pub(crate) fn undo(&mut self) {
        if self.file.set_len(self.end).is_err() {
            self.poisoned = true;
        }
        self.allocated = self.end;
    }

    /// After a write that ended at `new_end`, preallocates ahead of the next ones (see
    /// [`preallocate`]).
    fn preallocate(&mut self, new_end: u64) {
        self.allocated = preallocate(&self.file, self.end, self.allocated, new_end);
    }

    /// Stores each tool result appended from now on with its token estimate by
    /// `estimator` (in its metadata, see `docs/format.md`), so that a lazy
    /// [`history`](RecordLog::history) gives projectors the estimate without reading the
    /// content. Give the estimator the projector uses (psych-elision's `Estimator`): a
    /// result stored without one has it computed from its content on first need.
    /// Set it before sharing the log ([`SharedRecordLog::new`](crate::SharedRecordLog::new)
    /// takes it over).
    pub fn set_estimator(&mut self, estimator: std::sync::Arc<dyn TokenEstimator + Send + Sync>) {
        self.estimator = Some(estimator);
    }

    fn write_unsynced(
        &mut self,
        records: &[Record],
        first: u64,
        entries: &mut Vec<Entry>,
    ) -> Result<(), WriteFailure> {
        let mut offset = self.end;
        let mut flushed = self.end;
        self.scratch.clear();
        for (i, record) in records.iter().enumerate() {
            let (header, encoded, crc) = frame_parts(
                record,
                first + i as u64,
                format::write_index(i),
                self.estimator.as_deref().map(|e| e as &dyn TokenEstimator),
            )
            .map_err(WriteFailure::Encode)?;
            self.scratch.extend_from_slice(&header.encode());
            self.scratch.extend_from_slice(&encoded.meta);
            let content: &[u8] = match &encoded.content {
                Cow::Borrowed(bytes) => bytes,
                Cow::Owned(bytes) => bytes,
            };
            if content.len() > COPY_LIMIT {
                self.file.write_all_at(&self.scratch, flushed)?;
                flushed += self.scratch.len() as u64;
                self.scratch.clear();
                self.file.write_all_at(content, flushed)?;
                flushed += content.len() as u64;
            } else {
                self.scratch.extend_from_slice(content);
            }
            self.scratch.extend_from_slice(&crc.to_le_bytes());
            entries.push(Entry { offset, header });
            offset += header.frame_len();
        }
        if !self.scratch.is_empty() {
            self.file.write_all_at(&self.scratch, flushed)?;
        }
        Ok(())
    }

    /// The Run this log belongs to.
    pub fn run(&self) -> &RunId {
        &self.run
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The sync policy appends follow.
    pub fn sync_policy(&self) -> SyncPolicy {
        self.sync
    }

    /// Number of records in the log.
    pub fn len(&self) -> u64 {
        self.index.len() as u64
    }

    /// Whether the log holds no record.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Bytes of the file holding whole frames (the header included). The file itself may be
    /// longer: zeros preallocated for the next appends.
    pub fn size_bytes(&self) -> u64 {
        self.end
    }

    /// What opening found (the same value `open` returned).
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The handle of record `seq`, if the log holds that many records.
    pub fn handle(&self, seq: u64) -> Option<RecordHandle> {
        (seq < self.len()).then(|| RecordHandle::new(self.run.clone(), seq))
    }

    /// Every record with its handle, in order, read one at a time.
    pub fn iter(&self) -> impl Iterator<Item = Result<LoggedRecord, ReadError>> + '_ {
        (0..self.len()).filter_map(|seq| {
            let handle = RecordHandle::new(self.run.clone(), seq);
            self.read_record(&handle)
                .transpose()
                .map(|record| record.map(|record| LoggedRecord { handle, record }))
        })
    }

    fn entry(&self, handle: &RecordHandle) -> Option<&Entry> {
        if handle.run != self.run {
            return None;
        }
        usize::try_from(handle.seq)
            .ok()
            .and_then(|i| self.index.get(i))
    }

    fn read_io(&self, offset: u64) -> impl FnOnce(std::io::Error) -> ReadError + '_ {
        move |source| ReadError::Io {
            path: self.path.clone(),
            offset,
            source,
        }
    }

    fn corrupt(&self, offset: u64, reason: &str) -> ReadError {
        ReadError::Corrupt {
            path: self.path.clone(),
            offset,
            reason: reason.to_owned(),
        }
    }

    /// The whole record at `handle`, its body checksum checked again.
    pub(crate) fn read_record(&self, handle: &RecordHandle) -> Result<Option<Record>, ReadError> {
        let Some(entry) = self.entry(handle) else {
            return Ok(None);
        };
        let header = &entry.header;
        let meta_len = header.meta_len as usize;
        let body_len = usize::try_from(header.frame_len() - FRAME_HEADER_LEN as u64)
            .map_err(|_| self.corrupt(entry.offset, "frame larger than memory"))?;
        let mut body = vec![0u8; body_len];
        let at = entry.offset + FRAME_HEADER_LEN as u64;
        self.file
            .read_exact_at(&mut body, at)
            .map_err(self.read_io(at))?;
        let trailer = body.split_off(body_len - FRAME_TRAILER_LEN);
        let stored = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
        let mut crc = Crc32c::new();
        crc.update(&body);
        if crc.finish() != stored {
            return Err(self.corrupt(entry.offset, "frame body checksum mismatch"));
        }
        self.first_touch.verified(header.seq);
        let content = body.split_off(meta_len);
        format::decode_record(header, &body, content)
            .map(Some)
            .map_err(|reason| self.corrupt(entry.offset, reason))
    }

    fn tool_result_entry(&self, handle: &RecordHandle) -> Option<&Entry> {
        self.entry(handle)
            .filter(|entry| entry.header.kind == KIND_TOOL_RESULT)
    }
}

/// Why [`RecordLog::write_unsynced`] stopped.
enum WriteFailure {
    Encode(AppendError),
    Io(std::io::Error),
}

impl From<std::io::Error> for WriteFailure {
    fn from(err: std::io::Error) -> Self {
        WriteFailure::Io(err)
    }
}

/// After a write of frames from `end` to `new_end` into a file of length `allocated`, when
/// the write was at most `PREALLOC_MAX_WRITE` and fewer than `PREALLOC / 2` bytes are left
/// past it, extends the file with zeros to `PREALLOC` past `new_end`; the zeros reach the
/// disk with the write's own sync, and the writes after it overwrite existing blocks
/// without a metadata commit. Larger writes grow the file themselves: for them the zeros
/// would cost as much bandwidth as the metadata commit they save. Returns the file's new
/// length.
///
/// Best effort: preallocation only makes later syncs cheaper, so a failure to write the
/// zeros (a nearly full disk, a file size limit) must not fail an append whose own bytes
/// were written. The zeros written are given back and the length before them returned.
pub(crate) fn preallocate(file: &File, end: u64, allocated: u64, new_end: u64) -> u64 {
    let allocated = allocated.max(new_end);
    if new_end.saturating_sub(end) > PREALLOC_MAX_WRITE || allocated - new_end >= PREALLOC / 2 {
        return allocated;
    }
    let target = new_end + PREALLOC;
    let zeros = vec![0u8; (target - allocated) as usize];
    match file.write_all_at(&zeros, allocated) {
        Ok(()) => target,
        Err(_) => {
            // If even this fails, zeros past `allocated` are read as free space anyway.
            let _ = file.set_len(allocated);
            allocated
        }
    }
}

/// Encodes `record` for a frame at position `seq`, with index `write_index` in its write:
/// its header, its metadata and content, and the checksum over both.
fn frame_parts<'a>(
    record: &'a Record,
    seq: u64,
    write_index: u8,
    estimator: Option<&dyn TokenEstimator>,
) -> Result<(FrameHeader, format::Encoded<'a>, u32), AppendError> {
    let encoded = format::encode_record(record, estimator).map_err(AppendError::Encode)?;
    let meta_len = u32::try_from(encoded.meta.len()).map_err(|_| AppendError::TooLarge {
        len: encoded.meta.len(),
    })?;
    let header = FrameHeader {
        seq,
        kind: encoded.kind,
        content_kind: encoded.content_kind,
        flags: encoded.flags,
        write_index,
        meta_len,
        content_len: encoded.content.len() as u64,
    };
    let crc = format::body_crc(&encoded.meta, &encoded.content);
    Ok((header, encoded, crc))
}

/// One record encoded as a whole frame whose position is not yet known: the header's
/// 32 bytes are a placeholder until [`PendingFrame::place`] fills them in.
pub(crate) struct PendingFrame {
    pub(crate) header: FrameHeader,
    pub(crate) bytes: Vec<u8>,
}

impl PendingFrame {
    /// Encodes `record` (metadata, content, body checksum) into an owned frame buffer.
    pub(crate) fn encode(
        record: &Record,
        estimator: Option<&dyn TokenEstimator>,
    ) -> Result<Self, AppendError> {
        let (header, encoded, crc) = frame_parts(record, 0, 0, estimator)?;
        let len = usize::try_from(header.frame_len())
            .map_err(|_| AppendError::TooLarge { len: usize::MAX })?;
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
        bytes.extend_from_slice(&encoded.meta);
        bytes.extend_from_slice(&encoded.content);
        bytes.extend_from_slice(&crc.to_le_bytes());
        Ok(Self { header, bytes })
    }

    /// Gives the frame its position `seq` and its index `write_index` within the write that
    /// carries it (header and header checksum) and returns its index entry at `offset`.
    pub(crate) fn place(&mut self, seq: u64, write_index: u8, offset: u64) -> Entry {
        self.header.seq = seq;
        self.header.write_index = write_index;
        self.bytes[..FRAME_HEADER_LEN].copy_from_slice(&self.header.encode());
        Entry {
            offset,
            header: self.header,
        }
    }
}

/// Makes a new directory entry durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

impl RecordSource for RecordLog {
    type Error = ReadError;

    fn run(&self) -> &RunId {
        &self.run
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, ReadError> {
        self.read_record(handle)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, ReadError> {
        Ok(self
            .result_summary(handle)?
            .map(|(entry, summary, readable)| output_info(entry, summary, readable)))
    }

    /// Serves `buf.len()` bytes at most with one positional read of the stored readable
    /// text (two for a result with binary blocks, whose text length comes first); the rest
    /// of the result is not touched. Its body checksum was checked at open or at append,
    /// or, for a frame the open took from its checkpoint, is checked whole on the first
    /// content read in this process.
    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, ReadError> {
        let Some(entry) = self.tool_result_entry(handle) else {
            return Ok(0);
        };
        self.check_first_touch(entry)?;
        let (start, len) = self.readable_range(entry)?;
        if offset >= len {
            return Ok(0);
        }
        let n = usize::try_from(len - offset).map_or(buf.len(), |left| left.min(buf.len()));
        let at = entry.offset + entry.header.content_start() + start + offset;
        self.file
            .read_exact_at(&mut buf[..n], at)
            .map_err(self.read_io(at))?;
        Ok(n)
    }

    /// Reads the metadata and the one block's bytes, not the rest of the result.
    fn content_block(
        &self,
        handle: &RecordHandle,
        position: usize,
    ) -> Result<Option<ContentBlock>, ReadError> {
        let Some((entry, summary, readable)) = self.result_summary(handle)? else {
            return Ok(None);
        };
        self.check_first_touch(entry)?;
        let Some(place) = summary
            .place(position, readable)
            .map_err(|reason| self.corrupt(entry.offset, reason))?
        else {
            return Ok(None);
        };
        let mut bulk = Vec::new();
        if let Some((at, len)) = place.bulk {
            if at.saturating_add(len) > entry.header.content_len {
                return Err(self.corrupt(entry.offset, "block runs past the content"));
            }
            let len = usize::try_from(len)
                .map_err(|_| self.corrupt(entry.offset, "block larger than memory"))?;
            bulk = vec![0u8; len];
            let at = entry.offset + entry.header.content_start() + at;
            self.file
                .read_exact_at(&mut bulk, at)
                .map_err(self.read_io(at))?;
        }
        place
            .rebuild(bulk)
            .map(Some)
            .map_err(|reason| self.corrupt(entry.offset, reason))
    }
}

/// A tool result's index entry, its metadata, and where its readable text lies in its
/// content (offset and length).
pub(crate) type StoredResult<'a> = (&'a Entry, format::ResultSummary, (u64, u64));

/// The [`OutputInfo`] of a tool result from its index entry, metadata and readable range.
pub(crate) fn output_info(
    entry: &Entry,
    summary: format::ResultSummary,
    readable: (u64, u64),
) -> OutputInfo {
    OutputInfo {
        kind: summary.kind,
        len: readable.1,
        is_error: entry.header.flags & format::FLAG_IS_ERROR != 0,
        call_id: summary.call_id,
        name: summary.name,
    }
}

impl RecordLog {
    /// Where the readable text of the tool result at `entry` lies in its content.
    fn readable_range(&self, entry: &Entry) -> Result<(u64, u64), ReadError> {
        let mut prefix = [0u8; format::READABLE_LEN_PREFIX as usize];
        let prefix: &[u8] = if entry.header.content_kind == format::CONTENT_WITH_BINARY {
            let at = entry.offset + entry.header.content_start();
            self.file
                .read_exact_at(&mut prefix, at)
                .map_err(self.read_io(at))?;
            &prefix
        } else {
            &[]
        };
        format::readable_range(&entry.header, prefix)
            .map_err(|reason| self.corrupt(entry.offset, reason))
    }

    /// The checked header and metadata of the tool result at `handle`, and where its
    /// readable text lies, read with one positional read.
    pub(crate) fn result_summary(
        &self,
        handle: &RecordHandle,
    ) -> Result<Option<StoredResult<'_>>, ReadError> {
        let Some(entry) = self.tool_result_entry(handle) else {
            return Ok(None);
        };
        let prefix = if entry.header.content_kind == format::CONTENT_WITH_BINARY {
            format::READABLE_LEN_PREFIX as usize
        } else {
            0
        };
        let mut raw = vec![0u8; FRAME_HEADER_LEN + entry.header.meta_len as usize + prefix];
        self.file
            .read_exact_at(&mut raw, entry.offset)
            .map_err(self.read_io(entry.offset))?;
        let mut head = [0u8; FRAME_HEADER_LEN];
        head.copy_from_slice(&raw[..FRAME_HEADER_LEN]);
        if FrameHeader::decode(&head).ok() != Some(entry.header) {
            return Err(self.corrupt(entry.offset, "frame header changed on disk"));
        }
        let meta_end = FRAME_HEADER_LEN + entry.header.meta_len as usize;
        let summary = format::decode_summary(&entry.header, &raw[FRAME_HEADER_LEN..meta_end])
            .map_err(|reason| self.corrupt(entry.offset, reason))?;
        let readable = format::readable_range(&entry.header, &raw[meta_end..])
            .map_err(|reason| self.corrupt(entry.offset, reason))?;
        Ok(Some((entry, summary, readable)))
    }
}

#[cfg(test)]
mod format_doc {
    //! `docs/format.md` against the code: its constants and its worked example.

    use super::*;
    use crate::format::*;
    use psych_types::{ToolCallId, ToolOutput, ToolResult, UserMessage};

    const DOC: &str = include_str!("../docs/format.md");

    fn hex(bytes: &[u8]) -> String {
        bytes
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The example log of the document: a user message and a text tool result, each
    /// appended and synced on its own (so both high-water mark slots have been written).
    fn example_file() -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("run-7").unwrap();
        let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
        log.append(&Record::User(UserMessage { text: "hi".into() }))
            .unwrap();
        log.append(&Record::ToolResult(ToolResult {
            call_id: ToolCallId::new("c1").unwrap(),
            name: "ls".into(),
            output: ToolOutput::text("a\nb\n"),
        }))
        .unwrap();
        let mut bytes = std::fs::read(log.path()).unwrap();
        assert!(bytes[log.size_bytes() as usize..].iter().all(|&b| b == 0));
        bytes.truncate(log.size_bytes() as usize);
        bytes
    }

    /// A hex dump, 16 bytes a line, offsets in decimal.
    fn dump(bytes: &[u8]) -> String {
        bytes
            .chunks(16)
            .enumerate()
            .map(|(i, line)| format!("{:04}  {}\n", i * 16, hex(line)))
            .collect()
    }

    #[test]
    fn documented_constants_match_the_code() {
        let expect = [
            format!("`{}`", hex(&FILE_MAGIC)),
            format!("`{}`", hex(&FRAME_MAGIC)),
            format!("format version: {FORMAT_VERSION}"),
            format!("frame header: {FRAME_HEADER_LEN} bytes"),
            format!("frame trailer: {FRAME_TRAILER_LEN} bytes"),
            format!("fixed file header: {FILE_HEADER_FIXED} bytes"),
            format!("`{KIND_USER}` user message"),
            format!("`{KIND_ASSISTANT}` assistant message"),
            format!("`{KIND_TOOL_RESULT}` tool result"),
            format!("`{CONTENT_NONE}` none"),
            format!("`{CONTENT_TEXT}` text"),
            format!("`{CONTENT_JSON}` JSON"),
            format!("`{CONTENT_WITH_BINARY}` content blocks with binary data"),
            format!("bit 0 (`{FLAG_IS_ERROR}`)"),
            format!("`<run>.{FILE_EXTENSION}`"),
            format!("capped at {MAX_WRITE_INDEX}"),
            format!("{MARK_SLOTS} slots of {MARK_LEN} bytes"),
            format!("`{}`", hex(&crate::checkpoint::CHECKPOINT_MAGIC)),
            format!(
                "checkpoint version: {}",
                crate::checkpoint::CHECKPOINT_VERSION
            ),
            format!(
                "checkpoint's fixed part: {} bytes",
                crate::checkpoint::CHECKPOINT_HEAD_LEN
            ),
            format!(
                "at least {} MiB of frames",
                crate::checkpoint::CHECKPOINT_AFTER >> 20
            ),
            format!(
                "`<run>.{FILE_EXTENSION}{}`",
                crate::checkpoint::CHECKPOINT_SUFFIX
            ),
        ];
        for needle in expect {
            assert!(
                DOC.contains(&needle),
                "docs/format.md does not say {needle}"
            );
        }
        assert_eq!(&FILE_MAGIC, b"PSYCHLOG");
        assert_eq!(&FRAME_MAGIC, b"PSRF");
    }

    #[test]
    fn documented_example_is_what_the_code_writes() {
        let dump = dump(&example_file());
        assert!(
            DOC.contains(&dump),
            "docs/format.md's example dump is stale; the code writes:\n{dump}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{CONTENT_TEXT, KIND_TOOL_RESULT};
    use psych_types::UserMessage;

    #[test]
    fn preallocation_is_best_effort() {
        // A handle that cannot write stands for a full disk: the zeros fail, the append
        // they follow must not.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, [1u8; 100]).unwrap();
        let read_only = File::open(&path).unwrap();
        assert_eq!(preallocate(&read_only, 60, 60, 100), 100);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 100);
        let writable = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        assert_eq!(preallocate(&writable, 60, 60, 100), 100 + PREALLOC);
    }

    #[test]
    fn a_forged_length_at_the_tail_is_cut_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("forged").unwrap();
        let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        let handle = log
            .append(&Record::User(UserMessage {
                text: "kept".into(),
            }))
            .unwrap();
        let end = log.size_bytes();
        let path = log.path().to_path_buf();
        drop(log);
        for (meta_len, content_len) in [(u32::MAX, u64::MAX), (0, u64::MAX - 40), (7, 1 << 40)] {
            let forged = FrameHeader {
                seq: 1,
                kind: KIND_TOOL_RESULT,
                content_kind: CONTENT_TEXT,
                flags: 0,
                write_index: 0,
                meta_len,
                content_len,
            };
            let mut bytes = std::fs::read(&path).unwrap();
            bytes.truncate(end as usize);
            bytes.extend_from_slice(&forged.encode());
            bytes.extend_from_slice(b"some bytes");
            std::fs::write(&path, &bytes).unwrap();
            let (log, recovery) =
                RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
            assert_eq!(recovery.records, 1);
            assert_eq!(recovery.tail.as_ref().map(|t| t.offset), Some(end));
            assert!(log.record(&handle).unwrap().is_some());
        }
    }

    #[test]
    fn debug_shows_identity_not_contents() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("dbg").unwrap();
        let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        log.append(&Record::User(UserMessage {
            text: "secret".into(),
        }))
        .unwrap();
        let shown = format!("{log:?}");
        assert!(
            shown.contains("records: 1") && !shown.contains("secret"),
            "{shown}"
        );
    }
}
