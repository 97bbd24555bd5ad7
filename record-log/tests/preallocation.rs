//! Writes of up to 128 KiB land in space the log preallocated: an append, or a batch or a
//! group of 16 records of 4 KiB (66 KiB of frames), never grows the file once the first
//! write has preallocated, so its `fdatasync` flushes data only. Larger writes, a group of
//! 64 records of 4 KiB (266 KiB) included, grow the file themselves when they do not fit in
//! what is left, with no zeros after them: past that size the zeros cost more than the
//! metadata commit they save (`docs/format.md`, "Preallocation").

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::time::Duration;

use psych_record_log::{RecordLog, SharedRecordLog, SyncPolicy};

fn group(records: u8, len: usize) -> Vec<psych_types::Record> {
    (0..records)
        .map(|i| common::text_result(&char::from(b'a' + i % 26).to_string().repeat(len)))
        .collect()
}

fn file_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// Does `write` on `log` and checks that it wrote no zeros: the file kept its length (the
/// write fitted in what was left) or now ends right after the write's end mark (it grew
/// the file itself). Returns whether it grew the file.
#[track_caller]
fn grew_without_zeros(log: &mut RecordLog, write: impl FnOnce(&mut RecordLog)) -> bool {
    let before = file_len(log.path());
    write(log);
    let after = file_len(log.path());
    assert!(log.size_bytes() + common::END_MARK <= after);
    if after == before {
        return false;
    }
    assert_eq!(
        after,
        log.size_bytes() + common::END_MARK,
        "a write that grew the file wrote zeros after it"
    );
    true
}

#[test]
fn batches_of_16_records_of_4k_land_in_preallocated_space() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) =
        RecordLog::open(dir.path(), &common::run("pre"), SyncPolicy::EveryAppend).unwrap();
    let batch = group(16, 4096);
    log.append_batch(&batch).unwrap();
    // 150 batches: about 10 MiB, ten times past the first MiB.
    for round in 0..150 {
        let before = file_len(log.path());
        let start = log.size_bytes();
        log.append_batch(&batch).unwrap();
        let written = log.size_bytes() - start;
        assert!(written > 64 << 10, "{written}");
        assert!(
            log.size_bytes() <= before,
            "round {round}: the batch ended at {} in a file of {before} bytes: it grew the file",
            log.size_bytes()
        );
        assert!(file_len(log.path()) - log.size_bytes() >= 512 << 10);
    }
}

#[test]
fn groups_of_16_records_of_4k_land_in_preallocated_space() {
    let dir = tempfile::tempdir().unwrap();
    let policy = common::group_commit(Duration::ZERO, 64, 1 << 20);
    let shared = SharedRecordLog::open(dir.path(), &common::run("pre"), policy)
        .unwrap()
        .0;
    let batch = group(16, 4096);
    shared.append_batch(&batch).unwrap();
    let path = shared.path().to_path_buf();
    for round in 0..150 {
        let before = file_len(&path);
        shared.append_batch(&batch).unwrap();
        assert!(
            shared.size_bytes() <= before,
            "round {round}: the group ended at {} in a file of {before} bytes",
            shared.size_bytes()
        );
    }
    assert_eq!(shared.stats().groups, 151);
}

#[test]
fn batches_of_64_records_of_4k_use_what_is_left_then_grow_the_file_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) =
        RecordLog::open(dir.path(), &common::run("pre"), SyncPolicy::EveryAppend).unwrap();
    // A small append preallocates 1 MiB past itself.
    log.append(&common::user("first")).unwrap();
    let preallocated = file_len(log.path());
    let batch = group(64, 4096);
    let grew: Vec<bool> = (0..12)
        .map(|_| grew_without_zeros(&mut log, |log| drop(log.append_batch(&batch).unwrap())))
        .collect();
    // 1 MiB of zeros holds three batches of 266 KiB; each one after them grows the file.
    assert!(preallocated > 1 << 20);
    assert_eq!(grew, [[false; 3].as_slice(), &[true; 9]].concat());
}

#[test]
fn writes_over_128k_grow_the_file_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) =
        RecordLog::open(dir.path(), &common::run("pre"), SyncPolicy::EveryAppend).unwrap();
    log.append(&common::user("first")).unwrap();
    // 150 KiB: over the limit, under the 512 KiB the earlier limit preallocated for. The
    // first six fill the 1 MiB the first append preallocated; from then on, less than
    // 512 KiB is left after each, and none of them writes zeros.
    let record = common::text_result(&"x".repeat(150 << 10));
    let grew = (0..10)
        .filter(|_| grew_without_zeros(&mut log, |log| drop(log.append(&record).unwrap())))
        .count();
    assert!(grew >= 3, "{grew}");
    // And a large one, 2 MiB, past what is left.
    let big = common::text_result(&"x".repeat(2 << 20));
    log.append(&big).unwrap();
    assert_eq!(file_len(log.path()), log.size_bytes() + common::END_MARK);
}

#[test]
fn a_durable_append_into_preallocated_space_is_one_write_and_one_sync() {
    // The end mark rides in the frames' own write, and the high-water mark is written only
    // by a sync that commits a new file length anyway: so an append into preallocated
    // space dirties the frames' pages only (`docs/format.md`, "End mark").
    use psych_record_log::{FaultyStorage, StorageOp};
    let dir = tempfile::tempdir().unwrap();
    let storage = std::sync::Arc::new(FaultyStorage::new());
    let (mut log, _) = RecordLog::open_with_storage(
        dir.path(),
        &common::run("pre"),
        SyncPolicy::EveryAppend,
        storage.clone(),
    )
    .unwrap();
    let record = common::text_result(&"x".repeat(4096));
    // The first append preallocates: frames and end mark, zeros, the high-water mark.
    let calls = |op| storage.calls(op);
    let (writes, syncs) = (calls(StorageOp::Write), calls(StorageOp::Sync));
    log.append(&record).unwrap();
    assert_eq!(
        (
            calls(StorageOp::Write) - writes,
            calls(StorageOp::Sync) - syncs
        ),
        (3, 1)
    );
    let marks = std::fs::read(log.path()).unwrap()[..128].to_vec();
    for _ in 0..50 {
        let (writes, syncs) = (calls(StorageOp::Write), calls(StorageOp::Sync));
        let before = file_len(log.path());
        log.append(&record).unwrap();
        assert_eq!(file_len(log.path()), before, "within preallocated space");
        assert_eq!(
            (
                calls(StorageOp::Write) - writes,
                calls(StorageOp::Sync) - syncs
            ),
            (1, 1),
            "one pwrite (frame and end mark), one fdatasync"
        );
    }
    assert_eq!(
        std::fs::read(log.path()).unwrap()[..128],
        marks[..],
        "the header page was not written"
    );
    // Past half the preallocation, the next append preallocates again, and with it the
    // high-water mark is written, under the sync that commits the new length.
    for _ in 0..200 {
        let before = file_len(log.path());
        let writes = calls(StorageOp::Write);
        log.append(&record).unwrap();
        if file_len(log.path()) != before {
            assert_eq!(calls(StorageOp::Write) - writes, 3, "frames, zeros, mark");
            assert_ne!(std::fs::read(log.path()).unwrap()[..128], marks[..]);
            return;
        }
    }
    panic!("200 appends of 4 KiB never preallocated again");
}
