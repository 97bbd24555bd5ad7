//! Torn multi-frame writes: after a power loss the pages of the last, unsynced write (an
//! `append_batch`, or one group of a `SharedRecordLog`) can reach the disk out of order, so
//! a damaged frame of that write is followed by whole frames of the same write. Opening cuts
//! such a write back to its first damaged frame and reports it; damage in an earlier (synced)
//! write stays `OpenError::Corrupt`, and so does a torn write it cannot prove (a batch
//! damaged only in its first 256 frames, whose whole frames' write index is capped).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use psych_record_log::{OpenError, RecordLog, SharedRecordLog, SyncPolicy, TailReason};
use psych_types::{Record, RecordSource, RunId};

/// One frame in a file: where it starts and ends, its `seq` and its write index (byte 15).
#[derive(Debug, Clone, Copy)]
struct Frame {
    start: u64,
    end: u64,
    seq: u64,
    write_index: u8,
}

/// The frames of a log file of Run `run`, read straight from its bytes (docs/format.md):
/// after the file header and the two 36-byte slots of the high-water mark, frames until the
/// end or the preallocated zeros.
fn frames(bytes: &[u8], run: &RunId) -> Vec<Frame> {
    let mut pos = 12 + run.as_str().len() + 4 + 2 * 36;
    let mut out = Vec::new();
    while pos + 32 <= bytes.len() && bytes[pos..pos + 4] == *b"PSRF" {
        let field = |at: usize, n: usize| {
            let mut le = [0u8; 8];
            le[..n].copy_from_slice(&bytes[pos + at..pos + at + n]);
            u64::from_le_bytes(le)
        };
        let len = 36 + field(16, 4) + field(20, 8);
        out.push(Frame {
            start: pos as u64,
            end: pos as u64 + len,
            seq: field(4, 8),
            write_index: bytes[pos + 15],
        });
        pos += len as usize;
    }
    out
}

fn records(prefix: &str, n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| match i % 2 {
            0 => common::user(&format!("{prefix} {i}")),
            _ => common::text_result(&format!("{prefix} {i}\n").repeat(i + 1)),
        })
        .collect()
}

/// A log of Run `torn` under `dir`: `singles` appended one at a time, then each of
/// `batches` with one `append_batch`. Returns the file's path, bytes (preallocated zeros
/// included) as a crash right after the last sync leaves them (read before the log is
/// closed: closing it brings the high-water mark up to every synced record, after which
/// damage in the last write is lost durable records, `Corrupt`), and frames.
fn build(dir: &Path, singles: &[Record], batches: &[&[Record]]) -> (PathBuf, Vec<u8>, Vec<Frame>) {
    let run = common::run("torn");
    let (mut log, _) = RecordLog::open(dir, &run, SyncPolicy::EveryAppend).unwrap();
    for record in singles {
        log.append(record).unwrap();
    }
    for batch in batches {
        log.append_batch(batch).unwrap();
    }
    let path = log.path().to_path_buf();
    let bytes = std::fs::read(&path).unwrap();
    drop(log);
    let frames = frames(&bytes, &run);
    (path, bytes, frames)
}

/// What damaged bytes hold, by their position within a frame.
type Fill = fn(usize) -> u8;

/// Overwrites `frames` in `bytes` with `fill`.
fn damage(bytes: &[u8], frames: &[Frame], fill: impl Fn(usize) -> u8) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for frame in frames {
        for (k, byte) in out[frame.start as usize..frame.end as usize]
            .iter_mut()
            .enumerate()
        {
            *byte = fill(k);
        }
    }
    out
}

/// Opens the log at `dir` and checks it was cut back to record `kept` with a torn-write loss
/// naming records `kept..=last`; that the records before are intact, and that the log
/// appends after it and reopens clean.
fn assert_torn_write(dir: &Path, expected: &[Record], kept: usize, last: u64, cut_at: u64) {
    let run = common::run("torn");
    let path = RecordLog::path_for(dir, &run);
    let len_before = std::fs::metadata(&path).unwrap().len();
    let (mut log, recovery) = RecordLog::open(dir, &run, SyncPolicy::EveryAppend)
        .unwrap_or_else(|err| panic!("a torn last write must open: {err}"));
    assert_eq!(recovery.records, kept as u64, "{recovery}");
    let loss = recovery.tail.clone().expect("the torn write is reported");
    assert_eq!((loss.offset, loss.bytes), (cut_at, len_before - cut_at));
    assert!(
        matches!(loss.reason, TailReason::TornWrite { first, last: l, damaged_at, .. }
            if first == kept as u64 && l == last && damaged_at == cut_at),
        "{loss}"
    );
    assert!(
        loss.to_string().starts_with(&format!(
            "torn write: records {kept}..={last} of the last write"
        )),
        "{loss}"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        cut_at + common::END_MARK,
        "file cut back, the end mark written again"
    );
    for (seq, record) in expected.iter().take(kept).enumerate() {
        let handle = log.handle(seq as u64).unwrap();
        assert_eq!(log.record(&handle).unwrap().as_ref(), Some(record));
    }
    assert!(log.handle(kept as u64).is_none());
    let after = common::user("after the torn write");
    let handle = log.append(&after).unwrap();
    assert_eq!(handle.seq, kept as u64);
    drop(log);
    let (log, recovery) = RecordLog::open(dir, &run, SyncPolicy::EveryAppend).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.len(), kept as u64 + 1);
    assert_eq!(log.record(&handle).unwrap(), Some(after));
}

fn assert_corrupt_at(dir: &Path, offset: u64) {
    let run = common::run("torn");
    let path = RecordLog::path_for(dir, &run);
    let before = std::fs::read(&path).unwrap();
    match RecordLog::open(dir, &run, SyncPolicy::EveryAppend) {
        Err(OpenError::Corrupt { offset: at, .. }) => assert_eq!(at, offset),
        Err(other) => panic!("expected Corrupt at {offset}, got {other:?}"),
        Ok((_, recovery)) => panic!("expected Corrupt at {offset}, opened: {recovery}"),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the file is left as it was"
    );
}

#[test]
fn frames_carry_their_index_within_their_write() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, frames) = build(dir.path(), &records("single", 3), &[&records("batch", 5)]);
    let indices: Vec<u8> = frames.iter().map(|f| f.write_index).collect();
    assert_eq!(indices, [0, 0, 0, 0, 1, 2, 3, 4]);
    let seqs: Vec<u64> = frames.iter().map(|f| f.seq).collect();
    assert_eq!(seqs, (0..8).collect::<Vec<_>>());
}

#[test]
fn a_batch_torn_by_a_power_loss_is_cut_and_reported() {
    let singles = records("single", 3);
    let batch = records("batch", 5);
    let all = [singles.clone(), batch.clone()].concat();
    let source = tempfile::tempdir().unwrap();
    let (_, bytes, frames) = build(source.path(), &singles, &[&batch]);
    let b = &frames[3..8];
    // (damaged frames of the batch, how, the first damaged record)
    let cases: [(&[Frame], Fill, usize); 5] = [
        // Its first frame still preallocated zeros.
        (&b[..1], |_| 0, 3),
        // Garbage in it instead.
        (&b[..1], |k| (k as u8).wrapping_mul(37) | 0x80, 3),
        // Frames 1..=3 zeros, 0 and 4 whole: damage at record 4, frame 4 (index 4) whole.
        (&b[1..4], |_| 0, 4),
        // Only the last but one missing.
        (&b[3..4], |_| 0, 6),
        // Zeros in the whole batch but its last frame.
        (&b[..4], |_| 0, 3),
    ];
    for (damaged, fill, kept) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = RecordLog::path_for(dir.path(), &common::run("torn"));
        std::fs::write(&path, damage(&bytes, damaged, fill)).unwrap();
        assert_torn_write(dir.path(), &all, kept, 7, frames[kept].start);
    }
    // A flipped bit in the first frame's body (its header whole): the same.
    let dir = tempfile::tempdir().unwrap();
    let path = RecordLog::path_for(dir.path(), &common::run("torn"));
    let mut flipped = bytes.clone();
    flipped[b[0].start as usize + 40] ^= 0x10;
    std::fs::write(&path, &flipped).unwrap();
    assert_torn_write(dir.path(), &all, 3, 7, b[0].start);
    // Cut at the end of the batch's last frame (no preallocated zeros): the same.
    let dir = tempfile::tempdir().unwrap();
    let path = RecordLog::path_for(dir.path(), &common::run("torn"));
    let mut zeroed = damage(&bytes, &b[..1], |_| 0);
    zeroed.truncate(b[4].end as usize);
    std::fs::write(&path, &zeroed).unwrap();
    assert_torn_write(dir.path(), &all, 3, 7, b[0].start);
}

#[test]
fn damage_in_an_earlier_write_stays_corrupt() {
    let source = tempfile::tempdir().unwrap();
    let singles = records("single", 5);
    let (_, bytes, frames) = build(source.path(), &singles, &[]);
    // A single append damaged, whole single appends after it: each was synced on its own.
    let fills: [Fill; 2] = [|_| 0, |k| (k as u8) | 0x80];
    for fill in fills {
        let dir = tempfile::tempdir().unwrap();
        let path = RecordLog::path_for(dir.path(), &common::run("torn"));
        std::fs::write(&path, damage(&bytes, &frames[2..3], fill)).unwrap();
        assert_corrupt_at(dir.path(), frames[2].start);
    }

    // A single append damaged, then a whole batch as the last write: the batch's frames
    // say their write began after the damaged record.
    let source = tempfile::tempdir().unwrap();
    let (_, bytes, frames) = build(source.path(), &records("single", 3), &[&records("b", 3)]);
    let dir = tempfile::tempdir().unwrap();
    let path = RecordLog::path_for(dir.path(), &common::run("torn"));
    std::fs::write(&path, damage(&bytes, &frames[2..3], |_| 0)).unwrap();
    assert_corrupt_at(dir.path(), frames[2].start);

    // A batch damaged at its first frame, the rest of it whole, then a later append: the
    // batch was synced before that append began.
    let source = tempfile::tempdir().unwrap();
    let batch = records("batch", 5);
    let later = records("later", 1);
    let (_, bytes, frames) = build(source.path(), &records("single", 3), &[&batch, &later]);
    assert_eq!(frames[8].write_index, 0);
    let dir = tempfile::tempdir().unwrap();
    let path = RecordLog::path_for(dir.path(), &common::run("torn"));
    std::fs::write(&path, damage(&bytes, &frames[3..4], |_| 0)).unwrap();
    assert_corrupt_at(dir.path(), frames[3].start);

    // The last batch damaged, but what follows its whole frames is neither its next frame
    // nor zeros: not provably the same write, so corrupt.
    let source = tempfile::tempdir().unwrap();
    let (_, bytes, frames) = build(source.path(), &records("single", 3), &[&batch]);
    let dir = tempfile::tempdir().unwrap();
    let path = RecordLog::path_for(dir.path(), &common::run("torn"));
    let mut file = damage(&bytes, &frames[3..4], |_| 0);
    file[frames[7].end as usize + 10] = 0x55;
    std::fs::write(&path, &file).unwrap();
    assert_corrupt_at(dir.path(), frames[3].start);
}

#[test]
fn a_huge_batch_is_recovered_only_while_the_write_index_proves_it() {
    // A batch of 300: frames from 255 on all hold the capped index 255.
    let batch: Vec<Record> = (0..300).map(|i| common::user(&format!("b{i}"))).collect();
    let singles = records("single", 2);
    let all = [singles.clone(), batch.clone()].concat();
    let source = tempfile::tempdir().unwrap();
    let (_, bytes, frames) = build(source.path(), &singles, &[&batch]);
    let b = &frames[2..];
    assert_eq!(b.len(), 300);
    assert_eq!(b[254].write_index, 254);
    assert!(b[255..].iter().all(|f| f.write_index == 255));

    // Damage at frame 10 only: frame 11 (index 11) starts the walk, through the capped
    // indices to the end. Recovered.
    let dir = tempfile::tempdir().unwrap();
    let path = RecordLog::path_for(dir.path(), &common::run("torn"));
    std::fs::write(&path, damage(&bytes, &b[10..11], |_| 0)).unwrap();
    assert_torn_write(dir.path(), &all, 12, 301, b[10].start);

    // Frames 0..=255 damaged, 256.. whole: frame 256 holds index 255, so its write seems to
    // start at record 3, after the damaged record 2. It cannot be told from a later write:
    // conservatively corrupt.
    let dir = tempfile::tempdir().unwrap();
    let path = RecordLog::path_for(dir.path(), &common::run("torn"));
    std::fs::write(&path, damage(&bytes, &b[..256], |_| 0)).unwrap();
    assert_corrupt_at(dir.path(), b[0].start);

    // Frames 0..=254 damaged, 255.. whole: index 255 at record 257, write start 2. Recovered.
    let dir = tempfile::tempdir().unwrap();
    let path = RecordLog::path_for(dir.path(), &common::run("torn"));
    std::fs::write(&path, damage(&bytes, &b[..255], |_| 0)).unwrap();
    assert_torn_write(dir.path(), &all, 2, 301, b[0].start);
}

#[test]
fn a_torn_group_of_a_shared_log_is_cut_and_reported() {
    let source = tempfile::tempdir().unwrap();
    let run = common::run("torn");
    let singles = records("single", 3);
    let (_, _, _) = build(source.path(), &singles, &[]);
    // Two calls, a batch of 2 and a batch of 3, closing one group of 5 records.
    let policy = common::group_commit(Duration::from_secs(1), 5, 1 << 20);
    let (log, _) = SharedRecordLog::open(source.path(), &run, policy).unwrap();
    let log = Arc::new(log);
    let barrier = Arc::new(Barrier::new(2));
    let calls = [records("two", 2), records("three", 3)];
    let workers: Vec<_> = calls
        .iter()
        .cloned()
        .map(|call| {
            let (log, barrier) = (Arc::clone(&log), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                log.append_batch(&call).unwrap()
            })
        })
        .collect();
    let handles: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(log.stats().groups, 1, "{:?}", log.stats());
    let mut all = singles.clone();
    let (first, second) = if handles[0][0].seq < handles[1][0].seq {
        (0, 1)
    } else {
        (1, 0)
    };
    all.extend(calls[first].iter().cloned());
    all.extend(calls[second].iter().cloned());
    let path = log.path().to_path_buf();
    // As a crash right after the group's sync leaves it (see `build`).
    let bytes = std::fs::read(&path).unwrap();
    drop(log);
    let frames = frames(&bytes, &run);
    let indices: Vec<u8> = frames.iter().map(|f| f.write_index).collect();
    assert_eq!(
        indices,
        [0, 0, 0, 0, 1, 2, 3, 4],
        "one write, indexed across calls"
    );
    let g = &frames[3..8];
    // (damaged frames of the group, the first damaged record)
    for (damaged, kept) in [(&g[..1], 3), (&g[1..4], 4), (&g[2..3], 5)] {
        let dir = tempfile::tempdir().unwrap();
        let path = RecordLog::path_for(dir.path(), &run);
        std::fs::write(&path, damage(&bytes, damaged, |_| 0)).unwrap();
        assert_torn_write(dir.path(), &all, kept, 7, frames[kept].start);
        // And through a shared log: it opens, and appends after the cut.
        std::fs::write(&path, damage(&bytes, damaged, |_| 0)).unwrap();
        let (shared, recovery) =
            SharedRecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
        assert_eq!(recovery.records, kept as u64);
        let handle = shared.append(&common::user("next")).unwrap();
        assert_eq!(handle.seq, kept as u64);
    }
    // A group damaged at its first frame, then a later group: corrupt.
    let (log, _) = SharedRecordLog::open(source.path(), &run, SyncPolicy::EveryAppend).unwrap();
    log.append(&common::user("later group")).unwrap();
    drop(log);
    let bytes = std::fs::read(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        RecordLog::path_for(dir.path(), &run),
        damage(&bytes, &g[..1], |_| 0),
    )
    .unwrap();
    assert_corrupt_at(dir.path(), g[0].start);
}
