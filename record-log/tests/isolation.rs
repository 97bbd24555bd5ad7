//! Runs are isolated: a log serves only its own Run's handles, whatever shape a foreign or
//! forged handle takes, and never another Run's bytes.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{RecordHandle, RecordSource};

/// Asserts `handle` resolves to nothing at all in `log`.
fn unresolved(log: &RecordLog, handle: &RecordHandle) {
    assert_eq!(log.record(handle).unwrap(), None, "{handle}");
    assert_eq!(log.output_info(handle).unwrap(), None, "{handle}");
    let mut buf = [0u8; 64];
    assert_eq!(log.read_output(handle, 0, &mut buf).unwrap(), 0, "{handle}");
}

#[test]
fn one_runs_handles_do_not_resolve_in_another_runs_log() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, _) =
        RecordLog::open(dir.path(), &common::run("a"), SyncPolicy::OsBuffered).unwrap();
    let (mut b, _) =
        RecordLog::open(dir.path(), &common::run("b"), SyncPolicy::OsBuffered).unwrap();
    let a0 = a.append(&common::text_result("secret of a")).unwrap();
    let b0 = b.append(&common::text_result("data of b")).unwrap();
    assert_eq!(a0.seq, b0.seq, "both Runs have a record 0");

    // A valid handle of another Run.
    unresolved(&b, &a0);
    unresolved(&a, &b0);
    // A handle with the Run altered (same seq, the other Run's name): resolves in that Run
    // to that Run's own record, never to the original's bytes.
    let altered = RecordHandle::new(b.run().clone(), a0.seq);
    let mut buf = [0u8; 64];
    let n = b.read_output(&altered, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"data of b");
    // Forged handles: a Run that does not exist, a position never issued, the largest seq.
    unresolved(&a, &RecordHandle::new(common::run("nobody"), 0));
    unresolved(&a, &RecordHandle::new(common::run("a"), 1));
    unresolved(&a, &RecordHandle::new(common::run("a"), u64::MAX));
    // A prefix of the Run's name (a truncated handle's Run part) is another Run.
    let (mut long, _) =
        RecordLog::open(dir.path(), &common::run("run-10"), SyncPolicy::OsBuffered).unwrap();
    let l0 = long.append(&common::text_result("long")).unwrap();
    let truncated: RecordHandle = "run-1:0".parse().unwrap();
    assert_ne!(truncated, l0);
    unresolved(&long, &truncated);
}

#[test]
fn runs_live_in_separate_files_and_survive_each_others_damage() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, _) =
        RecordLog::open(dir.path(), &common::run("a"), SyncPolicy::OsBuffered).unwrap();
    let (mut b, _) =
        RecordLog::open(dir.path(), &common::run("b"), SyncPolicy::OsBuffered).unwrap();
    let a0 = a.append(&common::user("hello a")).unwrap();
    b.append(&common::user("hello b")).unwrap();
    assert_ne!(a.path(), b.path());
    let b_path = b.path().to_path_buf();
    drop((a, b));
    std::fs::write(&b_path, b"garbage").unwrap();
    assert!(RecordLog::open(dir.path(), &common::run("b"), SyncPolicy::OsBuffered).is_err());
    let (a, recovery) =
        RecordLog::open(dir.path(), &common::run("a"), SyncPolicy::OsBuffered).unwrap();
    assert!(recovery.is_clean());
    assert_eq!(a.record(&a0).unwrap(), Some(common::user("hello a")));
}

#[test]
fn non_tool_result_records_serve_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) =
        RecordLog::open(dir.path(), &common::run("a"), SyncPolicy::OsBuffered).unwrap();
    let user = log.append(&common::user("not output")).unwrap();
    assert!(log.record(&user).unwrap().is_some());
    assert_eq!(log.output_info(&user).unwrap(), None);
    let mut buf = [0u8; 8];
    assert_eq!(log.read_output(&user, 0, &mut buf).unwrap(), 0);
}
