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

mod common;

use std::path::Path;

use psych_record_log::{OpenError, RecordLog};

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

/// Flips one byte of the log inside record 5's content: only a full verification sees it.
fn damage(dir: &Path, starts: &[u64]) -> u64 {
    let path = common::big_log_path(dir);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[starts[5] as usize + 1000] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    starts[5]
}

#[test]
fn a_torn_checkpoint_is_never_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let starts = big(dir.path());
    drop(common::open_big(dir.path()).unwrap());
    let ckpt = common::big_checkpoint_path(dir.path());
    let whole = std::fs::read(&ckpt).unwrap();
    let pristine = std::fs::read(common::big_log_path(dir.path())).unwrap();
    let at = damage(dir.path(), &starts);
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
    match RecordLog::open_read_only(dir.path(), &common::run("big")) {
        Err(OpenError::Corrupt { offset, .. }) => assert_eq!(offset, at),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(ckpt.exists());

    // Undamaged, the open after a torn one verifies every frame and writes a whole one.
    std::fs::write(common::big_log_path(dir.path()), &pristine).unwrap();
    let (log, recovery) = common::open_big(dir.path()).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.len(), 17);
    drop(log);
    assert_eq!(std::fs::read(&ckpt).unwrap(), whole);
}

#[test]
fn a_temporary_checkpoint_left_by_a_crash_is_ignored_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let starts = big(dir.path());
    drop(common::open_big(dir.path()).unwrap());
    let ckpt = common::big_checkpoint_path(dir.path());
    let tmp = common::with_suffix(common::big_log_path(dir.path()), ".ckpt.tmp");
    // A crash before the rename: the temporary file (here, half of one) and no checkpoint.
    let whole = std::fs::read(&ckpt).unwrap();
    std::fs::rename(&ckpt, &tmp).unwrap();
    std::fs::write(&tmp, &whole[..whole.len() / 2]).unwrap();
    let at = damage(dir.path(), &starts);
    common::expect_corrupt_at(common::open_big(dir.path()), at);
    // The temporary file is never read as a checkpoint, even whole.
    std::fs::write(&tmp, &whole).unwrap();
    common::expect_corrupt_at(common::open_big(dir.path()), at);
    // Undamaged, the verifying open writes over it and renames it into place.
    std::fs::write(&tmp, &whole[..100]).unwrap();
    let mut bytes = std::fs::read(common::big_log_path(dir.path())).unwrap();
    bytes[at as usize + 1000] ^= 1;
    std::fs::write(common::big_log_path(dir.path()), &bytes).unwrap();
    let (_, recovery) = common::open_big(dir.path()).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert!(!tmp.exists());
    assert_eq!(std::fs::read(&ckpt).unwrap(), whole);
}
