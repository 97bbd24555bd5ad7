//! A preview's marker names the `read_tool_output` offset that reads on after its head:
//! following it with the real reader returns exactly the first omitted line.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use proptest::prelude::*;
use psych_elision::PreviewConfig;
use psych_reader_tool::{Answer, Reader};
use psych_types::{MemoryRecords, Record, RunId, ToolCallId, ToolOutput, ToolResult};
use serde_json::json;

/// The omitted bytes `a..b` and the offset `K` of a preview's marker line, which follows
/// the head (the text's first `a` bytes).
fn marker(preview: &str, text: &str) -> (usize, usize, u64) {
    let line_start = preview
        .match_indices("[… line")
        .map(|(at, _)| at)
        .find(|&at| {
            let line = &preview[at..];
            let bytes = &line[line.find("(bytes ").unwrap() + 7..];
            let a: usize = bytes.split_once("..").unwrap().0.parse().unwrap();
            preview.starts_with(&text[..a])
        })
        .unwrap();
    let line = &preview[line_start..line_start + preview[line_start..].find('\n').unwrap()];
    let bytes = &line[line.find("(bytes ").unwrap() + 7..];
    let (a, rest) = bytes.split_once("..").unwrap();
    let b = rest.split_once(' ').unwrap().0;
    let k = &line[line.find("offset=").unwrap() + 7..];
    let k = k.split_once(' ').unwrap().0;
    (a.parse().unwrap(), b.parse().unwrap(), k.parse().unwrap())
}

/// Previews `text`, follows the marker's offset with the reader, and checks that the line
/// it returns is the first omitted one: the line holding byte `a`, whole, which starts at
/// `a` when the head ends at a line break. Returns whether a preview was made.
fn check(text: &str, config: PreviewConfig) -> bool {
    let mut log = MemoryRecords::new(RunId::new("run-3").unwrap());
    let handle = log.push(Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new("c").unwrap(),
        name: "t".into(),
        output: ToolOutput::text(text),
    }));
    let preview = config.preview(text, &handle);
    if preview == text {
        return false;
    }
    let (a, _b, k) = marker(&preview, text);
    let answer = Reader::new(&log)
        .call(&json!({"handle": handle.to_string(), "offset": k, "limit": 1}))
        .unwrap();
    let Answer::Page(page) = answer else {
        panic!("{answer:?}")
    };
    let line = &page.lines[0];
    let line_start = text[..a].rfind('\n').map_or(0, |at| at + 1);
    assert_eq!(line.number, k + 1);
    assert_eq!(line.start as usize, line_start, "{preview}");
    if text[..a].ends_with('\n') || a == 0 {
        assert_eq!(line.start as usize, a, "the head ends at a line break");
    }
    let end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |at| line_start + at);
    assert_eq!(line.len as usize, end - line_start);
    if line.is_whole() {
        assert_eq!(line.shown, text.as_bytes()[line_start..end]);
    }
    true
}

#[test]
fn following_the_offset_on_real_results_reads_the_first_omitted_line() {
    let issues: Vec<_> = (0..40)
        .map(|i| {
            json!({"number": i, "title": format!("Issue {i}"), "labels": ["bug"],
            "created_at": "2025-08-13T09:22:31Z", "body": "Steps to reproduce:\n1. run\n2. fail"})
        })
        .collect();
    let json_text = psych_types::render_json(&json!(issues));
    let server_log: String = (0..500)
        .map(|i| {
            format!(
                "2026-11-30T12:{:02}:{:02}Z INFO GET /api/items/{i} 200 {}ms\n",
                i / 60 % 60,
                i % 60,
                i % 97
            )
        })
        .collect();
    for text in [&json_text, &server_log] {
        assert!(check(text, PreviewConfig::default()));
        assert!(check(
            text,
            PreviewConfig::builder()
                .head_chars(333)
                .tail_chars(77)
                .failure_chars(0)
                .build()
        ));
    }
}

fn lines() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-z é日\\-]{0,120}", 1..200).prop_map(|lines| lines.join("\n"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn following_the_offset_reads_the_first_omitted_line(
        text in lines(),
        head in 0usize..400,
        tail in 0usize..200,
    ) {
        check(&text, PreviewConfig::builder().head_chars(head).tail_chars(tail).failure_chars(0).build());
    }
}
