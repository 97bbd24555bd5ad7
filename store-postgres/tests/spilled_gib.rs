//! Issue 31's size on PostgreSQL: a 1 GiB spilled text appended to the store (streamed
//! from its file, 128 KiB chunks), read at its end by offset and by line, and read again by
//! a second opening of the Run, in a process whose peak resident memory stays under
//! 200 MiB. Its own test binary, so that the peak (`VmHWM`) is this test's alone.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::io::{BufWriter, Write as _};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use psych_store_postgres::PgBlocking;
use psych_types::{
    ContentBlock, Record, RecordSource, RecordStore, RunId, SpilledBlock, SpilledText, ToolCallId,
    ToolOutput, ToolResult,
};

/// The text's size: 1 GiB, rounded down to whole lines.
const TARGET: u64 = 1 << 30;
/// The most resident memory the process may reach.
const LIMIT: u64 = 200 << 20;
/// The last line, found nowhere else in the text.
const LAST: &str = "the one last line: 7f3a-unique\n";
/// Line `n` of the text (before the last): 64 bytes, its number in bytes 5..17.
const LINE: &[u8; 64] = b"line 000000000000 the quick brown fox jumps over the lazy dogs.\n";

fn database() -> String {
    std::env::var("PSYCH_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn psql(sql: &str) {
    let out = Command::new("psql")
        .args([&database(), "-qc", sql])
        .output()
        .expect("psql runs");
    assert!(out.status.success(), "{sql}: {out:?}");
}

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
fn a_gib_spilled_result_is_stored_and_read_in_bounded_memory() {
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

    let schema = format!("t_gib_{}", std::process::id());
    psql(&format!("drop schema if exists {schema} cascade"));
    let url = format!("{}?schema={schema}", database());
    let store = PgBlocking::open(&url).unwrap();
    let run = RunId::new("gib").unwrap();
    let records = store.records("tenant", &run).unwrap();
    let output = ToolOutput {
        spilled: vec![SpilledBlock {
            block: 0,
            text: Arc::clone(&text),
        }],
        ..ToolOutput::from_blocks(vec![ContentBlock::text(text.placeholder())])
    };
    let appending = Instant::now();
    let handle = records
        .append(&Record::ToolResult(ToolResult {
            call_id: ToolCallId::new("big").unwrap(),
            name: "read".into(),
            output,
        }))
        .unwrap();
    let appended = appending.elapsed();
    drop(text);

    let check_reads = |records: &psych_store_postgres::PgRecords| {
        let info = records.output_info(&handle).unwrap().unwrap();
        assert_eq!(info.len, len);
        let mut tail = vec![0u8; LAST.len()];
        let n = records
            .read_output(&handle, len - LAST.len() as u64, &mut tail)
            .unwrap();
        assert_eq!(&tail[..n], LAST.as_bytes());
        let mark = records.line_mark(&handle, lines).unwrap();
        let last_start = lines * line_len;
        assert!(
            mark.at <= last_start && last_start - mark.at <= 512 << 10,
            "{mark:?}"
        );
        assert_eq!(mark.breaks_before, mark.at / line_len);
        let mut page = vec![0u8; (last_start - mark.at) as usize + LAST.len()];
        let n = records.read_output(&handle, mark.at, &mut page).unwrap();
        let page = std::str::from_utf8(&page[..n]).unwrap();
        let found = page
            .split_inclusive('\n')
            .nth((lines - mark.breaks_before) as usize);
        assert_eq!(found, Some(LAST));
    };
    check_reads(&records);
    drop(records);
    let reading = Instant::now();
    let again = store.existing_records("tenant", &run).unwrap().unwrap();
    check_reads(&again);
    let read = reading.elapsed();
    let size = again.size_bytes();
    drop((again, store));
    psql(&format!("drop schema if exists {schema} cascade"));

    let peak = peak_rss();
    println!(
        "1 GiB spilled result in PostgreSQL: appended in {appended:?}, read at its end by a \
         second opening in {read:?}, {size} bytes stored; peak RSS {} MiB (limit {} MiB); \
         total {:?}",
        peak >> 20,
        LIMIT >> 20,
        started.elapsed()
    );
    assert!(peak < LIMIT, "peak RSS {peak} bytes");
}
