//! A stored result's info and its history entry do not build its body's values: a peer's
//! 8 MiB `structuredContent` of `[0,0,…]` beside one text block is about 128 MiB of JSON
//! values, and each `read_tool_output` asks for the info (an elided result's preview for
//! its blocks' lines). A history reads its rows in batches: a resume after 128
//! screenshots does not hold them all. The reads run in a child process (this binary
//! again), so that the peak resident memory (`VmHWM`) measured is theirs alone.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_store_conformance::large::{assert_child_peak_under, print_peak, tool_result};
use psych_store_conformance::pg::Schema;
use psych_store_postgres::PgBlocking;
use psych_types::{
    ContentBlock, History, HistoryItem, OutputKind, RecordHandle, RecordSource, RecordStore, RunId,
    ToolOutput,
};
use serde_json::Value;

/// The store's URL; set only in the child.
const CHILD: &str = "PSYCH_PG_SUMMARY_MEMORY_URL";
/// The structured content's elements: `[0,0,…]`, 8 MiB of JSON.
const ELEMENTS: usize = 4 << 20;
/// Results of a 1 MiB image each, after it.
const SCREENSHOTS: usize = 128;
/// The most the child may reach: the process and its connection pool, one body fetched
/// whole (8 MiB), a history's batch of rows (about 8 MiB of bodies), far
/// under the values' 128 MiB or the 171 MiB of all the bodies at once.
const LIMIT: u64 = 80 << 20;

#[test]
fn infos_and_history_do_not_build_the_body() {
    if let Ok(url) = std::env::var(CHILD) {
        read_infos(&url);
        return;
    }
    // Dropped when the test ends, whether its bound held or not.
    let schema = Schema::fresh("summary");
    let url = schema.url();
    {
        let store = PgBlocking::open(&url).unwrap();
        let records = store
            .records("tenant", &RunId::new("sum").unwrap())
            .unwrap();
        let mut output = ToolOutput::text("a short text beside a large structured result");
        output.structured_content = Some(Value::Array(vec![Value::from(0); ELEMENTS]));
        records.append(&tool_result("big", "read", output)).unwrap();
        // A result that is its structured content alone, read as JSON.
        records
            .append(&tool_result(
                "json",
                "query",
                ToolOutput::json(serde_json::json!({"rows": [1, 2, 3]})),
            ))
            .unwrap();
        // Screenshots: 128 MiB of images, 171 MiB as base64 in their rows' bodies.
        for i in 0..SCREENSHOTS {
            let output = ToolOutput::from_blocks(vec![
                ContentBlock::text(format!("screenshot {i}")),
                ContentBlock::image("image/png", vec![7; 1 << 20]),
            ]);
            records
                .append(&tool_result(&format!("shot-{i}"), "screenshot", output))
                .unwrap();
        }
    }
    assert_child_peak_under(
        "infos_and_history_do_not_build_the_body",
        CHILD,
        &url,
        LIMIT,
    );
}

/// In the child: the info ten times over, then the whole history.
fn read_infos(url: &str) {
    let store = PgBlocking::open(url).unwrap();
    let records = store
        .existing_records("tenant", &RunId::new("sum").unwrap())
        .unwrap()
        .unwrap();
    let handle = RecordHandle::new(RunId::new("sum").unwrap(), 0);
    for _ in 0..10 {
        let info = records.output_info(&handle).unwrap().unwrap();
        assert_eq!(
            (info.name.as_str(), info.kind, info.is_error),
            ("read", OutputKind::Text, false)
        );
        assert!(records.block_lines(&handle).unwrap().is_some());
    }
    let json = records
        .output_info(&RecordHandle::new(RunId::new("sum").unwrap(), 1))
        .unwrap()
        .unwrap();
    assert_eq!((json.name.as_str(), json.kind), ("query", OutputKind::Json));
    let mut history = History::default();
    records.extend_history(&mut history).unwrap();
    assert_eq!(history.entries.len(), 2 + SCREENSHOTS);
    for (seq, entry) in history.entries.iter().enumerate() {
        assert_eq!(entry.handle.seq, seq as u64);
        let HistoryItem::Result(stored) = &entry.item else {
            panic!("record {seq} is a result")
        };
        assert_eq!(stored.info.kind == OutputKind::Json, seq == 1);
    }
    print_peak();
}
