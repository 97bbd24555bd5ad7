//! `RecordLog::open_read_only`: it reads what `open` reads, reports what `open` would cut,
//! refuses what `open` refuses, and never changes, cuts, syncs or locks the file.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::path::Path;

use psych_record_log::{AppendError, OpenError, RecordLog, SharedRecordLog, SyncPolicy};
use psych_types::RecordSource;

/// A log of four records under `dir`, closed; returns the frames' starts and the end.
fn four(dir: &Path) -> (Vec<u64>, u64) {
    let (mut log, _) = RecordLog::open(dir, &common::run("ro"), SyncPolicy::EveryAppend).unwrap();
    let mut starts = Vec::new();
    for i in 0..4 {
        starts.push(log.size_bytes());
        log.append(&common::text_result(&format!("line {i}\n").repeat(20)))
            .unwrap();
    }
    (starts, log.size_bytes())
}

fn path(dir: &Path) -> std::path::PathBuf {
    RecordLog::path_for(dir, &common::run("ro"))
}

#[test]
fn a_clean_log_reads_whole_and_the_file_is_untouched() {
    let dir = tempfile::tempdir().unwrap();
    four(dir.path());
    let before = std::fs::read(path(dir.path())).unwrap();
    let (log, recovery) = RecordLog::open_read_only(dir.path(), &common::run("ro")).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.len(), 4);
    for seq in 0..4 {
        let record = log.record(&log.handle(seq).unwrap()).unwrap().unwrap();
        assert_eq!(
            record,
            common::text_result(&format!("line {seq}\n").repeat(20))
        );
    }
    drop(log);
    assert_eq!(std::fs::read(path(dir.path())).unwrap(), before);
}

#[test]
fn a_writer_holding_the_log_does_not_stop_a_reader() {
    let dir = tempfile::tempdir().unwrap();
    four(dir.path());
    let (mut writer, _) =
        RecordLog::open(dir.path(), &common::run("ro"), SyncPolicy::EveryAppend).unwrap();
    let (reader, _) = RecordLog::open_read_only(dir.path(), &common::run("ro")).unwrap();
    assert_eq!(reader.len(), 4);
    // And the reader holds no lock the writer or a second writer would meet.
    writer.append(&common::user("after the reader")).unwrap();
    drop(writer);
    let (writer, _) =
        RecordLog::open(dir.path(), &common::run("ro"), SyncPolicy::EveryAppend).unwrap();
    assert_eq!(writer.len(), 5);
    assert_eq!(reader.len(), 4);
}

#[test]
fn a_torn_tail_is_reported_and_left_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let (_, end) = four(dir.path());
    let file = path(dir.path());
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.truncate(end as usize);
    // The first 30 bytes of a fifth frame: a torn write. (Its header, written by a
    // second log with the same four records before it.)
    let other = tempfile::tempdir().unwrap();
    let (mut log, _) =
        RecordLog::open(other.path(), &common::run("ro"), SyncPolicy::OsBuffered).unwrap();
    for i in 0..4 {
        log.append(&common::text_result(
            &format!(
                "line {i}
"
            )
            .repeat(20),
        ))
        .unwrap();
    }
    log.append(&common::user("torn")).unwrap();
    let fifth = std::fs::read(log.path()).unwrap();
    let mut torn = bytes.clone();
    torn.extend_from_slice(&fifth[end as usize..end as usize + 30]);
    std::fs::write(&file, &torn).unwrap();

    let (log, recovery) = RecordLog::open_read_only(dir.path(), &common::run("ro")).unwrap();
    assert_eq!(recovery.records, 4);
    assert_eq!(log.len(), 4);
    let tail = recovery.tail.clone().expect("torn tail reported");
    assert_eq!((tail.offset, tail.bytes), (end, 30));
    assert!(
        tail.left_in_place
            && tail
                .to_string()
                .ends_with("left in place: opened read-only"),
        "{tail}"
    );
    assert!(log.record(&log.handle(3).unwrap()).unwrap().is_some());
    drop(log);
    assert_eq!(
        std::fs::read(&file).unwrap(),
        torn,
        "read-only open changed the file"
    );

    // A writable open then cuts it, as it always did.
    let (_, recovery) =
        RecordLog::open(dir.path(), &common::run("ro"), SyncPolicy::EveryAppend).unwrap();
    assert_eq!(recovery.tail.map(|t| t.offset), Some(end));
}

#[test]
fn damage_and_lost_durable_records_are_refused_as_by_open() {
    let dir = tempfile::tempdir().unwrap();
    let (starts, _) = four(dir.path());
    let file = path(dir.path());
    let pristine = std::fs::read(&file).unwrap();

    // A flipped byte in frame 1, whole frames after it.
    let mut flipped = pristine.clone();
    flipped[starts[1] as usize + 40] ^= 1;
    std::fs::write(&file, &flipped).unwrap();
    match RecordLog::open_read_only(dir.path(), &common::run("ro")).unwrap_err() {
        OpenError::Corrupt { offset, .. } => assert_eq!(offset, starts[1]),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(std::fs::read(&file).unwrap(), flipped);

    // Zeros from frame 1 to the end: records the high-water mark counts durable are gone.
    let mut zeroed = pristine.clone();
    zeroed[starts[1] as usize..].fill(0);
    std::fs::write(&file, &zeroed).unwrap();
    match RecordLog::open_read_only(dir.path(), &common::run("ro")).unwrap_err() {
        OpenError::Corrupt { offset, .. } => assert_eq!(offset, starts[1]),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(std::fs::read(&file).unwrap(), zeroed);
}

#[test]
fn appends_and_syncs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    four(dir.path());
    let before = std::fs::read(path(dir.path())).unwrap();
    let (mut log, _) = RecordLog::open_read_only(dir.path(), &common::run("ro")).unwrap();
    assert!(matches!(
        log.append(&common::user("no")),
        Err(AppendError::ReadOnly { .. })
    ));
    assert!(matches!(
        log.append_batch(&[common::user("no")]),
        Err(AppendError::ReadOnly { .. })
    ));
    assert!(matches!(log.sync(), Err(AppendError::ReadOnly { .. })));
    assert_eq!(log.len(), 4);
    let shared = SharedRecordLog::new(log);
    assert!(matches!(
        shared.append(&common::user("no")),
        Err(AppendError::ReadOnly { .. })
    ));
    assert!(matches!(shared.sync(), Err(AppendError::ReadOnly { .. })));
    assert_eq!(shared.len(), 4);
    drop(shared);
    assert_eq!(std::fs::read(path(dir.path())).unwrap(), before);
}

#[test]
fn a_missing_log_is_an_error_and_is_not_created() {
    let dir = tempfile::tempdir().unwrap();
    match RecordLog::open_read_only(dir.path(), &common::run("ro")).unwrap_err() {
        OpenError::Io { source, .. } => {
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Io, got {other:?}"),
    }
    assert!(!path(dir.path()).exists());
}

#[test]
fn a_file_whose_creation_was_torn_reads_as_empty_and_is_not_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    four(dir.path());
    let file = path(dir.path());
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.truncate(9);
    std::fs::write(&file, &bytes).unwrap();
    let (log, recovery) = RecordLog::open_read_only(dir.path(), &common::run("ro")).unwrap();
    assert_eq!(log.len(), 0);
    let tail = recovery.tail.expect("torn creation reported");
    assert_eq!((tail.offset, tail.bytes), (0, 9));
    assert_eq!(std::fs::read(&file).unwrap(), bytes);
    // Empty: a creation that never started.
    std::fs::write(&file, b"").unwrap();
    let (log, recovery) = RecordLog::open_read_only(dir.path(), &common::run("ro")).unwrap();
    assert!(log.is_empty() && recovery.is_clean(), "{recovery}");
    assert_eq!(std::fs::read(&file).unwrap(), b"");
}

/// Review: a reader opening a log while its writer appends steadily must never find it
/// corrupt: a frame still being written reads as a torn tail, frames written during the
/// scan are either seen whole or not at all.
#[test]
fn a_reader_opening_a_log_under_steady_appends_never_finds_it_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (mut writer, _) =
        RecordLog::open(dir.path(), &common::run("ro"), SyncPolicy::OsBuffered).unwrap();
    writer.append(&common::text_result("first\n")).unwrap();
    let appending = {
        std::thread::spawn(move || {
            // Sizes that vary, one in 64 past the scan's 1 MiB buffer: about 85 MB in all.
            for n in 0..3_000u64 {
                let size = if n % 64 == 63 {
                    1_100_000
                } else {
                    [10, 300, 5_000, 40_000][(n % 4) as usize]
                };
                writer
                    .append(&common::text_result(&"x".repeat(size)))
                    .unwrap();
            }
            3_000u64
        })
    };
    let mut opens = 0;
    // Until the writer is done, or has failed (its panic is the test's, at the join).
    while !appending.is_finished() {
        match RecordLog::open_read_only(dir.path(), &common::run("ro")) {
            Ok((log, _)) => assert!(!log.is_empty()),
            Err(err) => panic!("open {opens}: {err}"),
        }
        opens += 1;
    }
    let appended = appending.join().unwrap();
    eprintln!("{opens} read-only opens while {appended} records were appended");
}

/// A frame the view indexed that a writer then replaced (a failed sync undone, another
/// record written at the same place) is a typed error when its text is read, never the
/// other record's bytes.
#[test]
fn a_frame_replaced_under_a_reader_is_corrupt_not_another_records_text() {
    let dir = tempfile::tempdir().unwrap();
    four(dir.path());
    let (reader, _) = RecordLog::open_read_only(dir.path(), &common::run("ro")).unwrap();
    // The same first three records, then another fourth, written in the file's place.
    let other = tempfile::tempdir().unwrap();
    let (mut log, _) =
        RecordLog::open(other.path(), &common::run("ro"), SyncPolicy::EveryAppend).unwrap();
    for i in 0..3 {
        log.append(&common::text_result(&format!("line {i}\n").repeat(20)))
            .unwrap();
    }
    log.append(&common::text_result(&"another record\n".repeat(30)))
        .unwrap();
    drop(log);
    let replaced = std::fs::read(path(other.path())).unwrap();
    std::fs::write(path(dir.path()), &replaced).unwrap();
    let mut buf = vec![0u8; 4096];
    let error = reader
        .read_output(&reader.handle(3).unwrap(), 0, &mut buf)
        .unwrap_err();
    assert!(
        error.to_string().contains("frame header changed on disk"),
        "{error}"
    );
    // The frames it did not lose still read.
    let n = reader
        .read_output(&reader.handle(2).unwrap(), 0, &mut buf)
        .unwrap();
    assert_eq!(&buf[..n], "line 2\n".repeat(20).as_bytes());
}

/// A frame replaced under a reader by a record of the very same lengths and kind (its
/// header the same bytes) is a typed error too, for every read of it; its neighbours read.
#[test]
fn a_frame_replaced_by_one_of_the_same_lengths_is_corrupt_not_its_text() {
    let dir = tempfile::tempdir().unwrap();
    four(dir.path());
    let (reader, _) = RecordLog::open_read_only(dir.path(), &common::run("ro")).unwrap();
    let other = tempfile::tempdir().unwrap();
    let (mut log, _) =
        RecordLog::open(other.path(), &common::run("ro"), SyncPolicy::EveryAppend).unwrap();
    for i in 0..3 {
        log.append(&common::text_result(&format!("line {i}\n").repeat(20)))
            .unwrap();
    }
    // "line 3\n" and "LINE 3\n": the same lengths, kind and call, other bytes.
    log.append(&common::text_result(&"LINE 3\n".repeat(20)))
        .unwrap();
    drop(log);
    let original = std::fs::read(path(dir.path())).unwrap();
    let replaced = std::fs::read(path(other.path())).unwrap();
    assert_eq!(original.len(), replaced.len());
    std::fs::write(path(dir.path()), &replaced).unwrap();
    let handle = reader.handle(3).unwrap();
    let mut buf = vec![0u8; 4096];
    let replaced = "frame replaced on disk since the log was opened";
    let error = reader.read_output(&handle, 0, &mut buf).unwrap_err();
    assert!(error.to_string().contains(replaced), "{error}");
    let error = reader.record(&handle).unwrap_err();
    assert!(error.to_string().contains(replaced), "{error}");
    let error = reader.output_info(&handle).unwrap_err();
    assert!(error.to_string().contains(replaced), "{error}");
    let error = reader.content_block(&handle, 0).unwrap_err();
    assert!(error.to_string().contains(replaced), "{error}");
    let error = reader.block_lines(&handle).unwrap_err();
    assert!(error.to_string().contains(replaced), "{error}");
    let n = reader
        .read_output(&reader.handle(2).unwrap(), 0, &mut buf)
        .unwrap();
    assert_eq!(&buf[..n], "line 2\n".repeat(20).as_bytes());
}
