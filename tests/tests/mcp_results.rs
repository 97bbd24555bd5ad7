//! MCP `tools/call` results, as JSON a server sends (every block kind, mixed, empty, huge,
//! unknown kinds, structured content, `_meta`), go into `ToolOutput` and through the real
//! record log whole: the record reads back equal after a reopen, its readable text pages back
//! identically through the real reader, and every block (binary data included) comes back
//! whole by position.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common::{open, read_back};
use proptest::prelude::*;
use psych_reader_tool::Reader;
use psych_record_log::SyncPolicy;
use psych_types::{Record, RecordSource, ToolCallId, ToolOutput, ToolResult, encode_base64};
use serde_json::{Value, json};

/// Text of `lines` lines of at most 80 characters (the reader pages whole lines).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec("[^\n\r]{0,80}", 0..6).prop_map(|lines| lines.join("\n")),
        1 => (1usize..20_000).prop_map(|n| (0..n).map(|i| format!("line {i} é ✓\n")).collect()),
    ]
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..400),
        1 => (1usize..3_000_000).prop_map(|n| (0..n).map(|i| (i % 251) as u8).collect()),
    ]
}

fn annotations() -> impl Strategy<Value = Option<Value>> {
    prop::option::of(
        (0u8..=10, any::<bool>())
            .prop_map(|(p, user)| json!({"priority": f64::from(p) / 10.0, "audience": if user { vec!["user"] } else { vec!["assistant", "user"] }})),
    )
}

/// One content block as MCP JSON.
fn block() -> impl Strategy<Value = Value> {
    let with = |mut block: Value, annotations: Option<Value>, meta: bool| {
        if let Some(a) = annotations {
            block["annotations"] = a;
        }
        if meta {
            block["_meta"] = json!({"io.example/trace": "t-1"});
        }
        block
    };
    prop_oneof![
        4 => (text(), annotations(), any::<bool>())
            .prop_map(move |(t, a, m)| with(json!({"type": "text", "text": t}), a, m)),
        2 => (bytes(), "image/(png|jpeg|gif|webp|svg\\+xml)", annotations())
            .prop_map(move |(d, mime, a)| with(json!({"type": "image", "data": encode_base64(&d), "mimeType": mime}), a, false)),
        1 => (bytes(), any::<bool>())
            .prop_map(move |(d, m)| with(json!({"type": "audio", "data": encode_base64(&d), "mimeType": "audio/wav"}), None, m)),
        1 => ("[a-z]{1,12}", prop::option::of(0u64..1_000_000), any::<bool>())
            .prop_map(move |(name, size, m)| {
                let mut link = json!({"type": "resource_link", "uri": format!("file:///srv/{name}.txt"), "name": name, "mimeType": "text/plain"});
                if let Some(size) = size {
                    link["size"] = json!(size);
                }
                with(link, None, m)
            }),
        1 => ("[a-z]{1,12}", text(), annotations())
            .prop_map(move |(name, t, a)| with(json!({"type": "resource", "resource": {"uri": format!("file:///srv/{name}.md"), "mimeType": "text/markdown", "text": t}}), a, false)),
        1 => ("[a-z]{1,12}", bytes())
            .prop_map(|(name, d)| json!({"type": "resource", "resource": {"uri": format!("s3://bucket/{name}.pdf"), "mimeType": "application/pdf", "blob": encode_base64(&d)}})),
        1 => "[a-z]{1,8}".prop_map(|kind| json!({"type": format!("x-{kind}"), "payload": {"n": 1.5, "list": [1, "two"]}})),
    ]
}

/// A `CallToolResult` as JSON.
fn call_tool_result() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(block(), 0..6),
        prop::option::of(prop_oneof![
            Just(json!({"total": 3, "items": [{"id": 1, "ok": true}, {"id": 2.5, "ok": null}]})),
            Just(json!({})),
        ]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(content, structured, is_error, meta)| {
            let mut result = json!({"content": content});
            if let Some(s) = structured {
                result["structuredContent"] = s;
            }
            if is_error {
                result["isError"] = json!(true);
            }
            if meta {
                result["_meta"] = json!({"io.example/server": "browser"});
            }
            result
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn every_mcp_result_round_trips_through_the_log_and_reads_back(
        results in prop::collection::vec(call_tool_result(), 1..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let outputs: Vec<ToolOutput> = results
            .iter()
            .map(|raw| serde_json::from_value(raw.clone()).unwrap())
            .collect();
        // Nothing of the JSON is lost in the typed form.
        for (raw, output) in results.iter().zip(&outputs) {
            prop_assert_eq!(&serde_json::to_value(output).unwrap(), raw);
        }
        let handles = {
            let mut log = open(dir.path(), "run-mcp", SyncPolicy::EveryAppend);
            let records: Vec<Record> = outputs
                .iter()
                .enumerate()
                .map(|(i, output)| Record::ToolResult(ToolResult {
                    target: None,
                    call_id: ToolCallId::new(format!("call_{i}")).unwrap(),
                    name: "browser_snapshot".into(),
                    output: output.clone(),
                }))
                .collect();
            log.append_batch(&records).unwrap()
        };
        let log = open(dir.path(), "run-mcp", SyncPolicy::EveryAppend);
        let reader = Reader::new(&log);
        for (handle, output) in handles.iter().zip(&outputs) {
            let Some(Record::ToolResult(back)) = log.record(handle).unwrap() else {
                panic!("{handle} is not a tool result");
            };
            prop_assert_eq!(&back.output, output);
            let paged = read_back(&reader, &handle.to_string(), 1000).unwrap();
            let readable = output.readable_text();
            prop_assert_eq!(paged.as_slice(), readable.as_bytes());
            for (position, block) in output.content.iter().enumerate() {
                let whole = log.content_block(handle, position).unwrap();
                prop_assert_eq!(whole.as_ref(), Some(block));
            }
            prop_assert_eq!(log.content_block(handle, output.content.len()).unwrap(), None);
        }
    }
}
