//! Issue 27's size: a 1 GiB spilled text appended, read at its end, found by line, and the
//! log reopened twice (the second open takes the frame from the checkpoint, so the first
//! content read checks it whole), all in a process whose peak resident memory stays under
//! 200 MiB. Its own test binary, so that the peak (`VmHWM`) is this test's alone.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod common;

use std::sync::Arc;
use std::time::Instant;

use psych_record_log::{RecordLog, SyncPolicy};
use psych_store_conformance::large::{assert_end_reads, peak_rss, spilled_output};
use psych_types::TokenEstimator;

/// The text's size: 1 GiB, rounded down to whole lines.
const TARGET: u64 = 1 << 30;
/// The most resident memory the process may reach.
const LIMIT: u64 = 200 << 20;

/// About four bytes a token.
#[derive(Debug)]
struct Quarter;

impl TokenEstimator for Quarter {
    fn estimate_text(&self, text: &str) -> u64 {
        text.len().div_ceil(4) as u64
    }

    fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
        len / 3
    }
}

#[test]
fn a_gib_spilled_result_is_stored_and_served_in_bounded_memory() {
    let started = Instant::now();
    let (output, len, lines) = spilled_output(TARGET);
    let generated = started.elapsed();

    let dir = tempfile::tempdir().unwrap();
    let run = common::run("gib");
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    log.set_estimator(Arc::new(Quarter));
    let appending = Instant::now();
    let handle = log.append(&common::result("big", output)).unwrap();
    let appended = appending.elapsed();

    // The end, by offset and by line.
    let check_reads = |log: &RecordLog| {
        assert_end_reads(log, &handle, len, lines);
        let history = log.history().unwrap();
        assert_eq!(history.len(), 1);
    };
    check_reads(&log);
    drop(log);

    // Reopened: every frame checksummed (streamed), and a checkpoint written past 64 MiB.
    let reopening = Instant::now();
    let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    let reopened = reopening.elapsed();
    assert!(recovery.is_clean(), "{recovery}");
    check_reads(&log);
    drop(log);
    // Again: the frame comes from the checkpoint, so the first content read checks it.
    let checkpoint = common::with_suffix(RecordLog::path_for(dir.path(), &run), ".ckpt");
    assert!(checkpoint.exists(), "the reopen wrote a checkpoint");
    let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    check_reads(&log);
    let size = log.size_bytes();
    drop(log);
    drop(dir);

    let peak = peak_rss();
    println!(
        "1 GiB spilled result: generated in {generated:?}, appended in {appended:?}, \
         reopened in {reopened:?}, log {size} bytes; peak RSS {} MiB (limit {} MiB); \
         total {:?}",
        peak >> 20,
        LIMIT >> 20,
        started.elapsed()
    );
    assert!(peak < LIMIT, "peak RSS {peak} bytes");
}
