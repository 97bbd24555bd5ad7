//! Whose results a call's log holds and whose handles it may read: one identity's part of
//! the gateway.
//!
//! A result is logged in its identity's folder, `<dir>/serve/<identity>/`, and its handle
//! works for that identity on any later request, connection or session, and after a
//! restart: the logs are on disk. Each process appends to a segment of its own per
//! identity, `<run>.plog`, opened on the identity's first call (two processes serving one
//! identity, two stdio clients on one `--dir`, never contend for a file lock). A handle of
//! another segment of the folder is read through the [`Kept`] archive; a handle of another
//! identity's folder is never looked up, so it is `invalid_deferred_handle`.
//!
//! A segment's run id is `h` and 26 base-32 characters of 128 random bits, so a handle
//! naming a run that was never minted resolves to no file: guessing one is a 1 in 2^128
//! chance per guess, and the guess would still have to fall in the caller's own folder.
//!
//! Retention ([`Retention`]): whole segments older than the age limit are deleted, then
//! the oldest until the identity's folder fits its size limit; a segment being written
//! (locked by its process) is never deleted. Each deleted run is recorded in the folder's
//! `expired` file, so a handle of it is answered as expired (a failed result saying to
//! call the tool again), not as a handle never minted. The live segment rotates when it
//! reaches an eighth of the size limit (at most 256 MiB), so a busy long-running gateway's
//! results age out too; a quiet identity's live segment (below that size) stays until the
//! process ends, past the age limit if the process runs that long. Sweeps run at start,
//! hourly, and on an identity's folder each time one of its segments opens.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use psych_record_log::RecordLog;
use psych_runtime::{Archive, Archived};
use psych_types::{RecordHandle, RunId};

/// How long and how much of one identity's results are kept, by default.
pub const DEFAULT_RETAIN: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many bytes of one identity's results are kept, by default: 1 GiB.
pub const DEFAULT_RETAIN_BYTES: u64 = 1 << 30;

/// The largest a live segment grows before the next call opens another.
const MAX_SEGMENT: u64 = 256 << 20;

/// How many read-only segments an archive keeps open (each an open file and its index).
const OPEN_SEGMENTS: usize = 16;

/// The `expired` file is cut to its newer half past this size (some 37,000 runs).
const MAX_EXPIRED_BYTES: u64 = 1 << 20;

/// What [`Retention`] keeps of each identity's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Segments last written longer ago than this are deleted.
    pub max_age: Duration,
    /// The oldest segments are deleted until the identity's folder holds at most this.
    pub max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_age: DEFAULT_RETAIN,
            max_bytes: DEFAULT_RETAIN_BYTES,
        }
    }
}

impl Retention {
    /// The size at which a live segment rotates: an eighth of the limit, at most 256 MiB,
    /// at least 1 byte.
    pub(crate) fn rotate_at(&self) -> u64 {
        (self.max_bytes / 8).clamp(1, MAX_SEGMENT)
    }

    /// What an expired handle's reader is told.
    fn expired(&self, handle: &RecordHandle) -> String {
        format!(
            "handle {handle} has expired: psych serve keeps an identity's results for {} and \
             at most {} MiB (psych serve --retain-days, --retain-mib), and this one is gone. \
             Call the tool again for a fresh result.",
            days(self.max_age),
            self.max_bytes >> 20
        )
    }
}

/// `age` in words, in days when it is whole days.
fn days(age: Duration) -> String {
    let secs = age.as_secs();
    if secs.is_multiple_of(86_400) {
        let n = secs / 86_400;
        format!("{n} day{}", if n == 1 { "" } else { "s" })
    } else {
        format!("{secs} s")
    }
}

/// Whether `name` may name an identity: `[A-Za-z0-9_-]{1,64}`, so it is a folder name
/// that cannot climb out of `<dir>/serve/`.
pub(crate) fn valid_identity(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// 128 bits from the system's random source.
///
/// # Errors
///
/// The system's random source failing.
pub(crate) fn random_u128() -> Result<u128, String> {
    let mut bits = [0u8; 16];
    getrandom::fill(&mut bits).map_err(|e| format!("the system's random source: {e}"))?;
    Ok(u128::from_be_bytes(bits))
}

/// A fresh segment's run id: `h` and 128 random bits in lowercase base 32 (26 characters).
///
/// # Errors
///
/// The system's random source failing.
pub(crate) fn fresh_run() -> Result<RunId, String> {
    let mut value = random_u128()?;
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut text = String::with_capacity(27);
    text.push('h');
    for _ in 0..26 {
        text.push(char::from(ALPHABET[(value & 31) as usize]));
        value >>= 5;
    }
    RunId::new(text).map_err(|e| e.to_string())
}

/// One identity's archive: the segments of its folder, read-only, and the runs retention
/// removed from it. See the [module docs](self).
#[derive(Debug)]
pub(crate) struct Kept {
    dir: PathBuf,
    retention: Retention,
    /// The segments opened last, newest at the back, each with its file as it was just
    /// before it was opened.
    open: Mutex<VecDeque<(Arc<RecordLog>, Seen)>>,
    /// The runs being opened now, each with its turn: opening a segment reads every frame
    /// of it, so readers of one run take turns (the first opens it, the rest find it
    /// open) rather than each reading it whole at once. An entry lives while a reader
    /// holds or waits for its turn ([`Kept::end_turn`]).
    opening: Mutex<HashMap<RunId, Arc<Mutex<()>>>>,
}

/// A segment's file as it was just before a copy of it was opened: while it is the same
/// (length and modification time) and was last modified long enough before (coarser file
/// system clocks tick every 2 s), nothing was appended since. (On NFS, attributes cached
/// by the client may hide another host's appends until they are revalidated, up to its
/// `acregmax`: a handle minted there that recently reads as unknown until then.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    len: u64,
    modified: Option<SystemTime>,
    at: SystemTime,
}

/// Within this of its last modification, a file may have been written again without its
/// modification time changing (FAT's clock ticks every 2 s).
const MTIME_TICK: Duration = Duration::from_secs(2);

impl Seen {
    fn of(file: &std::fs::Metadata) -> Self {
        Self {
            len: file.len(),
            modified: file.modified().ok(),
            at: SystemTime::now(),
        }
    }

    /// Whether a copy opened when the file was `self` still holds all of it, the file being
    /// `now`.
    fn unchanged(&self, now: &Self) -> bool {
        self.len == now.len
            && self.modified == now.modified
            && self
                .modified
                .and_then(|modified| self.at.duration_since(modified).ok())
                .is_some_and(|quiet| quiet >= MTIME_TICK)
    }
}

impl Kept {
    /// The archive of the identity folder `dir`.
    pub(crate) fn new(dir: PathBuf, retention: Retention) -> Self {
        Self {
            dir,
            retention,
            open: Mutex::new(VecDeque::new()),
            opening: Mutex::new(HashMap::new()),
        }
    }

    /// The turn to open `run`: shared by every reader opening it now.
    fn turn(&self, run: &RunId) -> Arc<Mutex<()>> {
        let mut opening = self.opening.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(opening.entry(run.clone()).or_default())
    }

    /// Gives back `turn` of `run`, forgetting it when no other reader holds it. This
    /// reader's copy is dropped under the lock, as every copy is taken under it, so the
    /// last of readers ending together sees the map's copy alone and forgets it.
    fn end_turn(&self, run: &RunId, turn: Arc<Mutex<()>>) {
        let mut opening = self.opening.lock().unwrap_or_else(PoisonError::into_inner);
        drop(turn);
        if opening
            .get(run)
            .is_some_and(|shared| Arc::strong_count(shared) == 1)
        {
            opening.remove(run);
        }
    }

    /// `run`'s segment opened read-only and kept open, `now` being its file as it was
    /// before, or why it could not be opened.
    fn open_kept(
        &self,
        run: &RunId,
        now: Seen,
    ) -> Result<Arc<RecordLog>, psych_record_log::OpenError> {
        let (log, _) = RecordLog::open_read_only(&self.dir, run)?;
        let log = Arc::new(log);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        while open.len() >= OPEN_SEGMENTS {
            open.pop_front();
        }
        open.push_back((Arc::clone(&log), now));
        Ok(log)
    }

    /// The open segment of `handle`'s run, when one is open and holds the handle or its
    /// file (`now`) is unchanged since it was opened (else the open one, if any, is
    /// dropped).
    fn cached(&self, handle: &RecordHandle, now: &Seen) -> Option<Arc<RecordLog>> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let at = open.iter().position(|(log, _)| log.run() == &handle.run)?;
        let (log, seen) = open.remove(at)?;
        // A segment another process is still writing: reopened to see what it has
        // appended since, when the handle is past what this copy saw and the file may
        // have changed. (Reopening checks every frame of the segment: a handle past the
        // end of a segment nobody writes, asked again and again, must not read the whole
        // file each time.)
        if handle.seq >= log.len() && !seen.unchanged(now) {
            return None;
        }
        open.push_back((Arc::clone(&log), seen));
        Some(log)
    }

    /// What `handle`, whose run's file is not there, finds: expired if retention removed
    /// it, else nothing (never minted here). The run's open copy, if any, is dropped.
    fn gone(&self, handle: &RecordHandle) -> Archived {
        self.forget(&handle.run);
        if was_expired(&self.dir, &handle.run) {
            Archived::Gone {
                why: self.retention.expired(handle),
            }
        } else {
            Archived::Unknown
        }
    }

    /// Drops the open segment of `run`, if any.
    fn forget(&self, run: &psych_types::RunId) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(log, _)| log.run() != run);
    }
}

impl Archive for Kept {
    fn find(&self, handle: &RecordHandle) -> Archived {
        // The file first, once: a segment retention removed since it was opened (a
        // read-only open holds no lock to keep it) is dropped from the open ones, so that
        // its handles answer that they expired and its disk space is freed.
        let now = std::fs::metadata(RecordLog::path_for(&self.dir, &handle.run))
            .ok()
            .filter(std::fs::Metadata::is_file)
            .map(|file| Seen::of(&file));
        let Some(now) = now else {
            return self.gone(handle);
        };
        if let Some(log) = self.cached(handle, &now) {
            return Archived::Log(log);
        }
        // One reader of a run opens it; one that came meanwhile waits its turn and then
        // finds it open (unless the handle is past what that copy saw of a segment still
        // changing: then it opens it again).
        let turn = self.turn(&handle.run);
        let found = {
            let _turn = turn.lock().unwrap_or_else(PoisonError::into_inner);
            match self.cached(handle, &now) {
                Some(log) => Archived::Log(log),
                None => match self.open_kept(&handle.run, now) {
                    Ok(log) => Archived::Log(log),
                    // Removed by retention while this reader waited its turn.
                    Err(psych_record_log::OpenError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        self.gone(handle)
                    }
                    Err(error) => Archived::Failed(error),
                },
            }
        };
        self.end_turn(&handle.run, turn);
        found
    }
}

/// One identity's archive on a shared store (the PostgreSQL store): any Run of the identity
/// there, whichever process wrote it, read through the store, whose queries name the
/// identity (another identity's Run of the same name is not found); a Run retention
/// deleted answers that it expired, as a deleted segment does.
#[derive(Debug)]
pub(crate) struct InStore {
    stores: std::sync::Arc<dyn psych_types::RecordStores>,
    identity: String,
    retention: Retention,
}

impl InStore {
    /// The archive of `identity` in `stores`, kept for `retention`.
    pub(crate) fn new(
        stores: std::sync::Arc<dyn psych_types::RecordStores>,
        identity: &str,
        retention: Retention,
    ) -> Self {
        Self {
            stores,
            identity: identity.to_owned(),
            retention,
        }
    }
}

impl Archive for InStore {
    fn find(&self, handle: &RecordHandle) -> Archived {
        match self.stores.find(&self.identity, &handle.run) {
            Ok(Some(store)) => Archived::Store(store),
            Ok(None) => match self.stores.expired(&self.identity, &handle.run) {
                Ok(Some(_)) => Archived::Gone {
                    why: self.retention.expired(handle),
                },
                Ok(None) => Archived::Unknown,
                Err(error) => Archived::StoreFailed(error),
            },
            Err(error) => Archived::StoreFailed(error),
        }
    }
}

/// Applies `retention` to a shared store's Runs (every identity's; one replica at a time),
/// saying on `report` when the store fails. Blocks.
pub(crate) fn sweep_store(
    stores: &dyn psych_types::RecordStores,
    retention: Retention,
    report: &(dyn Fn(&str) + Send + Sync),
) {
    if let Err(error) = stores.sweep(retention.max_age, retention.max_bytes) {
        report(&format!(
            "retention of the store's Runs did not finish (tried again in an hour): {}",
            psych_types::error_chain(&error)
        ));
    }
}

/// Whether `run` is in `dir`'s `expired` file.
fn was_expired(dir: &Path, run: &RunId) -> bool {
    std::fs::read_to_string(dir.join("expired"))
        .is_ok_and(|text| text.lines().any(|line| line == run.as_str()))
}

/// A segment file of an identity folder, as the sweep sees it.
struct Segment {
    path: PathBuf,
    run: String,
    /// Its bytes and its side files'.
    len: u64,
    modified: SystemTime,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Swept {
    /// The runs deleted.
    pub(crate) deleted: Vec<String>,
}

/// Applies `retention` to every identity folder under `logs` (`<dir>/serve/`). Blocks
/// (directory reads, deletions): call it off the async workers. Errors on one file are
/// skipped: a sweep never fails the gateway.
pub(crate) fn sweep(logs: &Path, retention: Retention) -> Swept {
    let mut swept = Swept::default();
    let Ok(entries) = std::fs::read_dir(logs) else {
        return swept;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            sweep_identity(&entry.path(), retention, SystemTime::now(), &mut swept);
        }
    }
    swept
}

/// Applies `retention` to the one identity folder `dir` now. Blocks, as [`sweep`].
pub(crate) fn sweep_folder(dir: &Path, retention: Retention) {
    sweep_identity(dir, retention, SystemTime::now(), &mut Swept::default());
}

/// Applies `retention` to one identity folder as of `now`.
fn sweep_identity(dir: &Path, retention: Retention, now: SystemTime, swept: &mut Swept) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let entries: Vec<std::fs::DirEntry> = entries.flatten().collect();
    let names: Vec<String> = entries
        .iter()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    delete_orphaned_side_files(dir, &names);
    let mut segments: Vec<Segment> = entries
        .into_iter()
        .filter_map(|entry| {
            let path = entry.path();
            let run = path
                .file_name()?
                .to_str()?
                .strip_suffix(".plog")?
                .to_owned();
            let meta = entry.metadata().ok()?;
            // Created and not yet locked by its writer (the record log locks a new file
            // before it writes its header): never a candidate.
            if meta.len() == 0 {
                return None;
            }
            // Its checkpoint counts with it: the folder holds both (16 bytes a frame).
            let sides: u64 = RecordLog::side_files(&path)
                .iter()
                .filter_map(|side| std::fs::metadata(side).ok())
                .map(|side| side.len())
                .sum();
            Some(Segment {
                len: meta.len().saturating_add(sides),
                path,
                run,
                modified: meta.modified().ok()?,
            })
        })
        .collect();
    segments.sort_by_key(|s| s.modified);
    let mut total: u64 = segments.iter().map(|s| s.len).sum();
    let mut deleted = Vec::new();
    for segment in segments {
        let old = now
            .duration_since(segment.modified)
            .is_ok_and(|age| age > retention.max_age);
        if !old && total <= retention.max_bytes {
            continue;
        }
        if delete_unless_written(&segment.path) {
            total = total.saturating_sub(segment.len);
            deleted.push(segment.run);
        }
    }
    if !deleted.is_empty() {
        record_expired(dir, &deleted);
        swept.deleted.extend(deleted);
    }
}

/// Deletes the segment at `path`, and the files the record log keeps beside it
/// ([`RecordLog::side_files`]: its checkpoint), unless a process holds its lock (it is
/// being written).
fn delete_unless_written(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    // The record log locks its file for as long as it is open for writing; holding the
    // lock while the file is removed keeps a writer from opening it in between.
    if file.try_lock().is_err() {
        return false;
    }
    if std::fs::remove_file(path).is_err() {
        return false;
    }
    for side in RecordLog::side_files(path) {
        let _ = std::fs::remove_file(side);
    }
    true
}

/// Deletes the side files ([`RecordLog::side_files`]) in `dir` whose segment is gone (a
/// segment an earlier build deleted without them): `names` are the folder's file names.
fn delete_orphaned_side_files(dir: &Path, names: &[String]) {
    let present: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    for name in names {
        if RecordLog::side_file_log(name).is_some_and(|log| !present.contains(log)) {
            let _ = std::fs::remove_file(dir.join(name));
        }
    }
}

/// Appends `runs` to `dir`'s `expired` file, cut to its newer half when it grew past
/// [`MAX_EXPIRED_BYTES`] (written to a new file renamed over it, so a reader never sees
/// it half written; a run another process appends between the read and the rename is
/// lost, and its handle reads as never minted).
fn record_expired(dir: &Path, runs: &[String]) {
    let path = dir.join("expired");
    if std::fs::metadata(&path).is_ok_and(|m| m.len() > MAX_EXPIRED_BYTES)
        && let Ok(text) = std::fs::read_to_string(&path)
    {
        let lines: Vec<&str> = text.lines().collect();
        let kept = lines[lines.len() / 2..].join("\n");
        let fresh = dir.join(format!("expired.{}", std::process::id()));
        if std::fs::write(&fresh, format!("{kept}\n")).is_ok() {
            let _ = std::fs::rename(&fresh, &path);
        }
    }
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let _ = file.write_all(format!("{}\n", runs.join("\n")).as_bytes());
    }
}

/// Counts the calls of one identity in this process: each call's id in its log.
#[derive(Debug, Default)]
pub(crate) struct Calls(AtomicU64);

impl Calls {
    /// The next call's number.
    pub(crate) fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_record_log::SyncPolicy;
    use psych_types::{Record, ToolCallId, ToolOutput, ToolResult};

    fn result(text: &str) -> Record {
        Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new("c").unwrap_or_else(|_| unreachable!()),
            name: "t".into(),
            output: ToolOutput::text(text),
        })
    }

    #[test]
    fn run_ids_are_fresh_and_valid() {
        let a = fresh_run().unwrap_or_else(|e| panic!("{e}"));
        let b = fresh_run().unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 27);
        assert!(a.as_str().starts_with('h'));
    }

    #[test]
    fn identity_names_stay_in_their_folder() {
        for good in ["stdio", "alice", "ci-bot_2"] {
            assert!(valid_identity(good), "{good}");
        }
        for bad in ["", "..", "a/b", "a b", &"x".repeat(65)] {
            assert!(!valid_identity(bad), "{bad}");
        }
    }

    #[test]
    fn the_sweep_deletes_by_size_oldest_first_never_a_written_segment_and_says_expired() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = root.path().join("alice");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let mut handles = Vec::new();
        for n in 0..3 {
            let run = RunId::new(format!("r{n}")).unwrap_or_else(|e| panic!("{e}"));
            let (mut log, _) = RecordLog::open(&dir, &run, SyncPolicy::OsBuffered)
                .unwrap_or_else(|e| panic!("{e}"));
            handles.push(
                log.append(&result(&"x".repeat(10_000)))
                    .unwrap_or_else(|e| panic!("{e}")),
            );
        }
        // Distinct modification times, oldest first, whatever the file system's clock.
        for n in 0..3u64 {
            let path = RecordLog::path_for(&dir, &handles[n as usize].run);
            let file = std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("{e}"));
            file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + n))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        // The newest is being written.
        let (_writer, _) = RecordLog::open(
            &dir,
            &RunId::new("r2").unwrap_or_else(|e| panic!("{e}")),
            SyncPolicy::OsBuffered,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let retention = Retention {
            max_age: DEFAULT_RETAIN,
            max_bytes: 1,
        };
        let swept = sweep(root.path(), retention);
        assert_eq!(
            swept.deleted,
            ["r0", "r1"],
            "oldest first, the written one kept"
        );
        assert!(RecordLog::path_for(&dir, &handles[2].run).is_file());

        let kept = Kept::new(dir.clone(), retention);
        match kept.find(&handles[0]) {
            Archived::Gone { why } => assert!(why.contains("has expired"), "{why}"),
            other => panic!("expired: {other:?}"),
        }
        assert!(matches!(kept.find(&handles[2]), Archived::Log(_)));
        let never = RecordHandle::new(fresh_run().unwrap_or_else(|e| panic!("{e}")), 0);
        assert!(matches!(kept.find(&never), Archived::Unknown));
    }

    /// Readers of one segment at once open it once: the first reads its frames, the rest
    /// wait their turn and find it open; nothing of the turns is left after.
    #[test]
    fn readers_of_one_segment_at_once_open_it_once() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = root.path().join("dave");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let run = RunId::new("large").unwrap_or_else(|e| panic!("{e}"));
        let handles: Vec<RecordHandle> = {
            let (mut log, _) = RecordLog::open(&dir, &run, SyncPolicy::OsBuffered)
                .unwrap_or_else(|e| panic!("{e}"));
            (0..2_000)
                .map(|n| {
                    log.append(&result(&format!("{n}{}", "x".repeat(8_000))))
                        .unwrap_or_else(|e| panic!("{e}"))
                })
                .collect()
        };
        let kept = Kept::new(dir, Retention::default());
        let readers = 8;
        let start = std::sync::Barrier::new(readers);
        let found: Vec<Arc<RecordLog>> = std::thread::scope(|scope| {
            let reading: Vec<_> = (0..readers)
                .map(|n| {
                    let (kept, start, handle) = (&kept, &start, &handles[n * 100]);
                    scope.spawn(move || {
                        start.wait();
                        match kept.find(handle) {
                            Archived::Log(log) => log,
                            other => panic!("not found: {other:?}"),
                        }
                    })
                })
                .collect();
            reading
                .into_iter()
                .map(|reader| {
                    reader
                        .join()
                        .unwrap_or_else(|_| panic!("a reader panicked"))
                })
                .collect()
        });
        assert!(
            found.iter().all(|log| Arc::ptr_eq(log, &found[0])),
            "each reader opened a copy of its own"
        );
        assert_eq!(found[0].len(), 2_000);
        assert!(no_turns(&kept), "the turns are forgotten");
    }

    /// A segment retention removes while a reader waits its turn to open it answers that
    /// it expired, as one removed before the reader came does.
    #[test]
    fn a_segment_removed_while_a_reader_waits_its_turn_expired() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (dir, handle) = one_result(root.path(), "erin", "removed-meanwhile");
        let run = handle.run.clone();
        let kept = Kept::new(dir.clone(), Retention::default());
        // Another reader's turn, held while the file goes.
        let turn = kept.turn(&run);
        let held = turn.lock().unwrap_or_else(PoisonError::into_inner);
        let found = std::thread::scope(|scope| {
            let reader = scope.spawn(|| kept.find(&handle));
            // The reader has taken its copy of the turn and waits for it (one that does not
            // wait fails the test rather than hang it).
            let waited = std::time::Instant::now();
            while Arc::strong_count(&turn) < 3 {
                assert!(!reader.is_finished(), "the reader did not wait its turn");
                assert!(waited.elapsed() < Duration::from_secs(30), "no turn taken");
                std::thread::yield_now();
            }
            std::fs::remove_file(RecordLog::path_for(&dir, &run)).unwrap_or_else(|e| panic!("{e}"));
            record_expired(&dir, &[run.as_str().to_owned()]);
            drop(held);
            reader
                .join()
                .unwrap_or_else(|_| panic!("the reader panicked"))
        });
        match found {
            Archived::Gone { why } => assert!(why.contains("has expired"), "{why}"),
            other => panic!("expired: {other:?}"),
        }
        kept.end_turn(&run, turn);
        assert!(no_turns(&kept), "the turns are forgotten");
    }

    /// Whether `kept` holds no turn: every reader's is forgotten.
    fn no_turns(kept: &Kept) -> bool {
        kept.opening
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// A segment `run` of one result in `identity`'s folder under `root`: the folder and
    /// the result's handle.
    fn one_result(root: &Path, identity: &str, run: &str) -> (PathBuf, RecordHandle) {
        let dir = root.join(identity);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let run = RunId::new(run).unwrap_or_else(|e| panic!("{e}"));
        let (mut log, _) =
            RecordLog::open(&dir, &run, SyncPolicy::OsBuffered).unwrap_or_else(|e| panic!("{e}"));
        let handle = log
            .append(&result("kept a while"))
            .unwrap_or_else(|e| panic!("{e}"));
        (dir, handle)
    }

    #[test]
    fn a_segment_swept_after_it_was_read_answers_that_it_expired() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (dir, handle) = one_result(root.path(), "carol", "read-then-swept");
        let retention = Retention {
            max_age: DEFAULT_RETAIN,
            max_bytes: 1,
        };
        let kept = Kept::new(dir.clone(), retention);
        assert!(matches!(kept.find(&handle), Archived::Log(_)));
        assert_eq!(sweep(root.path(), retention).deleted, ["read-then-swept"]);
        match kept.find(&handle) {
            Archived::Gone { why } => assert!(why.contains("has expired"), "{why}"),
            other => panic!("expired: {other:?}"),
        }
    }

    /// A handle past the end of a segment asked again and again reopens it (checking every
    /// frame) only when its file has grown since: the copy already open answers otherwise.
    /// (Before, each such request reopened the whole segment.)
    #[test]
    fn a_handle_past_the_end_reopens_a_segment_only_when_it_grew() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = root.path().join("dave");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let run = RunId::new("growing").unwrap_or_else(|e| panic!("{e}"));
        let (mut writer, _) =
            RecordLog::open(&dir, &run, SyncPolicy::OsBuffered).unwrap_or_else(|e| panic!("{e}"));
        let first = writer
            .append(&result("one"))
            .unwrap_or_else(|e| panic!("{e}"));
        // Last written long ago: a copy opened now holds all of it.
        std::fs::File::options()
            .write(true)
            .open(RecordLog::path_for(&dir, &run))
            .and_then(|file| file.set_modified(SystemTime::now() - Duration::from_secs(60)))
            .unwrap_or_else(|e| panic!("{e}"));
        let kept = Kept::new(dir.clone(), Retention::default());
        let log_of = |handle: &RecordHandle| match kept.find(handle) {
            Archived::Log(log) => log,
            other => panic!("a log: {other:?}"),
        };
        let opened = log_of(&first);
        let past = RecordHandle::new(run.clone(), 1_000_000);
        for _ in 0..3 {
            assert!(Arc::ptr_eq(&log_of(&past), &opened), "not reopened");
        }
        let second = writer
            .append(&result("two"))
            .unwrap_or_else(|e| panic!("{e}"));
        // Modified at a time not long enough before it is opened (here ahead of the clock,
        // so that no stall of the machine makes it look long past): a write within the
        // file system's clock tick would not show, so a handle past its end reopens it
        // again though nothing changed.
        std::fs::File::options()
            .write(true)
            .open(RecordLog::path_for(&dir, &run))
            .and_then(|file| file.set_modified(SystemTime::now() + Duration::from_secs(3600)))
            .unwrap_or_else(|e| panic!("{e}"));
        let reopened = log_of(&second);
        assert!(!Arc::ptr_eq(&reopened, &opened), "reopened: it changed");
        assert!(second.seq < reopened.len());
        assert!(!Arc::ptr_eq(&log_of(&past), &reopened), "reopened: recent");
    }

    #[test]
    fn the_sweep_deletes_by_age() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = root.path().join("bob");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let run = RunId::new("old").unwrap_or_else(|e| panic!("{e}"));
        drop(RecordLog::open(&dir, &run, SyncPolicy::OsBuffered).unwrap_or_else(|e| panic!("{e}")));
        let mut swept = Swept::default();
        let later = SystemTime::now() + Duration::from_secs(3600);
        let retention = Retention {
            max_age: Duration::from_secs(60),
            max_bytes: DEFAULT_RETAIN_BYTES,
        };
        sweep_identity(&dir, retention, later, &mut swept);
        assert_eq!(swept.deleted, ["old"]);
        assert!(was_expired(&dir, &run));
    }

    /// A segment's checkpoint counts against `max_bytes` with it: the folder holds both.
    #[test]
    fn a_segments_checkpoint_counts_against_the_bytes_kept() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (dir, older) = one_result(root.path(), "frank", "older");
        let (_, newer) = one_result(root.path(), "frank", "newer");
        let path = |handle: &RecordHandle| RecordLog::path_for(&dir, &handle.run);
        for (n, handle) in [&older, &newer].into_iter().enumerate() {
            std::fs::File::options()
                .write(true)
                .open(path(handle))
                .and_then(|file| {
                    file.set_modified(SystemTime::now() - Duration::from_secs(100 - n as u64))
                })
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let checkpoint = 1_000;
        for file in RecordLog::side_files(path(&newer)).into_iter().take(1) {
            std::fs::write(file, vec![0u8; checkpoint]).unwrap_or_else(|e| panic!("{e}"));
        }
        let logs: u64 = [&older, &newer]
            .iter()
            .map(|handle| {
                std::fs::metadata(path(handle))
                    .unwrap_or_else(|e| panic!("{e}"))
                    .len()
            })
            .sum();
        let retention = Retention {
            max_age: DEFAULT_RETAIN,
            max_bytes: logs + checkpoint as u64 - 1,
        };
        let mut swept = Swept::default();
        sweep_identity(&dir, retention, SystemTime::now(), &mut swept);
        assert_eq!(
            swept.deleted,
            ["older"],
            "one byte over, with the checkpoint"
        );
        assert!(path(&newer).is_file());
    }

    /// A deleted segment's checkpoint goes with it, and one whose segment an earlier build
    /// deleted alone is deleted at the next sweep; a kept segment's stays.
    #[test]
    fn the_sweep_deletes_a_segments_side_files_with_it() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = root.path().join("bob");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let run = |name: &str| RunId::new(name).unwrap_or_else(|e| panic!("{e}"));
        let (old, kept) = (run("old"), run("kept"));
        let side = |run: &RunId| RecordLog::side_files(RecordLog::path_for(&dir, run));
        for run in [&old, &kept] {
            drop(
                RecordLog::open(&dir, run, SyncPolicy::OsBuffered)
                    .unwrap_or_else(|e| panic!("{e}")),
            );
            for file in side(run) {
                std::fs::write(file, b"checkpoint").unwrap_or_else(|e| panic!("{e}"));
            }
        }
        // A recent write keeps `kept`; `gone`'s segment was deleted before, alone.
        std::fs::File::options()
            .write(true)
            .open(RecordLog::path_for(&dir, &kept))
            .and_then(|file| file.set_modified(SystemTime::now() + Duration::from_secs(3600)))
            .unwrap_or_else(|e| panic!("{e}"));
        let orphans = side(&run("gone"));
        for file in &orphans {
            std::fs::write(file, b"checkpoint").unwrap_or_else(|e| panic!("{e}"));
        }
        let retention = Retention {
            max_age: Duration::from_secs(60),
            max_bytes: DEFAULT_RETAIN_BYTES,
        };
        let later = SystemTime::now() + Duration::from_secs(3600);
        let mut swept = Swept::default();
        sweep_identity(&dir, retention, later, &mut swept);
        assert_eq!(swept.deleted, ["old"]);
        for file in side(&old).iter().chain(&orphans) {
            assert!(!file.exists(), "{} left", file.display());
        }
        for file in side(&kept) {
            assert!(file.exists(), "{} deleted", file.display());
        }
    }
}
