//! A 64-line page, and a `grep` page of 64 matches, at offsets 0, 50 % and 99 % of a
//! 256 MiB stored result, from a source that keeps a line index (at the record log's
//! stride, 128 KiB) and from one that does not (the reader counts from byte 0, as every
//! read did before the index), in one group each so the ratios come from one run.
//! Goal: with the index, the page at 99 % costs at most 2x the page at 0.
//!
//! The result and its sources are `support/shared_bytes.rs`'s; the `grep` needle is
//! `WARN`, on about one line in five. Run with
//! `cargo bench -p psych-reader-tool --bench paging -- --warm-up-time 1 --measurement-time 3`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unreachable_pub,
    reason = "a benchmark fails loudly on bad data; its support module is shared"
)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use psych_reader_tool::{Answer, ReadArgs, Reader};
use psych_types::count_line_breaks;

#[path = "support/shared_bytes.rs"]
mod shared_bytes;

use shared_bytes::{SharedBytes, log_text};

/// The record log's stride for a result of up to 256 MiB.
const STRIDE: u64 = 128 << 10;

fn args(offset: u64, grep: Option<&str>) -> ReadArgs {
    ReadArgs {
        offset,
        limit: Some(64),
        grep: grep.map(str::to_owned),
        ..ReadArgs::new("bench:0")
    }
}

fn paging(c: &mut Criterion) {
    let bytes = log_text();
    let lines = count_line_breaks(&bytes);
    let scanning = Reader::new(SharedBytes::scanning(&bytes));
    let indexed = Reader::new(SharedBytes::indexed(&bytes, STRIDE));
    let offsets = [("0%", 0), ("50%", lines / 2), ("99%", lines / 100 * 99)];
    for grep in [None, Some("WARN")] {
        // Sanity: both readers give the same full page at every offset.
        for (_, offset) in offsets {
            let want = scanning.read(&args(offset, grep)).unwrap();
            let Answer::Page(page) = &want else {
                panic!("text reads as a page");
            };
            assert_eq!(page.lines.len(), 64);
            assert_eq!(indexed.read(&args(offset, grep)).unwrap(), want);
        }
        let name = if grep.is_some() {
            "grep_64_from_offset_256MiB"
        } else {
            "page_64_lines_256MiB"
        };
        let mut group = c.benchmark_group(name);
        group.sample_size(10);
        for (label, offset) in offsets {
            let args = args(offset, grep);
            for (source, reader) in [("indexed", &indexed), ("scanning", &scanning)] {
                group.bench_with_input(BenchmarkId::new(source, label), &args, |b, args| {
                    b.iter(|| match reader.read(black_box(args)).unwrap() {
                        Answer::Page(page) => page.lines.len(),
                        _ => unreachable!("checked above"),
                    });
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, paging);
criterion_main!(benches);
