//! Torn and damaged tails: the file cut at every byte offset of its last frames, trailing
//! garbage, a flipped byte in the last frame, the last sync's frames zeroed. Opening never
//! panics, keeps every whole record before the damage, cuts the rest and reports the loss;
//! every state a crash can leave a write and its high-water mark in opens.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::path::Path;

use psych_record_log::{RecordLog, Recovery, SyncPolicy, TailReason};
use psych_types::{Record, RecordSource, ToolOutput};

/// Writes `records` to a fresh log of Run `cut` under `dir`; returns the file's bytes up to
/// the end mark's end (the end mark included) and the end offset of each frame.
fn build(dir: &Path, records: &[Record]) -> (Vec<u8>, Vec<u64>) {
    let (mut log, _) = RecordLog::open(dir, &common::run("cut"), SyncPolicy::OsBuffered).unwrap();
    let mut ends = Vec::new();
    for record in records {
        log.append(record).unwrap();
        ends.push(log.size_bytes());
    }
    let mut bytes = std::fs::read(log.path()).unwrap();
    // Past the last frame the file holds the end mark, then only preallocated zeros.
    let end = (log.size_bytes() + common::END_MARK) as usize;
    assert_eq!(&bytes[log.size_bytes() as usize..][..4], b"PSEM");
    assert!(bytes[end..].iter().all(|&b| b == 0));
    bytes.truncate(end);
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
    // append into preallocated space). Only the whole file, its end mark included, opens
    // clean: a cut at a frame boundary leaves no end mark, so records after it may have
    // been lost, and that is reported (it used to open clean).
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
                assert_eq!(
                    cut,
                    bytes.len() as u64,
                    "cut at {cut}+{padding} went unreported"
                );
                assert_eq!(boundary + common::END_MARK, cut);
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
                assert!(!tail.left_in_place, "{tail}");
                assert_eq!(
                    std::fs::metadata(&path).unwrap().len(),
                    boundary + common::END_MARK,
                    "file cut back, and the end mark written again"
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
    // Magic, version, id length, `cut`, checksum, and the high-water mark's two slots of
    // 36 bytes (docs/format.md).
    let header_len = 12 + 3 + 4 + 2 * 36;
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
        // Cut from the end of the last frame: the end mark and the garbage after it.
        assert_eq!(
            (loss.offset, loss.bytes),
            (ends[5], common::END_MARK + tail.len() as u64)
        );
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

/// Writes `records` to a fresh log of Run `cut` under `dir` with `SyncPolicy::EveryAppend`,
/// the last `batch` of them with one `append_batch` (one write, one sync, one mark).
/// Returns the file's bytes (preallocated zeros included) and each frame's start offset,
/// then the end of the last frame.
fn build_synced(dir: &Path, records: &[Record], batch: usize) -> (Vec<u8>, Vec<u64>) {
    let (mut log, _) = RecordLog::open(dir, &common::run("cut"), SyncPolicy::EveryAppend).unwrap();
    let mut starts = Vec::new();
    let singles = records.len() - batch;
    for record in &records[..singles] {
        starts.push(log.size_bytes());
        log.append(record).unwrap();
    }
    let handles = log.append_batch(&records[singles..]).unwrap();
    assert_eq!(handles.len(), batch);
    let mut bytes = std::fs::read(log.path()).unwrap();
    let end = log.size_bytes();
    drop(log);
    // The batch's frame starts, from the file (each frame is `36 + m + c` bytes).
    let mut at = *starts.last().unwrap();
    for _ in 0..=batch {
        let field = |from: usize, n: usize| {
            let mut le = [0u8; 8];
            le[..n].copy_from_slice(&bytes[at as usize + from..at as usize + from + n]);
            u64::from_le_bytes(le)
        };
        at += 36 + field(16, 4) + field(20, 8);
        starts.push(at);
    }
    starts.truncate(records.len() + 1);
    assert_eq!(*starts.last().unwrap(), end);
    bytes.resize(bytes.len().max(end as usize), 0);
    (bytes, starts)
}

/// Opens the log at `dir`, expecting success; returns it with its recovery.
fn reopen(dir: &Path) -> (RecordLog, Recovery) {
    RecordLog::open(dir, &common::run("cut"), SyncPolicy::EveryAppend)
        .unwrap_or_else(|err| panic!("must open: {err}"))
}

#[test]
fn the_last_syncs_frames_zeroed_or_cut_are_reported_once_never_silent() {
    // Zeros (or the end of the file) where the last sync's frames were: a crash before that
    // sync returned leaves the same bytes, so they are cut and reported, not Corrupt; they
    // used to open as a clean, shorter log. The last record is over 1 MiB, so its write
    // grows the file past the preallocated space and writes the high-water mark with its
    // sync (a write within preallocated space leaves the mark as it is; the end mark alone
    // reports such a loss: `durable_records_lost_while_the_mark_lags_are_reported_by_the_end_mark`).
    let dir = tempfile::tempdir().unwrap();
    let mut records = records();
    records[5] = common::text_result(&"line\n".repeat(250_000));
    let (bytes, starts) = build_synced(&dir.path().join("source"), &records, 1);
    let last = starts[5];
    let run = common::run("cut");
    let target = dir.path().join("t");
    std::fs::create_dir_all(&target).unwrap();
    let path = RecordLog::path_for(&target, &run);
    // (file, what the reason starts with)
    let mut middle = bytes.clone();
    middle[(last + 40) as usize..].fill(0);
    let cases: [(Vec<u8>, &str); 4] = [
        (
            [
                &bytes[..last as usize],
                &vec![0; bytes.len() - last as usize][..],
            ]
            .concat(),
            "last write missing: records 5..=5 of the last sync are not in the file (zeros from",
        ),
        (
            bytes[..last as usize].to_vec(),
            "last write missing: records 5..=5 of the last sync are not in the file (it ends",
        ),
        // From the middle of the frame: its header whole, its body not.
        (
            middle,
            "frame body checksum mismatch; the last sync wrote records up to 5",
        ),
        // Cut inside its header.
        (
            bytes[..(last + 10) as usize].to_vec(),
            "incomplete frame header; the last sync wrote records up to 5",
        ),
    ];
    for (file, reason) in cases {
        std::fs::write(&path, &file).unwrap();
        let (log, recovery) = reopen(&target);
        assert_eq!(recovery.records, 5, "{recovery}");
        let tail = recovery
            .tail
            .clone()
            .expect("the missing records are reported");
        assert!(tail.to_string().starts_with(reason), "{tail}");
        assert_eq!((tail.offset, tail.bytes), (last, file.len() as u64 - last));
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            last + common::END_MARK,
            "cut back, the end mark written again"
        );
        for (seq, record) in records.iter().take(5).enumerate() {
            let handle = log.handle(seq as u64).unwrap();
            assert_eq!(log.record(&handle).unwrap().as_ref(), Some(record));
        }
        drop(log);
        // Reported once: the cut wrote a mark of 5 records.
        let (mut log, recovery) = reopen(&target);
        assert!(recovery.is_clean(), "{recovery}");
        let handle = log.append(&common::user("next")).unwrap();
        assert_eq!(handle.seq, 5);
        drop(log);
        let (log, recovery) = reopen(&target);
        assert!(recovery.is_clean(), "{recovery}");
        assert_eq!(log.record(&handle).unwrap(), Some(common::user("next")));
    }
}

/// Where the high-water mark's two slots are in a log file of Run `cut`: after its header.
fn slots() -> std::ops::Range<usize> {
    let at = 12 + 3 + 4;
    at..at + 72
}

#[test]
fn every_state_a_crash_leaves_a_write_and_its_mark_in_opens() {
    // A power loss during the last write's sync can leave on disk any of: the new mark or
    // the old one or a torn slot, with any of: the write's frames and end mark whole, its
    // pages missing from some frame on (the old bytes there: the old end mark, then zeros),
    // a first frame missing and later ones whole, or only its end mark missing. None of
    // these may be Corrupt (the write was never acknowledged, and every earlier one is
    // whole), and every record before the write must be kept.
    let dir = tempfile::tempdir().unwrap();
    let mut records = records();
    // Three single appends, then a batch of three as the last write; its last record is
    // over 1 MiB, so the batch grows the file and writes the high-water mark.
    records[5] = common::text_result(&"line\n".repeat(250_000));
    let (after, starts) = build_synced(&dir.path().join("after"), &records, 3);
    let mut before = {
        let (mut log, _) = RecordLog::open(
            dir.path().join("before"),
            &common::run("cut"),
            SyncPolicy::EveryAppend,
        )
        .unwrap();
        for record in &records[..3] {
            log.append(record).unwrap();
        }
        // Read before the log is closed: as a crash leaves it.
        std::fs::read(log.path()).unwrap()
    };
    before.resize(after.len().max(before.len()), 0);
    let end = starts[6];
    assert_eq!(
        &before[starts[3] as usize..][..4],
        b"PSEM",
        "the old end mark"
    );
    assert_eq!(&after[end as usize..][..4], b"PSEM", "the new end mark");
    let slots = slots();
    let old_marks = &before[slots.clone()];
    let new_marks = &after[slots.clone()];
    assert_ne!(old_marks, new_marks, "the last write wrote a mark");
    // The new mark went to the slot of generation 2 (slot 0); tear it mid-way.
    let mut torn_marks = new_marks.to_vec();
    torn_marks[20..36].copy_from_slice(&old_marks[20..36]);
    // The last write's pages from `from` to `to` never reached the disk.
    let old_from = |from: u64, to: u64| {
        let mut file = after.clone();
        file[from as usize..to as usize].copy_from_slice(&before[from as usize..to as usize]);
        file
    };
    let len = after.len() as u64;
    // (state of the write's pages, file, records kept, whether reported with either mark)
    let frames = [
        ("whole", after.clone(), 6, false),
        (
            "first frame missing",
            old_from(starts[3], starts[4]),
            3,
            true,
        ),
        (
            "missing from its second frame",
            old_from(starts[4], len),
            4,
            true,
        ),
        // The old end mark still after record 2: a clean log of 3, unless the new mark
        // counts the write.
        ("all missing", old_from(starts[3], len), 3, false),
        ("only its end mark missing", old_from(end, len), 6, true),
    ];
    let target = dir.path().join("t");
    std::fs::create_dir_all(&target).unwrap();
    let path = RecordLog::path_for(&target, &common::run("cut"));
    for (marks, mark_state) in [
        (new_marks.to_vec(), "new mark"),
        (old_marks.to_vec(), "old mark"),
        (torn_marks, "torn new slot"),
    ] {
        for (frames_state, file, kept, reported) in &frames {
            let mut file = file.clone();
            file[slots.clone()].copy_from_slice(&marks);
            std::fs::write(&path, &file).unwrap();
            let (log, recovery) =
                RecordLog::open(&target, &common::run("cut"), SyncPolicy::EveryAppend)
                    .unwrap_or_else(|err| panic!("{mark_state}, frames {frames_state}: {err}"));
            assert_eq!(
                log.len(),
                *kept,
                "{mark_state}, frames {frames_state}: {recovery}"
            );
            for (seq, record) in records.iter().take(*kept as usize).enumerate() {
                let handle = log.handle(seq as u64).unwrap();
                assert_eq!(log.record(&handle).unwrap().as_ref(), Some(record));
            }
            // With the new mark on disk, missing frames of its write are reported; with the
            // old one, the end mark says whether the log ends where its last write left it.
            let reported = *reported || (mark_state == "new mark" && *kept < 6);
            assert_eq!(
                recovery.tail.is_some(),
                reported,
                "{mark_state}, frames {frames_state}: {recovery}"
            );
        }
    }
}

#[test]
fn durable_records_lost_while_the_mark_lags_are_reported_by_the_end_mark() {
    // The high-water mark is written only by syncs that change the file's length (and when
    // the log is closed), so after a crash it may count none of the last appends durable.
    // Zeros or a cut from any of their frames to the end of the file then leave no end mark
    // after the last whole frame: reported, never a clean shorter log (issue 8, section 3:
    // zeros to the end used to be taken for preallocated space).
    let dir = tempfile::tempdir().unwrap();
    let records = records();
    let (mut log, _) = RecordLog::open(
        dir.path().join("source"),
        &common::run("cut"),
        SyncPolicy::EveryAppend,
    )
    .unwrap();
    let mut starts = Vec::new();
    for record in &records {
        starts.push(log.size_bytes());
        log.append(record).unwrap();
    }
    // As a crash leaves it: every append synced, the mark written by the first one only
    // (it counts record 0 as written, so from record 1 on only the end mark tells).
    let pristine = std::fs::read(log.path()).unwrap();
    let end = log.size_bytes();
    drop(log);
    let target = dir.path().join("t");
    std::fs::create_dir_all(&target).unwrap();
    let path = RecordLog::path_for(&target, &common::run("cut"));
    for (k, &from) in starts.iter().enumerate().skip(1) {
        let mut zeroed = pristine.clone();
        zeroed[from as usize..].fill(0);
        let cut = pristine[..from as usize].to_vec();
        for (file, file_ends) in [(zeroed, false), (cut, true)] {
            // Read-only: reported, left in place.
            std::fs::write(&path, &file).unwrap();
            let (log, recovery) = RecordLog::open_read_only(&target, &common::run("cut"))
                .unwrap_or_else(|err| panic!("from {k}: {err}"));
            assert_eq!(log.len(), k as u64);
            let tail = recovery.tail.expect("the loss is reported");
            assert!(tail.left_in_place, "{tail}");
            assert_eq!(
                std::fs::read(&path).unwrap(),
                file,
                "read-only writes nothing"
            );
            drop(log);
            // Writable: reported, cut, the end mark written again; reported once.
            let (log, recovery) = reopen(&target);
            assert_eq!(log.len(), k as u64, "{recovery}");
            let tail = recovery.tail.expect("the loss is reported");
            assert_eq!(
                tail.reason,
                TailReason::EndMarkMissing {
                    at: from,
                    file_ends
                },
                "from {k}"
            );
            assert_eq!((tail.offset, tail.bytes), (from, file.len() as u64 - from));
            let what = if file_ends { "the file ends" } else { "zeros" };
            assert_eq!(
                tail.to_string(),
                format!(
                    "the log's end mark is missing: records after byte {from} may have been \
                     lost ({what} from there)"
                )
            );
            for (seq, record) in records.iter().take(k).enumerate() {
                let handle = log.handle(seq as u64).unwrap();
                assert_eq!(log.record(&handle).unwrap().as_ref(), Some(record));
            }
            drop(log);
            let (log, recovery) = reopen(&target);
            assert!(recovery.is_clean(), "{recovery}");
            assert_eq!(log.len(), k as u64);
        }
    }
    // Untouched, as a crash leaves it: clean.
    std::fs::write(&path, &pristine).unwrap();
    let (log, recovery) = reopen(&target);
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!((log.len(), log.size_bytes()), (6, end));
}
