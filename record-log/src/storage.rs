//! The storage seam: the file operations through which a log changes its file
//! ([`Storage`]), the real one ([`FileStorage`]) and a fault-injecting one for tests
//! ([`FaultyStorage`]).

use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The operations through which a [`RecordLog`](crate::RecordLog) changes its file: every
/// positional write (frames, the high-water mark, preallocated zeros, a new file's header),
/// every change of length (cutting a torn tail or a failed append back, giving
/// preallocated zeros back) and every `fdatasync`. Reads, the file lock and the checkpoint
/// side file do not go through it.
///
/// The log calls these with its own open file; an implementation decides whether to carry
/// them out. [`FileStorage`] (what [`RecordLog::open`](crate::RecordLog::open) uses) does
/// exactly that; [`FaultyStorage`] fails chosen operations, to test what the log promises
/// when a write or a sync fails ([`RecordLog::open_with_storage`](crate::RecordLog::open_with_storage)).
/// The calls block the thread as the file operations do.
pub trait Storage: Send + Sync + fmt::Debug {
    /// Writes all of `buf` at byte `offset` of `file` (`FileExt::write_all_at`).
    ///
    /// # Errors
    ///
    /// The operating system's error, or an injected one.
    fn write_all_at(&self, file: &File, buf: &[u8], offset: u64) -> std::io::Result<()>;

    /// Cuts or extends `file` to `len` bytes (`File::set_len`).
    ///
    /// # Errors
    ///
    /// The operating system's error, or an injected one.
    fn set_len(&self, file: &File, len: u64) -> std::io::Result<()>;

    /// Makes `file`'s data durable (`File::sync_data`, `fdatasync`).
    ///
    /// # Errors
    ///
    /// The operating system's error, or an injected one.
    fn sync_data(&self, file: &File) -> std::io::Result<()>;
}

/// The real storage: each operation is the file operation of the same name.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileStorage;

impl Storage for FileStorage {
    fn write_all_at(&self, file: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
        file.write_all_at(buf, offset)
    }

    fn set_len(&self, file: &File, len: u64) -> std::io::Result<()> {
        file.set_len(len)
    }

    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        file.sync_data()
    }
}

/// One of the operations of [`Storage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StorageOp {
    /// [`Storage::write_all_at`].
    Write,
    /// [`Storage::set_len`].
    SetLen,
    /// [`Storage::sync_data`].
    Sync,
}

impl StorageOp {
    fn index(self) -> usize {
        match self {
            StorageOp::Write => 0,
            StorageOp::SetLen => 1,
            StorageOp::Sync => 2,
        }
    }
}

/// A test seam, not a storage to run on: [`FileStorage`] that fails chosen operations on
/// demand, so that a test (this crate's, or a user's of their own handling of a failed
/// append) can see what the log does when a write, a cut or a sync fails. A failed
/// operation does nothing and returns the operating system's `EIO` (raw error 5). It counts
/// every call, failed or not.
///
/// It is public so that integration tests, which see only the public API, can use it; it
/// holds no state that the log depends on and is never used unless given to
/// [`RecordLog::open_with_storage`](crate::RecordLog::open_with_storage).
///
/// ```
/// use std::sync::Arc;
///
/// use psych_record_log::{AppendError, FaultyStorage, RecordLog, StorageOp, SyncPolicy};
/// use psych_types::{Record, RunId, UserMessage};
///
/// let dir = tempfile::tempdir()?;
/// let faults = Arc::new(FaultyStorage::new());
/// let run = RunId::new("run-7")?;
/// let (mut log, _) =
///     RecordLog::open_with_storage(dir.path(), &run, SyncPolicy::EveryAppend, faults.clone())?;
/// faults.fail_next(StorageOp::Sync, 1);
/// let err = log.append(&Record::User(UserMessage { text: "hi".into() })).unwrap_err();
/// assert!(matches!(&err, AppendError::Io { source, .. } if source.raw_os_error() == Some(5)));
/// assert_eq!(log.len(), 0); // cut back: nothing was acknowledged
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Default)]
pub struct FaultyStorage {
    /// Per operation: how many of the next calls fail.
    failing: [AtomicU64; 3],
    /// Per operation: calls so far.
    calls: [AtomicU64; 3],
}

/// `EIO`, the same number on Linux and the BSDs (macOS included).
const EIO: i32 = 5;

impl FaultyStorage {
    /// A storage that fails nothing until told to.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the next `times` calls of `op` fail (`u64::MAX`: every call from now on);
    /// replaces what was set for `op` before (0 heals it).
    pub fn fail_next(&self, op: StorageOp, times: u64) {
        self.failing[op.index()].store(times, Ordering::SeqCst);
    }

    /// How many times `op` was called, failed calls included.
    pub fn calls(&self, op: StorageOp) -> u64 {
        self.calls[op.index()].load(Ordering::SeqCst)
    }

    /// Counts a call of `op`; the injected error when it is to fail.
    fn check(&self, op: StorageOp) -> std::io::Result<()> {
        self.calls[op.index()].fetch_add(1, Ordering::SeqCst);
        let failing = &self.failing[op.index()];
        let fail = failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| match left {
                0 => None,
                u64::MAX => Some(u64::MAX),
                left => Some(left - 1),
            })
            .is_ok();
        if fail {
            Err(std::io::Error::from_raw_os_error(EIO))
        } else {
            Ok(())
        }
    }
}

impl fmt::Debug for FaultyStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let load =
            |counters: &[AtomicU64; 3]| counters.each_ref().map(|c| c.load(Ordering::SeqCst));
        f.debug_struct("FaultyStorage")
            .field("failing [write, set_len, sync]", &load(&self.failing))
            .field("calls [write, set_len, sync]", &load(&self.calls))
            .finish()
    }
}

impl Storage for FaultyStorage {
    fn write_all_at(&self, file: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.check(StorageOp::Write)?;
        FileStorage.write_all_at(file, buf, offset)
    }

    fn set_len(&self, file: &File, len: u64) -> std::io::Result<()> {
        self.check(StorageOp::SetLen)?;
        FileStorage.set_len(file, len)
    }

    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        self.check(StorageOp::Sync)?;
        FileStorage.sync_data(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_counted_down_and_healed() {
        let storage = FaultyStorage::new();
        storage.fail_next(StorageOp::Sync, 2);
        assert_eq!(
            storage.check(StorageOp::Sync).unwrap_err().raw_os_error(),
            Some(EIO)
        );
        assert!(storage.check(StorageOp::Sync).is_err());
        assert!(storage.check(StorageOp::Sync).is_ok());
        assert!(storage.check(StorageOp::Write).is_ok());
        storage.fail_next(StorageOp::Write, u64::MAX);
        for _ in 0..3 {
            assert!(storage.check(StorageOp::Write).is_err());
        }
        storage.fail_next(StorageOp::Write, 0);
        assert!(storage.check(StorageOp::Write).is_ok());
        assert_eq!(storage.calls(StorageOp::Sync), 3);
        assert_eq!(storage.calls(StorageOp::Write), 5);
        assert_eq!(storage.calls(StorageOp::SetLen), 0);
    }
}
