//! The log's one write path, used by [`RecordLog::append`] and [`RecordLog::append_batch`]
//! and by [`SharedRecordLog`](crate::SharedRecordLog)'s group leader alike: frames gathered
//! and the end mark into as few positional writes as their sizes allow, preallocation, the
//! high-water mark when the sync commits a new file length, one sync; then the index
//! extended, or the file cut back (and the log poisoned when even that fails). Every file
//! operation goes through the log's [`Storage`](crate::Storage).

use std::fs::File;

use psych_types::{Record, RecordHandle, TokenEstimator};

use crate::crc32c::Crc32c;
use crate::error::AppendError;
use crate::format::{
    self, Content, END_MARK_LEN, EndMark, FRAME_HEADER_LEN, FrameHeader, MARK_LEN, Mark,
};
use crate::log::{Entry, RecordLog};
use crate::spill::{StreamFailure, Streamed};
use crate::storage::Storage;

/// Pieces of a write up to this size are gathered into one buffer and written together;
/// larger ones (a large result's content) are written from where they are, not copied.
const GATHER_LIMIT: usize = 1 << 20;
/// The gather buffer is dropped after a write that made it larger than this.
pub(crate) const SCRATCH_KEEP: usize = 4 << 20;
/// The file is extended with zeros this far past the last frame, ahead of appends, so that
/// an append overwrites blocks that already exist and its `fdatasync` flushes data only,
/// not the file's size and extents (see `docs/format.md`, "Preallocation").
const PREALLOC: u64 = 1 << 20;
/// Writes (one append, one batch, one group) larger than this do not trigger
/// preallocation: they grow the file themselves, and pay a metadata commit on their sync
/// instead of the zeros' bandwidth (every preallocated byte is written twice). The commit
/// costs about as much as writing 128 KiB more, so past this size growing is cheaper:
/// 64 records of 4 KiB (266 KiB) in one `append_batch` take 1.6-1.9x one bare write +
/// `fdatasync` of their bytes when each batch grows the file, 2.6-3.0x when zeros are
/// written ahead of them (`cargo bench -p psych-record-log --bench append --
/// group_commit_64`, interleaved medians; `docs/format.md`, "Preallocation"). A large
/// write still lands in preallocated space when it fits in what is left.
const PREALLOC_MAX_WRITE: u64 = 128 << 10;

/// Why a write stopped.
pub(crate) enum WriteFailure {
    /// A record could not be encoded, or its spilled text not read as it is written.
    Encode(AppendError),
    /// A write or the sync failed.
    Io(std::io::Error),
}

impl From<std::io::Error> for WriteFailure {
    fn from(err: std::io::Error) -> Self {
        WriteFailure::Io(err)
    }
}

/// Positional writes from one offset on, small pieces gathered into one buffer.
pub(crate) struct Gather<'a> {
    storage: &'a dyn Storage,
    file: &'a File,
    /// Where the buffered bytes go.
    at: u64,
    buf: &'a mut Vec<u8>,
}

impl Gather<'_> {
    /// Appends `bytes` to the write: buffered when small, written at once (after what is
    /// buffered) when larger than [`GATHER_LIMIT`].
    pub(crate) fn push(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.len() > GATHER_LIMIT {
            self.flush()?;
            self.storage.write_all_at(self.file, bytes, self.at)?;
            self.at += bytes.len() as u64;
        } else {
            self.buf.extend_from_slice(bytes);
        }
        Ok(())
    }

    /// Appends a piece of a streamed frame (at most [`GATHER_LIMIT`] bytes, a chunk of a
    /// spilled text at most): buffered, and the buffer written out once it holds
    /// [`GATHER_LIMIT`] bytes, so a streamed frame of any size holds at most that much
    /// of its content here.
    pub(crate) fn push_streamed(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.push(bytes)?;
        if self.buf.len() >= GATHER_LIMIT {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.storage.write_all_at(self.file, self.buf, self.at)?;
            self.at += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(())
    }
}

/// A write that reached the disk (under the policy): what [`RecordLog::commit_write`]
/// records.
pub(crate) struct Written {
    /// The file's length after it (preallocated zeros included).
    allocated: u64,
    /// The high-water mark written with it: under a syncing policy, when the write changed
    /// the file's length.
    mark: Option<Mark>,
}

impl RecordLog {
    /// Refuses a write to a read-only or poisoned log.
    pub(crate) fn check_writable(&self) -> Result<(), AppendError> {
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
        Ok(())
    }

    /// Writes `records` frames after the last whole one: `fill` pushes their bytes in
    /// order and returns where they end, and the end mark follows them in the same write
    /// (over the previous one, where the write starts); then preallocation, the high-water
    /// mark when the write changes the file's length, and one sync (under a syncing
    /// policy). The log is not changed: on success give the result to
    /// [`RecordLog::commit_write`], on failure call [`RecordLog::undo`]. The error is
    /// `fill`'s own or an I/O error made into it: [`WriteFailure`] where `fill` encodes
    /// records, `std::io::Error` where they come encoded (a group's).
    pub(crate) fn write_frames<E: From<std::io::Error>>(
        &self,
        records: u64,
        buf: &mut Vec<u8>,
        fill: impl FnOnce(&mut Gather<'_>) -> Result<u64, E>,
    ) -> Result<Written, E> {
        buf.clear();
        let mut gather = Gather {
            storage: &*self.storage,
            file: &self.file,
            at: self.end,
            buf,
        };
        let new_end = fill(&mut gather)?;
        // The end mark, in the same write as the last frame it follows.
        gather.push(&EndMark::new(self.len() + records, new_end).encode())?;
        gather.flush()?;
        let allocated = self.preallocate(new_end + END_MARK_LEN as u64);
        // The high-water mark goes to disk with the frames, under their one sync, when
        // that sync commits a new file length anyway (about once per `PREALLOC / 2`
        // bytes appended): a sync of frames alone then flushes their pages only, not the
        // header's too (`docs/format.md`, "High-water mark").
        let mark = (self.sync.syncs() && allocated != self.allocated)
            .then(|| self.next_mark(self.len() + records));
        if let Some(mark) = &mark {
            self.write_mark(mark)?;
        }
        if self.sync.syncs() {
            self.storage.sync_data(&self.file)?;
        }
        Ok(Written { allocated, mark })
    }

    /// Indexes the frames of a write that reached the disk: `entries`, ending at the new
    /// end of the log.
    pub(crate) fn commit_write(&mut self, entries: Vec<Entry>, written: Written) {
        if let Some(last) = entries.last() {
            self.end = last.offset + last.header.frame_len();
        }
        self.allocated = written.allocated.max(self.end + END_MARK_LEN as u64);
        self.index.extend(entries);
        if self.sync.syncs() {
            self.synced(written.mark);
        }
    }

    /// Cuts the file back to its last whole frame and end mark after a failed write, and
    /// writes the end mark again (the write began over it); poisons the log if the cut
    /// fails (what is on disk past the last frame is then unknown). If only the end
    /// mark's write fails, the next write (which starts there) or the next open (which
    /// reports the mark missing) puts it back.
    pub(crate) fn undo(&mut self) {
        let mark_end = self.end + END_MARK_LEN as u64;
        if self.storage.set_len(&self.file, mark_end).is_err() {
            self.poisoned = true;
        } else {
            let _ = self.write_end_mark();
        }
        self.allocated = mark_end;
    }

    /// Writes the end mark after the last whole frame, unsynced.
    pub(crate) fn write_end_mark(&self) -> std::io::Result<()> {
        let mark = EndMark::new(self.len(), self.end).encode();
        self.storage.write_all_at(&self.file, &mark, self.end)
    }

    /// Takes no more appends: a write failed in a way that leaves the file unknown.
    pub(crate) fn poison(&mut self) {
        self.poisoned = true;
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
        self.storage.write_all_at(&self.file, &mark.encode(), at)
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

    /// After a write of frames from the log's end to `new_end`, when the write was at most
    /// `PREALLOC_MAX_WRITE` and fewer than `PREALLOC / 2` bytes are left past it, extends
    /// the file with zeros to `PREALLOC` past `new_end`; the zeros reach the disk with the
    /// write's own sync, and the writes after it overwrite existing blocks without a
    /// metadata commit. Larger writes land in what is left of the preallocated space, or
    /// grow the file themselves where it is not enough: for them the zeros would cost more
    /// bandwidth than the metadata commit they save (see [`PREALLOC_MAX_WRITE`]). Returns
    /// the file's new length.
    ///
    /// Best effort: preallocation only makes later syncs cheaper, so a failure to write the
    /// zeros (a nearly full disk, a file size limit) must not fail an append whose own bytes
    /// were written. The zeros written are given back and the length before them returned.
    fn preallocate(&self, new_end: u64) -> u64 {
        let allocated = self.allocated.max(new_end);
        if new_end.saturating_sub(self.end) > PREALLOC_MAX_WRITE
            || allocated - new_end >= PREALLOC / 2
        {
            return allocated;
        }
        let target = new_end + PREALLOC;
        let zeros = vec![0u8; (target - allocated) as usize];
        match self.storage.write_all_at(&self.file, &zeros, allocated) {
            Ok(()) => target,
            Err(_) => {
                // If even this fails, zeros past `allocated` are read as free space anyway.
                let _ = self.storage.set_len(&self.file, allocated);
                allocated
            }
        }
    }

    /// Appends one record and returns its handle once it is durable under the log's
    /// [`SyncPolicy`](crate::SyncPolicy). Blocks the calling thread for the write and, under
    /// a syncing policy, one `fdatasync` (see the crate's "What blocks").
    ///
    /// # Errors
    ///
    /// [`AppendError`]; no handle is issued and the record is not in the log's index.
    pub fn append(&mut self, record: &Record) -> Result<RecordHandle, AppendError> {
        let seq = self.append_records(std::slice::from_ref(record))?;
        Ok(RecordHandle::new(self.run.clone(), seq))
    }

    /// Appends records in order with a single write and (under a syncing policy) a single
    /// `fdatasync`. All handles are returned after that one sync; on error none is issued.
    /// An empty batch writes and syncs nothing and returns no handle (as
    /// [`SharedRecordLog::append_batch`](crate::SharedRecordLog::append_batch) does).
    ///
    /// # Errors
    ///
    /// [`AppendError`]; the log cuts whatever of the batch it wrote.
    pub fn append_batch(&mut self, records: &[Record]) -> Result<Vec<RecordHandle>, AppendError> {
        let first = self.append_records(records)?;
        Ok((first..first + records.len() as u64)
            .map(|seq| RecordHandle::new(self.run.clone(), seq))
            .collect())
    }

    /// Makes every record appended so far durable (`fdatasync`, blocking). Needed only
    /// under [`SyncPolicy::OsBuffered`](crate::SyncPolicy::OsBuffered).
    ///
    /// # Errors
    ///
    /// [`AppendError::Io`] when the sync fails (the log is then poisoned: after a failed
    /// `fdatasync` the OS may have dropped the dirty pages); [`AppendError::ReadOnly`] on a
    /// log opened read-only; [`AppendError::Poisoned`] after an earlier such failure.
    pub fn sync(&mut self) -> Result<(), AppendError> {
        self.check_writable()?;
        // Records appended since the last sync (under `OsBuffered`) get a high-water mark.
        let mark = (self.durable_records < self.len()).then(|| self.next_mark(self.len()));
        let result = match &mark {
            Some(mark) => self.write_mark(mark),
            None => Ok(()),
        };
        result
            .and_then(|()| self.storage.sync_data(&self.file))
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

    /// Writes `records` as frames after the last whole one, encoding each as it goes (a
    /// large result's content is written from the record, not copied), syncs per policy,
    /// and indexes them. Returns the first one's position.
    fn append_records(&mut self, records: &[Record]) -> Result<u64, AppendError> {
        let first = self.len();
        if records.is_empty() {
            return Ok(first);
        }
        self.check_writable()?;
        let mut entries = Vec::with_capacity(records.len());
        let mut buf = std::mem::take(&mut self.scratch);
        let estimator = self.estimator.as_deref().map(|e| e as &dyn TokenEstimator);
        // Where a spilled text's chunks are read into (allocated only for one).
        let mut chunk = Vec::new();
        let written = self.write_frames(records.len() as u64, &mut buf, |gather| {
            let mut offset = self.end;
            for (i, record) in records.iter().enumerate() {
                let (header, encoded, crc) =
                    frame_parts(record, first + i as u64, format::write_index(i), estimator)
                        .map_err(WriteFailure::Encode)?;
                push_frame(
                    gather,
                    &header,
                    &encoded.meta,
                    &encoded.content,
                    crc,
                    &mut chunk,
                )
                .map_err(|failure| match failure.into_append_error() {
                    Ok(err) => WriteFailure::Encode(err),
                    Err(err) => WriteFailure::Io(err),
                })?;
                entries.push(Entry { offset, header });
                offset += header.frame_len();
            }
            Ok(offset)
        });
        if buf.capacity() <= SCRATCH_KEEP {
            self.scratch = buf;
        }
        match written {
            Ok(written) => {
                self.commit_write(entries, written);
                Ok(first)
            }
            Err(WriteFailure::Encode(err)) => {
                self.undo();
                Err(err)
            }
            Err(WriteFailure::Io(source)) => {
                let offset = self.end;
                self.undo();
                Err(AppendError::Io {
                    path: self.path.clone(),
                    offset,
                    source,
                })
            }
        }
    }
}

impl Drop for RecordLog {
    /// Brings the high-water mark up to date when the log is closed: it counts durable
    /// every record a sync that returned made so, which a crash cannot undo, so it needs no
    /// sync of its own (the system writes it back in its own time, or the next open's or
    /// append's sync does). Until then the older mark stands, which is only less strict.
    ///
    /// Then it releases the file's lock through its own descriptor rather than leaving that
    /// to the close: a process that any thread of this process is starting holds a copy of
    /// every open descriptor until it reaches `exec`, and a `flock` belongs to the open
    /// file that the copy shares, so a log closed and opened again meanwhile would find
    /// itself locked. Unlocking releases it for every copy.
    fn drop(&mut self) {
        if self.opened && !self.read_only && !self.poisoned {
            let mark = self.next_mark(self.len());
            let current = self.mark;
            if (mark.durable_records, mark.written_records)
                != (current.durable_records, current.written_records)
            {
                let _ = self.write_mark(&mark);
            }
        }
        let _ = self.file.unlock();
    }
}

/// Encodes `record` for a frame at position `seq`, with index `write_index` in its write:
/// its header, its metadata and content, and the checksum over both when the content is
/// in memory (a streamed content's is computed as it is written, [`push_frame`]).
fn frame_parts<'a>(
    record: &'a Record,
    seq: u64,
    write_index: u8,
    estimator: Option<&dyn TokenEstimator>,
) -> Result<(FrameHeader, format::Encoded<'a>, Option<u32>), AppendError> {
    let encoded = format::encode_record(record, estimator)?;
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
        content_len: encoded.content.len(),
    };
    let crc = match &encoded.content {
        Content::Memory(content) => Some(format::body_crc(&encoded.meta, content)),
        Content::Streamed(_) => None,
    };
    Ok((header, encoded, crc))
}

/// Pushes one frame onto a write: its header, metadata, content and body checksum. A
/// streamed content is read from its spill files in chunks (into `chunk`) and checksummed
/// as it goes, so the frame is never whole in memory.
fn push_frame(
    gather: &mut Gather<'_>,
    header: &FrameHeader,
    meta: &[u8],
    content: &Content<'_>,
    crc: Option<u32>,
    chunk: &mut Vec<u8>,
) -> Result<(), StreamFailure> {
    gather
        .push(&header.encode())
        .map_err(StreamFailure::Write)?;
    match content {
        Content::Streamed(streamed) => push_streamed(gather, meta, streamed, chunk),
        Content::Memory(content) => {
            let crc = crc.unwrap_or_else(|| format::body_crc(meta, content));
            [meta, content, &crc.to_le_bytes()]
                .into_iter()
                .try_for_each(|bytes| gather.push(bytes))
                .map_err(StreamFailure::Write)
        }
    }
}

/// The body of a streamed frame whose header is pushed: metadata, content read from the
/// spill files in chunks and checksummed as it goes, and the checksum.
fn push_streamed(
    gather: &mut Gather<'_>,
    meta: &[u8],
    streamed: &Streamed<'_>,
    chunk: &mut Vec<u8>,
) -> Result<(), StreamFailure> {
    gather.push(meta).map_err(StreamFailure::Write)?;
    let mut crc = Crc32c::new();
    crc.update(meta);
    streamed.emit(chunk, &mut |bytes| {
        crc.update(bytes);
        gather.push_streamed(bytes)
    })?;
    gather
        .push(&crc.finish().to_le_bytes())
        .map_err(StreamFailure::Write)
}

/// One record encoded as a whole frame whose position is not yet known (a call queued for
/// a group): the header's fields but `seq` and the write index, and the body.
pub(crate) struct PendingFrame {
    pub(crate) header: FrameHeader,
    body: PendingBody,
}

enum PendingBody {
    /// The whole frame; its first 32 bytes are a placeholder for the header until
    /// [`PendingFrame::place`] fills them in.
    Whole(Vec<u8>),
    /// A frame whose content is partly in spill files: its metadata, and the content read
    /// from the files as the leader writes it.
    Streamed {
        meta: Vec<u8>,
        content: Streamed<'static>,
    },
}

impl PendingFrame {
    /// Encodes `record` (metadata, content, body checksum) into an owned frame buffer, or,
    /// for a tool result with spilled text, its metadata and the pieces of its content
    /// (the spill files read through once to encode it; their text is not copied).
    pub(crate) fn encode(
        record: &Record,
        estimator: Option<&dyn TokenEstimator>,
    ) -> Result<Self, AppendError> {
        let (header, encoded, crc) = frame_parts(record, 0, 0, estimator)?;
        let content = match encoded.content {
            Content::Memory(content) => content,
            Content::Streamed(content) => {
                return Ok(Self {
                    header,
                    body: PendingBody::Streamed {
                        meta: encoded.meta,
                        content: content.into_owned(),
                    },
                });
            }
        };
        let len = usize::try_from(header.frame_len())
            .map_err(|_| AppendError::TooLarge { len: usize::MAX })?;
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
        bytes.extend_from_slice(&encoded.meta);
        bytes.extend_from_slice(&content);
        let crc = crc.unwrap_or_else(|| format::body_crc(&encoded.meta, &content));
        bytes.extend_from_slice(&crc.to_le_bytes());
        Ok(Self {
            header,
            body: PendingBody::Whole(bytes),
        })
    }

    /// The frame's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.header.frame_len()
    }

    /// Gives the frame its position `seq` and its index `write_index` within the write that
    /// carries it (header and header checksum) and returns its index entry at `offset`.
    pub(crate) fn place(&mut self, seq: u64, write_index: u8, offset: u64) -> Entry {
        self.header.seq = seq;
        self.header.write_index = write_index;
        if let PendingBody::Whole(bytes) = &mut self.body {
            bytes[..FRAME_HEADER_LEN].copy_from_slice(&self.header.encode());
        }
        Entry {
            offset,
            header: self.header,
        }
    }

    /// Pushes the placed frame onto a write; a streamed one reads its spill files
    /// (chunks into `chunk`) and checksums its body as it goes.
    pub(crate) fn push_to(
        &self,
        gather: &mut Gather<'_>,
        chunk: &mut Vec<u8>,
    ) -> Result<(), StreamFailure> {
        match &self.body {
            PendingBody::Whole(bytes) => gather.push(bytes).map_err(StreamFailure::Write),
            PendingBody::Streamed { meta, content } => {
                gather
                    .push(&self.header.encode())
                    .map_err(StreamFailure::Write)?;
                push_streamed(gather, meta, content, chunk)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::{RunId, UserMessage};

    use crate::{FaultyStorage, StorageOp, SyncPolicy};

    #[test]
    fn closing_releases_the_lock_that_a_copy_of_the_descriptor_shares() {
        // A process started while the log is open holds a copy of its descriptor (here
        // given as its standard input, so that it outlives `exec`): closing the log
        // releases the lock all the same, and the log opens again at once.
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("shared-fd").unwrap();
        let (log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(log.file.try_clone().unwrap())
            .spawn()
            .unwrap();
        drop(log);
        let reopened = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(reopened.is_ok(), "{:?}", reopened.err());
    }

    #[test]
    fn preallocation_is_best_effort() {
        // A storage whose writes fail stands for a full disk: the zeros fail, the append
        // they follow must not, and the file keeps the length before them.
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("full").unwrap();
        let faults = std::sync::Arc::new(FaultyStorage::new());
        let (mut log, _) =
            RecordLog::open_with_storage(dir.path(), &run, SyncPolicy::OsBuffered, faults.clone())
                .unwrap();
        log.append(&Record::User(UserMessage { text: "a".into() }))
            .unwrap();
        assert!(log.allocated >= log.end + PREALLOC / 2);
        let end = log.end;
        let allocated = log.allocated;
        log.end = allocated - 10;
        let cuts = faults.calls(StorageOp::SetLen);
        faults.fail_next(StorageOp::Write, 1);
        assert_eq!(log.preallocate(allocated), allocated);
        assert_eq!(
            faults.calls(StorageOp::SetLen),
            cuts + 1,
            "the zeros are given back"
        );
        assert_eq!(log.preallocate(allocated), allocated + PREALLOC);
        log.end = end;
    }
}
