//! A stored result's info and its history entry do not build its body's values: a peer's
//! 8 MiB `structuredContent` of `[0,0,…]` beside one text block is about 128 MiB of JSON
//! values, and each `read_tool_output` asks for the info. A history reads its rows in
//! batches: a resume after 128 screenshots does not hold them all. The reads run in a child process
//! (this binary again), so that the peak resident memory (`VmHWM`) measured is theirs
//! alone.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_store_conformance::large::peak_rss;
use psych_store_conformance::pg::{database, psql};
use psych_store_postgres::PgBlocking;
use psych_types::{
    ContentBlock, History, Record, RecordHandle, RecordSource, RecordStore, RunId, ToolCallId,
    ToolOutput, ToolResult,
};
use serde_json::Value;

/// The store's URL; set only in the child.
const CHILD: &str = "PSYCH_PG_SUMMARY_MEMORY_URL";
/// The structured content's elements: `[0,0,…]`, 8 MiB of JSON.
const ELEMENTS: usize = 4 << 20;
/// Results of a 1 MiB image each, after it.
const SCREENSHOTS: usize = 128;
/// The most the child may reach: the process and its connection pool, one body fetched
/// whole (8 MiB), a history's batch of rows (8 of the screenshots' 1.4 MB bodies), far
/// under the values' 128 MiB or the 171 MiB of all the bodies at once.
const LIMIT: u64 = 80 << 20;

#[test]
fn infos_and_history_do_not_build_the_body() {
    if let Ok(url) = std::env::var(CHILD) {
        read_infos(&url);
        return;
    }
    let schema = format!("t_summary_{}", std::process::id());
    psql(&format!("drop schema if exists {schema} cascade"));
    let url = format!("{}?schema={schema}", database());
    {
        let store = PgBlocking::open(&url).unwrap();
        let records = store
            .records("tenant", &RunId::new("sum").unwrap())
            .unwrap();
        let mut output = ToolOutput::text("a short text beside a large structured result");
        output.structured_content = Some(Value::Array(vec![Value::from(0); ELEMENTS]));
        records
            .append(&Record::ToolResult(ToolResult {
                target: None,
                call_id: ToolCallId::new("big").unwrap(),
                name: "read".into(),
                output,
            }))
            .unwrap();
        // Screenshots: 128 MiB of images, 171 MiB as base64 in their rows' bodies.
        for i in 0..SCREENSHOTS {
            let output = ToolOutput::from_blocks(vec![
                ContentBlock::text(format!("screenshot {i}")),
                ContentBlock::image("image/png", vec![7; 1 << 20]),
            ]);
            records
                .append(&Record::ToolResult(ToolResult {
                    target: None,
                    call_id: ToolCallId::new(format!("shot-{i}")).unwrap(),
                    name: "screenshot".into(),
                    output,
                }))
                .unwrap();
        }
    }
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "infos_and_history_do_not_build_the_body",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, &url)
        .output()
        .unwrap();
    psql(&format!("drop schema if exists {schema} cascade"));
    let stdout = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&child.stderr)
    );
    // The harness prints the test's name on the line the child's `peak N` ends.
    let peak: u64 = stdout
        .split("peak ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak in {stdout}"));
    eprintln!(
        "infos read in a child whose peak RSS was {} MiB",
        peak >> 20
    );
    assert!(
        peak < LIMIT,
        "peak {} MiB, over {} MiB",
        peak >> 20,
        LIMIT >> 20
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
        assert_eq!(info.name, "read");
    }
    let mut history = History::default();
    records.extend_history(&mut history).unwrap();
    assert_eq!(history.entries.len(), 1 + SCREENSHOTS);
    println!("peak {}", peak_rss());
}
