//! The 256 MiB result the reader's benchmarks read, and the in-memory sources serving it.
//!
//! The result is log-like text (about 100-byte lines of timestamps, levels, routes, status
//! codes and trace ids) with a rare needle: 8 lines of 2.9 million hold it. The source is an
//! in-memory `RecordSource` over one shared 256 MiB buffer; its `read_output` is the same
//! `copy_from_slice` as `psych_types::MemoryRecords`, which would keep a second copy of the
//! text (the record and its rendered bytes), so the buffer exists once here.

use std::convert::Infallible;

use psych_types::{
    LineMark, OutputInfo, OutputKind, Record, RecordHandle, RecordSource, RunId, ToolCallId,
    count_line_breaks,
};

pub const SIZE: usize = 256 << 20;
pub const NEEDLE: &str = "deadlock detected";

/// One stored text result of one Run, served from a shared buffer; with a line index when
/// built by [`SharedBytes::indexed`].
pub struct SharedBytes<'a> {
    run: RunId,
    bytes: &'a [u8],
    /// The stride and the line breaks before each multiple of it inside the text.
    index: Option<(u64, Vec<u64>)>,
}

impl<'a> SharedBytes<'a> {
    /// A source that keeps no line index: the reader counts lines from byte 0.
    pub fn scanning(bytes: &'a [u8]) -> Self {
        Self {
            run: RunId::new("bench").unwrap(),
            bytes,
            index: None,
        }
    }

    /// A source answering `line_mark` from a line index of the given stride, the record
    /// log's (the breaks before every `stride`-th byte).
    pub fn indexed(bytes: &'a [u8], stride: u64) -> Self {
        let entries = (bytes.len().saturating_sub(1)) / stride as usize;
        let mut total = 0;
        let breaks = bytes
            .chunks(stride as usize)
            .take(entries)
            .map(|chunk| {
                total += count_line_breaks(chunk);
                total
            })
            .collect();
        Self {
            index: Some((stride, breaks)),
            ..Self::scanning(bytes)
        }
    }
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

    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, Infallible> {
        let Some((stride, breaks)) = &self.index else {
            return Ok(LineMark::START);
        };
        if handle.run != self.run || handle.seq != 0 {
            return Ok(LineMark::START);
        }
        let k = breaks.partition_point(|&before| before < line);
        Ok(match k {
            0 => LineMark::START,
            k => LineMark {
                at: k as u64 * stride,
                breaks_before: breaks[k - 1],
            },
        })
    }
}

/// Log-like lines from a fixed-seed generator, cut to `SIZE` at a line end.
pub fn log_text() -> Vec<u8> {
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
