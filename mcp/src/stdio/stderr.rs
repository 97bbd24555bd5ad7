//! A stdio server's stderr, read in bounded memory whatever it writes: a `\r` progress bar
//! redrawn for hours, or a gigabyte without a line break, costs [`READ_BUFFER`] plus one
//! line preview ([`LINE_PREVIEW`] bytes and a character's tail) plus the kept tail of lines
//! ([`Diagnostics`](super::Diagnostics): at most `STDERR_LINES` lines and `STDERR_BYTES`
//! bytes). A line ends at `\n` or `\r` (`\r\n` is one end), and says which ([`End`]): a
//! line ended by a bare `\r` is a frame a terminal draws over with the next line, and the
//! tail keeps it so (a progress bar is one line there, not twenty that push out the line
//! that said why the server stopped). Of a longer line the first [`LINE_PREVIEW`] bytes are
//! kept and the rest is skipped unread into memory.

use std::pin::pin;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use super::LINE_PREVIEW;

/// The bytes read from stderr at a time.
pub(crate) const READ_BUFFER: usize = 8 * 1024;
/// Room past [`LINE_PREVIEW`] so that a character cut at the preview's end is whole.
const CHAR_TAIL: usize = 4;

/// How a line ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// At `\n` (or `\r\n`).
    Newline,
    /// At a `\r` not followed by `\n`: a frame that a terminal draws over with the next
    /// line (a progress bar).
    Return,
    /// At the end of the output, without a line break.
    Eof,
}

/// The line being read: its first bytes only.
#[derive(Debug)]
pub(crate) struct LinePreview {
    kept: Vec<u8>,
    cut: bool,
    /// The line in `kept` ended at a `\r`; it is passed on once the next byte says whether
    /// that was a `\r\n` ([`End::Newline`]) or a bare `\r` ([`End::Return`]).
    after_cr: bool,
}

impl Default for LinePreview {
    fn default() -> Self {
        Self {
            kept: Vec::with_capacity(LINE_PREVIEW + CHAR_TAIL),
            cut: false,
            after_cr: false,
        }
    }
}

impl LinePreview {
    /// Reads `bytes`, calling `line` with the preview of each line that ends in them,
    /// whether the line was longer than its preview, and how it ended. A line ended by `\r`
    /// is passed on when the byte after it is read (or at [`LinePreview::finish`]).
    pub(crate) fn feed(&mut self, mut bytes: &[u8], mut line: impl FnMut(&[u8], bool, End)) {
        while !bytes.is_empty() {
            if std::mem::take(&mut self.after_cr) {
                let end = if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    End::Newline
                } else {
                    End::Return
                };
                self.pass(end, &mut line);
                continue;
            }
            match memchr::memchr2(b'\n', b'\r', bytes) {
                Some(i) => {
                    self.keep(&bytes[..i]);
                    if bytes[i] == b'\r' {
                        self.after_cr = true;
                    } else {
                        self.pass(End::Newline, &mut line);
                    }
                    bytes = &bytes[i + 1..];
                }
                None => {
                    self.keep(bytes);
                    bytes = &[];
                }
            }
        }
    }

    /// At the end of the output: the last line, if it had no line break (or ended by a
    /// `\r`).
    pub(crate) fn finish(&mut self, mut line: impl FnMut(&[u8], bool, End)) {
        if std::mem::take(&mut self.after_cr) {
            self.pass(End::Return, &mut line);
        } else if !self.kept.is_empty() || self.cut {
            self.pass(End::Eof, &mut line);
        }
    }

    fn pass(&mut self, end: End, line: &mut impl FnMut(&[u8], bool, End)) {
        line(&self.kept, self.cut, end);
        self.kept.clear();
        self.cut = false;
    }

    fn keep(&mut self, part: &[u8]) {
        let room = LINE_PREVIEW + CHAR_TAIL - self.kept.len();
        if part.len() > room {
            self.kept.extend_from_slice(&part[..room]);
            self.cut = true;
        } else {
            self.kept.extend_from_slice(part);
        }
    }

    /// The memory held for the line being read.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.kept.capacity()
    }
}

/// Reads `reader` to its end, passing each line's preview to `line` (and whether the line
/// was cut, and how it ended). Once `exited` resolves (the process has exited), a read that waits longer than
/// `quiet` ends the reading too: a descendant may hold the pipe open forever.
pub(crate) async fn read_lines<R: AsyncRead + Unpin>(
    mut reader: R,
    exited: impl Future<Output = ()>,
    quiet: Duration,
    mut line: impl FnMut(&[u8], bool, End),
) {
    let mut buffer = vec![0u8; READ_BUFFER];
    let mut preview = LinePreview::default();
    let mut exited = pin!(exited);
    let mut gone = false;
    loop {
        let read = if gone {
            match tokio::time::timeout(quiet, reader.read(&mut buffer)).await {
                Ok(read) => read,
                Err(_) => break,
            }
        } else {
            tokio::select! {
                biased;
                read = reader.read(&mut buffer) => read,
                () = &mut exited => {
                    gone = true;
                    continue;
                }
            }
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(n) => preview.feed(&buffer[..n], &mut line),
        }
    }
    preview.finish(&mut line);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a reader of `input` keeps, line by line (`…` marks a cut line).
    async fn lines(input: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        read_lines(
            input,
            std::future::pending(),
            Duration::ZERO,
            |line, cut, end| {
                let mut text = String::from_utf8_lossy(line).into_owned();
                if cut {
                    text.push('…');
                }
                if end == End::Return {
                    text.push('⏎');
                }
                out.push(text);
            },
        )
        .await;
        out
    }

    #[tokio::test]
    async fn carriage_returns_end_lines_and_crlf_is_one_end() {
        assert_eq!(
            lines(b"a\r\nb\n10%\r20%\r\rdone\r").await,
            ["a", "b", "10%⏎", "20%⏎", "⏎", "done⏎"]
        );
        // A `\r\n` split between two reads is still one end.
        let mut preview = LinePreview::default();
        let mut seen = Vec::new();
        for part in [&b"50%\r"[..], b"\n", b"60%\r", b"x\n"] {
            preview.feed(part, |line, _, end| seen.push((line.to_vec(), end)));
        }
        preview.finish(|line, _, end| seen.push((line.to_vec(), end)));
        assert_eq!(
            seen,
            [
                (b"50%".to_vec(), End::Newline),
                (b"60%".to_vec(), End::Return),
                (b"x".to_vec(), End::Newline)
            ]
        );
    }

    #[tokio::test]
    async fn a_line_larger_than_every_bound_is_kept_as_a_preview_in_bounded_memory() {
        // Over 100 times everything stderr may hold, without a line break.
        let flood = vec![b'#'; 4 * 1024 * 1024];
        let mut preview = LinePreview::default();
        let start = preview.capacity();
        assert_eq!(start, LINE_PREVIEW + CHAR_TAIL);
        let mut seen = Vec::new();
        for chunk in flood.chunks(READ_BUFFER) {
            preview.feed(chunk, |line, cut, _| seen.push((line.len(), cut)));
            assert_eq!(preview.capacity(), start, "the preview grew");
        }
        preview.feed(b"\nnext", |line, cut, _| seen.push((line.len(), cut)));
        preview.finish(|line, cut, _| seen.push((line.len(), cut)));
        assert_eq!(seen, [(LINE_PREVIEW + CHAR_TAIL, true), (4, false)]);
        let read = lines(&flood).await;
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].len(), LINE_PREVIEW + CHAR_TAIL + '…'.len_utf8());
    }
}
