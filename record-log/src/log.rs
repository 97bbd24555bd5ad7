//! [`RecordLog`]: one Run's log file, its in-memory index, appends under a [`SyncPolicy`],
//! and reads by handle. Recovery on open is in `recovery.rs`.

use std::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use psych_types::{
    BlockLines, ContentBlock, LineMark, LoggedRecord, OutputInfo, Record, RecordHandle,
    RecordSource, RunId, TokenEstimator,
};

use crate::cause::RecordCorruption;
use crate::crc32c::Crc32c;
use crate::error::{OpenError, ReadError};
use crate::format::{
    self, FILE_EXTENSION, FRAME_HEADER_LEN, FRAME_TRAILER_LEN, FrameHeader, KIND_TOOL_RESULT, Mark,
};
use crate::policy::SyncPolicy;
use crate::recovery::Recovery;
use crate::storage::{FileStorage, Storage};

/// Where one record's frame is, with its checked header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Every change to `file` goes through it.
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) sync: SyncPolicy,
    pub(crate) index: Vec<Entry>,
    /// Byte length of the whole frames (where the next frame goes).
    pub(crate) end: u64,
    /// The file's length: `end` plus the end mark and preallocated zeros.
    pub(crate) allocated: u64,
    /// Byte offset of the high-water mark's first slot (right after the file header).
    pub(crate) marks_at: u64,
    /// The current high-water mark: the last one written by a sync that returned, or the
    /// one read on open.
    pub(crate) mark: Mark,
    /// Records a sync that returned has made durable (all of them when the policy syncs),
    /// and the byte offset where they end.
    pub(crate) durable_records: u64,
    pub(crate) durable_end: u64,
    pub(crate) poisoned: bool,
    /// Opened by [`RecordLog::open_read_only`]: nothing is ever written, cut or synced.
    pub(crate) read_only: bool,
    /// Set once opening succeeded: a log whose open failed is dropped without a write
    /// (its file must be left as it was found).
    pub(crate) opened: bool,
    pub(crate) scratch: Vec<u8>,
    pub(crate) recovery: Recovery,
    /// Estimates each tool result's tokens at append time, stored in its metadata.
    pub(crate) estimator: Option<Estimator>,
    /// The frames taken from the open checkpoint, each checked whole on its first content
    /// read in this process (`touch.rs`).
    pub(crate) first_touch: crate::touch::FirstTouch,
    /// Read-only: the body checksum (trailer) of each frame this open's scan indexed, the
    /// last `trailers.len()` entries of `index` (the ones before came from the checkpoint,
    /// whose frames are durable and never cut back). A read of such a frame checks its
    /// trailer on disk against it (`check_trailer_at`): a writer may have cut the frame
    /// back and written another in its place.
    pub(crate) trailers: Vec<u32>,
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

pub(crate) fn open_io(path: &Path) -> impl FnOnce(std::io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `path` names `file` (the same device and inode, and the file is not unlinked).
fn names(path: &Path, file: &File) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let held = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(named) => Ok(held.nlink() > 0 && named.dev() == held.dev() && named.ino() == held.ino()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(err),
    }
}

impl RecordLog {
    /// The file that holds `run`'s log under `dir`.
    pub fn path_for(dir: impl AsRef<Path>, run: &RunId) -> PathBuf {
        dir.as_ref().join(format!("{run}.{FILE_EXTENSION}"))
    }

    /// The files the log at `log` may keep beside it: its checkpoint (written once the log
    /// passes 64 MiB, to open it fast) and a checkpoint being written (left by a process
    /// killed while writing one). A program that deletes a log deletes these with it (each
    /// may be absent); the log rebuilds its checkpoint when it needs one.
    pub fn side_files(log: impl AsRef<Path>) -> [PathBuf; 2] {
        let checkpoint = crate::checkpoint::path_for(log.as_ref());
        let mut writing = checkpoint.clone().into_os_string();
        writing.push(crate::checkpoint::WRITING_SUFFIX);
        [checkpoint, PathBuf::from(writing)]
    }

    /// The file name of the log a side file ([`RecordLog::side_files`]) named `name`
    /// belongs to (`r.plog` for `r.plog.ckpt`), or `None` when `name` is no side file's:
    /// for a program that finds side files whose log is gone.
    pub fn side_file_log(name: &str) -> Option<&str> {
        use crate::checkpoint::{CHECKPOINT_SUFFIX, WRITING_SUFFIX};
        let checkpoint = name.strip_suffix(WRITING_SUFFIX).unwrap_or(name);
        checkpoint
            .strip_suffix(CHECKPOINT_SUFFIX)
            .filter(|log| log.ends_with(&format!(".{FILE_EXTENSION}")))
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
        Self::open_with_storage(dir, run, sync, Arc::new(FileStorage))
    }

    /// [`RecordLog::open`] with every change to the file made through `storage` (see
    /// [`Storage`]): a test seam, for [`FaultyStorage`](crate::FaultyStorage), to see what
    /// the log does when a write, a cut or a sync fails. Opening itself goes through it
    /// too (a new file's header, cutting a torn tail, syncs).
    ///
    /// # Errors
    ///
    /// As [`RecordLog::open`].
    pub fn open_with_storage(
        dir: impl AsRef<Path>,
        run: &RunId,
        sync: SyncPolicy,
        storage: Arc<dyn Storage>,
    ) -> Result<(Self, Recovery), OpenError> {
        let dir = dir.as_ref();
        create_dir_durably(dir).map_err(open_io(dir))?;
        let path = Self::path_for(dir, run);
        let (file, created) = Self::locked_file(&path)?;
        let mut log = Self::unopened(run, path, file, storage, sync, false);
        let (header_loss, header_written) = log.check_header()?;
        // The file's directory entry must be as durable as its header; and under a policy
        // that promises acknowledged records survive a power loss, as durable as they:
        // synced at every open, since a process killed after writing the header and
        // before syncing leaves an entry nothing synced. The folder's own entry is synced
        // in its parent too, as far as the parent can be read (a parent this process may
        // only pass through is left: the open does not fail for it).
        if created || header_written || sync.syncs() {
            sync_dir(dir).map_err(open_io(dir))?;
        }
        if sync.syncs() {
            let _ = sync_dir(&dir.join(".."));
        }
        log.finish_open(header_loss)
    }

    /// Opens the existing log of `run` under `dir` for reading only: the file is opened
    /// without write access, not locked (a writer may hold it open meanwhile), and never
    /// written, cut or synced. Every frame is checked as [`RecordLog::open`] checks it and
    /// the same damage is an error; a torn or damaged tail that `open` would cut is left in
    /// place, reported in [`Recovery::tail`] (with [`TailLoss::left_in_place`](crate::TailLoss::left_in_place)
    /// set), and the log serves the whole records before it. A file whose creation
    /// was torn reads as an empty log, its tail reported the same way. Appends and syncs
    /// are refused with [`AppendError::ReadOnly`](crate::AppendError::ReadOnly).
    ///
    /// A log being appended to while it is opened read-only may show a frame still being
    /// written as a torn tail (or a torn last write), never as damage: what looks like
    /// damage before whole frames is read again, on from there, in the file as it is then
    /// (a writer's appends can make the scan's buffer older than what it reads after it).
    /// Records appended after the open are not seen. A view may hold records written and
    /// not yet acknowledged (their sync still running); should the writer cut one back (its
    /// sync failed) and write another in its place, a read of it is an error, never the
    /// other record's bytes: [`RecordCorruption::HeaderChanged`](crate::RecordCorruption::HeaderChanged)
    /// when the new frame's header differs (its lengths, its kind), checked before the
    /// read, and [`RecordCorruption::Replaced`](crate::RecordCorruption::Replaced) when
    /// its body checksum differs from the one the open's scan checked, looked at after the
    /// read (4 bytes more per read; two records of the very same bytes are not told apart,
    /// and need not be). The view keeps that checksum, 4 bytes, for each frame its scan
    /// read (not for those its checkpoint gave: they are durable).
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
        let mut log = Self::unopened(
            run,
            path,
            file,
            Arc::new(FileStorage),
            SyncPolicy::OsBuffered,
            true,
        );
        let (header_loss, _) = log.check_header()?;
        log.finish_open(header_loss)
    }

    /// A log on `file` before its header and frames are read.
    fn unopened(
        run: &RunId,
        path: PathBuf,
        file: File,
        storage: Arc<dyn Storage>,
        sync: SyncPolicy,
        read_only: bool,
    ) -> Self {
        Self {
            run: run.clone(),
            path,
            file,
            storage,
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
            opened: false,
            scratch: Vec::new(),
            estimator: None,
            first_touch: crate::touch::FirstTouch::default(),
            trailers: Vec::new(),
            recovery: Recovery {
                records: 0,
                tail: None,
            },
        }
    }

    /// Opens (or creates) the file at `path` for writing and takes its lock, and makes sure
    /// that the file locked is the one `path` names once the lock is held: a deleter that
    /// takes the lock before it removes a log (the gateway's retention) may remove it
    /// between this open and this lock, and a log locked on a file no path names would
    /// acknowledge appends that are gone at close. Such an open is made again on what the
    /// path names then (a new log, when nothing).
    fn locked_file(path: &Path) -> Result<(File, bool), OpenError> {
        const TRIES: usize = 8;
        for _ in 0..TRIES {
            let (file, created) = Self::open_file(path)?;
            #[cfg(test)]
            tests::before_lock(path);
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Err(OpenError::Locked {
                        path: path.to_path_buf(),
                    });
                }
                Err(TryLockError::Error(err)) => return Err(open_io(path)(err)),
            }
            if names(path, &file).map_err(open_io(path))? {
                return Ok((file, created));
            }
        }
        Err(open_io(path)(std::io::Error::other(format!(
            "the log file was removed or replaced between its open and its lock {TRIES} times \
             in a row"
        ))))
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

    /// Bytes of the file holding whole frames (the header included). The file itself is
    /// longer: the end mark after the last frame, then zeros preallocated for the next
    /// appends.
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
        (0..self.len()).filter_map(|seq| self.logged(seq))
    }

    /// Record `seq` with its handle, read whole; `None` when the log holds no such record.
    pub(crate) fn logged(&self, seq: u64) -> Option<Result<LoggedRecord, ReadError>> {
        let handle = RecordHandle::new(self.run.clone(), seq);
        self.read_record(&handle)
            .transpose()
            .map(|record| record.map(|record| LoggedRecord { handle, record }))
    }

    fn entry(&self, handle: &RecordHandle) -> Option<&Entry> {
        if handle.run != self.run {
            return None;
        }
        usize::try_from(handle.seq)
            .ok()
            .and_then(|i| self.index.get(i))
    }

    pub(crate) fn read_io(&self, offset: u64) -> impl FnOnce(std::io::Error) -> ReadError + '_ {
        move |source| ReadError::Io {
            path: self.path.clone(),
            offset,
            source,
        }
    }

    pub(crate) fn corrupt(&self, offset: u64, reason: RecordCorruption) -> ReadError {
        ReadError::Corrupt {
            path: self.path.clone(),
            offset,
            reason,
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
            .map_err(|_| self.corrupt(entry.offset, RecordCorruption::TooLarge))?;
        let mut body = vec![0u8; body_len];
        let at = entry.offset + FRAME_HEADER_LEN as u64;
        self.file
            .read_exact_at(&mut body, at)
            .map_err(self.read_io(at))?;
        // The header was checked on open, so its body holds its metadata and the trailer;
        // checked again rather than trusted (a file changed on disk since reads as a
        // checksum mismatch).
        let Some(data_len) = body_len.checked_sub(FRAME_TRAILER_LEN) else {
            return Err(self.corrupt(entry.offset, RecordCorruption::Vanished));
        };
        let (data, trailer) = body.split_at(data_len);
        let stored = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
        if self
            .trailer_of(entry)
            .is_some_and(|scanned| scanned != stored)
        {
            // A read-only view's frame replaced by a writer since its scan: the record
            // read is another one, whole and checksummed.
            return Err(self.corrupt(entry.offset, RecordCorruption::Replaced));
        }
        let mut crc = Crc32c::new();
        crc.update(data);
        if crc.finish() != stored {
            return Err(self.corrupt(entry.offset, RecordCorruption::BodyChecksum));
        }
        self.first_touch.verified(header.seq);
        let Some(content_len) = data_len.checked_sub(meta_len) else {
            return Err(self.corrupt(entry.offset, RecordCorruption::Vanished));
        };
        body.truncate(data_len);
        // The smaller side is copied. Content far larger than the metadata (a text result)
        // moves to the front of the body's own allocation, not held twice while it decodes;
        // else the content is copied out, so a text kept from it never holds the metadata's
        // room too (a short text beside megabytes of structured content).
        let (meta, content) = if meta_len.saturating_mul(8) <= content_len {
            let meta: Vec<u8> = body.drain(..meta_len).collect();
            (meta, body)
        } else {
            let content = body.split_off(meta_len);
            (body, content)
        };
        format::decode_record(header, &meta, content)
            .map(Some)
            .map_err(|reason| self.corrupt(entry.offset, reason))
    }

    fn tool_result_entry(&self, handle: &RecordHandle) -> Option<&Entry> {
        self.entry(handle)
            .filter(|entry| entry.header.kind == KIND_TOOL_RESULT)
    }
}

/// Makes a new directory entry durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and its missing ancestors, syncing the parent of each folder made (as far
/// as it can be read: one this process may only pass through is left), so that the path
/// to a log created in it is as durable as the log's own entry.
fn create_dir_durably(dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(folder) = at.filter(|folder| !folder.as_os_str().is_empty() && !folder.is_dir())
    {
        missing.push(folder);
        at = folder.parent();
    }
    if missing.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    for folder in missing {
        let _ = sync_dir(&folder.join(".."));
    }
    Ok(())
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
    /// content read in this process. A read-only view reads the frame's header before and
    /// its trailer after (see [`RecordLog::open_read_only`]).
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
        if self.read_only {
            // A writer may have cut the frame this view indexed (a failed sync undone) and
            // written another in its place: the header on disk must still be the one
            // indexed before its offsets are used, and its body checksum the one scanned
            // after the read (`check_trailer_at`), or the bytes are another record's.
            self.check_header_at(entry)?;
        }
        let (start, len) = self.readable_range(entry)?;
        if offset >= len {
            return Ok(0);
        }
        let n = usize::try_from(len - offset).map_or(buf.len(), |left| left.min(buf.len()));
        let at = entry.offset + entry.header.content_start() + start + offset;
        self.file
            .read_exact_at(&mut buf[..n], at)
            .map_err(self.read_io(at))?;
        self.check_trailer_at(entry)?;
        Ok(n)
    }

    /// Reads the metadata (one positional read) and searches the result's line index,
    /// stored with it when it was appended: the mark is within one stride (128 KiB up to
    /// 256 MiB results, see `docs/format.md`) before the line. A result written without an
    /// index (at most one stride long, or appended by an earlier build) gives the start.
    /// A frame the open took from its checkpoint is first checked whole, as on its first
    /// content read.
    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, ReadError> {
        let Some(entry) = self.tool_result_entry(handle) else {
            return Ok(LineMark::START);
        };
        if line == 0 {
            return Ok(LineMark::START);
        }
        self.check_first_touch(entry)?;
        let (raw, meta_end) = self.result_head(entry)?;
        let corrupt = |reason| self.corrupt(entry.offset, reason);
        let (_, len) = format::readable_range(&entry.header, &raw[meta_end..]).map_err(corrupt)?;
        format::line_mark(&raw[FRAME_HEADER_LEN..meta_end], len, line).map_err(corrupt)
    }

    /// From the result's metadata alone (one positional read): its content is not read.
    fn block_lines(&self, handle: &RecordHandle) -> Result<Option<BlockLines>, ReadError> {
        Ok(self
            .result_summary(handle)?
            .map(|(_, summary, _)| summary.block_lines()))
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
                return Err(self.corrupt(entry.offset, RecordCorruption::BlockRange));
            }
            let len = usize::try_from(len)
                .map_err(|_| self.corrupt(entry.offset, RecordCorruption::TooLarge))?;
            bulk = vec![0u8; len];
            let at = entry.offset + entry.header.content_start() + at;
            self.file
                .read_exact_at(&mut bulk, at)
                .map_err(self.read_io(at))?;
            self.check_trailer_at(entry)?;
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
        let (raw, meta_end) = self.result_head(entry)?;
        let summary = format::decode_summary(&entry.header, &raw[FRAME_HEADER_LEN..meta_end])
            .map_err(|reason| self.corrupt(entry.offset, reason))?;
        let readable = format::readable_range(&entry.header, &raw[meta_end..])
            .map_err(|reason| self.corrupt(entry.offset, reason))?;
        Ok(Some((entry, summary, readable)))
    }

    /// Checks that the frame header on disk at `entry` is the one indexed (one 32-byte
    /// positional read): [`RecordCorruption::HeaderChanged`] otherwise.
    fn check_header_at(&self, entry: &Entry) -> Result<(), ReadError> {
        let mut head = [0u8; FRAME_HEADER_LEN];
        self.file
            .read_exact_at(&mut head, entry.offset)
            .map_err(self.read_io(entry.offset))?;
        self.same_header(entry, &head)
    }

    /// Whether `head`, the frame header bytes read at `entry`, is the header indexed:
    /// [`RecordCorruption::HeaderChanged`] otherwise.
    fn same_header(&self, entry: &Entry, head: &[u8; FRAME_HEADER_LEN]) -> Result<(), ReadError> {
        if FrameHeader::decode(head).ok() != Some(entry.header) {
            return Err(self.corrupt(entry.offset, RecordCorruption::HeaderChanged));
        }
        Ok(())
    }

    /// The body checksum a read-only view's scan checked for the frame at `entry`, if its
    /// scan read it (`None` in a writer's log, and for a frame from the checkpoint).
    fn trailer_of(&self, entry: &Entry) -> Option<u32> {
        let first_scanned = (self.index.len() - self.trailers.len()) as u64;
        let i = entry.header.seq.checked_sub(first_scanned)?;
        self.trailers.get(usize::try_from(i).ok()?).copied()
    }

    /// After a read of the frame at `entry` in a read-only view: that the frame's body
    /// checksum on disk (one 4-byte positional read) is still the one the open's scan
    /// checked, else the bytes read may be another record's, written in its place
    /// ([`RecordCorruption::Replaced`]; a file now ending before it is the same). Nothing
    /// to do for a frame the view's checkpoint gave, or in a writer's log.
    fn check_trailer_at(&self, entry: &Entry) -> Result<(), ReadError> {
        let Some(scanned) = self.trailer_of(entry) else {
            return Ok(());
        };
        let at = entry.offset + entry.header.frame_len() - FRAME_TRAILER_LEN as u64;
        let mut stored = [0u8; FRAME_TRAILER_LEN];
        match self.file.read_exact_at(&mut stored, at) {
            Ok(()) if u32::from_le_bytes(stored) == scanned => Ok(()),
            Ok(()) => Err(self.corrupt(entry.offset, RecordCorruption::Replaced)),
            Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(self.corrupt(entry.offset, RecordCorruption::Replaced))
            }
            Err(err) => Err(self.read_io(at)(err)),
        }
    }

    /// The frame header (checked against the index), metadata and, for a result with
    /// binary data, the readable text's length prefix of the tool result at `entry`, read
    /// with one positional read; and where the metadata ends in them.
    fn result_head(&self, entry: &Entry) -> Result<(Vec<u8>, usize), ReadError> {
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
        self.same_header(entry, &head)?;
        self.check_trailer_at(entry)?;
        let meta_end = FRAME_HEADER_LEN + entry.header.meta_len as usize;
        Ok((raw, meta_end))
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
    /// appended and synced on its own, then the log closed (the first append and the close
    /// each wrote a high-water mark, one into each slot).
    fn example_file() -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("run-7").unwrap();
        let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
        log.append(&Record::User(UserMessage { text: "hi".into() }))
            .unwrap();
        log.append(&Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new("c1").unwrap(),
            name: "ls".into(),
            output: ToolOutput::text("a\nb\n"),
        }))
        .unwrap();
        let end = log.size_bytes() as usize + END_MARK_LEN;
        let path = log.path().to_path_buf();
        drop(log);
        let mut bytes = std::fs::read(path).unwrap();
        assert!(bytes[end..].iter().all(|&b| b == 0));
        bytes.truncate(end);
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
            format!("end mark: {END_MARK_LEN} bytes"),
            format!("`{}`", hex(&END_MAGIC)),
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
            format!(
                "power of two of at least {} KiB",
                LINE_INDEX_MIN_STRIDE >> 10
            ),
            format!("under {LINE_INDEX_MAX_ENTRIES} entries"),
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
    use std::cell::RefCell;

    type Hook = Box<dyn FnOnce(&Path)>;

    /// Each side file names its log; nothing else does.
    #[test]
    fn a_side_file_names_its_log() {
        let log = Path::new("/logs/r.plog");
        for side in RecordLog::side_files(log) {
            let name = side
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            assert_eq!(RecordLog::side_file_log(name), Some("r.plog"), "{name}");
        }
        for other in ["r.plog", "r.plog.tmp", "r.ckpt", "expired", "r.txt.ckpt"] {
            assert_eq!(RecordLog::side_file_log(other), None, "{other}");
        }
    }

    /// A log's folder is made with its missing ancestors (each one's parent synced), and
    /// asking again for folders that exist is a no-op; a log opens in the folder made.
    #[test]
    fn a_logs_folder_is_made_with_its_ancestors() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let deep = root.path().join("a").join("b").join("c");
        create_dir_durably(&deep).unwrap_or_else(|e| panic!("{e}"));
        assert!(deep.is_dir());
        create_dir_durably(&deep).unwrap_or_else(|e| panic!("{e}"));
        let run = RunId::new("r").unwrap_or_else(|e| panic!("{e}"));
        let (log, _) = RecordLog::open(
            root.path().join("a").join("x"),
            &run,
            SyncPolicy::EveryAppend,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(log.is_empty());
    }

    thread_local! {
        /// Run once between a writer's open of its file and its lock (this thread's next
        /// open): a test's deleter.
        static BEFORE_LOCK: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    pub(super) fn before_lock(path: &Path) {
        if let Some(hook) = BEFORE_LOCK.with(|hook| hook.borrow_mut().take()) {
            hook(path);
        }
    }

    /// Review: retention (open, lock, remove, unlock) between a writer's open and its lock
    /// left the writer locked on a file no path named, its acknowledged appends lost at
    /// close. The open now sees the path gone and opens what the path names.
    #[test]
    fn a_log_removed_between_open_and_lock_is_not_written_unlinked() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("removed").unwrap();
        let user = |text: &str| Record::User(UserMessage { text: text.into() });
        let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        log.append(&user("expired")).unwrap();
        drop(log);
        BEFORE_LOCK.with(|hook| {
            *hook.borrow_mut() = Some(Box::new(|path: &Path| {
                let deleter = File::open(path).unwrap();
                deleter.try_lock().unwrap();
                std::fs::remove_file(path).unwrap();
            }));
        });
        let (mut log, recovery) =
            RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        assert_eq!(
            recovery.records, 0,
            "the removed log's records went with it"
        );
        let handle = log.append(&user("kept")).unwrap();
        drop(log);
        let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        assert_eq!(recovery.records, 1);
        assert!(log.record(&handle).unwrap().is_some());
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
