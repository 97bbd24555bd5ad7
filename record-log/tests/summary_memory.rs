//! A stored result's summary (what `output_info`, `block_lines` and a lazy history read)
//! does not build its `structuredContent`: a peer's 8 MiB `[0,0,…]` beside one text block
//! is about 128 MiB of JSON values, and each `read_tool_output` asks for a summary; and a
//! record read back whole holds its content once. The reads run in a child process (this
//! binary again), so that the peak resident memory (`VmHWM`) measured is theirs alone.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod common;

use std::path::Path;

use psych_record_log::{RecordLog, SyncPolicy};
use psych_store_conformance::large::{assert_child_peak_under, print_peak};
use psych_types::{RecordSource, ToolOutput};
use serde_json::Value;

/// Where the child finds the log; set only in the child.
const CHILD: &str = "PSYCH_SUMMARY_MEMORY_DIR";
/// The structured content's elements: `[0,0,…]`, 8 MiB of JSON.
const ELEMENTS: usize = 4 << 20;
/// The most the child may reach: the metadata read whole (8 MiB) and the process itself,
/// far under the values' 128 MiB.
const LIMIT: u64 = 64 << 20;

#[test]
fn summaries_do_not_build_structured_content() {
    if let Some(dir) = std::env::var_os(CHILD) {
        read_summaries(Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _) =
            RecordLog::open(dir.path(), &common::run("sum"), SyncPolicy::OsBuffered).unwrap();
        let mut output = ToolOutput::text("a short text beside a large structured result");
        output.structured_content = Some(Value::Array(vec![Value::from(0); ELEMENTS]));
        log.append(&common::result("big", output)).unwrap();
    }
    assert_child_peak_under(
        "summaries_do_not_build_structured_content",
        CHILD,
        dir.path(),
        LIMIT,
    );
}

/// Where the child of the next test finds its log; set only in that child.
const RECORD_CHILD: &str = "PSYCH_RECORD_MEMORY_DIR";
/// A text result of 32 MiB, read back whole by handle.
const TEXT: usize = 32 << 20;

/// A record read back by handle holds its content once: a 32 MiB text result peaks at the
/// text and the process (it was four times the text: 128 MiB), and a short text beside
/// 8 MiB of structured content is a string of its own size, not of the record's.
#[test]
fn a_record_read_back_holds_its_content_once() {
    if let Some(dir) = std::env::var_os(RECORD_CHILD) {
        read_records(Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _) =
            RecordLog::open(dir.path(), &common::run("rec"), SyncPolicy::OsBuffered).unwrap();
        let text = "a line of text\n".repeat(TEXT / 15);
        log.append(&common::result("text", ToolOutput::text(text)))
            .unwrap();
        let mut output = ToolOutput::text("a short text");
        output.structured_content = Some(serde_json::json!({"blob": "x".repeat(8 << 20)}));
        log.append(&common::result("beside", output)).unwrap();
    }
    assert_child_peak_under(
        "a_record_read_back_holds_its_content_once",
        RECORD_CHILD,
        dir.path(),
        64 << 20,
    );
}

/// In the child: both records read back whole.
fn read_records(dir: &Path) {
    use psych_types::{ContentBlock, Record};
    let (log, _) = RecordLog::open_read_only(dir, &common::run("rec")).unwrap();
    let text_of = |record: Option<Record>| match record {
        Some(Record::ToolResult(result)) => match result.output.content.into_iter().next() {
            Some(ContentBlock::Text(text)) => text.text,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    let text = text_of(log.record(&log.handle(0).unwrap()).unwrap());
    assert_eq!(text.len(), TEXT / 15 * 15);
    drop(text);
    let short = text_of(log.record(&log.handle(1).unwrap()).unwrap());
    assert_eq!(short, "a short text");
    assert!(short.capacity() < 1024, "{}", short.capacity());
    print_peak();
}

/// In the child: every summary read, ten times over.
fn read_summaries(dir: &Path) {
    let (log, _) = RecordLog::open_read_only(dir, &common::run("sum")).unwrap();
    let handle = log.handle(0).unwrap();
    for _ in 0..10 {
        let info = log.output_info(&handle).unwrap().unwrap();
        assert!(info.len > 0);
        assert!(log.block_lines(&handle).unwrap().is_some());
        assert_eq!(log.history().unwrap().len(), 1);
    }
    print_peak();
}
