//! Damage in the middle of a log is a typed error naming the offset, at open and at read;
//! so are durable records gone from the end of the file (zeroed or cut from any frame but
//! the last sync's), which the high-water mark reveals, and a high-water mark with no valid
//! slot; files that are not this Run's log are refused with a typed error.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use psych_record_log::{
    LogCorruption, OpenError, ReadError, RecordLog, SharedRecordLog, SyncPolicy, TailReason,
};
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
                assert!(
                    matches!(reason, LogCorruption::DamageBeforeWholeFrame { whole_at, .. }
                        if *whole_at == starts[3]),
                    "{reason}"
                );
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

/// `flock(1)` holding `path`'s lock (the same `flock(2)` lock the log takes) in another
/// process until its standard input is closed; returns once it holds it.
fn hold_lock(path: &Path) -> std::process::Child {
    use std::io::BufRead;
    let mut holder = Command::new("flock")
        .arg(path)
        .args(["-c", "echo held; read -r _"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("flock(1), from util-linux");
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held");
    holder
}

#[test]
fn a_lock_held_by_another_process_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let run = common::run("held");
    drop(RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap());
    let path = RecordLog::path_for(dir.path(), &run);
    let mut holder = hold_lock(&path);
    let err = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap_err();
    assert!(
        matches!(&err, OpenError::Locked { path: p } if p == &path),
        "{err:?}"
    );
    drop(holder.stdin.take());
    holder.wait().unwrap();
    assert!(RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).is_ok());
}

/// Byte offset of the high-water mark's first slot in the log of Run `run`
/// (docs/format.md: right after the file header of `16 + n` bytes); each slot is 36 bytes.
fn marks_at(run: &str) -> u64 {
    16 + run.len() as u64
}

/// The generation a mark slot at `at` holds (whether or not its checksum is right).
fn generation(bytes: &[u8], at: u64) -> u64 {
    let mut le = [0u8; 8];
    le.copy_from_slice(&bytes[at as usize..at as usize + 8]);
    u64::from_le_bytes(le)
}

/// Expects `open` of Run `run` under `dir` to fail with `Corrupt` at `offset` naming the
/// missing durable records `first..=last`, and the file to be left as it was.
fn assert_durable_records_missing(dir: &Path, run: &str, offset: u64, first: u64, last: u64) {
    let run = common::run(run);
    let path = RecordLog::path_for(dir, &run);
    let before = std::fs::read(&path).unwrap();
    match RecordLog::open(dir, &run, SyncPolicy::EveryAppend) {
        Err(OpenError::Corrupt {
            offset: at, reason, ..
        }) => {
            assert_eq!(at, offset, "{reason}");
            assert!(
                matches!(&reason, LogCorruption::DurableMissing { first: f, durable_records, .. }
                    if *f == first && *durable_records == last + 1),
                "{reason:?}"
            );
            assert!(
                reason.to_string().starts_with(&format!(
                    "records {first}..={last} were made durable but are missing"
                )),
                "{reason}"
            );
        }
        Err(other) => panic!("expected Corrupt at {offset}, got {other:?}"),
        Ok((log, recovery)) => panic!(
            "durable records {first}..={last} lost, yet opened with {} records: {recovery}",
            log.len()
        ),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the file is untouched"
    );
}

/// `bytes` with every byte from `from` to the end zeroed (the length kept).
fn zeroed_from(bytes: &[u8], from: u64) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out[from as usize..].fill(0);
    out
}

#[test]
fn durable_records_zeroed_to_the_end_of_the_file_are_corrupt_not_free_space() {
    // Storage damage, not a crash: every acknowledged frame from one in the middle on
    // reads as zeros, which used to open as a clean, shorter log. The log was closed, so
    // its high-water mark counts all five durable (after a crash it may count fewer; the
    // end mark reports the loss then: torn_tail.rs,
    // `durable_records_lost_while_the_mark_lags_are_reported_by_the_end_mark`).
    let dir = tempfile::tempdir().unwrap();
    let starts = five(dir.path());
    let path = RecordLog::path_for(dir.path(), &common::run("mid"));
    let pristine = std::fs::read(&path).unwrap();
    let frame_header = 32;
    for k in 0..4 {
        // From the frame's first byte, from inside its header, from inside its body (its
        // header whole, so the frame fails its body checksum), from its last byte.
        for from in [
            starts[k],
            starts[k] + 5,
            starts[k] + frame_header + 3,
            starts[k + 1] - 1,
        ] {
            std::fs::write(&path, zeroed_from(&pristine, from)).unwrap();
            assert_durable_records_missing(dir.path(), "mid", starts[k], k as u64, 4);
        }
    }
    // The last record too: closing the log made the mark count it (its sync had returned).
    for from in [starts[4], starts[4] + 5, starts[4] + frame_header + 3] {
        std::fs::write(&path, zeroed_from(&pristine, from)).unwrap();
        assert_durable_records_missing(dir.path(), "mid", starts[4], 4, 4);
    }
    // The same damage with the preallocated zeros gone: the file cut at the frame.
    for k in 0..5 {
        std::fs::write(&path, &pristine[..starts[k] as usize]).unwrap();
        assert_durable_records_missing(dir.path(), "mid", starts[k], k as u64, 4);
    }
    // Untouched, it still opens clean.
    std::fs::write(&path, &pristine).unwrap();
    let (log, recovery) =
        RecordLog::open(dir.path(), &common::run("mid"), SyncPolicy::EveryAppend).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.len(), 5);
}

#[test]
fn durable_records_zeroed_after_group_commit_or_a_buffered_sync_are_corrupt() {
    // Group commit: four threads, five appends each; the last group's records are the
    // last sync's, every record before it was durable.
    let dir = tempfile::tempdir().unwrap();
    let run = common::run("groups");
    let policy = common::group_commit(Duration::from_millis(1), 3, 1 << 20);
    let (log, _) = SharedRecordLog::open(dir.path(), &run, policy).unwrap();
    let log = Arc::new(log);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for i in 0..5 {
                    log.append(&common::user(&format!("t{t} i{i}"))).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert!(log.stats().groups > 1, "{:?}", log.stats());
    let path = log.path().to_path_buf();
    drop(log);
    let pristine = std::fs::read(&path).unwrap();
    let starts = frame_starts(&pristine, "groups");
    assert_eq!(starts.len(), 20);
    std::fs::write(&path, zeroed_from(&pristine, starts[4])).unwrap();
    let err = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap_err();
    assert!(
        matches!(&err, OpenError::Corrupt { offset, reason, .. }
            if *offset == starts[4]
                && matches!(reason, LogCorruption::DurableMissing { first: 4, .. })),
        "{err}"
    );

    // Buffered appends are durable once `sync()` returns: zeroing them is corrupt then.
    let dir = tempfile::tempdir().unwrap();
    let run = common::run("buffered");
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
    let mut starts = Vec::new();
    for i in 0..4 {
        starts.push(log.size_bytes());
        log.append(&common::user(&format!("buffered {i}"))).unwrap();
    }
    log.sync().unwrap();
    // One more sync with nothing new keeps the mark as it is.
    log.sync().unwrap();
    starts.push(log.size_bytes());
    log.append(&common::user("after the sync")).unwrap();
    let path = log.path().to_path_buf();
    // As a crash leaves it (closing the log brings the mark up to date: below).
    let crashed = std::fs::read(&path).unwrap();
    drop(log);
    let closed = std::fs::read(&path).unwrap();
    std::fs::write(&path, zeroed_from(&crashed, starts[1])).unwrap();
    // The mark of that sync counts 0 durable before it and 4 written by it: records 1..=3
    // are its own, so (as after a crash during it) they are cut and reported, not corrupt.
    let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
    assert_eq!(log.len(), 1);
    let tail = recovery.tail.expect("the lost records are reported");
    assert!(
        matches!(
            tail.reason,
            TailReason::LastWriteMissing {
                first: 1,
                last: 3,
                ..
            }
        ) && tail
            .to_string()
            .starts_with("last write missing: records 1..=3"),
        "{}",
        tail.reason
    );
    drop(log);
    // Closed after that sync returned, the log's mark counts its records durable: corrupt.
    std::fs::write(&path, zeroed_from(&closed, starts[1])).unwrap();
    assert_durable_records_missing(dir.path(), "buffered", starts[1], 1, 3);
    // A second sync makes the first one's records durable before it: now they are corrupt.
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
    let mut starts = Vec::new();
    for i in 0..6 {
        starts.push(log.size_bytes());
        log.append(&common::user(&format!("buffered {i}"))).unwrap();
        if i == 3 || i == 5 {
            log.sync().unwrap();
        }
    }
    let path = log.path().to_path_buf();
    // As a crash leaves it.
    let pristine = std::fs::read(&path).unwrap();
    drop(log);
    std::fs::write(&path, zeroed_from(&pristine, starts[1])).unwrap();
    assert_durable_records_missing(dir.path(), "buffered", starts[1], 1, 3);
}

/// Where each frame of the log file `bytes` of Run `run` starts, read from the bytes
/// (docs/format.md): after the file header and the mark's two slots, each frame is
/// `36 + m + c` bytes, `m` at offset 16 (u32) and `c` at 20 (u64), until the zeros.
fn frame_starts(bytes: &[u8], run: &str) -> Vec<u64> {
    let mut at = (marks_at(run) + 72) as usize;
    let mut starts = Vec::new();
    while at + 32 <= bytes.len() && bytes[at..at + 4] == *b"PSRF" {
        starts.push(at as u64);
        let mut m = [0u8; 4];
        m.copy_from_slice(&bytes[at + 16..at + 20]);
        let mut c = [0u8; 8];
        c.copy_from_slice(&bytes[at + 20..at + 28]);
        at += 36 + u32::from_le_bytes(m) as usize + u64::from_le_bytes(c) as usize;
    }
    starts
}

#[test]
fn a_damaged_mark_slot_falls_back_to_the_other_and_both_damaged_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let starts = five(dir.path());
    let run = common::run("mid");
    let path = RecordLog::path_for(dir.path(), &run);
    let pristine = std::fs::read(&path).unwrap();
    let slots = [marks_at("mid"), marks_at("mid") + 36];
    // Two marks: the first append's (generation 1, it preallocated: `d` = 0, `w` = 1) in
    // slot 1, and the one written when the log was closed (generation 2: all five
    // durable), the current one, in slot 0. The other four appends synced frames only.
    assert_eq!(
        [
            generation(&pristine, slots[0]),
            generation(&pristine, slots[1])
        ],
        [2, 1]
    );
    for (slot, fill) in [(0, 0u8), (1, 0), (0, 0xA5)] {
        // One slot zeroed (or garbage): the other one is the mark. Nothing is lost.
        let mut bytes = pristine.clone();
        bytes[slots[slot] as usize..slots[slot] as usize + 36].fill(fill);
        std::fs::write(&path, &bytes).unwrap();
        let (mut log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend)
            .unwrap_or_else(|err| panic!("slot {slot} damaged: {err}"));
        assert!(recovery.is_clean(), "{recovery}");
        assert_eq!(log.len(), 5);
        // Closing the log writes the damaged slot or the other again (the next
        // generation's), and the log reopens clean.
        log.append(&common::user("after")).unwrap();
        drop(log);
        let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
        assert!(recovery.is_clean(), "{recovery}");
        assert_eq!(log.len(), 6);
        drop(log);
    }
    // The older mark alone counts none durable: records zeroed from the third on are
    // reported by the missing end mark (not Corrupt, but never a clean open).
    let mut bytes = zeroed_from(&pristine, starts[2]);
    bytes[slots[0] as usize..slots[0] as usize + 36].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    assert_eq!(log.len(), 2);
    assert!(
        matches!(
            recovery.tail.as_ref().map(|tail| &tail.reason),
            Some(TailReason::EndMarkMissing { at, file_ends: false }) if *at == starts[2]
        ),
        "{recovery}"
    );
    drop(log);
    // The current mark catches them as durable records missing.
    let mut bytes = zeroed_from(&pristine, starts[2]);
    bytes[slots[1] as usize..slots[1] as usize + 36].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    assert_durable_records_missing(dir.path(), "mid", starts[2], 2, 4);
    // A bit flipped in the current slot: its checksum fails, the other slot is used.
    let mut bytes = pristine.clone();
    bytes[slots[0] as usize + 9] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.len(), 5);
    drop(log);
    // Both slots zeroed: nothing says what was durable any more. Corrupt, file untouched.
    let mut bytes = pristine.clone();
    bytes[slots[0] as usize..slots[1] as usize + 36].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    match RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend) {
        Err(OpenError::Corrupt { offset, reason, .. }) => {
            assert_eq!(offset, slots[0]);
            assert_eq!(reason, LogCorruption::MarkDamaged, "{reason}");
        }
        other => panic!("expected Corrupt at the mark, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the file is untouched"
    );
}

#[test]
fn a_mark_that_disagrees_with_the_frames_is_corrupt() {
    // The mark of another log of the same Run (a file put together from two): its durable
    // records end where this file's do not.
    let dir = tempfile::tempdir().unwrap();
    five(dir.path());
    let run = common::run("mid");
    let path = RecordLog::path_for(dir.path(), &run);
    let ours = std::fs::read(&path).unwrap();
    let other = tempfile::tempdir().unwrap();
    let (mut log, _) = RecordLog::open(other.path(), &run, SyncPolicy::EveryAppend).unwrap();
    for i in 0..5 {
        log.append(&common::user(&format!("other {i}"))).unwrap();
    }
    let path_theirs = log.path().to_path_buf();
    drop(log);
    // Closed: its mark counts all five durable, ending at its fifth frame's end.
    let theirs = std::fs::read(path_theirs).unwrap();
    let mut spliced = ours.clone();
    let slots = marks_at("mid") as usize..marks_at("mid") as usize + 72;
    spliced[slots.clone()].copy_from_slice(&theirs[slots]);
    std::fs::write(&path, &spliced).unwrap();
    match RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend) {
        Err(OpenError::Corrupt { offset, reason, .. }) => {
            assert_eq!(offset, marks_at("mid"));
            assert!(
                matches!(reason, LogCorruption::MarkMismatch { .. }),
                "{reason}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}
