//! Issue 27's limit on mixed results: a stored result that mixes blocks of other kinds
//! (images, audio, resources, links, unknown blocks) with its text is previewed from the
//! record log's windows and its blocks' stored shapes, never read whole; the preview is the
//! same bytes the whole result gives.

use std::io::Write as _;
use std::sync::Arc;

use proptest::prelude::*;
use psych_elision::{Elider, Estimator, PreviewConfig, Thresholds};
use psych_record_log::{ReadError, RecordLog, SyncPolicy};
use psych_types::{
    BlockLines, ContentBlock, HistoryItem, LineMark, OutputInfo, Projection, Record, RecordHandle,
    RecordSource, ResultProjector, ResultRef, RunId, SpilledBlock, SpilledText, StoredRef,
    ToolCallId, ToolOutput, ToolResult,
};
use serde_json::json;

/// A block from MCP JSON.
fn block(value: serde_json::Value) -> ContentBlock {
    let serde_json::Value::Object(map) = value else {
        unreachable!("a block is an object")
    };
    ContentBlock::from_object(map)
}

/// A block of a kind other than text.
fn other_block() -> impl Strategy<Value = ContentBlock> {
    prop_oneof![
        (1usize..3000).prop_map(|n| ContentBlock::image("image/png", vec![7; n])),
        (1usize..500).prop_map(|n| ContentBlock::audio("audio/wav", vec![3; n])),
        "[ -~\n]{0,300}".prop_map(|text| block(json!({
            "type": "resource",
            "resource": {"uri": "file:///notes.txt", "mimeType": "text/plain", "text": text},
        }))),
        Just(block(json!({
            "type": "resource",
            "resource": {"uri": "file:///b.bin", "blob": "AAECAwQF"},
        }))),
        (0u64..1_000_000).prop_map(|size| block(json!({
            "type": "resource_link", "uri": "file:///d.txt", "name": "d", "size": size,
        }))),
        Just(block(json!({"type": "chart", "points": [1, 2, 3]}))),
    ]
}

/// Text blocks (often past both preview windows) mixed with blocks of other kinds.
fn mixed_output() -> impl Strategy<Value = ToolOutput> {
    prop::collection::vec(
        prop_oneof![
            3 => ("[ -~\n]{0,400}", 1usize..40).prop_map(|(t, n)| ContentBlock::text(t.repeat(n))),
            2 => other_block(),
        ],
        1..6,
    )
    .prop_map(ToolOutput::from_blocks)
}

/// A result record of `output`.
fn result(i: usize, output: ToolOutput) -> Record {
    Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new(format!("c{i}")).unwrap(),
        name: "t".into(),
        output,
    })
}

/// An elider that elides every result past a few hundred tokens.
fn elider() -> Elider<Estimator> {
    Elider::builder()
        .thresholds(
            Thresholds::builder()
                .per_result(200)
                .per_batch(400)
                .build()
                .unwrap(),
        )
        .preview(PreviewConfig::default())
        .build()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Through a real record log, the stored projection of mixed results is the bytes of
    /// the whole-output one, and the log's block lines are those of the whole output.
    #[test]
    fn a_logged_mixed_result_previews_as_the_whole_one_does(
        outputs in prop::collection::vec(mixed_output(), 1..5),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("mixed").unwrap();
        let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        log.set_estimator(Arc::new(Estimator::new()));
        let records: Vec<Record> =
            outputs.iter().cloned().enumerate().map(|(i, o)| result(i, o)).collect();
        let handles = log.append_batch(&records).unwrap();
        for (handle, output) in handles.iter().zip(&outputs) {
            prop_assert_eq!(
                RecordSource::block_lines(&log, handle).unwrap(),
                Some(BlockLines::of(output))
            );
        }
        let history = log.history().unwrap();
        let stored: Vec<StoredRef<'_>> = history
            .entries
            .iter()
            .filter_map(|entry| match &entry.item {
                HistoryItem::Result(stored) => Some(StoredRef { handle: &entry.handle, stored }),
                HistoryItem::Record(_) => None,
            })
            .collect();
        let batch: Vec<ResultRef<'_>> = handles
            .iter()
            .zip(&outputs)
            .map(|(handle, output)| ResultRef {
                handle,
                output,
                target: None,
            })
            .collect();
        let elider = elider();
        prop_assert_eq!(elider.project_stored(&stored, &log).unwrap(), elider.project(&batch));
    }
}

/// A record log that refuses to hand out a record whole and counts the readable bytes it
/// serves.
struct NeverWhole<'a> {
    log: &'a RecordLog,
    served: std::cell::Cell<u64>,
}

impl RecordSource for NeverWhole<'_> {
    type Error = ReadError;

    fn run(&self) -> &RunId {
        self.log.run()
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, ReadError> {
        panic!("{handle} was read whole")
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, ReadError> {
        self.log.output_info(handle)
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, ReadError> {
        let n = self.log.read_output(handle, offset, buf)?;
        self.served.set(self.served.get() + n as u64);
        Ok(n)
    }

    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, ReadError> {
        self.log.line_mark(handle, line)
    }

    fn block_lines(&self, handle: &RecordHandle) -> Result<Option<BlockLines>, ReadError> {
        self.log.block_lines(handle)
    }
}

/// A text of `mib` MiB in an unnamed file.
fn spilled(mib: usize, fill: u8) -> Arc<SpilledText> {
    let mut file = tempfile::tempfile().unwrap();
    let line = [vec![fill; 63], vec![b'\n']].concat();
    let mut chunk = Vec::with_capacity(1 << 20);
    while chunk.len() < 1 << 20 {
        chunk.extend_from_slice(&line);
    }
    for _ in 0..mib {
        file.write_all(&chunk).unwrap();
    }
    Arc::new(SpilledText::new(file, (mib << 20) as u64))
}

/// Two 32 MiB texts kept in files, an image between them and a link last: its preview
/// reads the two windows of the readable text and the blocks' lines, never the result
/// whole (it was read whole, 64 MiB in memory, for the image's line), and lists the image,
/// which neither window shows.
#[test]
fn a_mixed_result_with_spilled_texts_is_previewed_from_its_windows() {
    let dir = tempfile::tempdir().unwrap();
    let run = RunId::new("mixed").unwrap();
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
    log.set_estimator(Arc::new(Estimator::new()));
    let (first, second) = (spilled(32, b'a'), spilled(32, b'b'));
    let image = ContentBlock::image("image/png", vec![9; 4096]);
    let link = block(json!({"type": "resource_link", "uri": "file:///out.txt", "name": "out"}));
    let output = ToolOutput {
        spilled: vec![
            SpilledBlock {
                block: 0,
                text: Arc::clone(&first),
            },
            SpilledBlock {
                block: 2,
                text: Arc::clone(&second),
            },
        ],
        ..ToolOutput::from_blocks(vec![
            ContentBlock::text(first.placeholder()),
            image.clone(),
            ContentBlock::text(second.placeholder()),
            link.clone(),
        ])
    };
    let handle = log.append(&result(0, output)).unwrap();
    drop((first, second));
    let history = log.history().unwrap();
    let HistoryItem::Result(stored) = &history.entries[0].item else {
        panic!("not a result: {:?}", history.entries[0]);
    };
    let source = NeverWhole {
        log: &log,
        served: std::cell::Cell::new(0),
    };
    let config = PreviewConfig::default();
    let elider = elider();
    let views = elider
        .project_stored(
            &[StoredRef {
                handle: &handle,
                stored,
            }],
            &source,
        )
        .unwrap();
    let Projection::Replaced(view) = &views[0] else {
        panic!("not elided: {views:?}");
    };
    let windows = (config.head_window() + config.tail_window()) as u64;
    assert!(
        source.served.get() <= windows,
        "{} bytes read",
        source.served.get()
    );
    let image_line = image.placeholder(1).unwrap();
    assert!(
        view.ends_with(&format!(
            "Content blocks of this result not in the preview:\n{image_line}\n"
        )),
        "{view}"
    );
    // The link's line ends the readable text: the tail shows it, so it is not listed again.
    assert!(view.contains(&link.placeholder(3).unwrap()), "{view}");
    assert!(view.starts_with("aaaa"), "{view}");
}
