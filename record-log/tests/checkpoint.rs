//! The open checkpoint (`docs/format.md`, "Open checkpoint"): a log past 64 MiB is verified
//! in full once, and later opens take the verified frames from `<run>.plog.ckpt` instead of
//! checksumming them again. Damage inside them is then found when the record is read; any
//! doubt about the checkpoint (its checksum, another file's, its last frame gone, the file
//! cut) and open verifies every frame as before, so lost durable records stay `Corrupt`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::path::Path;

use psych_record_log::{ReadError, RecordLog, SyncPolicy, TailReason};
use psych_types::RecordSource;

const RECORDS: u64 = 17;

fn record(seq: u64) -> psych_types::Record {
    let line = format!("record {seq} line\n");
    common::text_result(&line.repeat((4 << 20) / line.len()))
}

/// A log of 17 results of 4 MiB (68 MiB), synced twice (after 16, then after the last),
/// so its high-water mark counts 16 records durable; returns each frame's start.
fn big(dir: &Path) -> Vec<u64> {
    let (mut log, _) = common::open_big(dir).unwrap();
    let mut starts = Vec::new();
    for seq in 0..RECORDS {
        if seq == RECORDS - 1 {
            log.sync().unwrap();
        }
        starts.push(log.size_bytes());
        log.append(&record(seq)).unwrap();
    }
    log.sync().unwrap();
    starts
}

#[test]
fn frames_verified_once_are_taken_from_the_checkpoint_and_checked_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let starts = big(dir.path());
    assert!(
        !common::big_checkpoint_path(dir.path()).exists(),
        "appending writes none"
    );
    let (log, recovery) = common::open_big(dir.path()).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    drop(log);
    assert!(
        common::big_checkpoint_path(dir.path()).exists(),
        "the verifying open writes one"
    );

    // A flipped content byte in record 3: not seen by open (checkpointed), but by a read.
    common::flip(&common::big_log_path(dir.path()), starts[3] + 1000);
    let (log, recovery) = common::open_big(dir.path()).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.len(), RECORDS);
    for seq in [0, 2, 4, 16] {
        assert_eq!(
            log.record(&log.handle(seq).unwrap()).unwrap(),
            Some(record(seq))
        );
    }
    match log.record(&log.handle(3).unwrap()) {
        Err(ReadError::Corrupt { offset, .. }) => assert_eq!(offset, starts[3]),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop(log);

    // Without the checkpoint, the open verifies every frame and refuses the damage.
    std::fs::remove_file(common::big_checkpoint_path(dir.path())).unwrap();
    common::expect_corrupt_at(common::open_big(dir.path()), starts[3]);
}

/// A lazy read (the history's walk, then a projection's slice of a result) of a log whose
/// frames came from the checkpoint: each frame is checked whole on its first content read
/// in this process, so damage inside it is `Corrupt` even where the slice read misses it.
#[test]
fn a_checkpointed_frame_is_checked_whole_on_its_first_lazy_read() {
    let dir = tempfile::tempdir().unwrap();
    let starts = big(dir.path());
    drop(common::open_big(dir.path()).unwrap());
    assert!(common::big_checkpoint_path(dir.path()).exists());

    // A flipped byte near the end of record 3's content, far from the head read below.
    common::flip(&common::big_log_path(dir.path()), starts[4] - 1000);
    let (log, recovery) = common::open_big(dir.path()).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    // The walk reads headers and metadata only.
    assert_eq!(log.history().unwrap().len() as u64, RECORDS);
    let damaged = log.handle(3).unwrap();
    let mut head = [0u8; 64];
    // Twice: a frame that failed is not remembered as verified.
    for _ in 0..2 {
        match log.read_output(&damaged, 0, &mut head) {
            Err(ReadError::Corrupt { offset, .. }) => assert_eq!(offset, starts[3]),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
    assert!(matches!(
        log.content_block(&damaged, 0),
        Err(ReadError::Corrupt { offset, .. }) if offset == starts[3]
    ));
    // Undamaged frames read as written (checked whole first).
    let whole = |seq: u64| match record(seq) {
        psych_types::Record::ToolResult(result) => result.output.readable_text().into_owned(),
        _ => unreachable!(),
    };
    let two = log.handle(2).unwrap();
    assert_eq!(log.read_output(&two, 0, &mut head).unwrap(), head.len());
    assert_eq!(&head[..], &whole(2).as_bytes()[..head.len()]);

    // Once checked, a frame is not read whole again by later slices of this process, as
    // frames checked at open are not: damage after the check is found by `record` (and by
    // the next process).
    common::flip(&common::big_log_path(dir.path()), starts[3] - 1000);
    assert_eq!(log.read_output(&two, 0, &mut head).unwrap(), head.len());
    assert!(matches!(
        log.record(&two),
        Err(ReadError::Corrupt { offset, .. }) if offset == starts[2]
    ));
}

#[test]
fn durable_records_zeroed_or_cut_are_corrupt_with_a_checkpoint_too() {
    let dir = tempfile::tempdir().unwrap();
    let starts = big(dir.path());
    drop(common::open_big(dir.path()).unwrap());
    let pristine = std::fs::read(common::big_log_path(dir.path())).unwrap();
    let checkpoint = std::fs::read(common::big_checkpoint_path(dir.path())).unwrap();

    // Zeros from a middle frame to the end of the file.
    let mut zeroed = pristine.clone();
    zeroed[starts[9] as usize..].fill(0);
    std::fs::write(common::big_log_path(dir.path()), &zeroed).unwrap();
    common::expect_corrupt_at(common::open_big(dir.path()), starts[9]);
    assert_eq!(
        std::fs::read(common::big_log_path(dir.path())).unwrap(),
        zeroed
    );

    // Cut at a middle frame.
    std::fs::write(common::big_checkpoint_path(dir.path()), &checkpoint).unwrap();
    std::fs::write(
        common::big_log_path(dir.path()),
        &pristine[..starts[12] as usize],
    )
    .unwrap();
    common::expect_corrupt_at(common::open_big(dir.path()), starts[12]);

    // The last checkpointed frame's header zeroed: the checkpoint is refused, and, as
    // without a checkpoint, the record is durable missing: closing the log after its sync
    // made the high-water mark count it (generation 3, slot 1).
    std::fs::write(common::big_checkpoint_path(dir.path()), &checkpoint).unwrap();
    let mut last = pristine.clone();
    last[starts[16] as usize..starts[16] as usize + 32].fill(0);
    std::fs::write(common::big_log_path(dir.path()), &last).unwrap();
    common::expect_corrupt_at(common::open_big(dir.path()), starts[16]);
    assert_eq!(
        std::fs::read(common::big_log_path(dir.path())).unwrap(),
        last
    );
    // Without that mark (a crash before the close: the mark of the last sync, generation
    // 2 in slot 0, counts record 16 as that sync's own), the record found damaged is cut
    // and reported.
    let slot_1 = 16 + "big".len() + 36;
    assert_eq!(last[slot_1], 3, "the mark the close wrote");
    last[slot_1..slot_1 + 36].fill(0);
    std::fs::write(common::big_checkpoint_path(dir.path()), &checkpoint).unwrap();
    std::fs::write(common::big_log_path(dir.path()), &last).unwrap();
    let (log, recovery) = common::open_big(dir.path()).unwrap();
    assert_eq!(log.len(), 16);
    let tail = recovery.tail.expect("reported");
    assert_eq!(tail.offset, starts[16]);
    assert!(
        matches!(
            tail.reason,
            TailReason::Damaged {
                last_synced: Some(16),
                ..
            } | TailReason::TornWrite {
                last_synced: Some(16),
                ..
            }
        ),
        "{tail}"
    );
    assert!(
        tail.to_string()
            .contains("the last sync wrote records up to 16"),
        "{tail}"
    );
}

#[test]
fn a_checkpoint_in_doubt_is_dropped_and_every_frame_verified() {
    let dir = tempfile::tempdir().unwrap();
    let starts = big(dir.path());
    drop(common::open_big(dir.path()).unwrap());
    let checkpoint = std::fs::read(common::big_checkpoint_path(dir.path())).unwrap();
    let damaged_log = {
        let mut bytes = std::fs::read(common::big_log_path(dir.path())).unwrap();
        bytes[starts[5] as usize + 500] ^= 1;
        bytes
    };

    // Its own checksum fails: every frame is verified (the damage is found) and the
    // checkpoint file is removed.
    let mut bad = checkpoint.clone();
    bad[100] ^= 1;
    std::fs::write(common::big_checkpoint_path(dir.path()), &bad).unwrap();
    std::fs::write(common::big_log_path(dir.path()), &damaged_log).unwrap();
    common::expect_corrupt_at(common::open_big(dir.path()), starts[5]);
    assert!(!common::big_checkpoint_path(dir.path()).exists());

    // The checkpoint of another file: the same log copied elsewhere (another inode).
    let other = tempfile::tempdir().unwrap();
    std::fs::write(common::big_log_path(other.path()), &damaged_log).unwrap();
    std::fs::write(common::big_checkpoint_path(other.path()), &checkpoint).unwrap();
    common::expect_corrupt_at(common::open_big(other.path()), starts[5]);
}

#[test]
fn frames_appended_after_the_checkpoint_are_verified_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    big(dir.path());
    let (mut log, _) = common::open_big(dir.path()).unwrap();
    let a = log.size_bytes();
    log.append(&common::user("after the checkpoint")).unwrap();
    log.append(&common::user("and another")).unwrap();
    log.sync().unwrap();
    drop(log);
    common::flip(&common::big_log_path(dir.path()), a + 40);
    common::expect_corrupt_at(common::open_big(dir.path()), a);
}

#[test]
fn read_only_opens_use_a_checkpoint_but_never_write_one_and_small_logs_get_none() {
    let dir = tempfile::tempdir().unwrap();
    let starts = big(dir.path());
    let (log, recovery) = RecordLog::open_read_only(dir.path(), &common::run("big")).unwrap();
    assert!(recovery.is_clean() && log.len() == RECORDS);
    drop(log);
    assert!(!common::big_checkpoint_path(dir.path()).exists());
    drop(common::open_big(dir.path()).unwrap());
    common::flip(&common::big_log_path(dir.path()), starts[2] + 77);
    let (log, _) = RecordLog::open_read_only(dir.path(), &common::run("big")).unwrap();
    assert!(log.record(&log.handle(2).unwrap()).is_err());

    let small = tempfile::tempdir().unwrap();
    let (mut log, _) =
        RecordLog::open(small.path(), &common::run("big"), SyncPolicy::EveryAppend).unwrap();
    log.append(&common::user("small")).unwrap();
    drop(log);
    drop(common::open_big(small.path()).unwrap());
    assert!(!common::big_checkpoint_path(small.path()).exists());
}

/// Counts `sync_data` calls, and whether the checkpoint was there at each.
#[derive(Debug)]
struct Watched {
    checkpoint: std::path::PathBuf,
    syncs_before_checkpoint: std::sync::atomic::AtomicUsize,
}

impl psych_record_log::Storage for Watched {
    fn write_all_at(&self, file: &std::fs::File, buf: &[u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
    }

    fn set_len(&self, file: &std::fs::File, len: u64) -> std::io::Result<()> {
        file.set_len(len)
    }

    fn sync_data(&self, file: &std::fs::File) -> std::io::Result<()> {
        if !self.checkpoint.exists() {
            self.syncs_before_checkpoint
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        file.sync_data()
    }
}

/// A checkpoint vouches for frames on disk: an open under a policy that does not sync
/// (`OsBuffered`, whose scan may read frames still only in the page cache) syncs them
/// before it writes one.
#[test]
fn an_open_that_does_not_sync_appends_syncs_the_frames_its_checkpoint_covers() {
    let dir = tempfile::tempdir().unwrap();
    big(dir.path());
    let watched = std::sync::Arc::new(Watched {
        checkpoint: common::big_checkpoint_path(dir.path()),
        syncs_before_checkpoint: std::sync::atomic::AtomicUsize::new(0),
    });
    let (log, recovery) = RecordLog::open_with_storage(
        dir.path(),
        &psych_types::RunId::new("big").unwrap(),
        SyncPolicy::OsBuffered,
        watched.clone(),
    )
    .unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    drop(log);
    assert!(common::big_checkpoint_path(dir.path()).exists());
    assert!(
        watched
            .syncs_before_checkpoint
            .load(std::sync::atomic::Ordering::SeqCst)
            > 0
    );
}
