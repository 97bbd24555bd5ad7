//! Crashes while the open checkpoint is written (`docs/format.md`, "Open checkpoint"): it is
//! written to `<run>.plog.ckpt.tmp`, unsynced, then renamed, so a crash can leave the
//! temporary file behind, or (after a power loss) a `.ckpt` whose bytes are a prefix of
//! the checkpoint or end in zeros. None of these is ever trusted: the open verifies every
//! frame, finds damage the checkpoint would have hidden, and a writable open replaces it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::path::{Path, PathBuf};

use psych_record_log::RecordLog;

/// A log of 17 results of 4 MiB (68 MiB: over the size that gets a checkpoint); returns
/// each frame's start.
fn big(dir: &Path) -> Vec<u64> {
    let (mut log, _) = common::open_big(dir).unwrap();
    let line = "a line of a large result\n";
    let text = line.repeat((4 << 20) / line.len());
    let mut starts = Vec::new();
    for _ in 0..17 {
        starts.push(log.size_bytes());
        log.append(&common::text_result(&text)).unwrap();
    }
    log.sync().unwrap();
    starts
}

/// The big log, opened once so that its checkpoint is written: the directory, each
/// frame's start, and the checkpoint's path and bytes.
fn checkpointed() -> (tempfile::TempDir, Vec<u64>, PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let starts = big(dir.path());
    drop(common::open_big(dir.path()).unwrap());
    let ckpt = common::big_checkpoint_path(dir.path());
    let whole = std::fs::read(&ckpt).unwrap();
    (dir, starts, ckpt, whole)
}

/// Flips one byte of the log inside the content of the record at `start` (again, to undo
/// it): only a full verification sees it. Returns `start`, where open reports the damage.
fn flip(dir: &Path, start: u64) -> u64 {
    common::flip(&common::big_log_path(dir), start + 1000);
    start
}

#[test]
fn a_torn_checkpoint_is_never_trusted() {
    let (dir, starts, ckpt, whole) = checkpointed();
    let at = flip(dir.path(), starts[5]);
    // The whole checkpoint hides the damage (it is found on a read, not by open)...
    drop(common::open_big(dir.path()).unwrap());
    // ...but no torn one does: a prefix of it (cut inside its fixed part, inside the
    // entries, before its checksum), or its length with zeros from some point on.
    let cuts = [
        0,
        30,
        56,
        57,
        whole.len() / 2,
        whole.len() - 4,
        whole.len() - 1,
    ];
    for cut in cuts {
        let mut zeroed = whole.clone();
        zeroed[cut..].fill(0);
        for torn in [&whole[..cut], &zeroed[..]] {
            if torn == whole.as_slice() {
                continue; // zeros where it already held zeros: not torn
            }
            std::fs::write(&ckpt, torn).unwrap();
            common::expect_corrupt_at(common::open_big(dir.path()), at);
            assert!(!ckpt.exists(), "a writable open removes it (cut at {cut})");
        }
    }
    // Read-only opens verify in full too, and leave it where it is.
    std::fs::write(&ckpt, &whole[..whole.len() / 2]).unwrap();
    common::expect_corrupt_at(
        RecordLog::open_read_only(dir.path(), &common::run("big")),
        at,
    );
    assert!(ckpt.exists());

    // Undamaged, the open after a torn one verifies every frame and writes a whole one.
    flip(dir.path(), at);
    let (log, recovery) = common::open_big(dir.path()).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.len(), 17);
    drop(log);
    assert_eq!(std::fs::read(&ckpt).unwrap(), whole);
}

#[test]
fn a_temporary_checkpoint_left_by_a_crash_is_ignored_and_replaced() {
    let (dir, starts, ckpt, whole) = checkpointed();
    let tmp = common::with_suffix(common::big_log_path(dir.path()), ".ckpt.tmp");
    // A crash before the rename: the temporary file (here, half of one) and no checkpoint.
    std::fs::rename(&ckpt, &tmp).unwrap();
    std::fs::write(&tmp, &whole[..whole.len() / 2]).unwrap();
    let at = flip(dir.path(), starts[5]);
    common::expect_corrupt_at(common::open_big(dir.path()), at);
    // The temporary file is never read as a checkpoint, even whole.
    std::fs::write(&tmp, &whole).unwrap();
    common::expect_corrupt_at(common::open_big(dir.path()), at);
    // Undamaged, the verifying open writes over it and renames it into place.
    std::fs::write(&tmp, &whole[..100]).unwrap();
    flip(dir.path(), at);
    let (_, recovery) = common::open_big(dir.path()).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert!(!tmp.exists());
    assert_eq!(std::fs::read(&ckpt).unwrap(), whole);
}
