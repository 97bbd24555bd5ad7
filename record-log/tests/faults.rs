//! The failure paths the docs promise, driven through the storage seam
//! ([`FaultyStorage`]): a failed write or sync is cut back and nothing is acknowledged; a
//! failed cut-back poisons the log; a failed `sync()` is reported and poisons it; an empty
//! batch writes and syncs nothing on either log; a shared log gives its records, handles
//! and recovery as the single-writer log does.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::path::Path;
use std::sync::Arc;

use psych_record_log::{
    AppendError, FaultyStorage, RecordLog, SharedRecordLog, StorageOp, SyncPolicy,
};
use psych_types::{LoggedRecord, RecordSource};

/// `EIO`, what the faulty storage fails with.
const EIO: i32 = 5;

fn open(dir: &Path, run: &str, policy: SyncPolicy) -> (RecordLog, Arc<FaultyStorage>) {
    let faults = Arc::new(FaultyStorage::new());
    let (log, recovery) =
        RecordLog::open_with_storage(dir, &common::run(run), policy, faults.clone()).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    (log, faults)
}

fn file_len(log: &RecordLog) -> u64 {
    std::fs::metadata(log.path()).unwrap().len()
}

fn is_eio(err: &AppendError) -> bool {
    matches!(err, AppendError::Io { source, .. } if source.raw_os_error() == Some(EIO))
}

#[test]
fn a_failed_sync_is_cut_back_and_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, faults) = open(dir.path(), "sync", SyncPolicy::EveryAppend);
    let kept = log.append(&common::user("kept")).unwrap();
    let end = log.size_bytes();
    faults.fail_next(StorageOp::Sync, 1);
    let err = log.append(&common::text_result("lost")).unwrap_err();
    assert!(is_eio(&err), "{err:?}");
    assert!(matches!(err, AppendError::Io { offset, .. } if offset == end));
    // Nothing acknowledged, nothing indexed, and the file cut back to the last whole frame
    // and its end mark.
    assert_eq!(
        (log.len(), log.size_bytes(), file_len(&log)),
        (1, end, end + common::END_MARK)
    );
    let next = log.append(&common::user("next")).unwrap();
    assert_eq!(next.seq, 1, "the failed record's place is taken again");
    let path = log.path().to_path_buf();
    drop(log);
    let (log, recovery) = RecordLog::open(
        path.parent().unwrap(),
        &common::run("sync"),
        SyncPolicy::EveryAppend,
    )
    .unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.record(&kept).unwrap(), Some(common::user("kept")));
    assert_eq!(log.record(&next).unwrap(), Some(common::user("next")));
    assert_eq!(log.len(), 2);
}

#[test]
fn a_failed_sync_puts_the_end_mark_back_so_the_log_reopens_clean() {
    // The failed append's write went over the end mark; cutting it back writes the mark
    // again after the last whole frame, so closing now loses nothing and reports nothing.
    let dir = tempfile::tempdir().unwrap();
    let (mut log, faults) = open(dir.path(), "mark", SyncPolicy::EveryAppend);
    let kept = log.append(&common::user("kept")).unwrap();
    faults.fail_next(StorageOp::Sync, 1);
    assert!(is_eio(
        &log.append(&common::text_result("lost")).unwrap_err()
    ));
    let path = log.path().to_path_buf();
    drop(log);
    let (log, recovery) = RecordLog::open(
        path.parent().unwrap(),
        &common::run("mark"),
        SyncPolicy::EveryAppend,
    )
    .unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.len(), 1);
    assert_eq!(log.record(&kept).unwrap(), Some(common::user("kept")));
}

#[test]
fn a_failed_write_is_cut_back_too() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, faults) = open(dir.path(), "write", SyncPolicy::EveryAppend);
    log.append(&common::user("kept")).unwrap();
    let end = log.size_bytes();
    faults.fail_next(StorageOp::Write, 1);
    let batch = [common::user("a"), common::text_result("b")];
    assert!(is_eio(&log.append_batch(&batch).unwrap_err()));
    assert_eq!((log.len(), file_len(&log)), (1, end + common::END_MARK));
    assert_eq!(log.append_batch(&batch).unwrap().len(), 2);
}

#[test]
fn a_failed_cut_back_poisons_the_log_until_it_is_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, faults) = open(dir.path(), "poison", SyncPolicy::EveryAppend);
    let kept = log.append(&common::user("kept")).unwrap();
    faults.fail_next(StorageOp::Sync, 1);
    faults.fail_next(StorageOp::SetLen, 1);
    assert!(is_eio(&log.append(&common::user("lost")).unwrap_err()));
    // What is on disk past the last whole frame is unknown: no more appends or syncs.
    assert!(matches!(
        log.append(&common::user("refused")),
        Err(AppendError::Poisoned { .. })
    ));
    assert!(matches!(log.sync(), Err(AppendError::Poisoned { .. })));
    // Reads go on.
    assert_eq!(log.record(&kept).unwrap(), Some(common::user("kept")));
    let path = log.path().to_path_buf();
    drop(log);
    // Reopening recovers: the acknowledged record is there; the unacknowledged frame may be
    // too (it was written whole; a crash there would leave the same file).
    let (mut log, _) = RecordLog::open(
        path.parent().unwrap(),
        &common::run("poison"),
        SyncPolicy::EveryAppend,
    )
    .unwrap();
    assert_eq!(log.record(&kept).unwrap(), Some(common::user("kept")));
    assert!(log.append(&common::user("after")).is_ok());
}

#[test]
fn a_failed_sync_call_is_reported_and_poisons_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, faults) = open(dir.path(), "buffered", SyncPolicy::OsBuffered);
    let syncs = faults.calls(StorageOp::Sync);
    log.append(&common::user("buffered")).unwrap();
    assert_eq!(
        faults.calls(StorageOp::Sync),
        syncs,
        "OsBuffered appends do not sync"
    );
    faults.fail_next(StorageOp::Sync, 1);
    let err = log.sync().unwrap_err();
    assert!(is_eio(&err), "{err:?}");
    // After a failed fdatasync the kernel may have dropped the dirty pages: the log cannot
    // tell what is durable, so it takes nothing more.
    assert!(matches!(log.sync(), Err(AppendError::Poisoned { .. })));
    assert!(matches!(
        log.append(&common::user("refused")),
        Err(AppendError::Poisoned { .. })
    ));
}

#[test]
fn an_empty_batch_writes_and_syncs_nothing_on_either_log() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, faults) = open(dir.path(), "empty", SyncPolicy::EveryAppend);
    let (writes, syncs) = (
        faults.calls(StorageOp::Write),
        faults.calls(StorageOp::Sync),
    );
    let size = file_len(&log);
    assert!(log.append_batch(&[]).unwrap().is_empty());
    assert_eq!(
        (
            faults.calls(StorageOp::Write),
            faults.calls(StorageOp::Sync)
        ),
        (writes, syncs)
    );
    assert_eq!(file_len(&log), size, "a fresh file is not grown");
    let shared = SharedRecordLog::new(log);
    assert!(shared.append_batch(&[]).unwrap().is_empty());
    assert_eq!(
        (
            faults.calls(StorageOp::Write),
            faults.calls(StorageOp::Sync)
        ),
        (writes, syncs)
    );
    assert_eq!(shared.stats().groups, 0);
    drop(shared);
    // A read-only log answers an empty batch the same on both sides: nothing to refuse.
    let (mut log, _) = RecordLog::open_read_only(dir.path(), &common::run("empty")).unwrap();
    assert!(log.append_batch(&[]).unwrap().is_empty());
    assert!(
        SharedRecordLog::new(log)
            .append_batch(&[])
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_shared_log_gives_records_handles_and_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let run = common::run("shared");
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    log.append(&common::user("zero")).unwrap();
    let path = log.path().to_path_buf();
    let end = log.size_bytes();
    drop(log);
    // A torn frame after the last whole one, for the shared log's recovery to report.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(end as usize);
    bytes.extend_from_slice(b"PSRF torn");
    std::fs::write(&path, &bytes).unwrap();
    let (shared, recovery) =
        SharedRecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    assert!(!recovery.is_clean());
    assert_eq!(shared.recovery(), recovery);
    let one = shared.append(&common::text_result("one")).unwrap();
    shared.append(&common::user("two")).unwrap();
    assert_eq!(shared.handle(1), Some(one.clone()));
    assert_eq!(shared.handle(3), None);
    let all: Vec<LoggedRecord> = shared.iter().collect::<Result<_, _>>().unwrap();
    let single = shared.into_inner();
    let expected: Vec<LoggedRecord> = single.iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(all, expected);
    assert_eq!(all.len(), 3);
    assert_eq!(all[1].handle, one);
    let shared = SharedRecordLog::new(single);
    let from_two: Vec<LoggedRecord> = shared.iter_from(2).collect::<Result<_, _>>().unwrap();
    assert_eq!(from_two, all[2..]);
    assert!(shared.iter_from(9).next().is_none());
    assert_eq!(
        shared.record(&one).unwrap(),
        Some(common::text_result("one"))
    );
}
