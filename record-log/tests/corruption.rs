//! Damage in the middle of a log is a typed error naming the offset, at open and at read;
//! files that are not this Run's log are refused with a typed error.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod common;

use psych_record_log::{OpenError, ReadError, RecordLog, SyncPolicy};
use psych_types::RecordSource;

/// A log of five records under `dir`; returns each frame's start offset.
fn five(dir: &std::path::Path) -> Vec<u64> {
    let (mut log, _) = RecordLog::open(dir, &common::run("mid"), SyncPolicy::EveryAppend).unwrap();
    let mut starts = Vec::new();
    for i in 0..5 {
        starts.push(log.size_bytes());
        log.append(&common::text_result(&format!("result {i}\n").repeat(10)))
            .unwrap();
    }
    starts
}

fn flip(path: &std::path::Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn damage_before_whole_frames_is_a_typed_error_naming_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let starts = five(dir.path());
    let run = common::run("mid");
    let path = RecordLog::path_for(dir.path(), &run);
    let pristine = std::fs::read(&path).unwrap();
    // A byte in frame 2's header, metadata, content, and body checksum.
    for at in [starts[2] + 6, starts[2] + 40, starts[3] - 10, starts[3] - 1] {
        std::fs::write(&path, &pristine).unwrap();
        flip(&path, at);
        let err = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap_err();
        match err {
            OpenError::Corrupt {
                offset, ref reason, ..
            } => {
                assert_eq!(offset, starts[2], "flip at {at}: {err}");
                assert!(reason.contains(&format!("{}", starts[3])), "{reason}");
            }
            other => panic!("flip at {at}: expected Corrupt, got {other:?}"),
        }
        assert!(
            err.to_string().contains(&format!("byte {}", starts[2])),
            "{err}"
        );
        // The file is left as it was: nothing is cut.
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            pristine.len() as u64
        );
    }
}

#[test]
fn a_damaged_file_header_is_corrupt_at_offset_zero() {
    let dir = tempfile::tempdir().unwrap();
    five(dir.path());
    let run = common::run("mid");
    let path = RecordLog::path_for(dir.path(), &run);
    flip(&path, 13); // inside the Run id
    let err = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap_err();
    assert!(
        matches!(err, OpenError::Corrupt { offset: 0, .. }),
        "{err:?}"
    );
}

#[test]
fn damage_after_open_is_a_typed_read_error() {
    let dir = tempfile::tempdir().unwrap();
    let starts = five(dir.path());
    let run = common::run("mid");
    let (log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    // Changed behind the open log's back (another program, a bad disk).
    flip(log.path(), starts[1] + 60);
    let handle = log.handle(1).unwrap();
    match log.record(&handle) {
        Err(ReadError::Corrupt { offset, .. }) => assert_eq!(offset, starts[1]),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // The neighbours still read.
    assert!(log.record(&log.handle(0).unwrap()).unwrap().is_some());
    assert!(log.record(&log.handle(2).unwrap()).unwrap().is_some());
}

#[test]
fn files_that_are_not_this_runs_log_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    five(dir.path());
    let mid = RecordLog::path_for(dir.path(), &common::run("mid"));
    let other = common::run("other");
    std::fs::copy(&mid, RecordLog::path_for(dir.path(), &other)).unwrap();
    let err = RecordLog::open(dir.path(), &other, SyncPolicy::EveryAppend).unwrap_err();
    match err {
        OpenError::RunMismatch {
            expected, found, ..
        } => {
            assert_eq!((expected.as_str(), found.as_str()), ("other", "mid"));
        }
        other => panic!("expected RunMismatch, got {other:?}"),
    }
    let text = common::run("text");
    std::fs::write(RecordLog::path_for(dir.path(), &text), "just some notes\n").unwrap();
    assert!(matches!(
        RecordLog::open(dir.path(), &text, SyncPolicy::EveryAppend),
        Err(OpenError::NotALog { .. })
    ));
    let mut v9 = std::fs::read(&mid).unwrap();
    v9[8] = 9;
    let future = common::run("future");
    std::fs::write(RecordLog::path_for(dir.path(), &future), v9).unwrap();
    // The version byte is under the header checksum, so a flipped version is damage, not a
    // newer file; a real newer header (checksum recomputed) is UnsupportedVersion (unit test).
    assert!(matches!(
        RecordLog::open(dir.path(), &future, SyncPolicy::EveryAppend),
        Err(OpenError::Corrupt { offset: 0, .. })
    ));
}

#[test]
fn a_second_opener_is_refused_while_the_log_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let run = common::run("locked");
    let (log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    assert!(matches!(
        RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend),
        Err(OpenError::Locked { .. })
    ));
    drop(log);
    assert!(RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).is_ok());
}
