//! MCP results of every block kind go through the log whole: the readable text pages back
//! byte for byte, structured content and `_meta` come back equal, and each binary block
//! comes back whole by position, after a reopen too.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use proptest::prelude::*;
use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{ContentBlock, Record, RecordSource, ToolOutput};

/// Pages the readable text of `handle` back in chunks of `chunk` bytes.
fn page(log: &RecordLog, handle: &psych_types::RecordHandle, chunk: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; chunk];
    loop {
        let n = log.read_output(handle, out.len() as u64, &mut buf).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

fn check(outputs: &[ToolOutput], chunk: usize) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let run = common::run("blocks");
    let records: Vec<Record> = outputs
        .iter()
        .enumerate()
        .map(|(i, o)| common::result(&format!("call_{i}"), o.clone()))
        .collect();
    let handles = {
        let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
        log.append_batch(&records).unwrap()
    };
    let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    prop_assert!(recovery.is_clean());
    for (handle, output) in handles.iter().zip(outputs) {
        let Some(Record::ToolResult(back)) = log.record(handle).unwrap() else {
            return Err(TestCaseError::fail("not a tool result"));
        };
        prop_assert_eq!(&back.output, output);
        let readable = output.readable_text();
        let info = log.output_info(handle).unwrap().unwrap();
        prop_assert_eq!(info.len, readable.len() as u64);
        prop_assert_eq!(page(&log, handle, chunk), readable.as_bytes());
        for (position, block) in output.content.iter().enumerate() {
            let back = log.content_block(handle, position).unwrap();
            prop_assert_eq!(back.as_ref(), Some(block));
        }
        prop_assert_eq!(
            log.content_block(handle, output.content.len()).unwrap(),
            None
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn every_block_kind_round_trips(
        outputs in prop::collection::vec(common::output(), 1..6),
        chunk in 1usize..300,
    ) {
        check(&outputs, chunk)?;
    }
}

#[test]
fn huge_and_empty_results_round_trip() {
    let big_image: Vec<u8> = (0..6_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let outputs = [
        ToolOutput::default(),
        ToolOutput::from_blocks(vec![]),
        ToolOutput::from_blocks(vec![
            ContentBlock::text("x".repeat(3_000_000)),
            ContentBlock::image("image/png", big_image),
            ContentBlock::text(""),
        ]),
    ];
    check(&outputs, 1 << 16).unwrap();
}
