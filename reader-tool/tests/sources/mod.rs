//! Record sources for the integration tests: a byte-counting wrapper, a huge synthetic
//! result generated on the fly, a source serving raw (possibly invalid UTF-8) bytes, one
//! that fails, and one that serves fewer bytes than it announces.

#![allow(dead_code, reason = "each test file uses a different subset")]

use std::cell::Cell;
use std::convert::Infallible;

use psych_types::{
    LineMark, MemoryRecords, OutputInfo, OutputKind, Record, RecordHandle, RecordSource, RunId,
    ToolCallId, ToolOutput, ToolResult, UserMessage,
};

pub(crate) fn run(name: &str) -> RunId {
    RunId::new(name).unwrap()
}

/// A tool result record with the given output.
pub(crate) fn result(output: ToolOutput) -> Record {
    Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new("call_1").unwrap(),
        name: "fetch_logs".into(),
        output,
    })
}

/// A Run whose record 0 is a user message and record 1 the given text result.
pub(crate) fn text_log(run_name: &str, text: &str) -> (MemoryRecords, RecordHandle) {
    let mut log = MemoryRecords::new(run(run_name));
    log.push(Record::User(UserMessage {
        text: "show me the logs".into(),
    }));
    let handle = log.push(result(ToolOutput::text(text)));
    (log, handle)
}

/// Wraps a source and counts what the reader asks of it.
pub(crate) struct Counting<S> {
    pub(crate) inner: S,
    pub(crate) bytes_requested: Cell<u64>,
    pub(crate) reads: Cell<u64>,
    pub(crate) largest_read: Cell<usize>,
}

impl<S> Counting<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            bytes_requested: Cell::new(0),
            reads: Cell::new(0),
            largest_read: Cell::new(0),
        }
    }
}

impl<S: RecordSource> RecordSource for Counting<S> {
    type Error = S::Error;

    fn run(&self) -> &RunId {
        self.inner.run()
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, S::Error> {
        self.inner.record(handle)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, S::Error> {
        self.inner.output_info(handle)
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, S::Error> {
        self.bytes_requested
            .set(self.bytes_requested.get() + buf.len() as u64);
        self.reads.set(self.reads.get() + 1);
        self.largest_read
            .set(self.largest_read.get().max(buf.len()));
        self.inner.read_output(handle, offset, buf)
    }

    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, S::Error> {
        self.inner.line_mark(handle, line)
    }
}

/// Wraps a source and answers [`RecordSource::line_mark`] from a sparse line index of
/// each tool result it holds, built when wrapped: the line breaks before every
/// `stride`-th byte, as a store keeping such an index (the record log) answers it.
pub(crate) struct Indexed<S> {
    pub(crate) inner: S,
    stride: u64,
    /// Per record: the line breaks in `[0, k * stride)` for `k` from 1 while `k * stride`
    /// is inside the text (empty for records that are not tool results).
    breaks: Vec<Vec<u64>>,
}

impl<S: RecordSource> Indexed<S>
where
    S::Error: std::fmt::Debug,
{
    /// Indexes the first `records` records of `inner`.
    pub(crate) fn new(inner: S, records: u64, stride: u64) -> Self {
        assert!(stride > 0);
        let breaks = (0..records)
            .map(|seq| {
                let handle = RecordHandle::new(inner.run().clone(), seq);
                let Some(info) = inner.output_info(&handle).unwrap() else {
                    return Vec::new();
                };
                let mut text = vec![0u8; info.len as usize];
                let mut got = 0;
                while got < text.len() {
                    let n = inner
                        .read_output(&handle, got as u64, &mut text[got..])
                        .unwrap();
                    assert!(n > 0, "the source served less than it announced");
                    got += n;
                }
                let mut total = 0;
                text.chunks(stride as usize)
                    .map(|chunk| {
                        total += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
                        total
                    })
                    .take((text.len().saturating_sub(1)) / stride as usize)
                    .collect()
            })
            .collect();
        Self {
            inner,
            stride,
            breaks,
        }
    }
}

impl<S: RecordSource> RecordSource for Indexed<S> {
    type Error = S::Error;

    fn run(&self) -> &RunId {
        self.inner.run()
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, S::Error> {
        self.inner.record(handle)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, S::Error> {
        self.inner.output_info(handle)
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, S::Error> {
        self.inner.read_output(handle, offset, buf)
    }

    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, S::Error> {
        if handle.run != *self.run() || line == 0 {
            return Ok(LineMark::START);
        }
        let Some(breaks) = usize::try_from(handle.seq)
            .ok()
            .and_then(|i| self.breaks.get(i))
        else {
            return Ok(LineMark::START);
        };
        // The last entry with fewer than `line` breaks before it.
        let k = breaks.partition_point(|&before| before < line);
        Ok(match k {
            0 => LineMark::START,
            k => LineMark {
                at: k as u64 * self.stride,
                breaks_before: breaks[k - 1],
            },
        })
    }
}

/// One text result of `lines` lines, generated on the fly and never stored: line `i`
/// (0-based) is `line {i:010} ok  ` plus a line break, 21 bytes; every `needle_every`-th
/// line says `FAIL` instead of `ok  `. Record 0 of Run `huge` is that result.
pub(crate) struct Synthetic {
    run: RunId,
    pub(crate) lines: u64,
    pub(crate) needle_every: u64,
    /// Answers [`RecordSource::line_mark`] with the line's own start (its position is
    /// known), as a store with a line index would, give or take a stride.
    pub(crate) marks: bool,
}

pub(crate) const SYNTHETIC_LINE: u64 = 21;

impl Synthetic {
    pub(crate) fn new(lines: u64, needle_every: u64) -> Self {
        Self {
            run: run("huge"),
            lines,
            needle_every,
            marks: false,
        }
    }

    /// The same result, answering `line_mark` too.
    pub(crate) fn with_marks(self) -> Self {
        Self {
            marks: true,
            ..self
        }
    }

    pub(crate) fn handle(&self) -> RecordHandle {
        RecordHandle::new(self.run.clone(), 0)
    }

    pub(crate) fn line(&self, i: u64) -> String {
        let line = if i % self.needle_every == self.needle_every - 1 {
            format!("line {i:010} FAIL\n")
        } else {
            format!("line {i:010} ok  \n")
        };
        assert_eq!(line.len() as u64, SYNTHETIC_LINE);
        line
    }

    pub(crate) fn len(&self) -> u64 {
        self.lines * SYNTHETIC_LINE
    }
}

impl RecordSource for Synthetic {
    type Error = Infallible;

    fn run(&self) -> &RunId {
        &self.run
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, Infallible> {
        // A reader must never need the whole record: it would be gigabytes.
        assert!(
            handle.seq != 0,
            "the reader asked for the whole huge record"
        );
        Ok(None)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, Infallible> {
        Ok((handle == &self.handle()).then(|| OutputInfo {
            kind: OutputKind::Text,
            len: self.len(),
            is_error: false,
            call_id: ToolCallId::new("call_1").unwrap(),
            name: "dump".into(),
        }))
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Infallible> {
        if handle != &self.handle() {
            return Ok(0);
        }
        let end = (offset + buf.len() as u64).min(self.len());
        let mut at = offset;
        let mut n = 0;
        while at < end {
            let i = at / SYNTHETIC_LINE;
            let line = self.line(i);
            let from = (at - i * SYNTHETIC_LINE) as usize;
            let take = (line.len() - from).min((end - at) as usize);
            buf[n..n + take].copy_from_slice(&line.as_bytes()[from..from + take]);
            n += take;
            at += take as u64;
        }
        Ok(n)
    }

    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, Infallible> {
        if !self.marks || handle != &self.handle() || line == 0 {
            return Ok(LineMark::START);
        }
        // One line before it: a mark in the middle of a line, as a byte stride gives.
        let before = (line - 1).min(self.lines.saturating_sub(1));
        Ok(LineMark {
            at: before * SYNTHETIC_LINE + 7,
            breaks_before: before,
        })
    }
}

/// Serves arbitrary bytes as the content of record 0, declared as the given kind: stands for
/// a store whose text result holds bytes that are not UTF-8. Serves at most `max_read`
/// bytes per call, to exercise short reads, and pretends the content is `announced` bytes
/// long.
pub(crate) struct RawBytes {
    run: RunId,
    pub(crate) kind: OutputKind,
    pub(crate) bytes: Vec<u8>,
    pub(crate) max_read: usize,
    pub(crate) announced: u64,
}

impl RawBytes {
    pub(crate) fn text(bytes: &[u8]) -> Self {
        Self {
            run: run("raw"),
            kind: OutputKind::Text,
            bytes: bytes.to_vec(),
            max_read: 3,
            announced: bytes.len() as u64,
        }
    }

    pub(crate) fn handle(&self) -> RecordHandle {
        RecordHandle::new(self.run.clone(), 0)
    }
}

impl RecordSource for RawBytes {
    type Error = Infallible;

    fn run(&self) -> &RunId {
        &self.run
    }

    fn record(&self, _: &RecordHandle) -> Result<Option<Record>, Infallible> {
        Ok(None)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, Infallible> {
        Ok((handle == &self.handle()).then(|| OutputInfo {
            kind: self.kind,
            len: self.announced,
            is_error: false,
            call_id: ToolCallId::new("call_1").unwrap(),
            name: "cat".into(),
        }))
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Infallible> {
        if handle != &self.handle() {
            return Ok(0);
        }
        let start = (offset as usize).min(self.bytes.len());
        let n = buf.len().min(self.bytes.len() - start).min(self.max_read);
        buf[..n].copy_from_slice(&self.bytes[start..start + n]);
        Ok(n)
    }
}

/// The storage error of [`Failing`].
#[derive(Debug)]
pub(crate) struct DiskError(pub u64);

impl std::fmt::Display for DiskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "disk on fire at byte {}", self.0)
    }
}

impl std::error::Error for DiskError {}

/// Announces a 100-byte text result at record 0 of Run `fail` and fails every read of it;
/// `record` fails too.
pub(crate) struct Failing {
    run: RunId,
}

impl Failing {
    pub(crate) fn new() -> Self {
        Self { run: run("fail") }
    }
}

impl RecordSource for Failing {
    type Error = DiskError;

    fn run(&self) -> &RunId {
        &self.run
    }

    fn record(&self, _: &RecordHandle) -> Result<Option<Record>, DiskError> {
        Err(DiskError(0))
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, DiskError> {
        Ok((handle.seq == 0).then(|| OutputInfo {
            kind: OutputKind::Text,
            len: 100,
            is_error: false,
            call_id: ToolCallId::new("call_1").unwrap(),
            name: "cat".into(),
        }))
    }

    fn read_output(&self, _: &RecordHandle, offset: u64, _: &mut [u8]) -> Result<usize, DiskError> {
        Err(DiskError(offset))
    }
}

/// Record 0 of Run `long`: `first\n`, then one line of `len` bytes of `x` with `needle` in
/// its middle, then `\nlast\n`; generated on the fly, never stored.
pub(crate) struct LongLine {
    run: RunId,
    pub(crate) len: u64,
    pub(crate) needle: &'static [u8],
}

impl LongLine {
    pub(crate) fn new(len: u64, needle: &'static [u8]) -> Self {
        Self {
            run: run("long"),
            len,
            needle,
        }
    }

    pub(crate) fn handle(&self) -> RecordHandle {
        RecordHandle::new(self.run.clone(), 0)
    }

    fn byte(&self, at: u64) -> u8 {
        let needle_at = 6 + self.len / 2;
        match at {
            0..6 => b"first\n"[at as usize],
            _ if at >= needle_at && at < needle_at + self.needle.len() as u64 => {
                self.needle[(at - needle_at) as usize]
            }
            _ if at < 6 + self.len => b'x',
            _ => b"\nlast\n"[(at - 6 - self.len) as usize],
        }
    }

    fn total(&self) -> u64 {
        6 + self.len + 6
    }
}

impl RecordSource for LongLine {
    type Error = Infallible;

    fn run(&self) -> &RunId {
        &self.run
    }

    fn record(&self, _: &RecordHandle) -> Result<Option<Record>, Infallible> {
        Ok(None)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, Infallible> {
        Ok((handle == &self.handle()).then(|| OutputInfo {
            kind: OutputKind::Text,
            len: self.total(),
            is_error: false,
            call_id: ToolCallId::new("call_1").unwrap(),
            name: "minified".into(),
        }))
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Infallible> {
        if handle != &self.handle() {
            return Ok(0);
        }
        let end = (offset + buf.len() as u64).min(self.total());
        let n = end.saturating_sub(offset) as usize;
        // The run of `x` is filled in bulk; the few other bytes one by one.
        buf[..n].fill(b'x');
        for (i, slot) in buf[..n].iter_mut().enumerate() {
            let at = offset + i as u64;
            if at < 6 || at >= 6 + self.len || self.byte(at) != b'x' {
                *slot = self.byte(at);
            }
        }
        Ok(n)
    }
}
