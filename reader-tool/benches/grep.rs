//! `grep` over a 256 MiB stored result through a `RecordSource`, with line numbers computed,
//! against `memchr::memmem::find_iter` over the same bytes in memory, in one group so the
//! ratio is meaningful on a noisy machine.
//!
//! The result is log-like text (about 100-byte lines of timestamps, levels, routes, status
//! codes and trace ids) with a rare needle: 8 lines of 2.9 million hold it. The source is an
//! in-memory `RecordSource` over one shared 256 MiB buffer; its `read_output` is the same
//! `copy_from_slice` as `psych_types::MemoryRecords`, which would keep a second copy of the
//! text (the record and its rendered bytes), so the buffer exists once here.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad data"
)]

use std::convert::Infallible;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use psych_reader_tool::{Answer, ReadArgs, Reader};
use psych_types::{OutputInfo, OutputKind, Record, RecordHandle, RecordSource, RunId, ToolCallId};

const SIZE: usize = 256 << 20;
const NEEDLE: &str = "deadlock detected";

/// One stored text result of one Run, served from a shared buffer.
struct SharedBytes<'a> {
    run: RunId,
    bytes: &'a [u8],
}

impl RecordSource for SharedBytes<'_> {
    type Error = Infallible;

    fn run(&self) -> &RunId {
        &self.run
    }

    fn record(&self, _: &RecordHandle) -> Result<Option<Record>, Infallible> {
        Ok(None)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, Infallible> {
        Ok(
            (handle.run == self.run && handle.seq == 0).then(|| OutputInfo {
                kind: OutputKind::Text,
                len: self.bytes.len() as u64,
                is_error: false,
                call_id: ToolCallId::new("call_1").unwrap(),
                name: "fetch_logs".into(),
            }),
        )
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Infallible> {
        if handle.run != self.run || handle.seq != 0 {
            return Ok(0);
        }
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.bytes.len());
        let n = buf.len().min(self.bytes.len() - start);
        buf[..n].copy_from_slice(&self.bytes[start..start + n]);
        Ok(n)
    }
}

/// Log-like lines from a fixed-seed generator, cut to `SIZE` at a line end.
fn log_text() -> Vec<u8> {
    use std::io::Write as _;
    let levels = ["INFO ", "INFO ", "INFO ", "DEBUG", "WARN "];
    let services = ["api", "db", "worker", "auth", "cache"];
    let routes = [
        "GET /orders",
        "POST /orders",
        "GET /health",
        "GET /customers",
        "PUT /invoices",
    ];
    let mut out = Vec::with_capacity(SIZE + 256);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut line = 0u64;
    while out.len() < SIZE {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let r = state >> 16;
        let (h, m, s, ms) = (r % 24, (r >> 5) % 60, (r >> 11) % 60, (r >> 17) % 1000);
        if line % 350_000 == 349_999 {
            writeln!(
                out,
                "2026-11-30T{h:02}:{m:02}:{s:02}.{ms:03}Z ERROR db     {NEEDLE} on table orders, \
                 rolling back txn {r:016x}"
            )
            .unwrap();
        } else {
            writeln!(
                out,
                "2026-11-30T{h:02}:{m:02}:{s:02}.{ms:03}Z {} {:<6} {} {}/{} 200 {}ms trace={:016x}",
                levels[(r % 5) as usize],
                services[((r >> 3) % 5) as usize],
                routes[((r >> 7) % 5) as usize],
                (r >> 20) % 100_000,
                (r >> 9) % 7,
                (r >> 13) % 900 + 1,
                r,
            )
            .unwrap();
        }
        line += 1;
    }
    let cut = memchr::memrchr(b'\n', &out[..SIZE]).unwrap() + 1;
    out.truncate(cut);
    out
}

fn grep(c: &mut Criterion) {
    let bytes = log_text();
    let source = SharedBytes {
        run: RunId::new("bench").unwrap(),
        bytes: &bytes,
    };
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
