//! `read_tool_output` over a real record log: a 64-line page, and a `grep` page of 64
//! matches, at offsets 0, 50 % and 99 % of one 256 MiB tool result, read through the
//! log's line index (`RecordSource::line_mark`) and, beside it in the same group, through
//! a wrapper that hides the index (the reader counts lines from byte 0, as every read did
//! before the index). Goal: through the index, the page at 99 % costs at most 2x the page
//! at 0, and so does `grep` from 99 %.
//!
//! The log is written once into a temporary directory (256 MiB; the page cache serves the
//! reads). Run with
//! `cargo bench -p psych-tests --bench reader_paging -- --warm-up-time 1 --measurement-time 3`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad data"
)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use psych_reader_tool::{Answer, ReadArgs, Reader};
use psych_record_log::{ReadError, RecordLog, SyncPolicy};
use psych_types::{
    ContentBlock, OutputInfo, Record, RecordHandle, RecordSource, RunId, ToolCallId, ToolOutput,
    ToolResult, count_line_breaks,
};

const SIZE: usize = 256 << 20;

/// A record source that forwards to the log but for `line_mark`, which it leaves to the
/// default (the start of the text): the reader as it read before the line index.
struct WithoutIndex<'a>(&'a RecordLog);

impl RecordSource for WithoutIndex<'_> {
    type Error = ReadError;

    fn run(&self) -> &RunId {
        self.0.run()
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, ReadError> {
        self.0.record(handle)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, ReadError> {
        self.0.output_info(handle)
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, ReadError> {
        self.0.read_output(handle, offset, buf)
    }

    fn content_block(
        &self,
        handle: &RecordHandle,
        position: usize,
    ) -> Result<Option<ContentBlock>, ReadError> {
        self.0.content_block(handle, position)
    }
}

/// Lines of a server log, about 100 bytes each, a fifth of them `WARN`, cut at a line end.
fn server_log() -> String {
    let levels = ["INFO ", "INFO ", "DEBUG", "INFO ", "WARN "];
    let mut out = String::with_capacity(SIZE + 256);
    let mut i = 0usize;
    while out.len() < SIZE {
        out.push_str(&format!(
            "2026-11-30T12:{:02}:{:02}.{:03}Z {} GET /api/items/{i} 200 {}ms user={} trace={:016x}\n",
            i / 60 % 60,
            i % 60,
            i % 1000,
            levels[i % 5],
            i % 97,
            i % 13,
            i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        ));
        i += 1;
    }
    let cut = out[..SIZE].rfind('\n').unwrap() + 1;
    out.truncate(cut);
    out
}

fn args(handle: &RecordHandle, offset: u64, grep: Option<&str>) -> ReadArgs {
    ReadArgs {
        offset,
        limit: Some(64),
        grep: grep.map(str::to_owned),
        ..ReadArgs::new(handle.to_string())
    }
}

fn paging(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let run = RunId::new("paging").unwrap();
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
    let text = server_log();
    let lines = count_line_breaks(text.as_bytes());
    let handle = log
        .append(&Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new("call_1").unwrap(),
            name: "fetch_logs".into(),
            output: ToolOutput::text(text),
        }))
        .unwrap();
    log.sync().unwrap();
    let indexed = Reader::new(&log);
    let scanning = Reader::new(WithoutIndex(&log));
    let offsets = [("0%", 0), ("50%", lines / 2), ("99%", lines / 100 * 99)];
    for grep in [None, Some("WARN")] {
        for (_, offset) in offsets {
            let args = args(&handle, offset, grep);
            let want = scanning.read(&args).unwrap();
            let Answer::Page(page) = &want else {
                panic!("text reads as a page");
            };
            assert_eq!(page.lines.len(), 64);
            assert_eq!(indexed.read(&args).unwrap(), want);
        }
        let name = if grep.is_some() {
            "log_grep_64_from_offset_256MiB"
        } else {
            "log_page_64_lines_256MiB"
        };
        let mut group = c.benchmark_group(name);
        group.sample_size(10);
        for (label, offset) in offsets {
            let args = args(&handle, offset, grep);
            group.bench_with_input(BenchmarkId::new("indexed", label), &args, |b, args| {
                b.iter(|| match indexed.read(black_box(args)).unwrap() {
                    Answer::Page(page) => page.lines.len(),
                    _ => unreachable!("checked above"),
                });
            });
            group.bench_with_input(BenchmarkId::new("scanning", label), &args, |b, args| {
                b.iter(|| match scanning.read(black_box(args)).unwrap() {
                    Answer::Page(page) => page.lines.len(),
                    _ => unreachable!("checked above"),
                });
            });
        }
        group.finish();
    }
}

criterion_group!(benches, paging);
criterion_main!(benches);
