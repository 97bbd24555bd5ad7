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

use std::io::{BufWriter, Write as _};
use std::sync::Arc;
use std::time::Instant;

use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{
    ContentBlock, RecordSource, SpilledBlock, SpilledText, TokenEstimator, ToolOutput,
};

/// The text's size: 1 GiB, rounded down to whole lines.
const TARGET: u64 = 1 << 30;
/// The most resident memory the process may reach.
const LIMIT: u64 = 200 << 20;
/// The last line, found nowhere else in the text.
const LAST: &str = "the one last line: 7f3a-unique\n";

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

/// Line `n` of the text (before the last): 64 bytes, its number in bytes 5..17.
const LINE: &[u8; 64] = b"line 000000000000 the quick brown fox jumps over the lazy dogs.\n";

/// Writes `n` into the number of `line` (12 decimal digits).
fn number(line: &mut [u8; 64], mut n: u64) {
    for digit in line[5..17].iter_mut().rev() {
        *digit = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// The peak resident set of this process so far, in bytes (`VmHWM`).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

#[test]
fn a_gib_spilled_result_is_stored_and_served_in_bounded_memory() {
    let started = Instant::now();
    let line_len = LINE.len() as u64;
    let lines = (TARGET - LAST.len() as u64) / line_len;
    let file = tempfile::tempfile().unwrap();
    let mut out = BufWriter::with_capacity(1 << 20, &file);
    let mut buf = *LINE;
    for n in 0..lines {
        number(&mut buf, n);
        out.write_all(&buf).unwrap();
    }
    out.write_all(LAST.as_bytes()).unwrap();
    out.flush().unwrap();
    drop(out);
    let len = lines * line_len + LAST.len() as u64;
    let text = Arc::new(SpilledText::new(file, len));
    let generated = started.elapsed();

    let dir = tempfile::tempdir().unwrap();
    let run = common::run("gib");
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    log.set_estimator(Arc::new(Quarter));
    let output = ToolOutput {
        spilled: vec![SpilledBlock {
            block: 0,
            text: Arc::clone(&text),
        }],
        ..ToolOutput::from_blocks(vec![ContentBlock::text(text.placeholder())])
    };
    let appending = Instant::now();
    let handle = log.append(&common::result("big", output)).unwrap();
    let appended = appending.elapsed();
    drop(text);

    // The end, by offset and by line.
    let check_reads = |log: &RecordLog| {
        let info = log.output_info(&handle).unwrap().unwrap();
        assert_eq!(info.len, len);
        let mut tail = vec![0u8; LAST.len()];
        let n = log
            .read_output(&handle, len - LAST.len() as u64, &mut tail)
            .unwrap();
        assert_eq!(&tail[..n], LAST.as_bytes());
        // The last line is line `lines` (from 0): the mark is within a stride (512 KiB
        // for 1 GiB) before it.
        let mark = log.line_mark(&handle, lines).unwrap();
        let last_start = lines * line_len;
        assert!(
            mark.at <= last_start && last_start - mark.at <= 512 << 10,
            "{mark:?}"
        );
        assert_eq!(mark.breaks_before, mark.at / line_len);
        let mut page = vec![0u8; (last_start - mark.at) as usize + LAST.len()];
        let n = log.read_output(&handle, mark.at, &mut page).unwrap();
        let page = std::str::from_utf8(&page[..n]).unwrap();
        let found = page
            .split_inclusive('\n')
            .nth((lines - mark.breaks_before) as usize);
        assert_eq!(found, Some(LAST));
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
