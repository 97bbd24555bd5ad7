//! Torn and damaged tails: the file cut at every byte offset of its last frames, trailing
//! garbage, a flipped byte in the last frame. Opening never panics, keeps every whole record
//! before the damage, cuts the rest and reports the loss.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod common;

use std::path::Path;

use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{Record, RecordSource, ToolOutput};

/// Writes `records` to a fresh log of Run `cut` under `dir`; returns the file's bytes and
/// the end offset of each frame.
fn build(dir: &Path, records: &[Record]) -> (Vec<u8>, Vec<u64>) {
    let (mut log, _) = RecordLog::open(dir, &common::run("cut"), SyncPolicy::OsBuffered).unwrap();
    let mut ends = Vec::new();
    for record in records {
        log.append(record).unwrap();
        ends.push(log.size_bytes());
    }
    let mut bytes = std::fs::read(log.path()).unwrap();
    // Past the last frame the file holds only preallocated zeros.
    assert!(bytes[log.size_bytes() as usize..].iter().all(|&b| b == 0));
    bytes.truncate(log.size_bytes() as usize);
    (bytes, ends)
}

fn records() -> Vec<Record> {
    vec![
        common::user("first"),
        common::text_result("a\nb\nc\n"),
        common::user("third"),
        common::result(
            "call_9",
            ToolOutput::json(serde_json::json!({"rows": [1, 2, 3], "ok": true})),
        ),
        common::result(
            "call_10",
            ToolOutput::from_blocks(vec![
                psych_types::ContentBlock::text("a chart:"),
                psych_types::ContentBlock::image("image/png", vec![0x89, 0x50, 0, 255]),
            ]),
        ),
        common::text_result(&"line\n".repeat(40)),
    ]
}

#[test]
fn cut_at_every_offset_of_the_last_three_frames() {
    let dir = tempfile::tempdir().unwrap();
    let records = records();
    let (bytes, ends) = build(&dir.path().join("source"), &records);
    let start = ends[ends.len() - 4]; // end of the third-to-last frame's predecessor
    let target = dir.path().join("cut");
    let run = common::run("cut");
    let path = RecordLog::path_for(&target, &run);
    std::fs::create_dir_all(&target).unwrap();
    // Each cut twice: at the end of the file, and followed by preallocated zeros (a torn
    // append into preallocated space).
    for (cut, padding) in (start..=bytes.len() as u64).flat_map(|cut| [(cut, 0), (cut, 5000)]) {
        let mut file = bytes[..cut as usize].to_vec();
        file.resize(file.len() + padding, 0);
        std::fs::write(&path, &file).unwrap();
        let (log, recovery) = RecordLog::open(&target, &run, SyncPolicy::OsBuffered)
            .unwrap_or_else(|err| panic!("cut at {cut}: {err}"));
        let whole = ends.iter().filter(|&&end| end <= cut).count();
        let boundary = ends[whole - 1];
        assert_eq!(recovery.records, whole as u64, "cut at {cut}");
        assert_eq!(log.len(), whole as u64);
        assert_eq!(log.size_bytes(), boundary);
        match &recovery.tail {
            None => {
                assert_eq!(cut, boundary, "cut at {cut}+{padding} went unreported");
                // Zeros after the last whole frame are preallocated space, kept.
                assert_eq!(
                    std::fs::metadata(&path).unwrap().len(),
                    cut + padding as u64
                );
            }
            Some(tail) => {
                assert_eq!(
                    (tail.offset, tail.bytes),
                    (boundary, cut + padding as u64 - boundary),
                    "cut at {cut}+{padding}"
                );
                assert!(!tail.reason.is_empty());
                assert_eq!(
                    std::fs::metadata(&path).unwrap().len(),
                    boundary,
                    "file cut back"
                );
            }
        }
        for (seq, record) in records.iter().take(whole).enumerate() {
            let handle = log.handle(seq as u64).unwrap();
            assert_eq!(
                log.record(&handle).unwrap().as_ref(),
                Some(record),
                "cut at {cut}"
            );
        }
        assert!(log.handle(whole as u64).is_none());
    }
}

#[test]
fn cut_inside_the_file_header_recovers_an_empty_log() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, _) = build(dir.path(), &[common::user("x")]);
    // Magic, version, id length, `cut`, checksum (docs/format.md).
    let header_len = 12 + 3 + 4;
    let run = common::run("cut");
    let path = RecordLog::path_for(dir.path(), &run);
    for cut in 0..header_len {
        std::fs::write(&path, &bytes[..cut as usize]).unwrap();
        let (mut log, recovery) =
            RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        assert_eq!(recovery.records, 0);
        assert_eq!(recovery.tail.is_some(), cut > 0, "cut at {cut}: {recovery}");
        // The log is usable again.
        let handle = log.append(&common::user("again")).unwrap();
        assert_eq!(handle.seq, 0);
    }
}

#[test]
fn garbage_after_the_last_frame_is_cut_and_reported_but_zeros_are_not_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let records = records();
    let (bytes, ends) = build(dir.path(), &records);
    let run = common::run("cut");
    let path = RecordLog::path_for(dir.path(), &run);
    for tail in [
        b"PSRF and then some".to_vec(),
        vec![0xFF; 31],
        [vec![0u8; 100], vec![1]].concat(),
    ] {
        let mut damaged = bytes.clone();
        damaged.extend_from_slice(&tail);
        std::fs::write(&path, &damaged).unwrap();
        let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        assert_eq!(log.len(), records.len() as u64);
        let loss = recovery.tail.expect("the garbage is reported");
        assert_eq!((loss.offset, loss.bytes), (ends[5], tail.len() as u64));
    }
    // Zeros only: preallocated space, as the log itself leaves it.
    let mut padded = bytes.clone();
    padded.resize(bytes.len() + 3 * 4096 + 7, 0);
    std::fs::write(&path, &padded).unwrap();
    let (mut log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.len(), records.len() as u64);
    // The next append goes right after the last frame, into the zeros.
    let handle = log.append(&common::user("next")).unwrap();
    drop(log);
    let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.record(&handle).unwrap(), Some(common::user("next")));
}

#[test]
fn a_flipped_byte_in_the_last_frame_is_cut_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let records = records();
    let (bytes, ends) = build(dir.path(), &records);
    let run = common::run("cut");
    let path = RecordLog::path_for(dir.path(), &run);
    for at in ends[4]..ends[5] {
        let mut damaged = bytes.clone();
        damaged[at as usize] ^= 0x40;
        std::fs::write(&path, &damaged).unwrap();
        let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        assert_eq!(log.len(), 5, "flip at {at}");
        let loss = recovery.tail.expect("the damage is reported");
        assert_eq!(loss.offset, ends[4], "flip at {at}");
    }
}

#[test]
fn an_unacknowledged_partial_append_is_cut_when_the_log_is_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, ends) = build(dir.path(), &records());
    let run = common::run("cut");
    let path = RecordLog::path_for(dir.path(), &run);
    // Half of the last frame, as a killed writer leaves it; then append after reopening.
    std::fs::write(
        &path,
        &bytes[..(ends[4] + (ends[5] - ends[4]) / 2) as usize],
    )
    .unwrap();
    let (mut log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    assert_eq!(recovery.tail.unwrap().offset, ends[4]);
    let handle = log.append(&common::user("after")).unwrap();
    assert_eq!(handle.seq, 5);
    drop(log);
    let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.record(&handle).unwrap(), Some(common::user("after")));
}
