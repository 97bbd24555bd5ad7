//! Helpers shared by the record log's integration tests: record makers and a proptest
//! strategy over every record shape.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;
use psych_record_log::{GroupCommit, OpenError, RecordLog, Recovery, SyncPolicy};
use psych_types::{
    AssistantMessage, ContentBlock, Record, RunId, ToolCall, ToolCallId, ToolOutput, ToolResult,
    UserMessage,
};

/// Bytes of the end mark the log writes right after its last frame (`docs/format.md`,
/// "End mark"): a log's file holds it past `size_bytes()`, then preallocated zeros.
pub(crate) const END_MARK: u64 = 24;

/// A group commit policy with these bounds, panicking if they are out of range (tests
/// only).
pub(crate) fn group_commit(max_wait: Duration, max_records: usize, max_bytes: u64) -> SyncPolicy {
    SyncPolicy::GroupCommit(
        GroupCommit::builder()
            .max_wait(max_wait)
            .max_records(max_records)
            .max_bytes(max_bytes)
            .build()
            .expect("test group commit bounds"),
    )
}

/// A Run id, panicking on a bad literal (tests only).
pub(crate) fn run(id: &str) -> RunId {
    RunId::new(id).expect("test run id")
}

/// Opens the log of Run `big` in `dir`, buffered: the large log the checkpoint tests build.
pub(crate) fn open_big(dir: &Path) -> Result<(RecordLog, Recovery), OpenError> {
    RecordLog::open(dir, &run("big"), SyncPolicy::OsBuffered)
}

/// The file of Run `big`'s log in `dir`.
pub(crate) fn big_log_path(dir: &Path) -> PathBuf {
    RecordLog::path_for(dir, &run("big"))
}

/// Run `big`'s checkpoint file in `dir` (`big.plog.ckpt`).
pub(crate) fn big_checkpoint_path(dir: &Path) -> PathBuf {
    with_suffix(big_log_path(dir), ".ckpt")
}

/// Asserts that `opened` is [`OpenError::Corrupt`] at byte `at`.
pub(crate) fn expect_corrupt_at(opened: Result<(RecordLog, Recovery), OpenError>, at: u64) {
    match opened {
        Err(OpenError::Corrupt { offset, .. }) => assert_eq!(offset, at),
        Err(other) => panic!("expected Corrupt at {at}, got {other:?}"),
        Ok((_, recovery)) => panic!("expected Corrupt at {at}, opened: {recovery}"),
    }
}

/// Flips the lowest bit of byte `at` of the file at `path`, in place (again, to undo it).
pub(crate) fn flip(path: &Path, at: u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("the file to flip a byte of");
    let mut byte = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut byte, at).expect("a byte there");
    byte[0] ^= 1;
    std::os::unix::fs::FileExt::write_all_at(&file, &byte, at).expect("written back");
}

/// `path` with `suffix` added to its file name: `big.plog` and `.ckpt` give `big.plog.ckpt`.
pub(crate) fn with_suffix(path: PathBuf, suffix: &str) -> PathBuf {
    let mut name = path.into_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// A user message.
pub(crate) fn user(text: &str) -> Record {
    Record::User(UserMessage { text: text.into() })
}

/// A tool result with `output`.
pub(crate) fn result(call: &str, output: ToolOutput) -> Record {
    Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new(call).expect("test call id"),
        name: "read_file".into(),
        output,
    })
}

/// A text tool result.
pub(crate) fn text_result(text: &str) -> Record {
    result("call_1", ToolOutput::text(text))
}

/// The record a crash-test child appends at position `seq`: deterministic, so the parent
/// can recompute it, and of varied size (up to ~120 KB) so kills land mid-write.
pub(crate) fn numbered(seq: u64) -> Record {
    let len = match seq % 7 {
        0 => 3,
        1 => 700,
        2 => 4096,
        3 => 65_000,
        4 => 20,
        5 => 120_000,
        _ => 9_000,
    };
    let text: String = (0..len)
        .map(|i| char::from(b'a' + ((seq as usize * 31 + i) % 26) as u8))
        .collect();
    match seq % 3 {
        0 => user(&text),
        1 => result(&format!("call_{seq}"), ToolOutput::text(text)),
        _ => result(&format!("call_{seq}"), with_binary(text)),
    }
}

/// The record a group-commit crash-test child's thread `thread` appends as its `i`-th in
/// round `round`: deterministic, tagged with all three at the start of its text so the
/// parent can tell which it is ([`tag_of`]), and of varied size and kind.
pub(crate) fn tagged(round: u64, thread: u64, i: u64) -> Record {
    let len = match (i * 4 + thread) % 5 {
        0 => 10,
        1 => 4096,
        2 => 300,
        3 => 70_000,
        _ => 1_500,
    };
    let mut text = format!("r{round} t{thread} i{i};");
    text.extend((0..len).map(|k| char::from(b'a' + ((k as u64 + i + thread) % 26) as u8)));
    match (i + thread) % 3 {
        0 => user(&text),
        1 => result(&format!("call_{thread}_{i}"), ToolOutput::text(text)),
        _ => result(&format!("call_{thread}_{i}"), with_binary(text)),
    }
}

/// The `(round, thread, i)` a [`tagged`] record carries, if it is one.
pub(crate) fn tag_of(record: &Record) -> Option<(u64, u64, u64)> {
    let bytes = match record {
        Record::User(user) => user.text.as_bytes().to_vec(),
        Record::ToolResult(result) => psych_types::readable_bytes(&result.output).into_owned(),
        Record::Assistant(_) | Record::Usage(_) => return None,
    };
    let head = bytes.split(|&b| b == b';').next()?;
    let head = std::str::from_utf8(head).ok()?;
    let mut parts = head.split(' ');
    let mut field = |prefix: char| parts.next()?.strip_prefix(prefix)?.parse().ok();
    Some((field('r')?, field('t')?, field('i')?))
}

/// A result of `text` as a text block followed by the same bytes as a binary block.
pub(crate) fn with_binary(text: String) -> ToolOutput {
    let bytes = text.clone().into_bytes();
    ToolOutput::from_blocks(vec![
        ContentBlock::text(text),
        ContentBlock::image("application/octet-stream", bytes),
    ])
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        ".{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map("[a-z]{0,5}", inner, 0..4)
                .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
        ]
    })
}

/// A content block of any MCP kind, unknown ones included.
fn block() -> impl Strategy<Value = ContentBlock> {
    prop_oneof![
        ".{0,40}".prop_map(ContentBlock::text),
        (
            "[a-z]{1,8}/[a-z]{1,8}",
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(mime, data)| ContentBlock::image(mime, data)),
        prop::collection::vec(any::<u8>(), 0..100)
            .prop_map(|data| ContentBlock::audio("audio/wav", data)),
        ("[a-z]{1,8}", ".{0,30}").prop_map(|(name, text)| {
            ContentBlock::from_object(
                serde_json::json!({"type": "resource", "resource": {"uri": format!("file:///{name}"), "text": text}, "annotations": {"priority": 0.5}})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            )
        }),
        ("[a-z]{1,8}", prop::collection::vec(any::<u8>(), 0..50)).prop_map(|(name, data)| {
            ContentBlock::from_object(
                serde_json::json!({"type": "resource", "resource": {"uri": format!("mem://{name}"), "blob": psych_types::encode_base64(&data), "mimeType": "application/pdf"}})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            )
        }),
        "[a-z]{1,8}".prop_map(|name| {
            ContentBlock::from_object(
                serde_json::json!({"type": "resource_link", "uri": format!("https://x/{name}"), "name": name, "size": 3, "_meta": {"k": [1]}})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            )
        }),
        "[a-z]{1,8}".prop_map(|kind| {
            ContentBlock::from_object(
                serde_json::json!({"type": format!("x-{kind}"), "payload": {"n": 1.5}})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            )
        }),
    ]
}

pub(crate) fn output() -> impl Strategy<Value = ToolOutput> {
    let body = prop_oneof![
        ".{0,60}".prop_map(ToolOutput::text),
        // Multi-byte text and sizes past the small-record path.
        (0usize..3000).prop_map(|n| ToolOutput::text("é\n".repeat(n))),
        json_value().prop_map(ToolOutput::json),
        prop::collection::vec(block(), 0..6).prop_map(ToolOutput::from_blocks),
        (prop::collection::vec(block(), 1..4), json_value()).prop_map(|(blocks, value)| {
            ToolOutput::from_blocks(blocks).with_structured_content(value)
        }),
    ];
    (body, any::<bool>()).prop_map(|(mut output, is_error)| {
        output.is_error = is_error;
        output
    })
}

/// Any record: user, assistant with tool calls, or a tool result of any content kind.
pub(crate) fn any_record() -> impl Strategy<Value = Record> {
    prop_oneof![
        ".{0,40}".prop_map(|text| user(&text)),
        (
            ".{0,40}",
            prop::collection::vec(("[a-z_]{1,10}", json_value()), 0..3)
        )
            .prop_map(|(text, calls)| Record::Assistant(AssistantMessage {
                text,
                tool_calls: calls
                    .into_iter()
                    .enumerate()
                    .map(|(i, (name, arguments))| ToolCall {
                        id: ToolCallId::new(format!("call_{i}")).expect("valid id"),
                        name,
                        arguments,
                    })
                    .collect(),
            })),
        ("[a-z0-9_]{1,12}", output()).prop_map(|(call, output)| result(&call, output)),
    ]
}
