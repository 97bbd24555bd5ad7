//! `grep` over a 256 MiB stored result through a `RecordSource`, with line numbers computed,
//! against `memchr::memmem::find_iter` over the same bytes in memory, in one group so the
//! ratio is meaningful on a noisy machine.
//!
//! The result and its source are `support/shared_bytes.rs`'s: log-like text with a rare
//! needle, served from memory.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unreachable_pub,
    dead_code,
    reason = "a benchmark fails loudly on bad data; its support module is shared"
)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use psych_reader_tool::{Answer, ReadArgs, Reader};

#[path = "support/shared_bytes.rs"]
mod shared_bytes;

use shared_bytes::{NEEDLE, SharedBytes, log_text};

fn grep(c: &mut Criterion) {
    let bytes = log_text();
    let source = SharedBytes::scanning(&bytes);
    let reader = Reader::new(&source);
    let args = ReadArgs {
        grep: Some(NEEDLE.to_owned()),
        limit: Some(1000),
        ..ReadArgs::new("bench:0")
    };
    // Sanity: both sides find the same matches, and the reader numbers them.
    let expected = memchr::memmem::find_iter(&bytes, NEEDLE).count();
    let Answer::Page(page) = reader.read(&args).unwrap() else {
        panic!("text reads as a page");
    };
    assert_eq!(page.lines.len(), expected);
    assert!(expected >= 5, "a rare needle, but present: {expected}");
    assert!(page.total_lines.is_some());
    eprintln!(
        "grep bench: {} bytes, {} lines, {} matches, first at line {}",
        bytes.len(),
        page.total_lines.unwrap_or(0),
        expected,
        page.lines[0].number
    );

    let mut group = c.benchmark_group("grep_256MiB");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.sample_size(10);
    group.bench_function("memmem_find_iter_in_memory", |b| {
        b.iter(|| memchr::memmem::find_iter(black_box(&bytes), NEEDLE).count());
    });
    group.bench_function("reader_grep_with_line_numbers", |b| {
        b.iter(|| {
            let Answer::Page(page) = reader.read(black_box(&args)).unwrap() else {
                unreachable!("checked above");
            };
            page.lines.len()
        });
    });
    group.finish();
}

criterion_group!(benches, grep);
criterion_main!(benches);
