//! A stored result's summary (what `output_info`, `block_lines` and a lazy history read)
//! does not build its `structuredContent`: a peer's 8 MiB `[0,0,…]` beside one text block
//! is about 128 MiB of JSON values, and each `read_tool_output` asks for a summary. The
//! reads run in a child process (this binary again), so that the peak resident memory
//! (`VmHWM`) measured is theirs alone.

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
