//! Streamed appends: a tool result whose text blocks are partly spilled to files
//! (`ToolOutput::spilled`) is stored byte for byte as the same result with its texts in
//! memory, through `RecordLog::append`, `append_batch` and `SharedRecordLog`'s group
//! commit alike, and reads back as the in-memory result; a spill file that cannot be read
//! whole as UTF-8, or a write that fails mid-stream, acknowledges nothing and leaves the
//! log as it was.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use psych_record_log::{
    AppendError, FileStorage, RecordLog, SharedRecordLog, SpillError, Storage, SyncPolicy,
};
use psych_types::{
    ContentBlock, Record, RecordSource, SpilledBlock, SpilledText, TokenEstimator, ToolOutput,
};

/// An additive estimator (a byte a token, binary by a third), so that the estimate summed
/// over a spilled text's chunks is the estimate of the whole and frames compare equal.
#[derive(Debug)]
struct Bytes;

impl TokenEstimator for Bytes {
    fn estimate_text(&self, text: &str) -> u64 {
        text.len() as u64
    }

    fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
        len / 3
    }
}

/// One block of a test output: text in memory, text spilled, an image, a text resource.
#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Spilled(String),
    Image(Vec<u8>),
    Resource(String),
}

/// `text` in a file of its own (with bytes past it, which are not the text's).
fn spill(text: &str) -> Arc<SpilledText> {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file.write_all(b"\nnot part of the text").unwrap();
    Arc::new(SpilledText::new(file, text.len() as u64))
}

/// The output of `parts` with every text in memory, and the same output with the
/// `Spilled` parts' texts in files (each block's text its placeholder).
fn outputs(parts: &[Part], is_error: bool) -> (ToolOutput, ToolOutput) {
    let mut whole = Vec::new();
    let mut held = Vec::new();
    let mut spilled = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let block = match part {
            Part::Text(text) | Part::Spilled(text) => ContentBlock::text(text.clone()),
            Part::Image(data) => ContentBlock::image("image/png", data.clone()),
            Part::Resource(text) => ContentBlock::from_object(
                serde_json::json!({"type": "resource", "resource": {"uri": "file:///r", "text": text}})
                    .as_object()
                    .cloned()
                    .unwrap(),
            ),
        };
        whole.push(block.clone());
        if let Part::Spilled(text) = part {
            let text = spill(text);
            held.push(ContentBlock::text(text.placeholder()));
            spilled.push(SpilledBlock { block: i, text });
        } else {
            held.push(block);
        }
    }
    let whole = ToolOutput {
        is_error,
        ..ToolOutput::from_blocks(whole)
    };
    let held = ToolOutput {
        is_error,
        spilled,
        ..ToolOutput::from_blocks(held)
    };
    (whole, held)
}

/// How the records are appended.
#[derive(Debug, Clone, Copy)]
enum Way {
    Append,
    Batch,
    Group,
}

/// Appends `records` to a fresh log of Run `spill` in `dir` (after one user message, so
/// the frames do not start the file) and returns the file's bytes.
fn append_all(dir: &Path, records: &[Record], way: Way) -> Vec<u8> {
    let policy = match way {
        Way::Group => common::group_commit(std::time::Duration::from_millis(1), 64, 8 << 20),
        _ => SyncPolicy::EveryAppend,
    };
    let run = common::run("spill");
    let (mut log, _) = RecordLog::open(dir, &run, policy).unwrap();
    log.set_estimator(Arc::new(Bytes));
    log.append(&common::user("first")).unwrap();
    match way {
        Way::Append => {
            for record in records {
                log.append(record).unwrap();
            }
        }
        Way::Batch => {
            log.append_batch(records).unwrap();
        }
        Way::Group => {
            let shared = SharedRecordLog::new(log);
            shared.append_batch(records).unwrap();
            for record in records {
                shared.append(record).unwrap();
            }
            log = shared.into_inner();
        }
    }
    drop(log);
    std::fs::read(RecordLog::path_for(dir, &run)).unwrap()
}

/// Appends the spilled outputs and the whole ones each to a log of their own, every way,
/// and checks that the files are the same bytes and the records read back whole.
fn check(outputs: &[(ToolOutput, ToolOutput)]) {
    let whole: Vec<Record> = outputs
        .iter()
        .enumerate()
        .map(|(i, (whole, _))| common::result(&format!("c{i}"), whole.clone()))
        .collect();
    let held: Vec<Record> = outputs
        .iter()
        .enumerate()
        .map(|(i, (_, held))| common::result(&format!("c{i}"), held.clone()))
        .collect();
    for way in [Way::Append, Way::Batch, Way::Group] {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let expected = append_all(a.path(), &whole, way);
        let got = append_all(b.path(), &held, way);
        if expected != got {
            let at = expected
                .iter()
                .zip(&got)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            let from = at.saturating_sub(80);
            panic!(
                "{way:?}: the files differ at byte {at}:\n{}\n{}",
                String::from_utf8_lossy(&expected[from..(at + 120).min(expected.len())]),
                String::from_utf8_lossy(&got[from..(at + 120).min(got.len())])
            );
        }
        let (log, recovery) = RecordLog::open_read_only(b.path(), &common::run("spill")).unwrap();
        assert!(recovery.is_clean(), "{recovery}");
        for (seq, record) in (1..).zip(&whole) {
            let handle = log.handle(seq).unwrap();
            assert_eq!(
                log.record(&handle).unwrap().as_ref(),
                Some(record),
                "{way:?}"
            );
        }
    }
}

#[test]
fn a_spilled_output_is_stored_as_the_same_output_in_memory() {
    let big = (0..80_000)
        .map(|i| format!("line {i}: é à 🎉 {}\n", "x".repeat(i % 50)))
        .collect::<String>();
    assert!(big.len() > 3 << 20, "past a few chunks and a line index");
    check(&[
        outputs(&[Part::Spilled(big.clone())], false),
        outputs(
            &[
                Part::Text("before\n".into()),
                Part::Spilled(big.clone()),
                Part::Resource("a resource\n".into()),
                Part::Spilled("small\nspilled".into()),
                Part::Text(String::new()),
                Part::Spilled(String::new()),
            ],
            true,
        ),
        // With binary blocks: content kind 3.
        outputs(
            &[
                Part::Image(vec![1, 2, 3, 4, 5]),
                Part::Spilled(big),
                Part::Image(vec![9; 100]),
            ],
            false,
        ),
    ]);
}

fn part() -> impl Strategy<Value = Part> {
    let text = "[a-cé🎉\n ]{0,40}";
    prop_oneof![
        text.prop_map(Part::Text),
        text.prop_map(Part::Spilled),
        text.prop_map(Part::Spilled),
        proptest::collection::vec(any::<u8>(), 0..20).prop_map(Part::Image),
        text.prop_map(Part::Resource),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn small_spilled_outputs_are_stored_as_in_memory(
        outputs_ in proptest::collection::vec(
            (proptest::collection::vec(part(), 1..6), any::<bool>()),
            1..3,
        )
    ) {
        let pairs: Vec<_> = outputs_.iter().map(|(parts, err)| outputs(parts, *err)).collect();
        check(&pairs);
    }
}

/// Opens a fresh log of Run `spill` in `dir` holding one user message.
fn fresh(dir: &Path) -> RecordLog {
    let run = common::run("spill");
    let (mut log, _) = RecordLog::open(dir, &run, SyncPolicy::EveryAppend).unwrap();
    log.append(&common::user("first")).unwrap();
    log
}

/// After a failed append: nothing acknowledged, the log reopens clean with its one
/// record, and takes the next append.
fn left_as_it_was(dir: &Path, log: RecordLog) {
    assert_eq!(log.len(), 1);
    drop(log);
    let (mut log, recovery) =
        RecordLog::open(dir, &common::run("spill"), SyncPolicy::EveryAppend).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.len(), 1);
    log.append(&common::text_result("next")).unwrap();
}

/// A spilled output of one block whose file holds `bytes` and claims `len` bytes.
fn broken(bytes: &[u8], len: u64) -> Record {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(bytes).unwrap();
    let text = Arc::new(SpilledText::new(file, len));
    common::result(
        "c",
        ToolOutput {
            spilled: vec![SpilledBlock {
                block: 1,
                text: Arc::clone(&text),
            }],
            ..ToolOutput::from_blocks(vec![
                ContentBlock::text("head"),
                ContentBlock::text(text.placeholder()),
            ])
        },
    )
}

#[test]
fn a_spill_file_shorter_than_its_text_or_not_utf8_is_refused() {
    let chunk = 1 << 20;
    let mut bad = "a".repeat(chunk - 1).into_bytes();
    bad.extend_from_slice(&[0xF0, 0x9F, 0x8E, b'x']); // a 4-byte char cut short, at the edge
    let cases = [(b"short".to_vec(), 10), (bad, chunk as u64 + 3)];
    for (bytes, len) in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut log = fresh(dir.path());
        let err = log.append(&broken(&bytes, len)).unwrap_err();
        match &err {
            AppendError::Spill {
                block: 1,
                len: l,
                cause: SpillError::Short { at: 5 },
            } if *l == 10 => {}
            AppendError::Spill {
                block: 1,
                cause: SpillError::NotUtf8 { at },
                ..
            } if *at == chunk as u64 - 1 => {}
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("content block 1"), "{err}");
        left_as_it_was(dir.path(), log);
    }
    // Through group commit: the appender's own error, the log as it was.
    let dir = tempfile::tempdir().unwrap();
    let shared = SharedRecordLog::new(fresh(dir.path()));
    let err = shared.append(&broken(b"short", 10)).unwrap_err();
    assert!(
        matches!(
            err,
            AppendError::Spill {
                cause: SpillError::Short { .. },
                ..
            }
        ),
        "{err:?}"
    );
    left_as_it_was(dir.path(), shared.into_inner());
}

#[test]
fn spilled_blocks_must_name_text_blocks_in_order() {
    let text = spill("spilled");
    let named = |blocks: &[usize]| {
        common::result(
            "c",
            ToolOutput {
                spilled: blocks
                    .iter()
                    .map(|&block| SpilledBlock {
                        block,
                        text: Arc::clone(&text),
                    })
                    .collect(),
                ..ToolOutput::from_blocks(vec![
                    ContentBlock::text("a"),
                    ContentBlock::image("image/png", vec![1]),
                    ContentBlock::text("b"),
                ])
            },
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let mut log = fresh(dir.path());
    for blocks in [&[1][..], &[3], &[2, 0], &[0, 0]] {
        let err = log.append(&named(blocks)).unwrap_err();
        assert!(
            matches!(
                err,
                AppendError::Spill {
                    cause: SpillError::NotATextBlock,
                    ..
                }
            ),
            "{blocks:?}: {err:?}"
        );
    }
    left_as_it_was(dir.path(), log);
}

/// The file storage, but the `n`-th write from when it is armed fails (`EIO`).
#[derive(Debug, Default)]
struct FailNthWrite {
    /// Writes left before the failing one; `u64::MAX` when not armed.
    left: AtomicU64,
    writes: AtomicU64,
}

impl FailNthWrite {
    fn arm(&self, n: u64) {
        self.left.store(n, Ordering::SeqCst);
    }
}

impl Storage for FailNthWrite {
    fn write_all_at(&self, file: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        let left = self.left.fetch_sub(1, Ordering::SeqCst);
        if left == 1 {
            return Err(std::io::Error::from_raw_os_error(5));
        }
        if left == 0 || left > u64::MAX / 2 {
            self.left.store(u64::MAX, Ordering::SeqCst);
        }
        FileStorage.write_all_at(file, buf, offset)
    }

    fn set_len(&self, file: &File, len: u64) -> std::io::Result<()> {
        FileStorage.set_len(file, len)
    }

    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        FileStorage.sync_data(file)
    }
}

#[test]
fn a_write_failing_mid_stream_is_cut_back() {
    // A spilled text of 3 MiB goes out in several writes of about 1 MiB (the gather
    // limit); the second fails, with the frame's first MiB on disk.
    let text = "0123456789abcde\n".repeat(3 << 16);
    for group in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let storage = Arc::new(FailNthWrite {
            left: AtomicU64::new(u64::MAX),
            ..FailNthWrite::default()
        });
        let run = common::run("spill");
        let (mut log, _) = RecordLog::open_with_storage(
            dir.path(),
            &run,
            SyncPolicy::EveryAppend,
            storage.clone(),
        )
        .unwrap();
        log.append(&common::user("first")).unwrap();
        let (_, held) = outputs(&[Part::Spilled(text.clone())], false);
        let record = common::result("c", held);
        let before = storage.writes.load(Ordering::SeqCst);
        storage.arm(2);
        let (err, log) = if group {
            let shared = SharedRecordLog::new(log);
            (shared.append(&record).unwrap_err(), shared.into_inner())
        } else {
            (log.append(&record).unwrap_err(), log)
        };
        assert!(
            matches!(&err, AppendError::Io { source, .. } if source.raw_os_error() == Some(5)),
            "{err:?}"
        );
        assert!(
            storage.writes.load(Ordering::SeqCst) >= before + 2,
            "failed mid-stream"
        );
        left_as_it_was(dir.path(), log);
    }
}
