//! Issue 31's size on PostgreSQL: a 1 GiB spilled text appended to the store (streamed
//! from its file, 128 KiB chunks), read at its end by offset and by line, and read again by
//! a second opening of the Run, in a process whose peak resident memory stays under
//! 200 MiB. Its own test binary, so that the peak (`VmHWM`) is this test's alone.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::time::Instant;

use psych_store_conformance::large::{assert_end_reads, peak_rss, spilled_output, tool_result};
use psych_store_conformance::pg::{database, psql};
use psych_store_postgres::PgBlocking;
use psych_types::{RecordStore, RunId};

/// The text's size: 1 GiB, rounded down to whole lines.
const TARGET: u64 = 1 << 30;
/// The most resident memory the process may reach.
const LIMIT: u64 = 200 << 20;
#[test]
fn a_gib_spilled_result_is_stored_and_read_in_bounded_memory() {
    let started = Instant::now();
    let (output, len, lines) = spilled_output(TARGET);

    let schema = format!("t_gib_{}", std::process::id());
    psql(&format!("drop schema if exists {schema} cascade"));
    let url = format!("{}?schema={schema}", database());
    let store = PgBlocking::open(&url).unwrap();
    let run = RunId::new("gib").unwrap();
    let records = store.records("tenant", &run).unwrap();
    let appending = Instant::now();
    let handle = records.append(&tool_result("big", "read", output)).unwrap();
    let appended = appending.elapsed();

    assert_end_reads(&records, &handle, len, lines);
    drop(records);
    let reading = Instant::now();
    let again = store.existing_records("tenant", &run).unwrap().unwrap();
    assert_end_reads(&again, &handle, len, lines);
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
