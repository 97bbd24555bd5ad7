//! The record-store properties: what every [`RecordStore`] keeps, whatever it stores on.
//!
//! Each property takes `open`, a closure that opens (creating or resuming) the store of a
//! Run in one place: called again with the same Run after the first store is dropped, it
//! must find what was acknowledged; called with another Run, it gives that Run's store in
//! the same place.

use std::io::Write as _;
use std::sync::Arc;

use psych_types::{
    AssistantMessage, ContentBlock, History, HistoryItem, LineMark, Record, RecordFailure,
    RecordHandle, RecordStore, RunId, SpilledBlock, SpilledText, ToolCall, ToolCallId, ToolOutput,
    ToolResult, Usage, UserMessage, count_line_breaks, readable_bytes,
};
use serde_json::json;

/// One `#[test]` per record-store property, each over a fresh place made by `$fresh` (an
/// expression of a closure `|| -> O` where `O: Fn(&RunId) -> S` opens a Run's store in
/// that place and `S:` [`RecordStore`]).
#[macro_export]
macro_rules! records_conformance {
    ($fresh:expr) => {
        $crate::records_conformance!(@tests $fresh;
            handles_are_dense_and_in_order,
            every_kind_of_record_reads_back_as_it_was,
            readable_text_reads_back_from_any_offset,
            a_handle_of_another_run_does_not_resolve,
            records_survive_a_reopen_and_appends_go_on,
            a_failed_batch_acknowledges_nothing,
            a_spilled_result_reads_back_as_the_same_result_in_memory,
            a_large_result_reads_by_page_and_by_line,
            concurrent_appenders_get_distinct_dense_handles,
            the_history_summarizes_every_record,
            a_record_the_store_acknowledges_reads_back_however_deep,
        );
    };
    (@tests $fresh:expr; $($property:ident),* $(,)?) => {
        $(
            #[test]
            fn $property() {
                let open = ($fresh)();
                $crate::records::$property(&open);
            }
        )*
    };
}

fn run(name: &str) -> RunId {
    RunId::new(name).unwrap()
}

fn user(text: &str) -> Record {
    Record::User(UserMessage { text: text.into() })
}

fn result(call: &str, output: ToolOutput) -> Record {
    Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new(call).unwrap(),
        name: "search".into(),
        output,
    })
}

fn block(value: serde_json::Value) -> ContentBlock {
    serde_json::from_value(value).unwrap()
}

/// One record of every kind, and tool results of every shape.
fn every_kind() -> Vec<Record> {
    let text = "first line\nsecond line, é and 日本\nthird\n".repeat(40);
    vec![
        user("find the failing test"),
        Record::Assistant(AssistantMessage {
            text: "Looking.".into(),
            tool_calls: vec![ToolCall {
                id: ToolCallId::new("c1").unwrap(),
                name: "github__search".into(),
                arguments: json!({"q": "flaky", "limit": 5}),
            }],
        }),
        // A result records the remote tool its call reached.
        Record::ToolResult(ToolResult {
            target: Some(psych_types::ToolRef::new(
                psych_types::ServerId::new("github").unwrap(),
                psych_types::ToolName::new("search").unwrap(),
            )),
            call_id: ToolCallId::new("c1").unwrap(),
            name: "github__search".into(),
            output: ToolOutput::text(text.clone()),
        }),
        result("c2", ToolOutput::error("no such repository")),
        result(
            "c3",
            ToolOutput::json(json!({"b": [1, 2, {"c": null}], "a": "x\ny"})),
        ),
        result("c4", ToolOutput::default()),
        result(
            "c5",
            ToolOutput::from_blocks(vec![
                ContentBlock::text("before the image"),
                ContentBlock::image("image/png", vec![0x89, b'P', b'N', b'G', 0, 1, 2, 255]),
                block(json!({"type": "resource", "resource": {
                    "uri": "file:///notes.txt", "mimeType": "text/plain",
                    "text": "an embedded\ntext resource"}})),
                block(
                    json!({"type": "resource_link", "uri": "file:///big.log", "name": "big.log"}),
                ),
                block(json!({"type": "mystery", "payload": {"k": 1}})),
                ContentBlock::audio("audio/wav", vec![1, 2, 3]),
                ContentBlock::text(text),
            ])
            .with_structured_content(json!({"rows": 3})),
        ),
        Record::Usage(Usage {
            input: 1200,
            cache_read: 30_000,
            cache_write: 0,
            output: 85,
        }),
        result("c6", {
            let mut output = ToolOutput::text("with meta");
            output.meta = Some(serde_json::from_value(json!({"progressToken": 7})).unwrap());
            output
        }),
    ]
}

/// A tool result whose first text block is held in a file (`text`), the second in memory.
fn spilled_result(call: &str, text: &[u8]) -> (Record, Record) {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(text).unwrap();
    file.write_all(b"bytes past the text").unwrap();
    let spilled = Arc::new(SpilledText::new(file, text.len() as u64));
    let mut output = ToolOutput::from_blocks(vec![
        ContentBlock::text(spilled.placeholder()),
        ContentBlock::text("and a short tail"),
    ]);
    output.spilled = vec![SpilledBlock {
        block: 0,
        text: spilled,
    }];
    let whole = ToolOutput::from_blocks(vec![
        ContentBlock::text(String::from_utf8_lossy(text).into_owned()),
        ContentBlock::text("and a short tail"),
    ]);
    (result(call, output), result(call, whole))
}

fn all<S: RecordStore>(store: &S) -> Vec<Record> {
    (0..store.len())
        .map(|seq| {
            store
                .record(&RecordHandle::new(store.run().clone(), seq))
                .unwrap()
                .unwrap_or_else(|| panic!("record {seq} of {} is acknowledged", store.len()))
        })
        .collect()
}

/// The readable text of the result at `handle`, read through `read_output` in `step`-byte
/// reads.
fn read_all<S: RecordStore>(store: &S, handle: &RecordHandle, step: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0; step];
    loop {
        let n = store
            .read_output(handle, out.len() as u64, &mut buf)
            .unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// Appends `records` one by one and in batches give handles `RUN:0..n` in order, and
/// `len` counts them.
pub fn handles_are_dense_and_in_order<S: RecordStore>(open: &impl Fn(&RunId) -> S) {
    let id = run("dense");
    let store = open(&id);
    assert_eq!(store.len(), 0);
    assert!(store.is_empty());
    let first = store.append(&user("one")).unwrap();
    assert_eq!(first, RecordHandle::new(id.clone(), 0));
    let batch = store
        .append_batch(&[user("two"), user("three"), user("four")])
        .unwrap();
    assert_eq!(
        batch,
        (1..4)
            .map(|seq| RecordHandle::new(id.clone(), seq))
            .collect::<Vec<_>>()
    );
    assert_eq!(store.append_batch(&[]).unwrap(), Vec::new());
    assert_eq!(
        store.append(&user("five")).unwrap(),
        RecordHandle::new(id.clone(), 4)
    );
    assert_eq!(store.len(), 5);
    assert_eq!(
        all(&store),
        ["one", "two", "three", "four", "five"].map(user).to_vec()
    );
    assert_eq!(store.run(), &id);
}

/// Every kind of record, and tool results of every shape, read back as they were: whole,
/// by content block, as output info and as block lines.
pub fn every_kind_of_record_reads_back_as_it_was<S: RecordStore>(open: &impl Fn(&RunId) -> S) {
    let id = run("kinds");
    let store = open(&id);
    let records = every_kind();
    let handles = store.append_batch(&records).unwrap();
    assert_eq!(all(&store), records);
    for (handle, record) in handles.iter().zip(&records) {
        let info = store.output_info(handle).unwrap();
        let lines = store.block_lines(handle).unwrap();
        let Record::ToolResult(result) = record else {
            assert_eq!(info, None, "{handle} is not a tool result");
            assert_eq!(lines, None);
            assert_eq!(store.content_block(handle, 0).unwrap(), None);
            assert_eq!(store.read_output(handle, 0, &mut [0; 8]).unwrap(), 0);
            continue;
        };
        let info = info.unwrap_or_else(|| panic!("{handle} is a tool result"));
        assert_eq!(info.len, readable_bytes(&result.output).len() as u64);
        assert_eq!(info.kind, psych_types::OutputKind::of(&result.output));
        assert_eq!(info.is_error, result.output.is_error);
        assert_eq!(info.call_id, result.call_id);
        assert_eq!(info.name, result.name);
        assert_eq!(lines, Some(psych_types::BlockLines::of(&result.output)));
        for (position, content) in result.output.content.iter().enumerate() {
            assert_eq!(
                store.content_block(handle, position).unwrap().as_ref(),
                Some(content),
                "block {position} of {handle}"
            );
        }
        assert_eq!(
            store
                .content_block(handle, result.output.content.len())
                .unwrap(),
            None
        );
        assert_eq!(
            read_all(&store, handle, 4096),
            readable_bytes(&result.output).as_ref()
        );
    }
}

/// A result's readable text reads back from any offset, in reads of any size (a read may
/// be short, never wrong), and `0` at or past its end.
pub fn readable_text_reads_back_from_any_offset<S: RecordStore>(open: &impl Fn(&RunId) -> S) {
    let id = run("offsets");
    let store = open(&id);
    let text: String = (0..5_000)
        .map(|i| format!("line {i}: ünïcödé {}\n", "x".repeat(i % 17)))
        .collect();
    let handle = store
        .append(&result("c1", ToolOutput::text(text.clone())))
        .unwrap();
    let bytes = text.as_bytes();
    let len = bytes.len() as u64;
    // A cheap deterministic walk over offsets and sizes.
    let mut state = 0x9e37_79b9_u64;
    for _ in 0..200 {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let offset = (state >> 33) % (len + 10);
        let size = 1 + ((state >> 13) % 70_000) as usize;
        let mut buf = vec![0; size];
        let n = store.read_output(&handle, offset, &mut buf).unwrap();
        if offset >= len {
            assert_eq!(n, 0, "a read at {offset} of {len}");
            continue;
        }
        assert!(n > 0 && n <= size, "a read of {size} at {offset} gave {n}");
        let start = usize::try_from(offset).unwrap();
        assert_eq!(&buf[..n], &bytes[start..start + n], "{n} bytes at {offset}");
    }
    assert_eq!(store.read_output(&handle, len, &mut [0; 16]).unwrap(), 0);
    assert_eq!(
        store.read_output(&handle, u64::MAX, &mut [0; 16]).unwrap(),
        0
    );
    assert_eq!(read_all(&store, &handle, 1000), bytes);
}

/// Two Runs in one place keep apart: a handle of the other Run, or past the end, does not
/// resolve, however the store is asked.
pub fn a_handle_of_another_run_does_not_resolve<S: RecordStore>(open: &impl Fn(&RunId) -> S) {
    let (a, b) = (run("run-a"), run("run-b"));
    let store_a = open(&a);
    let store_b = open(&b);
    store_a
        .append(&result("c1", ToolOutput::text("a's secret")))
        .unwrap();
    store_b.append(&user("b's first")).unwrap();
    store_b
        .append(&result("c1", ToolOutput::text("b's result")))
        .unwrap();
    let foreign = RecordHandle::new(a.clone(), 0);
    assert_eq!(store_b.record(&foreign).unwrap(), None);
    assert_eq!(store_b.output_info(&foreign).unwrap(), None);
    assert_eq!(store_b.read_output(&foreign, 0, &mut [0; 16]).unwrap(), 0);
    assert_eq!(store_b.content_block(&foreign, 0).unwrap(), None);
    assert_eq!(store_b.block_lines(&foreign).unwrap(), None);
    assert_eq!(store_b.stored_result(&foreign).unwrap(), None);
    assert_eq!(store_b.line_mark(&foreign, 3).unwrap(), LineMark::START);
    let past = RecordHandle::new(b.clone(), 2);
    assert_eq!(store_b.record(&past).unwrap(), None);
    assert_eq!(store_b.output_info(&past).unwrap(), None);
    assert_eq!(store_b.read_output(&past, 0, &mut [0; 16]).unwrap(), 0);
    assert_eq!(store_a.len(), 1);
    assert_eq!(store_b.len(), 2);
    assert_eq!(
        all(&store_a),
        vec![result("c1", ToolOutput::text("a's secret"))]
    );
}

/// What was acknowledged is there after the store is dropped and opened again, and appends
/// go on from it.
pub fn records_survive_a_reopen_and_appends_go_on<S: RecordStore>(open: &impl Fn(&RunId) -> S) {
    let id = run("reopen");
    let records = every_kind();
    {
        let store = open(&id);
        let empty = store.size_bytes();
        store.append_batch(&records).unwrap();
        assert!(store.size_bytes() > empty, "the records take room");
    }
    let store = open(&id);
    assert!(store.size_bytes() > 0);
    assert_eq!(store.len(), records.len() as u64);
    assert_eq!(all(&store), records);
    let next = store.append(&user("after the reopen")).unwrap();
    assert_eq!(next.seq, records.len() as u64);
    drop(store);
    let store = open(&id);
    assert_eq!(store.len(), records.len() as u64 + 1);
    assert_eq!(store.record(&next).unwrap(), Some(user("after the reopen")));
}

/// A batch with a record that cannot be stored (a spilled text that is not UTF-8) is
/// refused whole, as a spill failure: none of it is acknowledged or read back, before or
/// after a reopen, and the next append takes the handle its first record would have had.
pub fn a_failed_batch_acknowledges_nothing<S: RecordStore>(open: &impl Fn(&RunId) -> S) {
    let id = run("refused");
    {
        let store = open(&id);
        store.append(&user("kept")).unwrap();
        let (bad, _) = spilled_result("c1", &[b'o', b'k', 0xff, 0xfe, b'\n']);
        let error = store
            .append_batch(&[user("lost 1"), bad, user("lost 2")])
            .unwrap_err();
        assert_eq!(store.failure(&error), RecordFailure::Spill, "{error}");
        assert_eq!(store.len(), 1);
        assert_eq!(
            store.record(&RecordHandle::new(id.clone(), 1)).unwrap(),
            None
        );
        let next = store.append(&user("next")).unwrap();
        assert_eq!(next.seq, 1);
    }
    let store = open(&id);
    assert_eq!(all(&store), vec![user("kept"), user("next")]);
}

/// A tool result whose text is in a spill file reads back exactly as the same result held
/// in memory: whole, by block, by offset, in its history.
pub fn a_spilled_result_reads_back_as_the_same_result_in_memory<S: RecordStore>(
    open: &impl Fn(&RunId) -> S,
) {
    let id = run("spilled");
    let store = open(&id);
    // Past a megabyte, with multi-byte characters across every chunk size a store might use.
    let text: String = (0..40_000)
        .map(|i| format!("{i:06} ünïcödé — 日本語のテキスト\n"))
        .collect();
    let (spilled, whole) = spilled_result("c1", text.as_bytes());
    let handle = store.append(&spilled).unwrap();
    assert_eq!(store.record(&handle).unwrap().as_ref(), Some(&whole));
    let Record::ToolResult(expected) = &whole else {
        unreachable!("a tool result")
    };
    let readable = readable_bytes(&expected.output);
    assert_eq!(read_all(&store, &handle, 100_003), readable.as_ref());
    assert_eq!(
        store.output_info(&handle).unwrap().unwrap().len,
        readable.len() as u64
    );
    assert_eq!(
        store.content_block(&handle, 1).unwrap(),
        Some(ContentBlock::text("and a short tail"))
    );
    let stored = store.stored_result(&handle).unwrap().unwrap();
    assert_eq!(stored.line_breaks, Some(count_line_breaks(&readable)));
    assert!(stored.text_only);
}

/// A result of megabytes reads by page from its end, and every line mark a store answers
/// is one a reader can count from.
pub fn a_large_result_reads_by_page_and_by_line<S: RecordStore>(open: &impl Fn(&RunId) -> S) {
    let id = run("large");
    let store = open(&id);
    let text: String = (0..60_000)
        .map(|i| format!("{i:08} {}\n", "ab".repeat(i % 40)))
        .collect();
    let bytes = text.as_bytes();
    let handle = store
        .append(&result("c1", ToolOutput::text(text.clone())))
        .unwrap();
    let len = bytes.len() as u64;
    let mut page = vec![0; 16 * 1024];
    let mut got = Vec::new();
    while got.len() < page.len() {
        let offset = len - page.len() as u64 + got.len() as u64;
        let n = store
            .read_output(&handle, offset, &mut page[got.len()..])
            .unwrap();
        assert!(n > 0);
        got.extend_from_slice(&page[got.len()..got.len() + n]);
    }
    assert_eq!(got, &bytes[bytes.len() - page.len()..]);
    let breaks = count_line_breaks(bytes);
    for line in [0, 1, 2, 999, 12_345, 30_000, 59_999, 60_000, 70_000] {
        let mark = store.line_mark(&handle, line).unwrap();
        assert!(mark.at <= len, "line {line}: {mark:?}");
        let at = usize::try_from(mark.at).unwrap();
        assert_eq!(
            count_line_breaks(&bytes[..at]),
            mark.breaks_before,
            "line {line}: {mark:?}"
        );
        if line == 0 {
            assert_eq!(mark, LineMark::START);
        } else {
            assert!(
                mark.breaks_before < line.min(breaks + 1),
                "line {line}: {mark:?}"
            );
        }
    }
}

/// Appenders on several threads each get their own handles, together dense from 0, and
/// every record reads back under its handle.
pub fn concurrent_appenders_get_distinct_dense_handles<S: RecordStore>(
    open: &impl Fn(&RunId) -> S,
) {
    let id = run("together");
    let store = open(&id);
    let threads = 4_usize;
    let each = 12_usize;
    let handles: Vec<(String, RecordHandle)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let store = &store;
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..each {
                        let text = format!("thread {t} record {i}");
                        let handle = if i % 3 == 0 {
                            store
                                .append_batch(&[user(&text), user(&format!("{text} b"))])
                                .unwrap()
                                .remove(0)
                        } else {
                            store.append(&user(&text)).unwrap()
                        };
                        mine.push((text, handle));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| worker.join().unwrap())
            .collect()
    });
    let batches = threads * each.div_ceil(3);
    assert_eq!(store.len(), (threads * each + batches) as u64);
    let mut seqs: Vec<u64> = handles.iter().map(|(_, h)| h.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), handles.len(), "handles are distinct");
    for (text, handle) in &handles {
        assert_eq!(store.record(handle).unwrap(), Some(user(text)));
    }
}

/// The history holds every record in order, each tool result summarized without its
/// content as the whole result would be, and extends from where it stopped.
pub fn the_history_summarizes_every_record<S: RecordStore>(open: &impl Fn(&RunId) -> S) {
    let id = run("history");
    let store = open(&id);
    let records = every_kind();
    let (first, rest) = records.split_at(3);
    store.append_batch(first).unwrap();
    let mut history = History::default();
    store.extend_history(&mut history).unwrap();
    assert_eq!(history.len(), 3);
    store.append_batch(rest).unwrap();
    store.extend_history(&mut history).unwrap();
    let logged: Vec<_> = records
        .iter()
        .enumerate()
        .map(|(seq, record)| psych_types::LoggedRecord {
            handle: RecordHandle::new(id.clone(), seq as u64),
            record: record.clone(),
        })
        .collect();
    let expected = History::from_records(&logged, None);
    assert_eq!(history.len(), expected.len());
    for (got, want) in history.entries.iter().zip(&expected.entries) {
        assert_eq!(got.handle, want.handle);
        match (&got.item, &want.item) {
            (HistoryItem::Result(got_result), HistoryItem::Result(want_result)) => {
                // The estimate is the store's estimator's, if it has one.
                let mut got_result = got_result.clone();
                got_result.estimate = None;
                assert_eq!(&got_result, want_result, "{}", got.handle);
                assert_eq!(
                    store.stored_result(&got.handle).unwrap().map(|mut s| {
                        s.estimate = None;
                        s
                    }),
                    Some(got_result)
                );
            }
            (got_item, want_item) => {
                assert_eq!(got_item, want_item, "{}", got.handle);
                assert_eq!(store.stored_result(&got.handle).unwrap(), None);
            }
        }
    }
    let mut again = history.clone();
    store.extend_history(&mut again).unwrap();
    assert_eq!(again, history, "nothing new, nothing added");
}

/// JSON nested `depth` levels: arrays in arrays around one object.
fn nested(depth: usize) -> serde_json::Value {
    (1..depth).fold(json!({"deepest": true}), |inner, _| json!([inner]))
}

/// Records whose JSON nests as deep as a peer's can (serde_json parses up to
/// [`json::MAX_DEPTH`](psych_types::json::MAX_DEPTH) levels, so a model's call arguments, a
/// server's structured content or a block's `_meta` may nest nearly that deep): each the
/// store acknowledges reads back as it was, in the history too, and each it refuses is
/// refused as [`RecordFailure::TooDeep`] with nothing acknowledged. Those nested well
/// within the limit are all acknowledged.
pub fn a_record_the_store_acknowledges_reads_back_however_deep<S: RecordStore>(
    open: &impl Fn(&RunId) -> S,
) {
    let id = run("deep");
    let store = open(&id);
    let max = psych_types::json::MAX_DEPTH;
    let mut refused = 0;
    for depth in [max - 20, max - 4, max - 3, max - 2, max - 1, max] {
        let shapes = [
            Record::Assistant(AssistantMessage {
                text: String::new(),
                tool_calls: vec![ToolCall {
                    id: ToolCallId::new(format!("c{depth}")).unwrap(),
                    name: "svc__deep".into(),
                    arguments: nested(depth),
                }],
            }),
            result(
                "s",
                ToolOutput::text("beside").with_structured_content(nested(depth)),
            ),
            result("j", ToolOutput::json(nested(depth))),
            result(
                "m",
                ToolOutput::from_blocks(vec![block(
                    json!({"type": "text", "text": "t", "_meta": {"k": nested(depth)}}),
                )]),
            ),
            result("o", {
                let mut output = ToolOutput::text("with meta");
                output.meta = Some(serde_json::from_value(json!({"k": nested(depth)})).unwrap());
                output
            }),
        ];
        for record in shapes {
            let before = store.len();
            match store.append(&record) {
                Ok(handle) => {
                    assert_eq!(store.record(&handle).unwrap().as_ref(), Some(&record));
                    if matches!(record, Record::ToolResult(_)) {
                        assert!(store.output_info(&handle).unwrap().is_some());
                    }
                }
                Err(error) => {
                    assert!(depth > max - 20, "{depth} levels refused: {error}");
                    assert_eq!(store.failure(&error), RecordFailure::TooDeep, "{error}");
                    assert_eq!(store.len(), before);
                    refused += 1;
                }
            }
        }
    }
    // A call's arguments sit inside the record, so some of these are past the limit.
    assert!(refused > 0);
    let mut history = History::default();
    store.extend_history(&mut history).unwrap();
    assert_eq!(history.entries.len() as u64, store.len());
    drop(store);
    let store = open(&id);
    assert_eq!(all(&store).len() as u64, store.len());
}
