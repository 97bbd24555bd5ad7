//! Properties of the reader against naive models: following `next_offset` from 0 pages
//! through any text and reconstructs it exactly; `grep` pages equal a naive line filter;
//! an escaped page decodes back to the exact bytes; a source with a line index gives the
//! same answers as one the reader scans from byte 0. Tiny chunk sizes put every chunk edge
//! inside lines and matches.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::sources::{Indexed, RawBytes, text_log};
use proptest::prelude::*;
use psych_reader_tool::{Answer, Limits, Page, ReadArgs, Reader};
use psych_types::RecordSource;

fn limits(chunk: usize, page: usize) -> Limits {
    Limits::builder()
        .chunk_bytes(chunk)
        .max_page_bytes(page)
        .build()
        .unwrap()
}

fn read<S: RecordSource>(reader: &Reader<S>, args: &ReadArgs) -> Page
where
    S::Error: std::fmt::Debug,
{
    match reader.read(args).unwrap() {
        Answer::Page(page) => page,
        other => panic!("{other:?}"),
    }
}

/// A line's bytes read on from cut to cut, and where each cut fell.
type ReadOn = (Vec<u8>, Vec<usize>);

/// Line `offset` (0-based) of `handle`'s result read from each cut to the next (`limit` 1,
/// `byte` from each line's read-on marker), each part checked to follow the last without a
/// gap or overlap and to be at most `cap` bytes: the bytes shown and where each cut fell,
/// or `None` when the page has no line.
fn read_line_on<S: RecordSource>(
    reader: &Reader<S>,
    handle: &str,
    offset: usize,
    cap: usize,
) -> Result<Option<ReadOn>, TestCaseError>
where
    S::Error: std::fmt::Debug,
{
    let mut args = ReadArgs {
        offset: offset as u64,
        limit: Some(1),
        ..ReadArgs::new(handle.to_owned())
    };
    let mut got = Vec::new();
    let mut cuts = Vec::new();
    loop {
        let page = read(reader, &args);
        let Some(line) = page.lines.first() else {
            return Ok(None);
        };
        if !got.is_empty() {
            cuts.push(got.len());
        }
        prop_assert_eq!(line.number, offset as u64 + 1);
        prop_assert_eq!(line.cut_before(), got.len() as u64, "no gap, no overlap");
        prop_assert!(line.shown.len() <= cap);
        got.extend_from_slice(&line.shown);
        match page.read_on(line) {
            Some(byte) => {
                prop_assert!(byte > args.byte);
                args.byte = byte;
            }
            None => return Ok(Some((got, cuts))),
        }
    }
}

/// The lines of `text` as `readlines` would split them, without their line breaks.
fn naive_lines(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.split('\n').collect();
    if text.is_empty() || text.ends_with('\n') {
        lines.pop();
    }
    lines
}

fn text_strategy() -> impl Strategy<Value = String> {
    // Short lines, empty lines, multi-byte characters, an optional final line break.
    prop::collection::vec("[a-c é€\t]{0,12}", 0..40).prop_flat_map(|lines| {
        let joined = lines.join("\n");
        prop_oneof![Just(joined.clone()), Just(format!("{joined}\n"))]
    })
}

/// Decodes a content line of a page rendered with escapes: `\\` is a backslash, `\xNN` a
/// byte, anything else itself.
fn unescape(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && bytes.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else if bytes[i] == b'\\' && bytes.get(i + 1) == Some(&b'x') {
            out.push(u8::from_str_radix(&text[i + 2..i + 4], 16).unwrap());
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn paging_by_next_offset_reconstructs_the_text(
        text in text_strategy(),
        limit in 1u32..8,
        chunk in 1usize..40,
        page_bytes in 1usize..60,
    ) {
        let (log, handle) = text_log("run-p", &text);
        let reader = Reader::with_limits(&log, limits(chunk, page_bytes));
        let mut args = ReadArgs::new(handle.to_string());
        args.limit = Some(limit);
        let mut rebuilt = Vec::new();
        let mut expected_number = 1;
        loop {
            let page = read(&reader, &args);
            prop_assert!(page.lines.len() <= limit as usize);
            for line in &page.lines {
                prop_assert_eq!(line.number, expected_number);
                prop_assert!(line.is_whole());
                expected_number += 1;
                rebuilt.extend_from_slice(&line.shown);
                rebuilt.push(b'\n');
            }
            match page.next_offset {
                Some(next) => {
                    prop_assert!(!page.lines.is_empty());
                    prop_assert_eq!(next, expected_number - 1);
                    args.offset = next;
                }
                None => {
                    if page.ends_without_newline {
                        rebuilt.pop();
                    }
                    prop_assert_eq!(page.total_lines, Some(naive_lines(&text).len() as u64));
                    break;
                }
            }
        }
        prop_assert_eq!(String::from_utf8(rebuilt).unwrap(), text);
    }

    #[test]
    fn any_offset_reads_the_same_lines_as_slicing(
        text in text_strategy(),
        offset in 0u64..50,
        limit in 1u32..10,
        chunk in 1usize..40,
    ) {
        let (log, handle) = text_log("run-p", &text);
        let reader = Reader::with_limits(&log, limits(chunk, usize::MAX));
        let args = ReadArgs { offset, limit: Some(limit), ..ReadArgs::new(handle.to_string()) };
        let page = read(&reader, &args);
        let lines = naive_lines(&text);
        let expected: Vec<&str> = lines.iter().skip(offset as usize).take(limit as usize).copied().collect();
        let got: Vec<String> = page.lines.iter().map(|l| String::from_utf8(l.shown.clone()).unwrap()).collect();
        prop_assert_eq!(got, expected);
        let more = (offset as usize + limit as usize) < lines.len();
        prop_assert_eq!(page.next_offset.is_some(), more);
    }

    #[test]
    fn grep_pages_equal_a_naive_line_filter(
        text in prop::collection::vec("[abc\n]{0,30}", 0..8).prop_map(|parts| parts.concat()),
        needle in "[abc]{1,3}",
        offset in 0u64..20,
        limit in 1u32..5,
        chunk in 1usize..32,
    ) {
        let (log, handle) = text_log("run-g", &text);
        let reader = Reader::with_limits(&log, limits(chunk, usize::MAX));
        let expected: Vec<(u64, &str)> = naive_lines(&text)
            .into_iter()
            .enumerate()
            .map(|(i, line)| (i as u64 + 1, line))
            .filter(|&(n, line)| n > offset && line.contains(needle.as_str()))
            .collect();
        let mut args = ReadArgs {
            offset,
            limit: Some(limit),
            grep: Some(needle.clone()),
            ..ReadArgs::new(handle.to_string())
        };
        let mut got = Vec::new();
        let mut pages = 0;
        loop {
            let page = read(&reader, &args);
            prop_assert!(page.lines.len() <= limit as usize);
            pages += 1;
            for line in &page.lines {
                got.push((line.number, String::from_utf8(line.shown.clone()).unwrap()));
            }
            match page.next_offset {
                Some(next) => {
                    // The next offset is exactly the next match's line.
                    let upcoming = expected.get(got.len()).map(|&(n, _)| n - 1);
                    prop_assert_eq!(Some(next), upcoming);
                    args.offset = next;
                }
                None => break,
            }
        }
        let expected: Vec<(u64, String)> = expected.into_iter().map(|(n, l)| (n, l.to_owned())).collect();
        prop_assert_eq!(got.len().div_ceil(limit as usize).max(1), pages);
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn an_escaped_page_decodes_to_the_exact_bytes(
        lines in prop::collection::vec(prop::collection::vec(any::<u8>().prop_filter("no line break", |b| *b != b'\n'), 0..20), 1..10),
    ) {
        let mut bytes = lines.join(&b'\n');
        bytes.push(b'\n');
        let source = RawBytes::text(&bytes);
        let answer = Reader::new(&source).read(&ReadArgs::new(source.handle().to_string())).unwrap();
        let rendered = answer.render();
        let escaped = rendered.contains("are written \\xNN") || rendered.contains("is written \\xNN");
        prop_assert_eq!(escaped, std::str::from_utf8(&bytes).is_err());
        let content: Vec<&str> = rendered.split('\n').filter(|l| l.len() >= 7 && l.as_bytes()[6] == b'\t').collect();
        prop_assert_eq!(content.len(), lines.len());
        for (shown, original) in content.iter().zip(&lines) {
            let body = &shown[7..];
            let decoded = if escaped { unescape(body) } else { body.as_bytes().to_vec() };
            prop_assert_eq!(&decoded, original);
        }
    }

    #[test]
    fn no_shown_line_exceeds_the_cap(
        lengths in prop::collection::vec(0usize..3000, 1..6),
        chunk in 16usize..4096,
    ) {
        let text: String = lengths.iter().map(|&n| format!("{}\n", "é".repeat(n / 2))).collect();
        let (log, handle) = text_log("run-c", &text);
        let reader = Reader::with_limits(&log, limits(chunk, usize::MAX));
        let page = read(&reader, &ReadArgs::new(handle.to_string()));
        for (line, &n) in page.lines.iter().zip(&lengths) {
            prop_assert!(line.shown.len() <= 2000);
            prop_assert!(std::str::from_utf8(&line.shown).is_ok());
            prop_assert_eq!(line.len as usize, n / 2 * 2);
            prop_assert_eq!(line.cut_before() + line.shown.len() as u64 + line.cut_after(), line.len);
        }
    }

    #[test]
    fn reading_on_from_each_cut_reconstructs_every_line(
        lines in prop::collection::vec("[aé€\t]{0,900}", 1..5),
        chunk in 1usize..700,
        indexed in any::<bool>(),
    ) {
        let text = lines.join("\n");
        let (log, handle) = text_log("run-o", &text);
        let limits = Limits::builder().chunk_bytes(chunk).max_line_bytes(512).build().unwrap();
        let reader = Reader::with_limits(Indexed::new(&log, 2, if indexed { 1 } else { u64::MAX }), limits);
        for (offset, original) in lines.iter().enumerate() {
            let got = read_line_on(&reader, &handle.to_string(), offset, 512)?;
            // An empty last line after a final line break is no line (as `readlines`).
            prop_assert!(got.is_some() || (original.is_empty() && offset + 1 == lines.len()));
            prop_assert_eq!(got.unwrap_or_default().0, original.as_bytes());
        }
    }

    #[test]
    fn reading_on_from_each_cut_reconstructs_lines_that_are_not_utf8(
        lines in prop::collection::vec(
            prop::collection::vec(prop::sample::select(vec![b'a', 0x80, 0xA9, 0xAC, 0x82, 0xC3, 0xE2, 0xF0, 0x9F, 0xFF]), 0..2000),
            1..4,
        ),
        cap in 512usize..530,
        chunk in 1usize..64,
    ) {
        // Stray continuation bytes, lead bytes without their tail and whole characters, with
        // cuts landing among them: no byte is skipped or shown twice.
        let bytes = lines.join(&b'\n');
        let source = RawBytes::text(&bytes);
        let limits = Limits::builder().chunk_bytes(chunk).max_line_bytes(cap).build().unwrap();
        let reader = Reader::with_limits(&source, limits);
        for (offset, original) in lines.iter().enumerate() {
            let got = read_line_on(&reader, &source.handle().to_string(), offset, cap)?;
            prop_assert!(got.is_some() || (original.is_empty() && offset + 1 == lines.len()));
            let (got, cuts) = got.unwrap_or_default();
            prop_assert_eq!(&got, original);
            // No cut falls inside a valid character among the stray bytes.
            for cut in cuts {
                let inside = (1..=3.min(cut)).any(|back| {
                    let width = match original[cut - back] {
                        0xC2..=0xDF => 2,
                        0xE0..=0xEF => 3,
                        0xF0..=0xF4 => 4,
                        _ => 0,
                    };
                    width > back
                        && original
                            .get(cut - back..cut - back + width)
                            .is_some_and(|c| std::str::from_utf8(c).is_ok())
                });
                prop_assert!(!inside, "a cut at {} splits a character", cut);
            }
        }
    }

    #[test]
    fn grep_read_on_from_each_cut_shows_every_match(
        lines in prop::collection::vec("[ab]{0,1500}", 1..4),
        needle in "[ab]{1,3}",
        chunk in 1usize..700,
    ) {
        let text = lines.join("\n");
        let (log, handle) = text_log("run-g", &text);
        let limits = Limits::builder().chunk_bytes(chunk).max_line_bytes(512).build().unwrap();
        let reader = Reader::with_limits(&log, limits);
        // Every match, as (line, position in it), is inside some window shown.
        let mut shown: Vec<(u64, u64, u64)> = Vec::new();
        let mut args = ReadArgs {
            limit: Some(1),
            grep: Some(needle.clone()),
            ..ReadArgs::new(handle.to_string())
        };
        for _ in 0..10_000 {
            let page = read(&reader, &args);
            let Some(line) = page.lines.first() else { break };
            let from = line.cut_before();
            shown.push((line.number, from, from + line.shown.len() as u64));
            (args.offset, args.byte) = match (page.read_on(line), page.next_offset) {
                (Some(byte), _) => {
                    prop_assert!(line.number - 1 > args.offset || byte > args.byte);
                    (line.number - 1, byte)
                }
                (None, Some(next)) => (next, 0),
                (None, None) => break,
            };
        }
        for (i, original) in lines.iter().enumerate() {
            let number = i as u64 + 1;
            for (at, _) in original.match_indices(needle.as_str()) {
                let (at, end) = (at as u64, (at + needle.len()) as u64);
                prop_assert!(
                    shown.iter().any(|&(n, from, to)| n == number && from <= at && end <= to),
                    "match at {} of line {} not shown: {:?}", at, number, shown
                );
            }
        }
    }

    #[test]
    fn pages_from_a_line_index_equal_the_scanning_readers(
        lines in prop::collection::vec(
            prop_oneof![
                8 => "[a-c é\t]{0,12}",
                1 => "[ab]{500,1200}",
            ],
            0..60,
        ),
        final_break in any::<bool>(),
        stride in 1u64..200,
        chunk in 1usize..300,
        page_bytes in prop_oneof![Just(usize::MAX), 1usize..2000],
        count_all in prop_oneof![Just(u64::MAX), 0u64..400],
        offset in 0u64..70,
        byte in prop_oneof![Just(0u64), 0u64..1300],
        limit in 1u32..12,
        grep in prop::option::of("[abé]{1,2}"),
    ) {
        let mut text = lines.join("\n");
        if final_break {
            text.push('\n');
        }
        let (log, handle) = text_log("run-i", &text);
        let limits = Limits::builder()
            .chunk_bytes(chunk)
            .max_page_bytes(page_bytes)
            .max_line_bytes(512)
            .count_all_bytes(count_all)
            .build()
            .unwrap();
        let scanning = Reader::with_limits(&log, limits.clone());
        let indexed = Reader::with_limits(Indexed::new(&log, 2, stride), limits);
        let args = ReadArgs {
            offset,
            byte,
            limit: Some(limit),
            grep,
            ..ReadArgs::new(handle.to_string())
        };
        prop_assert_eq!(indexed.read(&args).unwrap(), scanning.read(&args).unwrap());
    }
}
