//! Lines of a server's stdout, read so that a read dropped at any await loses nothing.
//!
//! rmcp drives a transport's `receive` inside its `tokio::select!` loop and drops it
//! whenever another branch is ready first (a request to send, a send finishing). So
//! [`LineReader::next`] keeps every byte it has taken from its buffered reader in `self`
//! until a whole line is returned: the only await is `fill_buf`, which takes nothing when it
//! is dropped, and what follows it (copying into the line, `consume`) runs without an
//! await in between. A dropped `next` is resumed by the next call where it stopped.
//!
//! A line over the limit is not kept: its bytes are counted and passed through an
//! [`IdScanner`] as they go by (the part read before the limit was reached first), and the
//! line is reported as [`Line::TooLong`] with the `id` it carried. That is the place where
//! a spill of oversized answers to a file would hook in: it sees the same chunks, in order.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use super::scan::IdScanner;

/// The read buffer: a pipe's default capacity, so one read takes what a writer can queue.
const READ_BUFFER: usize = 64 * 1024;

/// One line of output.
#[derive(Debug)]
pub(crate) enum Line {
    /// A whole line, without its `\n`.
    Whole(Vec<u8>),
    /// A line over the limit, read past and not kept.
    TooLong(Overflow),
}

/// What is known of a line over the limit.
#[derive(Debug)]
pub(crate) struct Overflow {
    /// The line's length in bytes, without its `\n`.
    pub(crate) bytes: u64,
    /// The line's top-level `id` (JSON text), if it had one.
    pub(crate) id: Option<String>,
    /// Whether the line had a top-level `method` (a request or notification, not an
    /// answer).
    pub(crate) has_method: bool,
}

/// Reads lines of at most `limit` bytes from `R`, cancel-safely (see the module docs).
pub(crate) struct LineReader<R> {
    reader: BufReader<R>,
    limit: usize,
    /// The line read so far (empty while it is over the limit).
    line: Vec<u8>,
    /// While the current line is over the limit: its scanner and its length so far.
    overflow: Option<(IdScanner, u64)>,
    /// Bytes consumed from the reader in all.
    consumed: u64,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// A reader of lines of at most `limit` bytes.
    pub(crate) fn new(reader: R, limit: usize) -> Self {
        Self {
            reader: BufReader::with_capacity(READ_BUFFER, reader),
            limit,
            line: Vec::new(),
            overflow: None,
            consumed: 0,
        }
    }

    /// How many bytes have been taken from the reader so far (whole lines or not).
    pub(crate) fn consumed(&self) -> u64 {
        self.consumed
    }

    /// The next line; `None` at the end of the output (a last line without `\n` is still
    /// returned).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropped before it returns, it loses nothing, and the next call goes on
    /// with the same line.
    pub(crate) async fn next(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let available = self.reader.fill_buf().await?;
            // From here to the end of the iteration there is no await.
            if available.is_empty() {
                if self.overflow.is_some() {
                    return Ok(Some(self.end_overflow()));
                }
                if self.line.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(Line::Whole(std::mem::take(&mut self.line))));
            }
            let (chunk, used, end) = match memchr::memchr(b'\n', available) {
                Some(i) => (&available[..i], i + 1, true),
                None => (available, available.len(), false),
            };
            match &mut self.overflow {
                Some((scanner, bytes)) => {
                    scanner.feed(chunk);
                    *bytes += chunk.len() as u64;
                }
                None if self.line.len() + chunk.len() <= self.limit => {
                    self.line.extend_from_slice(chunk);
                }
                None => {
                    let mut scanner = IdScanner::default();
                    scanner.feed(&self.line);
                    scanner.feed(chunk);
                    let bytes = (self.line.len() + chunk.len()) as u64;
                    // Given back now: an oversized line holds no memory past this point.
                    self.line = Vec::new();
                    self.overflow = Some((scanner, bytes));
                }
            }
            self.reader.consume(used);
            self.consumed += used as u64;
            if end {
                if self.overflow.is_some() {
                    return Ok(Some(self.end_overflow()));
                }
                return Ok(Some(Line::Whole(std::mem::take(&mut self.line))));
            }
        }
    }

    fn end_overflow(&mut self) -> Line {
        let (scanner, bytes) = self.overflow.take().unwrap_or_default();
        Line::TooLong(Overflow {
            bytes,
            id: scanner.id(),
            has_method: scanner.has_method(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use std::pin::pin;

    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::stdio::testing::{Rng, poll_up_to};

    /// Line `i` of length `len`: an id that says which line it is, then filler, in a
    /// top-level object when it is long enough, so that over the limit its id is found.
    fn line(i: u64, len: usize, id_last: bool) -> Vec<u8> {
        let head = if id_last {
            br#"{"result":""#.to_vec()
        } else {
            format!(r#"{{"jsonrpc":"2.0","id":{i},"result":""#).into_bytes()
        };
        let tail = if id_last {
            format!(r#"","jsonrpc":"2.0","id":{i}}}"#).into_bytes()
        } else {
            br#""}"#.to_vec()
        };
        if len < head.len() + tail.len() {
            let text = format!("{i:x}").into_bytes();
            return text.iter().copied().cycle().take(len).collect();
        }
        let mut out = head;
        out.resize(len - tail.len(), b'a' + (i % 26) as u8);
        out.extend_from_slice(&tail);
        out
    }

    /// A writer sends lines of 1 B to 8 MiB in chunks of random sizes through a pipe, while
    /// the reader's `next` futures are dropped after a random number of polls; every line
    /// must arrive whole and in order, and every line over the limit must be reported with
    /// its length and id.
    async fn lines_survive_dropped_reads(seed: u64) {
        const MAX: u64 = 8 * 1024 * 1024;
        const LIMIT: usize = 6 * 1024 * 1024;
        let mut rng = Rng(seed);
        let count = 48 + rng.below(32);
        let mut sizes: Vec<(usize, bool)> = (0..count)
            .map(|_| (rng.size(MAX) as usize, rng.below(2) == 0))
            .collect();
        // The extremes, whatever the seed drew.
        sizes[0].0 = 1;
        sizes[1].0 = MAX as usize;
        sizes[2].0 = LIMIT + 1;
        sizes[3].0 = LIMIT;
        let (mut writer, reader) = tokio::io::duplex(64 * 1024);
        let written = sizes.clone();
        let writer_seed = rng.next() | 1;
        let writing = tokio::spawn(async move {
            let mut rng = Rng(writer_seed);
            for (i, &(len, id_last)) in written.iter().enumerate() {
                let mut bytes = line(i as u64, len, id_last);
                bytes.push(b'\n');
                let mut rest = bytes.as_slice();
                while !rest.is_empty() {
                    let take = (rng.size(256 * 1024) as usize).min(rest.len());
                    writer.write_all(&rest[..take]).await.unwrap();
                    rest = &rest[take..];
                    if rng.below(4) == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }
        });
        let mut lines = LineReader::new(reader, LIMIT);
        let mut dropped = 0u64;
        for (i, &(len, id_last)) in sizes.iter().enumerate() {
            let got = loop {
                let polls = rng.below(6);
                let mut next = pin!(lines.next());
                match poll_up_to(&mut next, polls).await {
                    Some(line) => break line.unwrap().expect("a line"),
                    None => dropped += 1,
                }
            };
            let want = line(i as u64, len, id_last);
            match got {
                Line::Whole(bytes) => {
                    assert!(len <= LIMIT, "seed {seed}: line {i} of {len} B kept");
                    assert!(
                        bytes == want,
                        "seed {seed}: line {i} of {len} B came as {} B",
                        bytes.len()
                    );
                }
                Line::TooLong(over) => {
                    assert!(len > LIMIT, "seed {seed}: line {i} of {len} B too long");
                    assert_eq!(over.bytes, len as u64, "seed {seed}: line {i}");
                    assert_eq!(over.id, Some(i.to_string()), "seed {seed}: line {i}");
                }
            }
        }
        assert!(lines.next().await.unwrap().is_none(), "seed {seed}");
        writing.await.unwrap();
        assert!(
            dropped > 100,
            "seed {seed}: only {dropped} reads were dropped"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lines_arrive_whole_and_in_order_when_reads_are_dropped() {
        for seed in [0x9E37_79B9_7F4A_7C15, 7, 1_000_003, 0xDEAD_BEEF] {
            lines_survive_dropped_reads(seed).await;
        }
    }

    #[tokio::test]
    async fn a_last_line_without_a_newline_is_returned_and_ids_are_found_over_the_limit() {
        let input: &[u8] =
            b"{\"id\":3,\"result\":\"0123456789\"}\nshort\n{\"result\":\"0123456789\",\"id\":\"x\"}";
        let mut lines = LineReader::new(input, 16);
        let Some(Line::TooLong(first)) = lines.next().await.unwrap() else {
            panic!("not too long");
        };
        assert_eq!((first.bytes, first.id.as_deref()), (30, Some("3")));
        let Some(Line::Whole(short)) = lines.next().await.unwrap() else {
            panic!("not whole");
        };
        assert_eq!(short, b"short");
        let Some(Line::TooLong(last)) = lines.next().await.unwrap() else {
            panic!("not too long");
        };
        assert_eq!(last.id.as_deref(), Some("\"x\""));
        assert!(lines.next().await.unwrap().is_none());
        assert_eq!(lines.consumed(), input.len() as u64);
    }
}
