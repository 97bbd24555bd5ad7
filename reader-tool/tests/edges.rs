//! The reader's defined edges, one named test each, checked through the exact text the model
//! sees (insta snapshots in `snapshots/`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::path::PathBuf;

use crate::sources::{
    Counting, Failing, LongLine, RawBytes, SYNTHETIC_LINE, Synthetic, result, run, text_log,
};
use psych_reader_tool::{Answer, ArgsError, CallError, Limits, ReadArgs, Reader};
use psych_types::{ContentBlock, MemoryRecords, RecordSource, ToolOutput};
use serde_json::{Value, json};

/// Reads with the default limits and returns the text the model would see.
fn check<S: RecordSource>(source: &S, arguments: Value) -> String
where
    S::Error: std::fmt::Debug,
{
    Reader::new(source).call(&arguments).unwrap().render()
}

fn page(answer: Answer) -> psych_reader_tool::Page {
    match answer {
        Answer::Page(page) => page,
        other => panic!("expected a page, got {other:?}"),
    }
}

const TEN_LINES: &str = "2026-11-30T09:00:01Z INFO  api  started on :8080
2026-11-30T09:00:02Z INFO  db   pool ready (8 connections)
2026-11-30T09:00:05Z WARN  api  slow request GET /orders 1200ms
2026-11-30T09:00:09Z INFO  api  GET /health 200 1ms
2026-11-30T09:00:12Z ERROR db   deadlock detected on table orders
2026-11-30T09:00:12Z INFO  api  retrying transaction 7f3a
2026-11-30T09:00:13Z INFO  api  GET /orders 200 35ms
2026-11-30T09:00:20Z ERROR api  upstream payments timed out after 30s
2026-11-30T09:00:21Z INFO  api  GET /health 200 1ms
2026-11-30T09:00:30Z INFO  api  shutting down";

#[test]
fn first_page_gives_range_total_and_next_offset() {
    let (log, handle) = text_log("run-7", TEN_LINES);
    insta::assert_snapshot!(
        "first_page",
        check(&log, json!({"handle": handle.to_string(), "limit": 4}))
    );
}

#[test]
fn last_page_says_end_of_result_and_missing_final_line_break() {
    let (log, handle) = text_log("run-7", TEN_LINES);
    insta::assert_snapshot!(
        "last_page",
        check(
            &log,
            json!({"handle": handle.to_string(), "offset": 8, "limit": 4})
        )
    );
}

#[test]
fn offset_past_the_end_is_an_empty_page_not_an_error() {
    let (log, handle) = text_log("run-7", TEN_LINES);
    let text = check(&log, json!({"handle": handle.to_string(), "offset": 500}));
    insta::assert_snapshot!("offset_past_end", text);
    let at_end = page(
        Reader::new(&log)
            .call(&json!({"handle": handle.to_string(), "offset": 10}))
            .unwrap(),
    );
    assert!(at_end.lines.is_empty());
    assert_eq!((at_end.total_lines, at_end.next_offset), (Some(10), None));
    let far = check(
        &log,
        json!({"handle": handle.to_string(), "offset": u64::MAX}),
    );
    assert!(far.ends_with("no lines at offset 18446744073709551615: the result has 10 lines, at offsets 0 to 9; end of result"), "{far}");
}

#[test]
fn an_empty_result_reads_as_empty() {
    let (log, handle) = text_log("run-7", "");
    insta::assert_snapshot!("empty", check(&log, json!({"handle": handle.to_string()})));
    let grep = check(&log, json!({"handle": handle.to_string(), "grep": "x"}));
    assert!(
        grep.ends_with("grep \"x\" from offset 0: no matching lines"),
        "{grep}"
    );
}

#[test]
fn grep_returns_matching_lines_with_their_numbers() {
    let (log, handle) = text_log("run-7", TEN_LINES);
    insta::assert_snapshot!(
        "grep",
        check(&log, json!({"handle": handle.to_string(), "grep": "ERROR"}))
    );
}

#[test]
fn grep_with_no_match_is_an_empty_page_not_an_error() {
    let (log, handle) = text_log("run-7", TEN_LINES);
    insta::assert_snapshot!(
        "grep_no_match",
        check(&log, json!({"handle": handle.to_string(), "grep": "panic"}))
    );
    let from_line_4 = check(
        &log,
        json!({"handle": handle.to_string(), "grep": "panic", "offset": 3}),
    );
    assert!(
        from_line_4.ends_with("grep \"panic\" from offset 3: no matching lines"),
        "{from_line_4}"
    );
    let after_last_error = check(
        &log,
        json!({"handle": handle.to_string(), "grep": "ERROR", "offset": 8}),
    );
    assert!(
        after_last_error.ends_with("grep \"ERROR\" from offset 8: no matching lines"),
        "{after_last_error}"
    );
}

#[test]
fn grep_at_its_limit_points_at_the_next_match() {
    let (log, handle) = text_log("run-7", TEN_LINES);
    let reader = Reader::new(&log);
    let first = reader
        .call(&json!({"handle": handle.to_string(), "grep": "GET", "limit": 2}))
        .unwrap();
    insta::assert_snapshot!("grep_limited", first.render());
    let next = page(first).next_offset.unwrap();
    assert_eq!(next, 6, "line 7 is the third GET");
    let rest = page(
        reader
            .call(&json!({"handle": handle.to_string(), "grep": "GET", "offset": next}))
            .unwrap(),
    );
    let numbers: Vec<u64> = rest.lines.iter().map(|line| line.number).collect();
    assert_eq!(numbers, [7, 9]);
    assert_eq!(rest.next_offset, None);
}

#[test]
fn grep_from_an_offset_past_the_end_is_empty() {
    let (log, handle) = text_log("run-7", TEN_LINES);
    insta::assert_snapshot!(
        "grep_past_end",
        check(
            &log,
            json!({"handle": handle.to_string(), "grep": "INFO", "offset": 99})
        )
    );
}

#[test]
fn binary_blocks_are_placeholder_lines_never_bytes() {
    let mut log = MemoryRecords::new(run("run-7"));
    let png = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13];
    let handle = log.push(result(ToolOutput::from_blocks(vec![
        ContentBlock::text("Screenshot of the page:"),
        ContentBlock::image("image/png", png.to_vec()),
        ContentBlock::text("Title: Example Domain"),
    ])));
    let read = Reader::new(&log)
        .call(&json!({"handle": handle.to_string()}))
        .unwrap();
    assert!(!read.is_error());
    insta::assert_snapshot!("binary", read.render());
    let grep = check(
        &log,
        json!({"handle": handle.to_string(), "grep": "image/png"}),
    );
    assert!(
        grep.contains("[content block #1: image, image/png, 12 bytes]"),
        "{grep}"
    );
    let bytes = check(&log, json!({"handle": handle.to_string(), "grep": "PNG"}));
    assert!(
        !bytes.contains("PNG\r"),
        "no bytes of the image leak: {bytes}"
    );
}

#[test]
fn invalid_utf8_in_a_text_result_is_escaped_losslessly() {
    let source =
        RawBytes::text(b"ok line\npath C:\\temp \xff\xfe end\nhalf \xe2\x82 euro \xe2\x82\xac\n");
    let text = check(&source, json!({"handle": source.handle().to_string()}));
    insta::assert_snapshot!("invalid_utf8", text);
    assert!(text.contains("C:\\\\temp \\xFF\\xFE end"), "{text}");
    let grep = check(
        &source,
        json!({"handle": source.handle().to_string(), "grep": "euro"}),
    );
    assert!(grep.contains("half \\xE2\\x82 euro €"), "{grep}");
}

#[test]
fn a_page_without_bad_bytes_is_not_escaped() {
    let (log, handle) = text_log("run-7", "C:\\temp\\x41 is a path\n");
    let text = check(&log, json!({"handle": handle.to_string()}));
    assert!(text.ends_with("\tC:\\temp\\x41 is a path"), "{text}");
    assert!(!text.contains("note:"), "{text}");
}

#[test]
fn one_huge_line_cannot_flood_the_answer() {
    let huge = format!(
        "first\n{}needle{}\nlast\n",
        "x".repeat(10 << 20),
        "y".repeat(10 << 20)
    );
    let (log, handle) = text_log("run-7", &huge);
    let read = check(&log, json!({"handle": handle.to_string()}));
    assert!(read.len() < 2400, "{} bytes", read.len());
    insta::assert_snapshot!("huge_line", read.replace(&"x".repeat(2000), "x{2000}"));
    let grep = check(
        &log,
        json!({"handle": handle.to_string(), "grep": "needle"}),
    );
    // The line shown, its markers and the status saying where the rest of it is read.
    assert!(grep.len() < 2600, "{} bytes", grep.len());
    assert!(grep.contains("[…10484763 bytes]"), "{grep}");
    assert!(
        grep.contains("[…10484763 bytes; read on with offset=1 byte=10486763]"),
        "{grep}"
    );
    assert!(
        grep.contains("xxxneedleyyy"),
        "the window is around the match"
    );
}

#[test]
fn a_100_mb_line_is_cut_and_read_in_bounded_chunks() {
    let source = Counting::new(LongLine::new(100_000_000, b"NEEDLE"));
    let h = source.inner.handle().to_string();
    let reader = Reader::new(&source);
    let read = page(reader.call(&json!({"handle": h})).unwrap());
    let numbers: Vec<(u64, u64, usize)> = read
        .lines
        .iter()
        .map(|line| (line.number, line.len, line.shown.len()))
        .collect();
    assert_eq!(numbers, [(1, 5, 5), (2, 100_000_000, 2000), (3, 4, 4)]);
    let text = Answer::Page(read).render();
    assert!(text.len() < 2400, "{} bytes", text.len());
    assert!(
        text.contains("[…99998000 bytes; read on with offset=1 byte=2000]"),
        "{text}"
    );
    let grep = reader
        .call(&json!({"handle": h, "grep": "NEEDLE"}))
        .unwrap()
        .render();
    assert!(grep.len() < 2400, "{} bytes", grep.len());
    assert!(grep.contains("[…49999003 bytes]xxxx"), "{grep}");
    assert!(grep.contains("xxxxNEEDLExxxx"), "{grep}");
    let chunk = Limits::default().chunk_bytes();
    assert!(
        source.largest_read.get() <= chunk,
        "{}",
        source.largest_read.get()
    );
}

#[test]
fn a_cut_line_is_read_on_from_the_byte_its_end_names() {
    // One line of 3,333 bytes, multi-byte characters across the cuts, then a short one.
    let long: String = (0..1250)
        .map(|i| if i % 3 == 0 { "é" } else { "abc" })
        .collect();
    let text = format!("{long}\nend");
    let (log, handle) = text_log("run-7", &text);
    let h = handle.to_string();
    let first = check(&log, json!({"handle": h, "limit": 1}));
    let byte = long.floor_char_boundary(2000);
    assert!(
        first.ends_with(&format!(
            "[…{} bytes; read on with offset=0 byte={byte}]",
            long.len() - byte
        )),
        "{first}"
    );
    // Following the marker reads the line whole, each part once, in order.
    let reader = Reader::new(&log);
    let mut read = Vec::new();
    let mut at = 0;
    loop {
        let page = page(
            reader
                .call(&json!({"handle": h, "offset": 0, "byte": at, "limit": 1}))
                .unwrap(),
        );
        let line = &page.lines[0];
        assert_eq!(line.cut_before(), read.len() as u64);
        read.extend_from_slice(&line.shown);
        match page.read_on(line) {
            Some(next) => at = next,
            None => break,
        }
    }
    assert_eq!(read, long.as_bytes());
    // A byte inside a character starts at the next; the page goes on with the next line.
    let inside = check(&log, json!({"handle": h, "byte": 1}));
    assert!(
        inside.contains("lines 1-2 of 2 (line 1 from byte 1); end of result"),
        "{inside}"
    );
    assert!(inside.contains("     1\t[…2 bytes]abcabc"), "{inside}");
    assert!(inside.ends_with("     2\tend"), "{inside}");
    // A byte at or past the line's end shows none of it.
    let past = check(&log, json!({"handle": h, "byte": 99_999}));
    assert!(
        past.contains(&format!("     1\t[…{} bytes]\n     2\tend", long.len())),
        "{past}"
    );
    // Only the line at `offset` is read from `byte`; a skip asked for is not a cut.
    let second = check(&log, json!({"handle": h, "offset": 1, "byte": 1}));
    assert!(second.ends_with("     2\t[…1 bytes]nd"), "{second}");
    assert!(!second.contains("note:"), "{second}");
}

#[test]
fn a_result_of_one_long_line_says_where_it_goes_on_not_that_it_ended() {
    let (log, handle) = text_log("run-7", &"x".repeat(4500));
    let h = handle.to_string();
    let first = check(&log, json!({"handle": h}));
    assert!(
        first.contains("line 1 of 1; more follows in line 1: call again with offset=0 byte=2000\n"),
        "{first}"
    );
    let last = check(&log, json!({"handle": h, "byte": 4000}));
    assert!(
        last.contains(
            "line 1 of 1 (line 1 from byte 4000); end of result (no line break after its \
             last line)\n"
        ),
        "{last}"
    );
    assert!(
        last.ends_with(&format!("[…4000 bytes]{}", "x".repeat(500))),
        "{last}"
    );
}

#[test]
fn grep_from_a_byte_finds_the_next_match_in_the_same_line() {
    // Three matches 3,000 bytes apart in one line: a window shows one of them.
    let line = ["a", "NEEDLE-1", "NEEDLE-2", "NEEDLE-3"].join(&"-".repeat(3000));
    let (log, handle) = text_log("run-7", &format!("{line}\nNEEDLE-4\n"));
    let h = handle.to_string();
    let reader = Reader::new(&log);
    let mut seen = Vec::new();
    let (mut offset, mut byte) = (0, 0);
    loop {
        let page = page(
            reader
                .call(&json!({
                    "handle": h, "grep": "NEEDLE", "offset": offset, "byte": byte, "limit": 1
                }))
                .unwrap(),
        );
        let Some(line) = page.lines.first() else {
            break;
        };
        let shown = String::from_utf8(line.shown.clone()).unwrap();
        let at = shown.find("NEEDLE-").unwrap();
        seen.push((line.number, shown[at..at + 8].to_owned()));
        (offset, byte) = match (page.read_on(line), page.next_offset) {
            (Some(next), _) => (line.number - 1, next),
            (None, Some(next)) => (next, 0),
            (None, None) => break,
        };
    }
    assert_eq!(
        seen,
        [
            (1, "NEEDLE-1".to_owned()),
            (1, "NEEDLE-2".to_owned()),
            (1, "NEEDLE-3".to_owned()),
            (2, "NEEDLE-4".to_owned()),
        ]
    );
    // A byte that cuts through a match (as an elided preview's head may) finds it: only
    // matches wholly before the byte are passed over, and the window shows the match.
    let at = line.find("NEEDLE-2").unwrap() as u64;
    let through = page(
        reader
            .call(&json!({"handle": h, "grep": "NEEDLE", "byte": at + 3, "limit": 1}))
            .unwrap(),
    );
    let shown = String::from_utf8(through.lines[0].shown.clone()).unwrap();
    assert!(shown.starts_with("NEEDLE-2"), "{shown}");
    assert_eq!(through.lines[0].cut_before(), at);
    let text = check(
        &log,
        json!({"handle": h, "grep": "NEEDLE", "byte": at + 3, "limit": 1}),
    );
    assert!(
        text.contains(&format!(
            "grep \"NEEDLE\" from offset 0 byte {}: 1 matching line",
            at + 3
        )),
        "{text}"
    );
}

#[test]
fn a_grep_page_whose_last_line_is_cut_says_the_rest_of_it_may_match() {
    let text = format!("NEEDLE{}NEEDLE", "-".repeat(3000));
    let (log, handle) = text_log("run-7", &text);
    let read = check(
        &log,
        json!({"handle": handle.to_string(), "grep": "NEEDLE"}),
    );
    assert!(
        read.contains(
            "1 matching line; no more matching lines after line 1, which is cut: more of it \
             may match: call again with offset=0 byte=2000\n"
        ),
        "{read}"
    );
    // With more matching lines after it, the page says so and names the cut line's rest.
    let (more, more_handle) = text_log("run-7", &format!("{text}\nNEEDLE again\n"));
    let page = check(
        &more,
        json!({"handle": more_handle.to_string(), "grep": "NEEDLE", "limit": 1}),
    );
    assert!(
        page.contains(
            "more follows: call again with offset=1; line 1 is cut, and more of it may \
             match: offset=0 byte=2000 searches on in it\n"
        ),
        "{page}"
    );
    let rest = check(
        &log,
        json!({"handle": handle.to_string(), "grep": "NEEDLE", "byte": 2000}),
    );
    assert!(
        rest.contains("1 matching line; no more matches\n"),
        "{rest}"
    );
    assert!(rest.ends_with("-NEEDLE"), "{rest}");
}

#[test]
fn a_page_closes_at_its_byte_budget() {
    let text: String = (0..100)
        .map(|i| format!("{i:03} {}\n", "z".repeat(1500)))
        .collect();
    let (log, handle) = text_log("run-7", &text);
    let limits = Limits::builder().max_page_bytes(10_000).build().unwrap();
    let reader = Reader::with_limits(&log, limits);
    let first = page(
        reader
            .call(&json!({"handle": handle.to_string(), "limit": 50}))
            .unwrap(),
    );
    assert_eq!(first.lines.len(), 7, "7 × 1504 bytes reach 10,000");
    assert_eq!(first.next_offset, Some(7));
}

#[test]
fn a_json_result_reads_as_its_pretty_text() {
    let path = fixtures_dir().join("catalogs/server-memory.tools.json");
    let value: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut log = MemoryRecords::new(run("run-7"));
    let handle = log.push(result(ToolOutput::json(value)));
    let text = check(
        &log,
        json!({"handle": handle.to_string(), "grep": "\"name\": \"", "limit": 20}),
    );
    insta::assert_snapshot!("json_grep", text);
    assert!(text.contains("json shown pretty-printed"));
}

#[test]
fn a_failed_call_says_so_in_the_header() {
    let mut log = MemoryRecords::new(run("run-7"));
    let handle = log.push(result(ToolOutput::error(
        "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'id'",
    )));
    let text = check(&log, json!({"handle": handle.to_string()}));
    assert!(
        text.starts_with(
            "[read_tool_output run-7:0 · tool \"fetch_logs\" · text · 71 bytes · 3 lines · \
             the call failed]"
        ),
        "{text}"
    );
}

#[test]
fn malformed_arguments_are_a_validation_answer_for_the_model() {
    let (log, handle) = text_log("run-7", TEN_LINES);
    let reader = Reader::new(&log);
    let h = handle.to_string();
    let cases = [
        json!("run-7:1"),
        json!({}),
        json!({"handle": 1}),
        json!({"handle": h, "offset": -1}),
        json!({"handle": h, "offset": "2"}),
        json!({"handle": h, "limit": 0}),
        json!({"handle": h, "limit": 1001}),
        json!({"handle": h, "grep": ""}),
        json!({"handle": h, "pattern": "ERROR"}),
    ];
    let mut texts = Vec::new();
    for arguments in cases {
        let answer = reader.call(&arguments).unwrap();
        assert!(matches!(answer, Answer::Invalid(_)), "{arguments}");
        let output = answer.to_tool_output();
        assert!(
            output.is_error,
            "a validation error is a failed tool result"
        );
        texts.push(format!("{arguments}\n{}", output.readable_text()));
    }
    insta::assert_snapshot!("validation", texts.join("\n\n"));
    // Hand-built arguments get the same check.
    let mut args = ReadArgs::new(h);
    args.limit = Some(0);
    assert!(matches!(
        reader.read(&args).unwrap(),
        Answer::Invalid(ArgsError::Limit { .. })
    ));
}

#[test]
fn a_foreign_handle_is_corruption_even_with_malformed_arguments() {
    let (log, _) = text_log("run-7", TEN_LINES);
    let err = Reader::new(&log)
        .call(&json!({"handle": "run-8:1", "limit": 0}))
        .unwrap_err();
    assert_eq!(err.code(), "invalid_deferred_handle");
}

#[test]
fn a_small_read_of_a_huge_result_never_pulls_the_whole_result() {
    // 100 million lines, 2 GB: generated on the fly, never stored.
    let source = Counting::new(Synthetic::new(100_000_000, 1000));
    let h = source.inner.handle().to_string();
    let chunk = Limits::default().chunk_bytes() as u64;
    let reader = Reader::new(&source);

    let first = reader.call(&json!({"handle": h, "limit": 3})).unwrap();
    insta::assert_snapshot!("huge_first_page", first.render());
    assert!(source.bytes_requested.get() <= chunk);

    source.bytes_requested.set(0);
    let grep = page(
        reader
            .call(&json!({"handle": h, "grep": "FAIL", "limit": 2}))
            .unwrap(),
    );
    let numbers: Vec<u64> = grep.lines.iter().map(|line| line.number).collect();
    assert_eq!(numbers, [1000, 2000]);
    assert_eq!(grep.next_offset, Some(2999));
    assert_eq!(grep.total_lines, None);
    assert!(
        source.bytes_requested.get() <= chunk,
        "{}",
        source.bytes_requested.get()
    );

    // A deep page scans up to its offset, chunk by chunk, and no further than one chunk past.
    source.bytes_requested.set(0);
    let offset = 5_000_000u64;
    let deep = page(
        reader
            .call(&json!({"handle": h, "offset": offset, "limit": 2}))
            .unwrap(),
    );
    assert_eq!(
        deep.lines[0].shown,
        source
            .inner
            .line(offset)
            .strip_suffix('\n')
            .unwrap()
            .as_bytes()
    );
    assert!(source.bytes_requested.get() <= offset * SYNTHETIC_LINE + 2 * chunk);
    assert!(source.largest_read.get() as u64 <= chunk);
}

#[test]
fn a_deep_page_of_a_source_with_line_marks_reads_from_the_mark_not_from_the_start() {
    // 100 million lines, 2 GB, whose source knows where each line starts (as a store with
    // a line index knows it within a stride).
    let source = Counting::new(Synthetic::new(100_000_000, 1000).with_marks());
    let h = source.inner.handle().to_string();
    let chunk = Limits::default().chunk_bytes() as u64;
    let reader = Reader::new(&source);
    for offset in [5_000_000u64, 99_000_000, 99_999_999] {
        source.bytes_requested.set(0);
        let deep = page(
            reader
                .call(&json!({"handle": h, "offset": offset, "limit": 64}))
                .unwrap(),
        );
        assert_eq!(deep.lines[0].number, offset + 1);
        assert_eq!(
            deep.lines[0].shown,
            source
                .inner
                .line(offset)
                .strip_suffix('\n')
                .unwrap()
                .as_bytes()
        );
        assert!(
            source.bytes_requested.get() <= chunk,
            "offset {offset}: {} bytes read",
            source.bytes_requested.get()
        );
    }
    // The last page knows the total, counted from the mark.
    let last = page(
        reader
            .call(&json!({"handle": h, "offset": 99_999_990u64, "limit": 64}))
            .unwrap(),
    );
    assert_eq!(
        (last.total_lines, last.next_offset),
        (Some(100_000_000), None)
    );
    // `grep` from a deep offset starts there too.
    source.bytes_requested.set(0);
    let grep = page(
        reader
            .call(&json!({"handle": h, "grep": "FAIL", "offset": 99_000_000u64, "limit": 2}))
            .unwrap(),
    );
    let numbers: Vec<u64> = grep.lines.iter().map(|line| line.number).collect();
    assert_eq!(numbers, [99_001_000, 99_002_000]);
    assert!(source.bytes_requested.get() <= chunk);
}

#[test]
fn a_failing_source_is_a_typed_error_not_a_tool_result() {
    let source = Failing::new();
    let reader = Reader::new(&source);
    let err = reader.call(&json!({"handle": "fail:0"})).unwrap_err();
    assert!(matches!(err, CallError::Source(_)), "{err:?}");
    assert_eq!(err.code(), "record_source_failed");
    assert_eq!(
        err.to_string(),
        "the record source failed: disk on fire at byte 0"
    );
    // Classifying an unknown handle asks the source too; its failure surfaces the same way.
    let err = reader.call(&json!({"handle": "fail:3"})).unwrap_err();
    assert!(matches!(err, CallError::Source(_)), "{err:?}");
}

#[test]
fn a_source_shorter_than_announced_is_a_typed_error() {
    let mut source = RawBytes::text(b"only this\n");
    source.announced = 50;
    let err = Reader::new(&source)
        .call(&json!({"handle": source.handle().to_string()}))
        .unwrap_err();
    assert_eq!(err.code(), "record_short_read");
    assert_eq!(
        err.to_string(),
        "the record source ended the result raw:0 at byte 10, but announced 50 bytes"
    );
}

/// The `shared/fixtures` folder beside the checkout (or `$PSYCH_FIXTURES`).
fn fixtures_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PSYCH_FIXTURES") {
        return PathBuf::from(dir);
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .map(|dir| dir.join("shared/fixtures"))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| panic!("no shared/fixtures above {}", manifest.display()))
}

#[test]
fn a_reader_can_own_its_source_and_give_it_back() {
    let (log, handle) = text_log("run-7", TEN_LINES);
    let owned = Reader::new(log);
    let borrowed_text = check(
        owned.source(),
        json!({"handle": handle.to_string(), "limit": 2}),
    );
    let owned_text = owned
        .call(&json!({"handle": handle.to_string(), "limit": 2}))
        .unwrap()
        .render();
    assert_eq!(owned_text, borrowed_text);
    assert!(owned_text.contains("started on :8080"), "{owned_text}");
    let log: MemoryRecords = owned.into_source();
    assert!(log.output_info(&handle).unwrap().is_some());
}
