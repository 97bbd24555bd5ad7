//! Streamed appends: a tool result whose text blocks are partly in spill files
//! ([`psych_types::SpilledText`], named by `ToolOutput::spilled`) is stored exactly as the
//! same result with those texts in memory would be (`docs/format.md`, "Streamed
//! appends"), reading each file in chunks of [`CHUNK`] bytes, twice: once as the record
//! is encoded (UTF-8, line breaks and line index, token estimate: what the metadata,
//! written before the content, holds) and once as its frame is written (the content and
//! its checksum). Neither pass holds more than a chunk of a spilled text.

use std::borrow::Cow;
use std::sync::Arc;

use psych_types::{SpilledText, TokenEstimator, ToolOutput};

use crate::error::{AppendError, SpillError};
use crate::format::LineIndexer;

/// Bytes of a spilled text read at a time (and the most of it held in memory).
pub(crate) const CHUNK: usize = 1 << 20;

/// Why writing a streamed frame stopped.
#[derive(Debug)]
pub(crate) enum StreamFailure {
    /// A spilled text could not be read whole as the UTF-8 it was when encoded.
    Spill {
        /// The block whose text it is.
        block: usize,
        /// The text's length.
        len: u64,
        /// What went wrong.
        cause: SpillError,
    },
    /// Writing to the log failed.
    Write(std::io::Error),
}

impl StreamFailure {
    /// The append's error for the spill, `None` for a failed write.
    pub(crate) fn into_append_error(self) -> Result<AppendError, std::io::Error> {
        match self {
            StreamFailure::Spill { block, len, cause } => {
                Ok(AppendError::Spill { block, len, cause })
            }
            StreamFailure::Write(err) => Err(err),
        }
    }
}

/// One spilled text within a readable text.
#[derive(Debug, Clone)]
struct Spill {
    /// Where it goes in the in-memory bytes: before byte `at` of them.
    at: usize,
    /// The block whose text it is.
    block: usize,
    text: Arc<SpilledText>,
    /// Its line breaks, counted when the record was encoded: the write checks the file
    /// still holds as many.
    breaks: u64,
}

/// A tool result's readable text, partly in spill files: the in-memory bytes (the
/// readable text with each spilled block's placeholder cut out) and the spilled texts that
/// go between them.
#[derive(Debug, Clone)]
pub(crate) struct Readable<'a> {
    memory: Cow<'a, [u8]>,
    spills: Vec<Spill>,
}

/// A piece of a readable text, in order.
enum Piece<'s> {
    Memory(&'s [u8]),
    Spilled(&'s Spill),
}

impl<'a> Readable<'a> {
    /// The readable text of `output` given its in-memory form (`readable`, `spans`: what
    /// `readable_text_spans` gives, each spilled block showing its placeholder): the
    /// placeholders cut out, and `spans` made the spans of the whole text (each spilled
    /// block's its text's). Checks that `output.spilled` names text blocks, in order,
    /// each once.
    pub(crate) fn of(
        output: &ToolOutput,
        readable: Cow<'a, str>,
        spans: &mut [Option<std::ops::Range<usize>>],
    ) -> Result<Self, AppendError> {
        let spills: Vec<_> = output
            .spill_places(spans)
            .map_err(|refused| AppendError::Spill {
                block: refused.block,
                len: refused.text.len(),
                cause: SpillError::NotATextBlock,
            })?
            .into_iter()
            .map(|(spilled, span)| (spilled.block, span, Arc::clone(&spilled.text)))
            .collect();
        if spills.is_empty() {
            return Ok(Self {
                memory: bytes_of(readable),
                spills: Vec::new(),
            });
        }
        let bytes = readable.as_bytes();
        let mut memory = Vec::with_capacity(bytes.len());
        let mut from = 0;
        let mut out = Vec::with_capacity(spills.len());
        for (block, span, text) in spills {
            memory.extend_from_slice(&bytes[from..span.start]);
            from = span.end;
            out.push(Spill {
                at: memory.len(),
                block,
                text,
                breaks: 0,
            });
        }
        memory.extend_from_slice(&bytes[from..]);
        // The spans of the whole text: each shifted by what the spilled texts before it
        // add over their placeholders.
        let mut shift: i128 = 0;
        let mut next = out.iter().peekable();
        for (block, span) in spans.iter_mut().enumerate() {
            let Some(span) = span else { continue };
            let start = (span.start as i128 + shift) as usize;
            let mut len = span.len();
            if let Some(spill) = next.next_if(|spill| spill.block == block) {
                let text_len = usize::try_from(spill.text.len()).unwrap_or(usize::MAX);
                shift += text_len as i128 - len as i128;
                len = text_len;
            }
            *span = start..start.saturating_add(len);
        }
        Ok(Self {
            memory: Cow::Owned(memory),
            spills: out,
        })
    }

    /// Whether some of it is in spill files.
    pub(crate) fn is_spilled(&self) -> bool {
        !self.spills.is_empty()
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.memory.len() as u64 + self.spills.iter().map(|s| s.text.len()).sum::<u64>()
    }

    /// The in-memory bytes: the whole text when nothing is spilled.
    pub(crate) fn memory(&self) -> &[u8] {
        &self.memory
    }

    /// The in-memory bytes, taken: the whole text when nothing is spilled.
    pub(crate) fn into_memory(self) -> Cow<'a, [u8]> {
        self.memory
    }

    /// The text with nothing borrowed.
    pub(crate) fn into_owned(self) -> Readable<'static> {
        Readable {
            memory: Cow::Owned(self.memory.into_owned()),
            spills: self.spills,
        }
    }

    fn pieces(&self) -> impl Iterator<Item = Piece<'_>> {
        let mut from = 0;
        let mut out = Vec::with_capacity(2 * self.spills.len() + 1);
        for spill in &self.spills {
            out.push(Piece::Memory(&self.memory[from..spill.at]));
            out.push(Piece::Spilled(spill));
            from = spill.at;
        }
        out.push(Piece::Memory(&self.memory[from..]));
        out.into_iter()
    }

    /// The first pass over a spilled text: checks each spilled text is `len` bytes of
    /// UTF-8, counts its line breaks and builds its line index into `lines`, and, given
    /// an estimator, sums [`TokenEstimator::estimate_text`] over the in-memory pieces and
    /// the chunks of each spilled text (cut at a `\n`, or whitespace, near the chunk's
    /// end where there is one; always at a char boundary). Blocks: reads every spill file
    /// through, in chunks.
    pub(crate) fn scan(
        &mut self,
        lines: &mut LineIndexer,
        estimator: Option<&dyn TokenEstimator>,
    ) -> Result<u64, AppendError> {
        let mut estimate = 0u64;
        let mut buf = Vec::new();
        let mut counts = Vec::with_capacity(self.spills.len());
        for piece in self.pieces() {
            match piece {
                Piece::Memory(bytes) => {
                    lines.feed(bytes);
                    if let Some(estimator) = estimator.filter(|_| !bytes.is_empty()) {
                        // In-memory pieces are whole segments of the readable text.
                        let text = String::from_utf8_lossy(bytes);
                        estimate = estimate.saturating_add(estimator.estimate_text(&text));
                    }
                }
                Piece::Spilled(spill) => {
                    let before = lines.line_breaks();
                    for_each_chunk(spill, &mut buf, CHUNK, |chunk| {
                        lines.feed(chunk.as_bytes());
                        if let Some(estimator) = estimator {
                            estimate = estimate.saturating_add(estimator.estimate_text(chunk));
                        }
                        Ok(())
                    })
                    .map_err(|failure| match failure.into_append_error() {
                        Ok(err) => err,
                        // The closure writes nothing.
                        Err(source) => AppendError::Spill {
                            block: spill.block,
                            len: spill.text.len(),
                            cause: SpillError::Read { offset: 0, source },
                        },
                    })?;
                    counts.push(lines.line_breaks() - before);
                }
            }
        }
        for (spill, breaks) in self.spills.iter_mut().zip(counts) {
            spill.breaks = breaks;
        }
        Ok(estimate)
    }

    /// The second pass: gives `sink` the text's bytes in order, the spilled texts read in
    /// chunks into `buf`, each checked to hold the line breaks the first pass counted.
    pub(crate) fn emit(
        &self,
        buf: &mut Vec<u8>,
        sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<(), StreamFailure> {
        for piece in self.pieces() {
            match piece {
                Piece::Memory(bytes) => sink(bytes).map_err(StreamFailure::Write)?,
                Piece::Spilled(spill) => {
                    let mut breaks = 0;
                    for_each_chunk(spill, buf, CHUNK, |chunk| {
                        breaks += psych_types::count_line_breaks(chunk.as_bytes());
                        sink(chunk.as_bytes()).map_err(StreamFailure::Write)
                    })?;
                    if breaks != spill.breaks {
                        return Err(StreamFailure::Spill {
                            block: spill.block,
                            len: spill.text.len(),
                            cause: SpillError::Changed,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

fn bytes_of(text: Cow<'_, str>) -> Cow<'_, [u8]> {
    match text {
        Cow::Borrowed(text) => Cow::Borrowed(text.as_bytes()),
        Cow::Owned(text) => Cow::Owned(text.into_bytes()),
    }
}

/// Reads `spill`'s text whole, in chunks of at most `chunk` bytes (at least 4: a char's
/// longest encoding) read into `buf`, each
/// checked to be UTF-8 and cut at a char boundary ([`cut_point`]), and gives each to
/// `each` in order. Blocks (positional reads).
fn for_each_chunk(
    spill: &Spill,
    buf: &mut Vec<u8>,
    chunk: usize,
    mut each: impl FnMut(&str) -> Result<(), StreamFailure>,
) -> Result<(), StreamFailure> {
    let text = &spill.text;
    let len = text.len();
    let fail = |cause| StreamFailure::Spill {
        block: spill.block,
        len,
        cause,
    };
    buf.resize(chunk, 0);
    // `buf[..carry]` is the end of the previous chunk, carried over; it starts at `offset`.
    let (mut carry, mut offset) = (0usize, 0u64);
    loop {
        let mut filled = carry;
        while filled < buf.len() && offset + (filled as u64) < len {
            let at = offset + filled as u64;
            let n = text
                .read_at(at, &mut buf[filled..])
                .map_err(|source| fail(SpillError::Read { offset: at, source }))?;
            if n == 0 {
                return Err(fail(SpillError::Short { at }));
            }
            filled += n;
        }
        if filled == 0 {
            return Ok(());
        }
        let at_end = offset + filled as u64 == len;
        let valid = match std::str::from_utf8(&buf[..filled]) {
            Ok(valid) => valid,
            // A char cut by the chunk's end: carried over to the next chunk.
            Err(err) if err.error_len().is_none() && !at_end => {
                std::str::from_utf8(&buf[..err.valid_up_to()]).map_err(|_| {
                    fail(SpillError::NotUtf8 {
                        at: offset + err.valid_up_to() as u64,
                    })
                })?
            }
            Err(err) => {
                return Err(fail(SpillError::NotUtf8 {
                    at: offset + err.valid_up_to() as u64,
                }));
            }
        };
        let cut = if at_end {
            valid.len()
        } else {
            cut_point(valid)
        };
        if cut == 0 {
            // Not even one char in a whole chunk: not UTF-8 (a char is at most 4 bytes).
            return Err(fail(SpillError::NotUtf8 { at: offset }));
        }
        each(&valid[..cut])?;
        buf.copy_within(cut..filled, 0);
        carry = filled - cut;
        offset += cut as u64;
        if at_end && carry == 0 {
            return Ok(());
        }
    }
}

/// Where to end a chunk of `text` (not the text's last): after its last `\n` in its last
/// quarter, else after its last ASCII space or tab there, else at its end (a char
/// boundary), so that a text's estimate, summed over chunks, splits it where a
/// tokenizer would split anyway.
fn cut_point(text: &str) -> usize {
    let bytes = text.as_bytes();
    let window = bytes.len() - bytes.len() / 4;
    if let Some(at) = memchr::memrchr(b'\n', &bytes[window..]) {
        return window + at + 1;
    }
    if let Some(at) = memchr::memrchr2(b' ', b'\t', &bytes[window..]) {
        return window + at + 1;
    }
    bytes.len()
}

/// A tool result's content when part of its readable text is spilled: written in order,
/// the readable text's length (content kind 3), the readable text, the binary blocks.
#[derive(Debug, Clone)]
pub(crate) struct Streamed<'a> {
    /// The readable text's length, before it (content kind 3 only).
    pub(crate) prefix: Option<[u8; 8]>,
    pub(crate) readable: Readable<'a>,
    pub(crate) binary: Vec<Cow<'a, [u8]>>,
}

impl Streamed<'_> {
    /// The content's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.prefix.map_or(0, |p| p.len() as u64)
            + self.readable.len()
            + self.binary.iter().map(|b| b.len() as u64).sum::<u64>()
    }

    /// The content with nothing borrowed (for a frame queued for a group).
    pub(crate) fn into_owned(self) -> Streamed<'static> {
        Streamed {
            prefix: self.prefix,
            readable: self.readable.into_owned(),
            binary: self
                .binary
                .into_iter()
                .map(|b| Cow::Owned(b.into_owned()))
                .collect(),
        }
    }

    /// Gives `sink` the content's bytes in order (see [`Readable::emit`]).
    pub(crate) fn emit(
        &self,
        buf: &mut Vec<u8>,
        sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> Result<(), StreamFailure> {
        if let Some(prefix) = &self.prefix {
            sink(prefix).map_err(StreamFailure::Write)?;
        }
        self.readable.emit(buf, sink)?;
        for data in &self.binary {
            sink(data).map_err(StreamFailure::Write)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn spill(bytes: &[u8], len: u64) -> Spill {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        file.write_all(b"past the text").unwrap();
        Spill {
            at: 0,
            block: 3,
            text: Arc::new(SpilledText::new(file, len)),
            breaks: 0,
        }
    }

    fn chunks(spill: &Spill, chunk: usize) -> Result<Vec<String>, SpillError> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        for_each_chunk(spill, &mut buf, chunk, |piece| {
            out.push(piece.to_owned());
            Ok(())
        })
        .map(|()| out)
        .map_err(|failure| match failure {
            StreamFailure::Spill {
                block: 3, cause, ..
            } => cause,
            other => panic!("{other:?}"),
        })
    }

    #[test]
    fn chunks_are_whole_chars_and_make_up_the_text() {
        let text = "é\nà la ligne 🎉 deux\n€€€ fin";
        for chunk in [4, 5, 7, 8, 13, 64] {
            let pieces = chunks(&spill(text.as_bytes(), text.len() as u64), chunk).unwrap();
            assert_eq!(pieces.concat(), text, "{chunk}");
            assert!(pieces.iter().all(|p| !p.is_empty() && p.len() <= chunk));
        }
        assert_eq!(chunks(&spill(b"", 0), 8).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_short_or_broken_text_is_named() {
        let text = "abcdefgh\nijklmnop";
        let short = chunks(&spill(text.as_bytes(), 100), 8).unwrap_err();
        assert!(
            matches!(short, SpillError::Short { at } if at == text.len() as u64 + 13),
            "{short:?}"
        );
        // A broken char at a chunk's edge, and one cut off by the text's end.
        let mut bytes = b"abcdefg".to_vec();
        bytes.extend_from_slice(&[0xE2, 0x82, b'x']);
        let err = chunks(&spill(&bytes, bytes.len() as u64), 8).unwrap_err();
        assert!(matches!(err, SpillError::NotUtf8 { at: 7 }), "{err:?}");
        let err = chunks(&spill(&bytes, 9), 8).unwrap_err();
        assert!(matches!(err, SpillError::NotUtf8 { at: 7 }), "{err:?}");
    }

    #[test]
    fn chunks_end_at_a_line_break_or_a_space_near_their_end() {
        let text = format!("{}\n{}", "a".repeat(900), "b".repeat(99));
        assert_eq!(cut_point(&text), 901);
        let text = format!("{} {}", "a".repeat(900), "b".repeat(99));
        assert_eq!(cut_point(&text), 901);
        // Too far back: the chunk's end.
        let text = format!("{}\n{}", "a".repeat(10), "b".repeat(990));
        assert_eq!(cut_point(&text), text.len());
    }
}
