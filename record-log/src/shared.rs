//! [`SharedRecordLog`]: one Run's log shared by concurrent appenders, with group commit. A
//! leader thread writes every pending frame in one write, syncs once for the group, and
//! wakes the appenders that were waiting on it.
//!
//! The protocol:
//!
//! 1. An appender encodes its frames outside any lock, then, under the `group` mutex,
//!    queues them with a slot of its own to be woken through. If no thread is leading, it
//!    becomes the leader; otherwise it waits on its slot.
//! 2. The leader keeps the window open until the queue holds `max_records` records or
//!    `max_bytes` bytes, or the oldest queued call has waited `max_wait` (an arrival that
//!    fills the window wakes it through `filled`), then takes whole calls from the front of
//!    the queue up to those bounds, releases the mutex and does the I/O: positions the
//!    frames after the last one, writes them, preallocates, syncs once.
//! 3. It relocks, and hands leadership to the owner of the call now at the front of the
//!    queue (waking its slot), or gives it up when the queue is empty; then it wakes each
//!    call of its group through its slot with the group's outcome. Nobody is woken for
//!    nothing, and no waiter contends for the `group` mutex on the way out.
//!
//! Frames are positioned by the leader in queue order, so `seq` order is file order. The
//! [`RecordLog`] sits in an `RwLock`: the leader holds it shared while it writes and syncs
//! (readers go on reading, and see none of the group's records yet), and exclusively only
//! to index the group after the sync, or to cut it off after a failure.

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use psych_types::{
    BlockLines, ContentBlock, LineMark, LoggedRecord, OutputInfo, Record, RecordHandle,
    RecordSource, RunId, TokenEstimator,
};

use crate::error::{AppendError, OpenError, ReadError};
use crate::format;
use crate::log::RecordLog;
use crate::policy::SyncPolicy;
use crate::recovery::Recovery;
use crate::write::{PendingFrame, SCRATCH_KEEP};

/// Counters of a [`SharedRecordLog`]'s groups since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStats {
    /// Groups written, failed ones included: each is one write of its frames and, under a
    /// syncing policy, one `fdatasync`.
    pub groups: u64,
    /// Records acknowledged.
    pub records: u64,
    /// Groups whose write or sync failed; none of their records was acknowledged.
    pub failed_groups: u64,
    /// The most records one group held.
    pub largest_group: usize,
    /// Groups whose window closed because they were full (`max_records` or `max_bytes`
    /// reached), not because their oldest call had waited `max_wait`.
    pub full_groups: u64,
    /// The longest a group's window stayed open: from its oldest call's arrival to the
    /// window's close, before its write and sync.
    pub longest_window: Duration,
}

/// One Run's [`RecordLog`] shared by concurrent appenders (`&self`, `Send + Sync`; put it
/// in an `Arc`), with group commit under [`SyncPolicy::GroupCommit`].
///
/// Each [`append`](Self::append) returns its handle only once its frame is on disk under
/// the policy; appends arriving together (parallel tool calls finishing at once on several
/// threads, say) share one write and one `fdatasync`, in a group bounded by the policy's
/// `max_wait`, `max_records` and `max_bytes`. Handles are issued in file order. If a
/// group's write or sync fails, every append of that group gets an [`AppendError`], none of
/// it is acknowledged or readable, and the file is cut back to the group's start (as
/// [`RecordLog::append`] does). Under [`SyncPolicy::EveryAppend`] each call is synced on
/// its own; under [`SyncPolicy::OsBuffered`] whatever is queued is written together,
/// without a sync.
///
/// It is the [`RecordSource`] of its Run; reads go on while a group is being written and
/// see only records that are on disk (a group's records become readable once its sync
/// returns, possibly just before its appenders are woken). Frames are encoded by the appending threads, into one
/// owned buffer each, so a huge result is copied once more than through
/// [`RecordLog::append`]; a result with spilled text (`ToolOutput::spilled`) is encoded
/// on its appender's thread (its spill files read through once) and its text is read from
/// the files again by the leader as it writes the group, never copied whole.
pub struct SharedRecordLog {
    run: RunId,
    path: PathBuf,
    policy: SyncPolicy,
    window: Window,
    log: RwLock<RecordLog>,
    /// The log's acknowledged records and file bytes, stored as each group commits, so
    /// that [`SharedRecordLog::len`] and [`SharedRecordLog::size_bytes`] never wait for
    /// the lock (a writer waits there for readers reading records from disk).
    acknowledged: (AtomicU64, AtomicU64),
    group: Mutex<Group>,
    /// Wakes the leader when an arrival fills the window.
    filled: Condvar,
    /// The log's estimator, used by each appending thread as it encodes its records.
    estimator: Option<crate::log::Estimator>,
}

/// The bounds of a group, from the policy.
#[derive(Debug, Clone, Copy)]
struct Window {
    max_wait: Duration,
    max_records: usize,
    max_bytes: u64,
}

impl Window {
    fn of(policy: SyncPolicy) -> Self {
        match policy {
            SyncPolicy::GroupCommit(window) => Self {
                max_wait: window.max_wait(),
                max_records: window.max_records(),
                max_bytes: window.max_bytes(),
            },
            // One call per group: the smallest bound lets exactly one call in.
            SyncPolicy::EveryAppend => Self {
                max_wait: Duration::ZERO,
                max_records: 1,
                max_bytes: 1,
            },
            SyncPolicy::OsBuffered => Self {
                max_wait: Duration::ZERO,
                max_records: usize::MAX,
                max_bytes: u64::MAX,
            },
        }
    }

    fn is_full(&self, group: &Group) -> bool {
        group.queued_records >= self.max_records || group.queued_bytes >= self.max_bytes
    }
}

/// The queue and the leader's state.
#[derive(Default)]
struct Group {
    queue: VecDeque<Pending>,
    queued_records: usize,
    queued_bytes: u64,
    leading: bool,
    scratch: Vec<u8>,
    stats: GroupStats,
}

/// One call's frames, waiting for a group.
struct Pending {
    slot: Arc<Slot>,
    frames: Vec<PendingFrame>,
    bytes: u64,
    arrived: Instant,
}

/// Where a waiting appender is woken: with its call's outcome, or to lead.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    wake: Condvar,
}

#[derive(Default)]
enum SlotState {
    /// Queued; nothing to do yet.
    #[default]
    Waiting,
    /// The call is still queued and its owner is to lead the next group.
    Lead,
    /// The call's group is done.
    Done(Outcome),
}

impl Slot {
    fn set(&self, state: SlotState) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = state;
        self.wake.notify_one();
    }

    /// Waits until the slot is set; returns the outcome, or `None` when told to lead.
    fn wait(&self) -> Option<Outcome> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match std::mem::take(&mut *state) {
                SlotState::Waiting => {
                    state = self
                        .wake
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                SlotState::Lead => return None,
                SlotState::Done(outcome) => return Some(outcome),
            }
        }
    }
}

/// What became of one call.
enum Outcome {
    /// Durable; its first record is at this position.
    Committed(u64),
    Failed(Failure),
    /// Left out of its group for its own input (a spilled text that could not be read
    /// back), the rest of the group written without it.
    Refused(AppendError),
}

/// A group written: where its first record went, how many records it holds, and the
/// calls left out for their own spilled text (by their index in the group).
struct GroupDone {
    first: u64,
    records: usize,
    refused: Vec<(usize, AppendError)>,
}

/// Why filling a group's write stopped.
enum GroupFill {
    /// Call `call`'s spilled text could not be read back: its own append's error.
    Spill { call: usize, error: AppendError },
    /// Writing failed.
    Io(std::io::Error),
}

impl From<std::io::Error> for GroupFill {
    fn from(error: std::io::Error) -> Self {
        GroupFill::Io(error)
    }
}

/// Why a group failed, given to each of its calls.
#[derive(Debug, Clone)]
enum Failure {
    Io {
        offset: u64,
        /// The group's one error, shared by its calls (`io::Error` is not `Clone`).
        source: Arc<std::io::Error>,
    },
    Poisoned,
    ReadOnly,
}

/// Each call's copy of its group's I/O error: an operating system error is the same error
/// again (same kind, same `raw_os_error`, same text); any other keeps its kind and carries
/// the original, shared, as its inner error (`get_ref` downcasts to
/// `Arc<std::io::Error>`).
fn copy_of(source: &Arc<std::io::Error>) -> std::io::Error {
    match source.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(source.kind(), Arc::clone(source)),
    }
}

impl Failure {
    fn to_error(&self, path: &Path) -> AppendError {
        match self {
            Failure::Io { offset, source } => AppendError::Io {
                path: path.to_path_buf(),
                offset: *offset,
                source: copy_of(source),
            },
            Failure::Poisoned => AppendError::Poisoned {
                path: path.to_path_buf(),
            },
            Failure::ReadOnly => AppendError::ReadOnly {
                path: path.to_path_buf(),
            },
        }
    }
}

impl fmt::Debug for SharedRecordLog {
    /// The log's identity and size, not its index or queue.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRecordLog")
            .field("run", &self.run)
            .field("path", &self.path)
            .field("sync", &self.policy)
            .field("records", &self.len())
            .finish_non_exhaustive()
    }
}

impl From<RecordLog> for SharedRecordLog {
    fn from(log: RecordLog) -> Self {
        Self::new(log)
    }
}

impl SharedRecordLog {
    /// Opens the log of `run` under `dir` as [`RecordLog::open`] does, for sharing.
    ///
    /// # Errors
    ///
    /// [`OpenError`], as for [`RecordLog::open`].
    pub fn open(
        dir: impl AsRef<Path>,
        run: &RunId,
        sync: SyncPolicy,
    ) -> Result<(Self, Recovery), OpenError> {
        let (log, recovery) = RecordLog::open(dir, run, sync)?;
        Ok((Self::new(log), recovery))
    }

    /// Shares an open log; appends follow its [`SyncPolicy`] (checked when it was opened).
    pub fn new(log: RecordLog) -> Self {
        let policy = log.sync_policy();
        let estimator = log.estimator.clone();
        Self {
            run: log.run().clone(),
            path: log.path().to_path_buf(),
            policy,
            window: Window::of(policy),
            acknowledged: (AtomicU64::new(log.len()), AtomicU64::new(log.size_bytes())),
            log: RwLock::new(log),
            group: Mutex::new(Group::default()),
            filled: Condvar::new(),
            estimator,
        }
    }

    /// The log back, for single-writer use.
    pub fn into_inner(self) -> RecordLog {
        self.log
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
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
        self.policy
    }

    /// Number of acknowledged records in the log.
    /// Never waits for the log's lock.
    pub fn len(&self) -> u64 {
        self.acknowledged.0.load(Ordering::Acquire)
    }

    /// Whether the log holds no acknowledged record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the file holding acknowledged frames (see [`RecordLog::size_bytes`]).
    /// Never waits for the log's lock.
    pub fn size_bytes(&self) -> u64 {
        self.acknowledged.1.load(Ordering::Acquire)
    }

    /// What opening found (the [`Recovery`] `open` returned).
    pub fn recovery(&self) -> Recovery {
        self.read_log().recovery().clone()
    }

    /// The handle of record `seq`, if the log holds that many acknowledged records.
    pub fn handle(&self, seq: u64) -> Option<RecordHandle> {
        (seq < self.len()).then(|| RecordHandle::new(self.run.clone(), seq))
    }

    /// Every acknowledged record with its handle, in order, read one at a time (see
    /// [`iter_from`](Self::iter_from)).
    pub fn iter(&self) -> impl Iterator<Item = Result<LoggedRecord, ReadError>> + '_ {
        self.iter_from(0)
    }

    /// The acknowledged records from position `seq` on, with their handles, in order: those
    /// in the log when it is called (records appended meanwhile are not included), each read
    /// under the read lock taken for that record alone, so appends go on between reads.
    pub fn iter_from(
        &self,
        seq: u64,
    ) -> impl Iterator<Item = Result<LoggedRecord, ReadError>> + '_ {
        (seq..self.len()).filter_map(|seq| self.read_log().logged(seq))
    }

    /// Counters of the groups written so far.
    pub fn stats(&self) -> GroupStats {
        self.lock_group().stats
    }

    /// Appends one record and returns its handle once it is durable under the policy,
    /// possibly in a group with other threads' appends. Parks the calling thread until
    /// then: up to the group's `max_wait` for company, plus the group's write and
    /// `fdatasync` (call it from `spawn_blocking` or a thread of its own in async code; only
    /// appenders on different OS threads share a group).
    ///
    /// # Errors
    ///
    /// [`AppendError`]: encoding errors of this record alone, and
    /// [`AppendError::Spill`] when its spilled text cannot be read back as the group is
    /// written (this call is left out; the rest of the group is written without it); I/O
    /// errors and [`AppendError::Poisoned`] of the whole group. No handle is issued.
    pub fn append(&self, record: &Record) -> Result<RecordHandle, AppendError> {
        let seq = self.commit(std::slice::from_ref(record))?;
        Ok(RecordHandle::new(self.run.clone(), seq))
    }

    /// Appends records contiguously, in order, in one group (never split between groups,
    /// whatever the bounds), and returns their handles once they are durable. An empty
    /// batch writes and syncs nothing and returns no handle (as
    /// [`RecordLog::append_batch`] does).
    ///
    /// # Errors
    ///
    /// As [`append`](Self::append); on error none of the records is acknowledged.
    pub fn append_batch(&self, records: &[Record]) -> Result<Vec<RecordHandle>, AppendError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let first = self.commit(records)?;
        Ok((first..first + records.len() as u64)
            .map(|seq| RecordHandle::new(self.run.clone(), seq))
            .collect())
    }

    /// Makes every acknowledged record durable (see [`RecordLog::sync`]); needed only under
    /// [`SyncPolicy::OsBuffered`].
    ///
    /// # Errors
    ///
    /// As [`RecordLog::sync`].
    pub fn sync(&self) -> Result<(), AppendError> {
        self.log
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .sync()
    }

    /// Queues `records` as one call and waits for its outcome, leading groups when it is
    /// its turn. Returns the first record's position.
    fn commit(&self, records: &[Record]) -> Result<u64, AppendError> {
        let frames = records
            .iter()
            .map(|record| {
                PendingFrame::encode(
                    record,
                    self.estimator.as_deref().map(|e| e as &dyn TokenEstimator),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bytes = frames.iter().map(PendingFrame::len).sum();
        let slot = Arc::new(Slot::default());
        let mut lead = {
            let mut group = self.lock_group();
            group.queued_records += frames.len();
            group.queued_bytes += bytes;
            group.queue.push_back(Pending {
                slot: Arc::clone(&slot),
                frames,
                bytes,
                arrived: Instant::now(),
            });
            if self.window.is_full(&group) {
                self.filled.notify_one();
            }
            !std::mem::replace(&mut group.leading, true)
        };
        loop {
            if lead {
                self.lead();
            }
            match slot.wait() {
                Some(Outcome::Committed(first)) => return Ok(first),
                Some(Outcome::Failed(failure)) => return Err(failure.to_error(&self.path)),
                Some(Outcome::Refused(error)) => return Err(error),
                None => lead = true,
            }
        }
    }

    /// Leads one group: closes the window, takes the group off the queue, writes and syncs
    /// it with the lock released, hands leadership on and wakes the group's appenders.
    fn lead(&self) {
        let mut group = self.lock_group();
        let (full, window) = loop {
            let Some(oldest) = group.queue.front().map(|pending| pending.arrived) else {
                // Unreachable while the leader's own call is queued; give up leading.
                group.leading = false;
                return;
            };
            let waited = Instant::now().saturating_duration_since(oldest);
            if self.window.is_full(&group) {
                break (true, waited);
            }
            let left = self.window.max_wait.saturating_sub(waited);
            if left.is_zero() {
                break (false, waited);
            }
            group = self
                .filled
                .wait_timeout(group, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        };
        let (mut calls, mut records, mut bytes) = (Vec::new(), 0usize, 0u64);
        while let Some(next) = group.queue.front() {
            let (n, b) = (next.frames.len(), next.bytes);
            let fits = records.saturating_add(n) <= self.window.max_records
                && bytes.saturating_add(b) <= self.window.max_bytes;
            if !calls.is_empty() && !fits {
                break;
            }
            let Some(next) = group.queue.pop_front() else {
                break;
            };
            records += n;
            bytes += b;
            calls.push(next);
        }
        group.queued_records -= records;
        group.queued_bytes -= bytes;
        let mut scratch = std::mem::take(&mut group.scratch);
        drop(group);

        // A panic while writing (a bug: nothing on this path should panic) must not leave
        // `leading` set and every later appender waiting forever: the group fails, the log
        // refuses further appends until reopened (what is on disk is unknown), and
        // leadership is handed on as after any failure.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.write_group(&mut calls, &mut scratch)
        }))
        .unwrap_or_else(|_| {
            self.log
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .poison();
            Err(Failure::Poisoned)
        });

        let mut group = self.lock_group();
        if scratch.capacity() > SCRATCH_KEEP {
            scratch = Vec::new();
        }
        group.scratch = scratch;
        group.stats.groups += 1;
        group.stats.largest_group = group.stats.largest_group.max(records);
        group.stats.full_groups += u64::from(full);
        group.stats.longest_window = group.stats.longest_window.max(window);
        match &result {
            Ok(done) => group.stats.records += done.records as u64,
            Err(_) => group.stats.failed_groups += 1,
        }
        match group.queue.front() {
            Some(next) => next.slot.set(SlotState::Lead),
            None => group.leading = false,
        }
        drop(group);
        match result {
            Ok(GroupDone {
                first: mut seq,
                mut refused,
                ..
            }) => {
                for (i, call) in calls.iter().enumerate() {
                    match refused.iter().position(|(call, _)| *call == i) {
                        Some(at) => {
                            let (_, error) = refused.swap_remove(at);
                            call.slot.set(SlotState::Done(Outcome::Refused(error)));
                        }
                        None => {
                            call.slot.set(SlotState::Done(Outcome::Committed(seq)));
                            seq += call.frames.len() as u64;
                        }
                    }
                }
            }
            Err(failure) => {
                for call in &calls {
                    call.slot
                        .set(SlotState::Done(Outcome::Failed(failure.clone())));
                }
            }
        }
    }

    /// Positions the group's frames after the last whole one and writes them through the
    /// log's one write path (write, preallocation, high-water mark, sync per policy), then
    /// indexes them; on failure cuts them off again. A call whose spilled text cannot be
    /// read back (the second pass, as the group is written) is left out: the write is cut
    /// back and made again without it (a group of more than one call is at most
    /// `max_bytes`, so that is what a retry re-reads), and the call gets its own
    /// [`AppendError::Spill`], as a lone append would; a failure to write fails the group.
    fn write_group(
        &self,
        calls: &mut [Pending],
        scratch: &mut Vec<u8>,
    ) -> Result<GroupDone, Failure> {
        let mut live: Vec<usize> = (0..calls.len()).collect();
        let mut refused = Vec::new();
        // Where a spilled text's chunks are read into (allocated only for one).
        let mut chunk = Vec::new();
        loop {
            let log = self.read_log();
            log.check_writable().map_err(|err| match err {
                AppendError::ReadOnly { .. } => Failure::ReadOnly,
                _ => Failure::Poisoned,
            })?;
            let first = log.len();
            if live.is_empty() {
                return Ok(GroupDone {
                    first,
                    records: 0,
                    refused,
                });
            }
            let mut entries = Vec::new();
            let mut offset = log.end;
            for &i in &live {
                for frame in &mut calls[i].frames {
                    let entry = frame.place(
                        first + entries.len() as u64,
                        format::write_index(entries.len()),
                        offset,
                    );
                    offset += entry.header.frame_len();
                    entries.push(entry);
                }
            }
            let new_end = offset;
            let calls = &*calls;
            let written = log.write_frames(entries.len() as u64, scratch, |gather| {
                for &i in &live {
                    for frame in &calls[i].frames {
                        frame.push_to(gather, &mut chunk).map_err(|failure| {
                            match failure.into_append_error() {
                                Ok(error) => GroupFill::Spill { call: i, error },
                                Err(error) => GroupFill::Io(error),
                            }
                        })?;
                    }
                }
                Ok(new_end)
            });
            drop(log);
            let mut log = self.log.write().unwrap_or_else(PoisonError::into_inner);
            match written {
                Ok(written) => {
                    let records = entries.len();
                    log.commit_write(entries, written);
                    self.acknowledged
                        .1
                        .store(log.size_bytes(), Ordering::Release);
                    self.acknowledged.0.store(log.len(), Ordering::Release);
                    return Ok(GroupDone {
                        first,
                        records,
                        refused,
                    });
                }
                Err(GroupFill::Spill { call, error }) => {
                    // A cut that fails poisons the log: the next round says so to all.
                    log.undo();
                    live.retain(|&i| i != call);
                    refused.push((call, error));
                }
                Err(GroupFill::Io(failure)) => {
                    let offset = log.end;
                    log.undo();
                    return Err(Failure::Io {
                        offset,
                        source: Arc::new(failure),
                    });
                }
            }
        }
    }

    fn lock_group(&self) -> MutexGuard<'_, Group> {
        // Nothing panics while holding the lock; a poisoned one is still consistent.
        self.group.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn read_log(&self) -> RwLockReadGuard<'_, RecordLog> {
        self.log.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl RecordSource for SharedRecordLog {
    type Error = ReadError;

    fn run(&self) -> &RunId {
        &self.run
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, ReadError> {
        self.read_log().record(handle)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, ReadError> {
        self.read_log().output_info(handle)
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, ReadError> {
        self.read_log().read_output(handle, offset, buf)
    }

    fn content_block(
        &self,
        handle: &RecordHandle,
        position: usize,
    ) -> Result<Option<ContentBlock>, ReadError> {
        self.read_log().content_block(handle, position)
    }

    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, ReadError> {
        self.read_log().line_mark(handle, line)
    }

    fn block_lines(&self, handle: &RecordHandle) -> Result<Option<BlockLines>, ReadError> {
        self.read_log().block_lines(handle)
    }
}

/// The record log behind psych-types' record-store seam: the same group commit, the same
/// reads. An I/O failure is [`RecordFailure::Store`](psych_types::RecordFailure::Store) (a local disk is not "unavailable").
impl psych_types::RecordStore for SharedRecordLog {
    type AppendError = AppendError;

    fn failure(&self, error: &AppendError) -> psych_types::RecordFailure {
        match error {
            AppendError::Spill { .. } => psych_types::RecordFailure::Spill,
            AppendError::TooDeep { .. } => psych_types::RecordFailure::TooDeep,
            _ => psych_types::RecordFailure::Store,
        }
    }

    fn append_batch(&self, records: &[Record]) -> Result<Vec<RecordHandle>, AppendError> {
        SharedRecordLog::append_batch(self, records)
    }

    fn append(&self, record: &Record) -> Result<RecordHandle, AppendError> {
        SharedRecordLog::append(self, record)
    }

    fn len(&self) -> u64 {
        SharedRecordLog::len(self)
    }

    fn size_bytes(&self) -> u64 {
        SharedRecordLog::size_bytes(self)
    }

    fn extend_history(&self, history: &mut psych_types::History) -> Result<(), ReadError> {
        SharedRecordLog::extend_history(self, history)
    }

    fn stored_result(
        &self,
        handle: &RecordHandle,
    ) -> Result<Option<psych_types::StoredResult>, ReadError> {
        SharedRecordLog::stored_result(self, handle)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use std::fs::File;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::{FaultyStorage, FileStorage, GroupCommit, Storage, StorageOp};
    use psych_types::UserMessage;

    fn user(text: &str) -> Record {
        Record::User(UserMessage { text: text.into() })
    }

    /// A storage whose next write, once armed, panics: a bug on the leader's I/O path.
    #[derive(Debug, Default)]
    struct PanicOnWrite {
        armed: AtomicBool,
    }

    impl Storage for PanicOnWrite {
        fn write_all_at(&self, file: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
            assert!(
                !self.armed.swap(false, Ordering::SeqCst),
                "injected panic in a group's write"
            );
            FileStorage.write_all_at(file, buf, offset)
        }

        fn set_len(&self, file: &File, len: u64) -> std::io::Result<()> {
            FileStorage.set_len(file, len)
        }

        fn sync_data(&self, file: &File) -> std::io::Result<()> {
            FileStorage.sync_data(file)
        }
    }

    /// The shared log of `run` under `dir`, changing its file through `storage`, whose
    /// groups close at `threads` records: the 1 s window is long enough for that many
    /// threads to join one group, and `max_records` closes it.
    fn group_of(
        threads: usize,
        dir: &Path,
        run: &RunId,
        storage: Arc<dyn Storage>,
    ) -> SharedRecordLog {
        let policy = SyncPolicy::GroupCommit(
            GroupCommit::builder()
                .max_wait(Duration::from_secs(1))
                .max_records(threads)
                .max_bytes(u64::MAX)
                .build()
                .unwrap(),
        );
        let (log, _) = RecordLog::open_with_storage(dir, run, policy, storage).unwrap();
        SharedRecordLog::new(log)
    }

    #[test]
    fn a_failed_group_fails_every_appender_and_is_cut_off() {
        const THREADS: usize = 6;
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("fail").unwrap();
        let faults = Arc::new(FaultyStorage::new());
        let log = group_of(THREADS, dir.path(), &run, faults.clone());
        let kept = log.append(&user("before")).unwrap();
        let end = log.size_bytes();
        faults.fail_next(StorageOp::Sync, 1);
        let log = Arc::new(log);
        let barrier = Arc::new(Barrier::new(THREADS));
        let results: Vec<_> = (0..THREADS)
            .map(|i| {
                let (log, barrier) = (Arc::clone(&log), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    log.append(&user(&format!("lost {i}")))
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect();
        // Every appender gets the group's error itself: the same OS error number.
        for result in &results {
            let err = result.as_ref().unwrap_err();
            assert!(
                matches!(err, AppendError::Io { offset, source, .. }
                    if *offset == end && source.raw_os_error() == Some(5)),
                "{err:?}"
            );
        }
        let stats = log.stats();
        assert_eq!((stats.failed_groups, stats.records), (1, 1), "{stats:?}");
        assert_eq!((log.len(), log.size_bytes()), (1, end));
        // Nothing of the group is readable, and the file was cut back to the group's start
        // (where the end mark is written again).
        assert_eq!(
            log.record(&RecordHandle::new(run.clone(), 1)).unwrap(),
            None
        );
        assert_eq!(
            std::fs::metadata(log.path()).unwrap().len(),
            end + crate::format::END_MARK_LEN as u64
        );
        // The log goes on: the next append takes the failed group's place.
        let next = log.append(&user("after")).unwrap();
        assert_eq!(next.seq, 1);
        drop(log);
        let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
        assert!(recovery.is_clean(), "{recovery}");
        assert_eq!(log.len(), 2);
        assert_eq!(log.record(&kept).unwrap(), Some(user("before")));
        assert_eq!(log.record(&next).unwrap(), Some(user("after")));
    }

    #[test]
    fn a_panic_while_writing_fails_the_group_and_hangs_no_one() {
        const THREADS: usize = 4;
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("panic").unwrap();
        let panics = Arc::new(PanicOnWrite::default());
        let log = group_of(THREADS, dir.path(), &run, panics.clone());
        let kept = log.append(&user("before")).unwrap();
        panics.armed.store(true, Ordering::SeqCst);
        let log = Arc::new(log);
        let barrier = Arc::new(Barrier::new(THREADS));
        let (done, results) = std::sync::mpsc::channel();
        for i in 0..THREADS {
            let (log, barrier, done) = (Arc::clone(&log), Arc::clone(&barrier), done.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let _ = done.send(log.append(&user(&format!("lost {i}"))));
            });
        }
        for _ in 0..THREADS {
            let result = results
                .recv_timeout(Duration::from_secs(20))
                .expect("an appender hung after the leader panicked");
            assert!(
                matches!(result, Err(AppendError::Poisoned { .. })),
                "{result:?}"
            );
        }
        // Later appends are refused rather than written over an unknown tail.
        assert!(matches!(
            log.append(&user("after")),
            Err(AppendError::Poisoned { .. })
        ));
        drop(log);
        let (log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
        assert_eq!(log.record(&kept).unwrap(), Some(user("before")));
    }

    #[test]
    fn a_batch_is_never_split_between_groups() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("batch").unwrap();
        let policy = SyncPolicy::GroupCommit(
            GroupCommit::builder()
                .max_wait(Duration::ZERO)
                .max_records(2)
                .max_bytes(1)
                .build()
                .unwrap(),
        );
        let (log, _) = SharedRecordLog::open(dir.path(), &run, policy).unwrap();
        let batch: Vec<_> = (0..5).map(|i| user(&i.to_string())).collect();
        let handles = log.append_batch(&batch).unwrap();
        assert_eq!(
            handles.iter().map(|h| h.seq).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        assert_eq!(log.stats().groups, 1);
        assert_eq!(log.stats().largest_group, 5);
        assert!(log.append_batch(&[]).unwrap().is_empty());
        assert_eq!(log.stats().groups, 1, "an empty batch writes nothing");
    }

    #[test]
    fn each_waiter_gets_the_group_error_itself() {
        let os = Arc::new(std::io::Error::from_raw_os_error(28));
        let copy = copy_of(&os);
        assert_eq!(
            (copy.raw_os_error(), copy.kind(), copy.to_string()),
            (Some(28), os.kind(), os.to_string())
        );
        let other = Arc::new(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "short write",
        ));
        let copy = copy_of(&other);
        assert_eq!(
            (copy.kind(), copy.to_string()),
            (std::io::ErrorKind::WriteZero, "short write".to_owned())
        );
        let shared = copy
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<Arc<std::io::Error>>())
            .expect("the original is carried");
        assert!(Arc::ptr_eq(shared, &other));
    }

    /// A tool result whose one text block is spilled to `file` (`len` bytes).
    fn spilled_result(file: File, len: u64) -> Record {
        let text = Arc::new(psych_types::SpilledText::new(file, len));
        Record::ToolResult(psych_types::ToolResult {
            target: None,
            call_id: psych_types::ToolCallId::new("c").unwrap(),
            name: "t".into(),
            output: psych_types::ToolOutput {
                spilled: vec![psych_types::SpilledBlock {
                    block: 0,
                    text: Arc::clone(&text),
                }],
                ..psych_types::ToolOutput::from_blocks(vec![psych_types::ContentBlock::text(
                    text.placeholder(),
                )])
            },
        })
    }

    /// Issue 27's limit on group commit: a spilled text that can no longer be read back
    /// when the leader writes the group (its file cut after the append queued) failed
    /// every call of the group. Now its call alone gets its own `AppendError::Spill`; the
    /// others are written, one after another, and the log reopens with them.
    #[test]
    fn a_spilled_text_unreadable_in_a_group_fails_its_call_alone() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("refuse").unwrap();
        let policy = SyncPolicy::GroupCommit(
            GroupCommit::builder()
                .max_wait(Duration::from_millis(10))
                .max_records(3)
                .max_bytes(u64::MAX)
                .build()
                .unwrap(),
        );
        let (log, _) = SharedRecordLog::open(dir.path(), &run, policy).unwrap();
        let log = Arc::new(log);
        let append = |record: Record| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || log.append(&record))
        };
        let queued = |n: usize| {
            while log.lock_group().queue.len() != n {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        // A first group is held at its write (the log's lock taken here), so that the
        // three calls after it queue whatever the time and make the next group together.
        let held = log.log.write().unwrap();
        // What is acknowledged is known without the lock (an async caller asks it): asked
        // from another thread, answered while the lock is held here.
        let (tx, rx) = std::sync::mpsc::channel();
        let asker = Arc::clone(&log);
        std::thread::spawn(move || tx.send((asker.len(), asker.size_bytes())));
        let known = rx.recv_timeout(Duration::from_secs(10));
        assert_eq!(known, Ok((held.len(), held.size_bytes())));
        let first = append(user("first"));
        // Taken off the queue by its leader, who now waits for the lock.
        while {
            let group = log.lock_group();
            !(group.leading && group.queue.is_empty())
        } {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut file = tempfile::tempfile().unwrap();
        let text = "a line of the spilled text\n".repeat(4096);
        file.write_all(text.as_bytes()).unwrap();
        let cut = file.try_clone().unwrap();
        let spilled = append(spilled_result(file, text.len() as u64));
        queued(1);
        let one = append(user("one"));
        queued(2);
        let others = [one, append(user("two"))];
        queued(3);
        // Encoded (its text read once) and queued: now its file loses its end.
        cut.set_len(100).unwrap();
        drop(held);

        assert_eq!(first.join().unwrap().unwrap().seq, 0);
        let refused = spilled.join().unwrap();
        assert!(
            matches!(
                refused,
                Err(AppendError::Spill {
                    block: 0,
                    cause: crate::SpillError::Short { .. },
                    ..
                })
            ),
            "{refused:?}"
        );
        let seqs: Vec<u64> = others
            .into_iter()
            .map(|other| other.join().unwrap().unwrap().seq)
            .collect();
        assert_eq!(seqs, [1, 2]);
        let stats = log.stats();
        assert_eq!(
            (
                stats.groups,
                stats.largest_group,
                stats.records,
                stats.failed_groups
            ),
            (2, 3, 3, 0)
        );
        drop(log);
        let (reopened, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        assert_eq!(reopened.len(), 3);
        for (seq, want) in ["first", "one", "two"].into_iter().enumerate() {
            let record = reopened
                .record(&RecordHandle::new(run.clone(), seq as u64))
                .unwrap();
            assert_eq!(record, Some(user(want)));
        }
    }

    #[test]
    fn a_shared_log_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<SharedRecordLog>();
    }
}
