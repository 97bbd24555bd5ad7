//! What a read returns, as data ([`Answer`], [`Page`], [`Line`]) and as the exact text the
//! model is shown ([`Answer::render`]).

use std::fmt::Write as _;

use psych_types::{OutputKind, RecordHandle, ToolOutput};

use crate::ArgsError;

/// What the source says of the tool result being read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultInfo {
    /// The handle it was read by.
    pub handle: RecordHandle,
    /// The tool name of the call it answers, as the model gave it.
    pub name: String,
    /// Content blocks, or structured content only.
    pub kind: OutputKind,
    /// Its readable length in bytes.
    pub len: u64,
    /// Whether the call failed.
    pub is_error: bool,
}

/// One line of a [`Page`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Its line number, counting from 1 (its offset is `number - 1`).
    pub number: u64,
    /// Byte position of its first byte in the result.
    pub start: u64,
    /// Its length in bytes, without the line break.
    pub len: u64,
    /// Byte position of the first byte shown (after `start` when the front is cut).
    pub shown_from: u64,
    /// The bytes shown: the whole line, or a window of at most `max_line_bytes` (at the
    /// start of the line or the `byte` asked for, or around the `grep` match), never
    /// splitting a valid UTF-8 character. Bytes of no valid character (a source other than
    /// psych's may hold them) are places like any other: reading on from a cut shows the
    /// line's next byte, whatever it is.
    pub shown: Vec<u8>,
}

impl Line {
    /// Bytes of the line left out before the part shown.
    pub fn cut_before(&self) -> u64 {
        self.shown_from - self.start
    }

    /// Bytes of the line left out after the part shown.
    pub fn cut_after(&self) -> u64 {
        (self.start + self.len) - (self.shown_from + self.shown.len() as u64)
    }

    /// Whether the whole line is shown.
    pub fn is_whole(&self) -> bool {
        self.shown.len() as u64 == self.len
    }
}

/// A page of a text result: lines from an offset, or the lines matching a `grep`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The result read.
    pub result: ResultInfo,
    /// The offset asked for, in lines.
    pub offset: u64,
    /// The byte asked for: bytes of the line at `offset` skipped (0 for none).
    pub byte: u64,
    /// The `grep` string, when the read searched.
    pub grep: Option<String>,
    /// The lines, in order. Empty when the offset is past the end or nothing matched.
    pub lines: Vec<Line>,
    /// Lines in the whole result, when known: always once the read reached the end, and for
    /// results of at most [`Limits::count_all_bytes`](crate::Limits::count_all_bytes).
    pub total_lines: Option<u64>,
    /// The offset to pass next when more follows: the line after the last one shown, or with
    /// `grep` the next matching line.
    pub next_offset: Option<u64>,
    /// The byte position the next read would start at (the result's length at the end).
    pub stopped_at: u64,
    /// The page shows the result's last line and the result does not end with a line break.
    pub ends_without_newline: bool,
    /// The reader's line cap, named in the rendered note when a line was cut.
    pub max_line_bytes: usize,
}

impl Page {
    /// When `line` (of this page) is cut after the part shown, the `byte` that reads on
    /// from the cut with `offset` = `line.number - 1`: the bytes of the line before the
    /// cut. A `grep` from there finds a match the cut runs through (it passes over only
    /// matches wholly before the byte, as the one shown is).
    pub fn read_on(&self, line: &Line) -> Option<u64> {
        (line.cut_after() > 0).then(|| line.shown_from + line.shown.len() as u64 - line.start)
    }

    /// Whether `line` shows less than it was asked to: cut after, or before the `byte`
    /// asked for by more than the rest of a character the byte fell in (a `grep` window
    /// starting later). A byte past the end of a line shorter than it is not a cut.
    fn is_cut(&self, line: &Line) -> bool {
        let asked = if line.number == self.offset.saturating_add(1) {
            self.byte.min(line.len)
        } else {
            0
        };
        line.cut_after() > 0 || line.cut_before() > asked.saturating_add(3).min(line.len)
    }
}

/// The answer to one `read_tool_output` call that the model sees as its tool result.
///
/// Corruption (an `invalid_deferred_handle`) and storage failures are not answers: they are
/// [`CallError`](crate::CallError)s.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer {
    /// Lines of the result's readable text.
    Page(Page),
    /// The arguments were malformed.
    Invalid(ArgsError),
}

impl Answer {
    /// Whether the model should read this as a failed call: malformed arguments.
    pub fn is_error(&self) -> bool {
        !matches!(self, Answer::Page(_))
    }

    /// The tool result for the model: the rendered text, marked as an error when
    /// [`Answer::is_error`].
    pub fn to_tool_output(&self) -> ToolOutput {
        let text = self.render();
        if self.is_error() {
            ToolOutput::error(text)
        } else {
            ToolOutput::text(text)
        }
    }

    /// The text the model is shown. The same answer always gives the same bytes.
    ///
    /// A page is a header line, a status line (range, total, whether more follows and the
    /// offset to pass next), notes when a line was cut or bytes are not UTF-8, then one line
    /// per line of content: its number right-aligned in six columns, a tab, the content. A
    /// line cut after the part shown ends with the `offset` and `byte` that read on from
    /// the cut; a page whose last line is the result's and is cut says so where it would
    /// say "end of result".
    pub fn render(&self) -> String {
        match self {
            Answer::Page(page) => render_page(page),
            Answer::Invalid(err) => err.tool_text(),
        }
    }
}

/// Shows a model-given tool name safely: at most 64 characters, quoted and escaped.
fn tool_name(name: &str) -> String {
    let short: String = name.chars().take(64).collect();
    if short.len() < name.len() {
        format!("{short:?}…")
    } else {
        format!("{short:?}")
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

fn header(info: &ResultInfo, total_lines: Option<u64>) -> String {
    let kind = match &info.kind {
        OutputKind::Json => "json shown pretty-printed",
        _ => "text",
    };
    let mut out = format!(
        "[read_tool_output {} · tool {} · {kind} · {}",
        info.handle,
        tool_name(&info.name),
        plural(info.len, "byte", "bytes")
    );
    match total_lines {
        Some(n) => out.push_str(&format!(" · {}", plural(n, "line", "lines"))),
        None => out.push_str(" · lines not counted yet"),
    }
    if info.is_error {
        out.push_str(" · the call failed");
    }
    out.push(']');
    out
}

fn render_page(page: &Page) -> String {
    let mut out = header(&page.result, page.total_lines);
    out.push('\n');
    out.push_str(&status(page));
    let invalid: usize = page
        .lines
        .iter()
        .map(|line| {
            line.shown
                .utf8_chunks()
                .map(|c| c.invalid().len())
                .sum::<usize>()
        })
        .sum();
    if page.lines.iter().any(|line| page.is_cut(line)) {
        let _ = write!(
            out,
            "\nnote: lines over {} bytes are cut; \"[…N bytes]\" marks what was left out",
            page.max_line_bytes
        );
    }
    if invalid > 0 {
        let _ = write!(
            out,
            "\nnote: {} on this page {} not valid UTF-8 and {} written \\xNN; every backslash \
             on this page is written \\\\",
            plural(invalid as u64, "byte", "bytes"),
            if invalid == 1 { "is" } else { "are" },
            if invalid == 1 { "is" } else { "are" },
        );
    }
    for line in &page.lines {
        let _ = write!(out, "\n{:>6}\t", line.number);
        if line.cut_before() > 0 {
            let _ = write!(out, "[…{} bytes]", line.cut_before());
        }
        push_content(&mut out, &line.shown, invalid > 0);
        if let Some(at) = resume(page, line) {
            let _ = write!(out, "[…{} bytes; read on with {at}]", line.cut_after());
        }
    }
    out
}

/// The status line: the range, the total, and how to go on.
fn status(page: &Page) -> String {
    let stopped = || {
        if page.total_lines.is_none() {
            format!(
                " (stopped at byte {} of {})",
                page.stopped_at, page.result.len
            )
        } else {
            String::new()
        }
    };
    let more = |out: &mut String| {
        if let Some(next) = page.next_offset {
            let _ = write!(out, "; more follows: call again with offset={next}");
        }
    };
    let mut out = String::new();
    let past_end = page.lines.is_empty()
        && page.result.len > 0
        && page.total_lines.is_some_and(|total| page.offset >= total);
    match &page.grep {
        None => {
            if page.result.len == 0 {
                out.push_str("the result is empty");
            } else if let (Some(first), Some(last)) = (page.lines.first(), page.lines.last()) {
                if first.number == last.number {
                    let _ = write!(out, "line {}", first.number);
                } else {
                    let _ = write!(out, "lines {}-{}", first.number, last.number);
                }
                if let Some(total) = page.total_lines {
                    let _ = write!(out, " of {total}");
                }
                if page.byte > 0 && first.number == page.offset.saturating_add(1) {
                    let _ = write!(out, " (line {} from byte {})", first.number, page.byte);
                }
                out.push_str(&stopped());
                more(&mut out);
                match (page.next_offset, resume(page, last)) {
                    (Some(_), _) => {}
                    (None, Some(at)) => {
                        let _ = write!(
                            out,
                            "; more follows in line {}: call again with {at}",
                            last.number
                        );
                    }
                    (None, None) => {
                        out.push_str("; end of result");
                        if page.ends_without_newline {
                            out.push_str(" (no line break after its last line)");
                        }
                    }
                }
            } else {
                let total = page.total_lines.unwrap_or(page.offset);
                let _ = write!(
                    out,
                    "no lines at offset {}: the result has {}, at offsets 0 to {}; end of result",
                    page.offset,
                    plural(total, "line", "lines"),
                    total.saturating_sub(1)
                );
            }
        }
        Some(needle) => {
            let _ = write!(out, "grep {needle:?} from offset {}", page.offset);
            if page.byte > 0 {
                let _ = write!(out, " byte {}", page.byte);
            }
            out.push_str(": ");
            if past_end {
                let total = page.total_lines.unwrap_or(page.offset);
                let _ = write!(
                    out,
                    "no lines at that offset (the result has {}); no matches",
                    plural(total, "line", "lines")
                );
            } else if page.lines.is_empty() {
                out.push_str("no matching lines");
                out.push_str(&stopped());
                more(&mut out);
            } else {
                out.push_str(&plural(
                    page.lines.len() as u64,
                    "matching line",
                    "matching lines",
                ));
                out.push_str(&stopped());
                more(&mut out);
                let last = page
                    .lines
                    .last()
                    .and_then(|line| Some((line.number, resume(page, line)?)));
                match (page.next_offset, last) {
                    (Some(_), Some((n, at))) => {
                        let _ = write!(
                            out,
                            "; line {n} is cut, and more of it may match: {at} searches on in it"
                        );
                    }
                    (Some(_), None) => {}
                    // The rest of a cut last line was not searched.
                    (None, Some((n, at))) => {
                        let _ = write!(
                            out,
                            "; no more matching lines after line {n}, which is cut: more of it \
                             may match: call again with {at}"
                        );
                    }
                    (None, None) => out.push_str("; no more matches"),
                }
            }
        }
    }
    out
}

/// Where reading on from a cut line starts, as the model passes it: `offset=N byte=B`.
struct ReadOn {
    offset: u64,
    byte: u64,
}

impl std::fmt::Display for ReadOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "offset={} byte={}", self.offset, self.byte)
    }
}

/// Where to read on from `line` of `page`, when it is cut after the part shown.
fn resume(page: &Page, line: &Line) -> Option<ReadOn> {
    page.read_on(line).map(|byte| ReadOn {
        offset: line.number - 1,
        byte,
    })
}

/// Appends content bytes: as they are when the page is all UTF-8, else with invalid bytes
/// written `\xNN` and backslashes doubled, so the text decodes back to the exact bytes.
fn push_content(out: &mut String, bytes: &[u8], escaped: bool) {
    for chunk in bytes.utf8_chunks() {
        if escaped {
            for c in chunk.valid().chars() {
                if c == '\\' {
                    out.push_str("\\\\");
                } else {
                    out.push(c);
                }
            }
            for byte in chunk.invalid() {
                let _ = write!(out, "\\x{byte:02X}");
            }
        } else {
            out.push_str(chunk.valid());
        }
    }
}
