//! Reading a large result whole (`RecordStore::record`, what a resumed Run's history reads)
//! holds about the text once: its chunks are streamed and dropped as they are joined, and a
//! text that is the whole result is not copied again. A 256 MiB text, read whole, in a
//! process whose peak resident memory grows by under 1.25 times the text (measured: 256
//! MiB; before, holding every chunk and copying, 974 MiB). Its own test binary, so that the
//! peak (`VmHWM`) is this test's alone.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_store_conformance::large::{peak_rss, spilled_output, tool_result};
use psych_store_conformance::pg::{database, psql};
use psych_store_postgres::PgBlocking;
use psych_types::{Record, RecordSource, RecordStore, RunId};

/// The text's size: 256 MiB, rounded down to whole lines.
const TARGET: u64 = 256 << 20;

#[test]
fn a_large_result_read_whole_is_held_about_once() {
    let (output, len, _) = spilled_output(TARGET);
    let schema = format!("t_record_memory_{}", std::process::id());
    psql(&format!("drop schema if exists {schema} cascade"));
    let url = format!("{}?schema={schema}", database());
    let store = PgBlocking::open(&url).unwrap();
    let records = store
        .records("tenant", &RunId::new("whole").unwrap())
        .unwrap();
    let handle = records.append(&tool_result("big", "read", output)).unwrap();
    let before = peak_rss();
    let Some(Record::ToolResult(result)) = records.record(&handle).unwrap() else {
        panic!("the result");
    };
    let text = result.output.readable_text();
    assert_eq!(text.len() as u64, len);
    let peak = peak_rss();
    drop((result, records, store));
    psql(&format!("drop schema if exists {schema} cascade"));
    println!(
        "a {} MiB result read whole: peak RSS {} MiB ({} MiB before the read)",
        len >> 20,
        peak >> 20,
        before >> 20
    );
    assert!(
        peak < before + len + len / 4,
        "peak RSS {peak} bytes, {before} before the read, for {len} bytes"
    );
}
