//! The chunked scanner: reads a stored result through a [`RecordSource`] a bounded chunk at
//! a time, counting lines as it goes, and collects a page of lines or of `grep` matches.
//!
//! Memory is bounded by the limits, never by the result: the buffer holds one chunk plus a
//! carried-over partial last line of at most one chunk; a line longer than that is skipped
//! through with `memchr` and only the window shown of it is fetched again from the source.

use memchr::memmem::Finder;
use memchr::{memchr, memchr_iter, memrchr};
use psych_types::{LineMark, RecordHandle, RecordSource, count_line_breaks};

use crate::{CallError, Line};

type Result<T, S> = std::result::Result<T, CallError<<S as RecordSource>::Error>>;

/// What a page needs from one scan.
#[derive(Debug)]
pub(crate) struct Found {
    pub(crate) lines: Vec<Line>,
    pub(crate) next_offset: Option<u64>,
    pub(crate) stopped_at: u64,
    pub(crate) total_lines: Option<u64>,
    pub(crate) ends_without_newline: bool,
}

/// How much to show and when to stop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Lines (or matches) at most.
    pub(crate) limit: usize,
    /// Bytes shown of one line at most.
    pub(crate) line_cap: usize,
    /// The page closes once this many bytes are shown.
    pub(crate) page_budget: usize,
    /// Complete the line count for results at most this long.
    pub(crate) count_all: u64,
}

/// A cursor over one result with its line accounting.
///
/// Invariant: `start <= counted <= start + filled` whenever lines are being counted, so
/// the bytes between `counted` and a later position are in the buffer.
pub(crate) struct Scan<'a, S: RecordSource> {
    source: &'a S,
    handle: &'a RecordHandle,
    len: u64,
    chunk: usize,
    buf: Vec<u8>,
    filled: usize,
    /// Absolute position of `buf[0]`.
    start: u64,
    /// Line breaks before `counted` are counted in `lines_before`.
    counted: u64,
    lines_before: u64,
    /// Where the line holding `counted` starts.
    line_start: u64,
}

fn is_continuation(byte: u8) -> bool {
    byte & 0xC0 == 0x80
}

/// The span of the valid UTF-8 character of `bytes` that `at` falls strictly inside, if any.
///
/// A cut there would split the character, so a window's start moves to the span's end and
/// a window's end to the span's start. Bytes that are not part of a valid character are
/// never such a span: a stray continuation byte is a place like any other, so a cut beside
/// it and the read on from that cut agree and lose nothing.
fn char_around(bytes: &[u8], at: usize) -> Option<(usize, usize)> {
    if !bytes.get(at).is_some_and(|&b| is_continuation(b)) {
        return None;
    }
    let lead = (1..=3.min(at))
        .map(|back| at - back)
        .find(|&i| !is_continuation(bytes[i]))?;
    let width = match bytes[lead] {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return None,
    };
    let end = lead + width;
    let whole = end > at
        && bytes
            .get(lead..end)
            .is_some_and(|c| std::str::from_utf8(c).is_ok());
    whole.then_some((lead, end))
}

/// Bytes [`nth_line_break`] counts at a time before it looks for the break itself.
const SKIP_BLOCK: usize = 4096;

/// The index of the `n`-th (from 1) `\n` in `bytes`, or `None` when it holds fewer (or
/// `n` is 0).
///
/// Counts whole blocks with [`count_line_breaks`] (vectorized: an order of magnitude faster
/// than visiting each break) and walks the breaks of the one block that holds the `n`-th.
pub(crate) fn nth_line_break(bytes: &[u8], n: u64) -> Option<usize> {
    let mut left = n;
    for (i, block) in bytes.chunks(SKIP_BLOCK).enumerate() {
        let here = count_line_breaks(block);
        if here >= left {
            // 1 <= left <= here <= SKIP_BLOCK, so it fits usize.
            let index = usize::try_from(left.checked_sub(1)?).ok()?;
            return memchr_iter(b'\n', block)
                .nth(index)
                .map(|at| i * SKIP_BLOCK + at);
        }
        left -= here;
    }
    None
}

/// `mark` if it can be true of a text of `len` bytes and line `line`, else the start.
///
/// A mark past the text, with more breaks before it than bytes, or with `line` or more
/// breaks before it (so that the line would start before it) cannot be, and is not used;
/// nor is one at the text's very end, which would leave unknown whether a last line
/// without a line break precedes it (the total line count needs that).
pub(crate) fn checked_mark(mark: LineMark, line: u64, len: u64) -> LineMark {
    if mark.at < len && mark.breaks_before <= mark.at && mark.breaks_before < line {
        mark
    } else {
        LineMark::START
    }
}

/// Reads exactly `dst.len()` bytes at `at`, or fails with a short-read error.
pub(crate) fn read_exact<S: RecordSource>(
    source: &S,
    handle: &RecordHandle,
    mut at: u64,
    dst: &mut [u8],
    len: u64,
) -> Result<(), S> {
    let mut got = 0;
    while got < dst.len() {
        let n = source
            .read_output(handle, at, &mut dst[got..])
            .map_err(CallError::Source)?;
        if n == 0 {
            return Err(CallError::ShortRead {
                handle: handle.clone(),
                at,
                len,
            });
        }
        let n = n.min(dst.len() - got);
        got += n;
        at += n as u64;
    }
    Ok(())
}

impl<'a, S: RecordSource> Scan<'a, S> {
    #[cfg(test)]
    pub(crate) fn new(source: &'a S, handle: &'a RecordHandle, len: u64, chunk: usize) -> Self {
        Self::from_mark(source, handle, len, chunk, LineMark::START)
    }

    /// A cursor that starts counting at `mark` instead of byte 0: the bytes before it are
    /// never read. `mark` must be a true one (`breaks_before` line breaks before `at`,
    /// `at <= len`), as [`checked_mark`] makes sure of what it can.
    ///
    /// The line holding `mark.at` starts at or before it; taking `at` for its start keeps
    /// every use of `line_start` right: a line start found by counting replaces it before
    /// a line is shown, and the total's "unterminated last line" only asks whether any
    /// byte follows the last line break, which one at or after `at` does.
    pub(crate) fn from_mark(
        source: &'a S,
        handle: &'a RecordHandle,
        len: u64,
        chunk: usize,
        mark: LineMark,
    ) -> Self {
        Self {
            source,
            handle,
            len,
            chunk: chunk.max(1),
            buf: Vec::new(),
            filled: 0,
            start: mark.at,
            counted: mark.at,
            lines_before: mark.breaks_before,
            line_start: mark.at,
        }
    }

    fn end(&self) -> u64 {
        self.start + self.filled as u64
    }

    fn at_eof(&self) -> bool {
        self.end() >= self.len
    }

    /// Buffer index of an absolute position inside the buffer.
    fn rel(&self, abs: u64) -> usize {
        // In range by the callers' invariant; saturate rather than wrap if it were not.
        usize::try_from(abs.saturating_sub(self.start))
            .unwrap_or(usize::MAX)
            .min(self.filled)
    }

    fn data_from(&self, abs: u64) -> &[u8] {
        &self.buf[self.rel(abs)..self.filled]
    }

    /// Drops the bytes before `keep_from` and reads the next chunk after what is kept.
    /// Returns `false` at the end of the result (nothing read).
    fn load(&mut self, keep_from: u64) -> Result<bool, S> {
        let keep = self.rel(keep_from);
        self.buf.copy_within(keep..self.filled, 0);
        self.filled -= keep;
        self.start += keep as u64;
        let at = self.end();
        // At most one chunk, so it fits in usize.
        let want = usize::try_from(self.len.saturating_sub(at).min(self.chunk as u64))
            .unwrap_or(self.chunk);
        if want == 0 {
            return Ok(false);
        }
        let need = self.filled + want;
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        read_exact(
            self.source,
            self.handle,
            at,
            &mut self.buf[self.filled..need],
            self.len,
        )?;
        self.filled = need;
        Ok(true)
    }

    /// The bytes `[from, to)`: from the buffer when there, else read again from the source
    /// (at most one line window, so bounded).
    fn fetch(&self, from: u64, to: u64) -> Result<Vec<u8>, S> {
        if from >= self.start && to <= self.end() {
            return Ok(self.buf[self.rel(from)..self.rel(to)].to_vec());
        }
        let mut out = vec![0; usize::try_from(to - from).unwrap_or(0)];
        read_exact(self.source, self.handle, from, &mut out, self.len)?;
        Ok(out)
    }

    /// Counts the line breaks up to `to` (in the buffer). A position already counted is a
    /// no-op.
    fn count_to(&mut self, to: u64) {
        if to <= self.counted {
            return;
        }
        let from = self.rel(self.counted);
        let slice = &self.buf[from..self.rel(to)];
        let n = count_line_breaks(slice);
        if n > 0 {
            self.lines_before += n;
            if let Some(last) = memrchr(b'\n', slice) {
                self.line_start = self.counted + last as u64 + 1;
            }
        }
        self.counted = to;
    }

    /// Restarts the line accounting at a line start known to be line `lines_before`.
    fn set_line_start(&mut self, pos: u64, lines_before: u64) {
        self.counted = pos;
        self.lines_before = lines_before;
        self.line_start = pos;
    }

    /// Counts the rest of the result, chunk by chunk.
    fn count_rest(&mut self) -> Result<(), S> {
        loop {
            self.count_to(self.end());
            if !self.load(self.end())? {
                return Ok(());
            }
        }
    }

    /// Lines in the whole result, once the count reached its end.
    fn total_lines(&self) -> Option<u64> {
        (self.counted >= self.len)
            .then(|| self.lines_before + u64::from(self.line_start < self.len))
    }

    /// The total when known, or computed now when the result is small enough.
    fn finish_total(&mut self, count_all: u64) -> Result<Option<u64>, S> {
        if self.counted < self.len && self.len <= count_all {
            self.count_rest()?;
        }
        Ok(self.total_lines())
    }

    /// Moves to the start of line `n` (0-based) and returns its position, or the result's
    /// length when it has no such line. Reads only up to that line.
    fn skip_lines(&mut self, n: u64) -> Result<u64, S> {
        loop {
            if self.lines_before == n {
                return Ok(self.counted);
            }
            let need = n - self.lines_before;
            if let Some(at) = nth_line_break(self.data_from(self.counted), need) {
                let pos = self.counted + at as u64 + 1;
                self.set_line_start(pos, n);
                return Ok(pos);
            }
            self.count_to(self.end());
            if !self.load(self.end())? {
                return Ok(self.len);
            }
        }
    }

    /// With no line break in `[counted, end)`, reads on to the next line break and returns
    /// its position (`None` at the end of the result). The line accounting stays right.
    fn find_newline_beyond(&mut self) -> Result<Option<u64>, S> {
        loop {
            self.counted = self.end();
            if !self.load(self.end())? {
                return Ok(None);
            }
            if let Some(at) = memchr(b'\n', self.data_from(self.start)) {
                let pos = self.start + at as u64;
                self.counted = pos;
                return Ok(Some(pos));
            }
        }
    }

    /// Builds the shown form of the line `[start, end)` from its byte `skip` on (the line's
    /// end when it is shorter): whole when that fits `cap`, else a window of `cap` bytes
    /// from there, or around `matched` (a match's position, at or after `start + skip`, and
    /// length), never splitting a valid UTF-8 character ([`char_around`]).
    fn make_line(
        &self,
        number: u64,
        (start, end): (u64, u64),
        skip: u64,
        matched: Option<(u64, usize)>,
        cap: usize,
    ) -> Result<Line, S> {
        let len = end - start;
        let lo = start + skip.min(len);
        let (anchor, anchor_len) = matched.unwrap_or((lo, 0));
        let cap64 = cap as u64;
        let (from, to) = if end - lo <= cap64 {
            (lo, end)
        } else {
            let half = (cap.saturating_sub(anchor_len) / 2) as u64;
            let from = anchor.saturating_sub(half).max(lo);
            let to = (from + cap64).min(end);
            (to.saturating_sub(cap64).max(lo), to)
        };
        // Up to three bytes more on each side of a cut, to see whether it splits a
        // character (one is at most four bytes).
        let (lead, tail) = ((from - start).min(3), (end - to).min(3));
        let bytes = self.fetch(from - lead, to + tail)?;
        let lead = lead as usize; // at most 3
        let mut a = lead;
        if let Some((_, char_end)) = char_around(&bytes, a) {
            a = char_end;
        }
        let mut b = (lead + usize::try_from(to - from).unwrap_or(0)).min(bytes.len());
        if let Some((char_start, _)) = char_around(&bytes, b) {
            b = char_start;
        }
        Ok(Line {
            number,
            start,
            len,
            shown_from: from - lead as u64 + a as u64,
            shown: bytes[a..b.max(a)].to_vec(),
        })
    }

    /// Up to `bounds.limit` lines from line `offset` (0-based), the first of them from its
    /// byte `skip` on.
    pub(crate) fn read_lines(
        &mut self,
        offset: u64,
        skip: u64,
        bounds: Bounds,
    ) -> Result<Found, S> {
        let mut pos = self.skip_lines(offset)?;
        let mut line_no = offset;
        let mut lines = Vec::new();
        let mut shown = 0usize;
        let mut next_offset = None;
        let mut ends_without_newline = false;
        while pos < self.len {
            if lines.len() >= bounds.limit || shown >= bounds.page_budget {
                next_offset = Some(line_no);
                break;
            }
            let (end, next) = match memchr(b'\n', self.data_from(pos)) {
                Some(at) => (pos + at as u64, pos + at as u64 + 1),
                None if self.at_eof() => (self.len, self.len),
                None if self.end() - pos <= self.chunk as u64 => {
                    self.load(pos)?;
                    continue;
                }
                None => match self.find_newline_beyond()? {
                    Some(at) => (at, at + 1),
                    None => (self.len, self.len),
                },
            };
            let skip = if line_no == offset { skip } else { 0 };
            let line = self.make_line(line_no + 1, (pos, end), skip, None, bounds.line_cap)?;
            ends_without_newline = end == self.len;
            shown += line.shown.len();
            lines.push(line);
            line_no += 1;
            pos = next;
        }
        if !lines.is_empty() {
            self.set_line_start(pos, line_no);
        }
        Ok(Found {
            lines,
            next_offset,
            stopped_at: pos,
            total_lines: self.finish_total(bounds.count_all)?,
            ends_without_newline,
        })
    }

    /// The first match at or after `pos` in the buffer. Searches in windows small enough to
    /// stay in the core's cache and counts each window's line breaks right after searching
    /// it, so memory is read once for both rather than twice over the whole chunk. Windows
    /// overlap by `overlap` bytes (the needle's length less one) so that no match is missed.
    /// Without a match, every line break in the buffer is counted.
    fn find_in_buffer(&mut self, finder: &Finder<'_>, overlap: usize, pos: u64) -> Option<u64> {
        const WINDOW: usize = 32 << 10;
        let mut from = self.rel(pos);
        loop {
            let to = (from + WINDOW).min(self.filled);
            let hay_end = (to + overlap).min(self.filled);
            if let Some(at) = finder.find(&self.buf[from..hay_end]) {
                return Some(self.start + (from + at) as u64);
            }
            self.count_to(self.start + to as u64);
            if to == self.filled {
                return None;
            }
            from = to;
        }
    }

    /// Up to `bounds.limit` lines holding `needle` (no line break in it), from line
    /// `offset` on, searching that line from its byte `skip` on. When the page fills, scans
    /// on to the next match so that "more follows" is certain and the next offset is that
    /// match's line.
    pub(crate) fn grep(
        &mut self,
        offset: u64,
        skip: u64,
        needle: &[u8],
        bounds: Bounds,
    ) -> Result<Found, S> {
        let finder = Finder::new(needle);
        let window_overlap = needle.len().saturating_sub(1);
        let overlap = window_overlap as u64;
        let mut pos = self.skip_lines(offset)?;
        // Matches wholly before this in line `offset` are passed over (one the position
        // cuts through is found: it was not wholly shown before it).
        let skip_to = pos.saturating_add(skip);
        let mut lines = Vec::new();
        let mut shown = 0usize;
        let mut full = false;
        let mut next_offset = None;
        let mut stopped_at = self.len;
        while pos < self.len {
            let Some(m) = self.find_in_buffer(&finder, window_overlap, pos) else {
                let end = self.end();
                self.count_to(end);
                if self.at_eof() {
                    break;
                }
                // Carry the partial last line when short (its line start stays in the
                // buffer), else only what a match straddling the chunk edge needs.
                let tail = end.saturating_sub(overlap).max(pos);
                let keep = if self.line_start >= self.start
                    && end - self.line_start <= self.chunk as u64
                {
                    self.line_start.min(tail)
                } else {
                    tail
                };
                self.load(keep)?;
                pos = tail;
                continue;
            };
            self.count_to(m);
            if self.lines_before == offset && m + needle.len() as u64 <= skip_to {
                // Wholly before the byte asked for in the first line: go on from where a
                // match may still reach it, or from that line's end or the buffer's when
                // sooner (one jump per buffer).
                let line_end = memchr(b'\n', self.data_from(m)).map(|at| m + at as u64);
                pos = skip_to
                    .saturating_sub(overlap)
                    .min(line_end.unwrap_or(self.end()))
                    .max(m + 1);
                continue;
            }
            if full {
                next_offset = Some(self.lines_before);
                stopped_at = self.line_start;
                break;
            }
            let start = self.line_start;
            let (end, next) = match memchr(b'\n', self.data_from(m)) {
                Some(at) => (m + at as u64, m + at as u64 + 1),
                None if self.at_eof() => (self.len, self.len),
                None if start >= self.start && self.end() - start <= self.chunk as u64 => {
                    self.load(start)?;
                    pos = m;
                    continue;
                }
                None => {
                    self.count_to(self.end());
                    match self.find_newline_beyond()? {
                        Some(at) => (at, at + 1),
                        None => (self.len, self.len),
                    }
                }
            };
            let line = self.make_line(
                self.lines_before + 1,
                (start, end),
                // From the byte asked for, or from the match when it starts before it.
                if self.lines_before == offset {
                    skip.min(m - start)
                } else {
                    0
                },
                Some((m, needle.len())),
                bounds.line_cap,
            )?;
            shown += line.shown.len();
            lines.push(line);
            pos = next;
            self.count_to(pos);
            full = lines.len() >= bounds.limit || shown >= bounds.page_budget;
        }
        Ok(Found {
            lines,
            next_offset,
            stopped_at,
            total_lines: self.finish_total(bounds.count_all)?,
            ends_without_newline: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use psych_types::{MemoryRecords, Record, RunId, ToolCallId, ToolOutput, ToolResult};

    use super::*;

    fn store(text: &str) -> (MemoryRecords, RecordHandle) {
        let mut log = MemoryRecords::new(RunId::new("r").unwrap());
        let handle = log.push(Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new("c").unwrap(),
            name: "t".into(),
            output: ToolOutput::text(text),
        }));
        (log, handle)
    }

    const WIDE: Bounds = Bounds {
        limit: 1000,
        line_cap: 512,
        page_budget: usize::MAX,
        count_all: u64::MAX,
    };

    fn shown(found: &Found) -> Vec<(u64, String)> {
        found
            .lines
            .iter()
            .map(|line| (line.number, String::from_utf8(line.shown.clone()).unwrap()))
            .collect()
    }

    #[test]
    fn skip_lines_lands_on_line_starts_for_every_chunk_size() {
        let text = "a\nbb\n\nccc\nd";
        let (log, handle) = store(text);
        for chunk in 1..=12 {
            for (n, expected) in [(0, 0), (1, 2), (2, 5), (3, 6), (4, 10), (5, 11), (9, 11)] {
                let mut scan = Scan::new(&log, &handle, text.len() as u64, chunk);
                assert_eq!(scan.skip_lines(n).unwrap(), expected, "chunk {chunk} n {n}");
            }
        }
    }

    #[test]
    fn totals_count_an_unterminated_last_line() {
        for (text, total) in [("", 0), ("a", 1), ("a\n", 1), ("a\nb", 2), ("\n\n", 2)] {
            let (log, handle) = store(text);
            let mut scan = Scan::new(&log, &handle, text.len() as u64, 3);
            let found = scan.read_lines(0, 0, WIDE).unwrap();
            assert_eq!(found.total_lines, Some(total), "{text:?}");
            assert_eq!(found.lines.len() as u64, total, "{text:?}");
        }
    }

    #[test]
    fn grep_finds_matches_straddling_chunk_edges() {
        let text = "xxabcxx\nabc\nnope\nzzzzzzzzzzab\ncab";
        let (log, handle) = store(text);
        for chunk in 1..=40 {
            let mut scan = Scan::new(&log, &handle, text.len() as u64, chunk);
            let found = scan.grep(0, 0, b"abc", WIDE).unwrap();
            assert_eq!(
                shown(&found),
                [(1, "xxabcxx".to_owned()), (2, "abc".to_owned())],
                "chunk {chunk}"
            );
            assert_eq!(found.total_lines, Some(5));
        }
    }

    #[test]
    fn matches_straddling_search_windows_are_found_with_their_line_numbers() {
        // Lines of 100 bytes; a needle placed across each 32 KiB search-window edge.
        for shift in 0..8u64 {
            let mut text = String::new();
            for i in 0..3000 {
                text.push_str(&format!("{i:04} {}\n", "a".repeat(94)));
            }
            let mut bytes = text.into_bytes();
            let mut expected = Vec::new();
            for edge in [32_768u64, 65_536, 98_304, 131_072] {
                let at = (edge - shift) as usize;
                if bytes[at..at + 6].contains(&b'\n') {
                    continue;
                }
                bytes[at..at + 6].copy_from_slice(b"NEEDLE");
                expected.push(at as u64 / 100 + 1);
            }
            let text = String::from_utf8(bytes).unwrap();
            let (log, handle) = store(&text);
            let mut scan = Scan::new(&log, &handle, text.len() as u64, 1 << 20);
            let found = scan.grep(0, 0, b"NEEDLE", WIDE).unwrap();
            let numbers: Vec<u64> = found.lines.iter().map(|line| line.number).collect();
            assert_eq!(numbers, expected, "shift {shift}");
            assert!(!expected.is_empty());
            assert_eq!(found.total_lines, Some(3000));
        }
    }

    #[test]
    fn a_long_line_is_shown_as_a_window_around_the_match() {
        let text = format!("head\n{}NEEDLE{}\ntail", "a".repeat(5000), "b".repeat(5000));
        let (log, handle) = store(&text);
        for chunk in [7, 100, 1 << 20] {
            let mut scan = Scan::new(&log, &handle, text.len() as u64, chunk);
            let found = scan.grep(0, 0, b"NEEDLE", WIDE).unwrap();
            let line = &found.lines[0];
            assert_eq!((line.number, line.start, line.len), (2, 5, 10_006));
            assert_eq!(line.shown.len(), 512);
            let shown = String::from_utf8(line.shown.clone()).unwrap();
            assert!(shown.contains("NEEDLE"), "{shown}");
            assert_eq!(line.cut_before() + 512 + line.cut_after(), 10_006);
            assert_eq!(found.total_lines, Some(3));
        }
    }

    #[test]
    fn cuts_never_split_a_character() {
        let text = "é".repeat(1000);
        let (log, handle) = store(&text);
        let mut scan = Scan::new(&log, &handle, text.len() as u64, 64);
        let found = scan
            .read_lines(
                0,
                0,
                Bounds {
                    line_cap: 513,
                    ..WIDE
                },
            )
            .unwrap();
        let line = &found.lines[0];
        assert_eq!(line.shown.len(), 512, "backed off the split character");
        assert!(std::str::from_utf8(&line.shown).is_ok());
        assert_eq!(line.cut_after(), 2000 - 512);
    }
}
