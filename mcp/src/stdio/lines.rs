//! Lines of a server's stdout, read so that a read dropped at any await loses nothing.
//!
//! rmcp drives a transport's `receive` inside its `tokio::select!` loop and drops it
//! whenever another branch is ready first (a request to send, a send finishing). So
//! [`LineReader::next`] keeps every byte it has taken from its buffered reader in `self`
//! until a whole line is returned: the only await is `fill_buf`, which takes nothing when it
//! is dropped, and what follows it (copying into the line, `consume`) runs without an
//! await in between. A dropped `next` is resumed by the next call where it stopped.
//!
//! A line over the in-memory limit is, when spilling is on ([`LineReader::spilling`]),
//! written to an unnamed file as it is read, in chunks of [`WRITE_BUFFER`] written on a
//! blocking thread whose handle is kept in `self` (so the other await of `next` is that
//! handle, which a dropped `next` leaves in place), and reported as [`Line::Spilled`].
//! Memory for such a line: the limit while it grows in memory, then at most two chunks
//! (one filling, one being written) and the read buffer, about 2 MiB. Past the spill's
//! own cap, or without spilling, a line is not kept: its bytes are counted and passed
//! through an [`IdScanner`] as they go by (the part read before the limit was reached
//! first), and the line is reported as [`Line::TooLong`] with the `id` it carried. So is a
//! spilling line whose next bytes the [`SpillBudget`](crate::SpillBudget) refuses: each
//! chunk is reserved before it is handed to a write, and the file, with what it held of
//! the budget, goes as soon as the line is read past.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::task::JoinHandle;

use super::scan::IdScanner;
use crate::budget::{OverBudget, Reservation, SpillBudget};
use crate::spill::WRITE_BUFFER;
use crate::tap::TransferClock;

/// The read buffer: a pipe's default capacity, so one read takes what a writer can queue.
const READ_BUFFER: usize = 64 * 1024;

/// One line of output.
#[derive(Debug)]
pub(crate) enum Line {
    /// A whole line, without its `\n`.
    Whole(Vec<u8>),
    /// A line over the limit, read past and not kept.
    TooLong(Overflow),
    /// A line over the limit, kept in a file.
    Spilled(SpilledLine),
}

/// A line written to a file as it was read (see [`Line::Spilled`]).
#[derive(Debug)]
pub(crate) struct SpilledLine {
    spill: Spill,
}

impl SpilledLine {
    /// The line's length in bytes, without its `\n`.
    pub(crate) fn bytes(&self) -> u64 {
        self.spill.held.bytes()
    }

    /// The line's top-level `id` (JSON text), if it had one.
    pub(crate) fn id(&self) -> Option<String> {
        self.spill.scanner.id()
    }

    /// Whether the line had a top-level `method`.
    pub(crate) fn has_method(&self) -> bool {
        self.spill.scanner.has_method()
    }

    /// The file holding the whole line from offset 0, once its last chunk is written
    /// (awaits the write in flight, then writes the last chunk on a blocking thread), and
    /// the share of the budget it holds (the line's bytes), to drop with it. Dropped midway,
    /// the write in flight stays in the line, whose drop keeps the budget's bytes until the
    /// write has closed the file.
    pub(crate) async fn finish(mut self) -> std::io::Result<(File, Reservation)> {
        self.spill.flush().await?;
        let file = if let Some(writing) = self.spill.writing.as_mut() {
            let written = writing.await;
            self.spill.writing = None;
            written.map_err(std::io::Error::other)??.0
        } else {
            match self.spill.file.take() {
                Some(file) => file,
                None => return Err(std::io::Error::other("the spilled line has no file")),
            }
        };
        Ok((file, self.spill.held.take_all()))
    }
}

/// Spilling on: where the files go, the longest line kept in one, and what all the files
/// may hold.
#[derive(Debug, Clone)]
pub(crate) struct SpillTo {
    pub(crate) dir: PathBuf,
    pub(crate) max: u64,
    pub(crate) budget: SpillBudget,
}

/// A chunk written, with its file and its buffer (cleared) given back.
type Written = std::io::Result<(File, Vec<u8>)>;

/// A line being written to a file.
#[derive(Debug)]
struct Spill {
    dir: PathBuf,
    scanner: IdScanner,
    /// The budget's bytes held for the line: its length so far, each chunk reserved before
    /// it is written.
    held: Reservation,
    /// The file, while no write holds it (`None` before the first write creates it).
    file: Option<File>,
    /// Bytes read and not yet handed to a write.
    pending: Vec<u8>,
    /// A buffer given back by the last write, for the next chunk.
    spare: Vec<u8>,
    /// The write in flight, kept here so a dropped `next` leaves it.
    writing: Option<JoinHandle<Written>>,
}

impl Drop for Spill {
    /// A line dropped with a write in flight (read past, or the reader dropped): the write
    /// keeps the file open until it ends, so the line's bytes of the budget go back only
    /// then.
    fn drop(&mut self) {
        if let Some(writing) = self.writing.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let held = self.held.take_all();
            runtime.spawn(async move {
                let _ = writing.await;
                drop(held);
            });
        }
    }
}

impl Spill {
    /// Waits for the write in flight, then hands the pending bytes to a new one. Cancel
    /// safe: until the write in flight has ended, nothing of `self` has changed.
    async fn flush(&mut self) -> std::io::Result<()> {
        if let Some(writing) = self.writing.as_mut() {
            let written = writing.await;
            self.writing = None;
            let (file, mut buffer) = written.map_err(std::io::Error::other)??;
            self.file = Some(file);
            if buffer.capacity() > 2 * WRITE_BUFFER {
                // The first chunk is the line read in memory so far: not kept.
                buffer = Vec::new();
            }
            self.spare = buffer;
        }
        if self.pending.is_empty() {
            return Ok(());
        }
        let mut chunk = std::mem::replace(&mut self.pending, std::mem::take(&mut self.spare));
        let file = self.file.take();
        let dir = self.dir.clone();
        self.writing = Some(tokio::task::spawn_blocking(move || {
            let file = crate::spill::append(file, &dir, &chunk)?;
            chunk.clear();
            Ok((file, chunk))
        }));
        Ok(())
    }
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
    /// The limit it is over.
    pub(crate) limit: u64,
    /// Why it was not kept in a file, when spilling is on and writing it failed.
    pub(crate) unwritable: Option<String>,
    /// Why it was not kept in a file, when the spill budget refused it.
    pub(crate) over_budget: Option<OverBudget>,
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
    /// Where a line over the limit is written, if it is.
    spill_to: Option<SpillTo>,
    /// The current line, while it is being written to a file.
    spill: Option<Box<Spill>>,
    /// Why the current line could not be written to its file.
    spill_error: Option<String>,
    /// The budget's refusal of the current line's next bytes.
    over_budget: Option<OverBudget>,
    /// Noted whenever bytes of a line that has not ended yet are read.
    clock: Option<Arc<TransferClock>>,
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
            spill_to: None,
            spill: None,
            spill_error: None,
            over_budget: None,
            clock: None,
        }
    }

    /// The same reader, noting on `clock` each read of bytes of a line not ended yet (what
    /// keeps a call whose answer is arriving from timing out).
    pub(crate) fn noting(mut self, clock: Arc<TransferClock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The same reader, writing a line over its limit (up to `to.max` bytes) to an unnamed
    /// file in `to.dir` rather than reading past it.
    pub(crate) fn spilling(mut self, to: SpillTo) -> Self {
        self.spill_to = Some(to);
        self
    }

    /// How many bytes have been taken from the reader so far (whole lines or not).
    pub(crate) fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Whether a write of a line to its file is in flight: progress even while no byte is
    /// taken from the reader (it ends, however slow the disk).
    pub(crate) fn is_writing(&self) -> bool {
        self.spill
            .as_ref()
            .is_some_and(|spill| spill.writing.is_some())
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
            if let Some(spill) = self.spill.as_mut()
                && spill.pending.len() >= WRITE_BUFFER
                && let Err(error) = spill.flush().await
            {
                self.spill_failed(&error);
            }
            let available = self.reader.fill_buf().await?;
            // From here to the end of the iteration there is no await.
            if available.is_empty() {
                if self.spill.is_some() || self.overflow.is_some() {
                    return Ok(Some(self.end_long()));
                }
                if self.line.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(Line::Whole(std::mem::take(&mut self.line))));
            }
            // Whether this read goes on with a line begun by an earlier one.
            let spanned = !self.line.is_empty() || self.spill.is_some() || self.overflow.is_some();
            let (chunk, used, end) = match memchr::memchr(b'\n', available) {
                Some(i) => (&available[..i], i + 1, true),
                None => (available, available.len(), false),
            };
            let max = self.spill_to.as_ref().map_or(0, |to| to.max);
            let len = chunk.len() as u64;
            // Whether the spilling line takes the chunk: within its cap and its budget.
            let kept = match &mut self.spill {
                Some(spill) if spill.held.bytes() + len <= max => match spill.held.grow(len) {
                    Ok(()) => true,
                    Err(refused) => {
                        self.over_budget = Some(refused);
                        false
                    }
                },
                _ => false,
            };
            match (&mut self.spill, &mut self.overflow) {
                (Some(spill), _) if kept => {
                    spill.scanner.feed(chunk);
                    spill.pending.extend_from_slice(chunk);
                    if spill.scanner.has_method() {
                        // Found to be a request or notification (its `method` after a long
                        // start): never kept, so written no further; the file and what it
                        // held of the budget go with it.
                        if let Some(mut spill) = self.spill.take() {
                            let scanner = std::mem::take(&mut spill.scanner);
                            self.overflow = Some((scanner, spill.held.bytes()));
                        }
                    }
                }
                (Some(_), _) => {
                    // Past the spill's cap or its budget: read past the rest (the file, and
                    // what it held of the budget, go with it).
                    if let Some(mut spill) = self.spill.take() {
                        let mut scanner = std::mem::take(&mut spill.scanner);
                        scanner.feed(chunk);
                        self.overflow = Some((scanner, spill.held.bytes() + len));
                    }
                }
                (None, Some((scanner, bytes))) => {
                    scanner.feed(chunk);
                    *bytes += len;
                }
                (None, None) if self.line.len() + chunk.len() <= self.limit => {
                    self.line.extend_from_slice(chunk);
                }
                (None, None) => {
                    let mut scanner = IdScanner::default();
                    scanner.feed(&self.line);
                    scanner.feed(chunk);
                    let bytes = (self.line.len() + chunk.len()) as u64;
                    // A request or notification (a top-level `method`) is never kept over
                    // the limit, so it is not written either: read past.
                    let spill_to = self
                        .spill_to
                        .as_ref()
                        .filter(|to| bytes <= to.max && !scanner.has_method());
                    let held = spill_to.map(|to| {
                        let mut held = to.budget.reserve();
                        held.grow(bytes).map(|()| (to.dir.clone(), held))
                    });
                    match held {
                        Some(Ok((dir, held))) => {
                            // The line so far is the first chunk to write.
                            let mut pending = std::mem::take(&mut self.line);
                            // Exact: doubling the line's capacity here would be the peak.
                            pending.reserve_exact(chunk.len());
                            pending.extend_from_slice(chunk);
                            self.spill = Some(Box::new(Spill {
                                dir,
                                scanner,
                                held,
                                file: None,
                                pending,
                                spare: Vec::new(),
                                writing: None,
                            }));
                        }
                        refused => {
                            if let Some(Err(refused)) = refused {
                                self.over_budget = Some(refused);
                            }
                            // Given back now: an oversized line holds no memory past here.
                            self.line = Vec::new();
                            self.overflow = Some((scanner, bytes));
                        }
                    }
                }
            }
            self.reader.consume(used);
            self.consumed += used as u64;
            // Bytes of a line not ended, or the end of one that took several reads.
            if (!end || spanned)
                && let Some(clock) = &self.clock
            {
                clock.note();
            }
            if end {
                if self.spill.is_some() || self.overflow.is_some() {
                    return Ok(Some(self.end_long()));
                }
                return Ok(Some(Line::Whole(std::mem::take(&mut self.line))));
            }
        }
    }

    /// The line could not be written to its file: the rest of it is read past, and the
    /// line reported as too long with the reason.
    fn spill_failed(&mut self, error: &std::io::Error) {
        if let Some(mut spill) = self.spill.take() {
            self.spill_error = Some(format!(
                "it could not be written to a file in {}: {error}",
                spill.dir.display()
            ));
            self.overflow = Some((std::mem::take(&mut spill.scanner), spill.held.bytes()));
        }
    }

    fn end_long(&mut self) -> Line {
        match self.spill.take() {
            Some(spill) => Line::Spilled(SpilledLine { spill: *spill }),
            None => self.end_overflow(),
        }
    }

    fn end_overflow(&mut self) -> Line {
        let (scanner, bytes) = self.overflow.take().unwrap_or_default();
        // A request or notification is never kept past the in-memory limit: that is its
        // limit, whatever an answer may spill to.
        let spilled_to = self.spill_to.as_ref().filter(|_| !scanner.has_method());
        Line::TooLong(Overflow {
            bytes,
            id: scanner.id(),
            has_method: scanner.has_method(),
            limit: spilled_to.map_or(self.limit as u64, |to| to.max),
            unwritable: self.spill_error.take(),
            over_budget: self.over_budget.take(),
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
    async fn lines_survive_dropped_reads(seed: u64, spill: bool) {
        const MAX: u64 = 8 * 1024 * 1024;
        // Spilling, lines over LIMIT go to files, and those over SPILL_MAX are too long.
        let (limit, spill_max) = if spill {
            (1024 * 1024, 6 * 1024 * 1024)
        } else {
            (6 * 1024 * 1024, 0)
        };
        #[allow(non_snake_case, reason = "read as the constant it was")]
        let LIMIT: usize = if spill { spill_max } else { limit };
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
        sizes[4].0 = limit + 1;
        sizes[5].0 = limit;
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
        let mut lines = LineReader::new(reader, limit);
        let budget = SpillBudget::default();
        if spill {
            lines = lines.spilling(SpillTo {
                dir: std::env::temp_dir(),
                max: spill_max as u64,
                budget: budget.clone(),
            });
        }
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
                Line::Spilled(spilled) => {
                    assert!(
                        spill && len > limit && len <= LIMIT,
                        "seed {seed}: line {i} of {len} B spilled"
                    );
                    assert_eq!(spilled.bytes(), len as u64);
                    if len > 64 {
                        assert_eq!(spilled.id(), Some(i.to_string()), "seed {seed}: line {i}");
                    }
                    let (file, held) = spilled.finish().await.unwrap();
                    assert_eq!(held.bytes(), len as u64, "seed {seed}: line {i}");
                    let bytes = tokio::task::spawn_blocking(move || {
                        use std::io::{Read as _, Seek as _};
                        let mut file = file;
                        file.rewind().unwrap();
                        let mut bytes = Vec::new();
                        file.read_to_end(&mut bytes).unwrap();
                        bytes
                    })
                    .await
                    .unwrap();
                    assert!(
                        bytes == want,
                        "seed {seed}: line {i} of {len} B spilled wrong"
                    );
                }
                Line::Whole(bytes) => {
                    assert!(len <= limit, "seed {seed}: line {i} of {len} B kept");
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
        // A line read past with a write in flight gives its bytes back once that write ends.
        let started = std::time::Instant::now();
        while budget.in_use() > 0 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "seed {seed}: every file gave its bytes back"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        writing.await.unwrap();
        assert!(
            dropped > 100,
            "seed {seed}: only {dropped} reads were dropped"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lines_arrive_whole_and_in_order_when_reads_are_dropped() {
        for seed in [0x9E37_79B9_7F4A_7C15, 7, 1_000_003, 0xDEAD_BEEF] {
            lines_survive_dropped_reads(seed, false).await;
        }
    }

    /// The same with spilling on, at a small threshold: lines over it are written to files
    /// (their writes awaited inside `next`, so dropped there too) and come back whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spilled_lines_arrive_whole_and_in_order_when_reads_are_dropped() {
        for seed in [0x9E37_79B9_7F4A_7C15, 11, 0xDEAD_BEEF] {
            lines_survive_dropped_reads(seed, true).await;
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

    /// A spilling line the budget refuses is read past and reported with its id and why;
    /// what it had reserved goes back at once, and the next line is kept again.
    #[tokio::test]
    async fn a_line_over_the_spill_budget_is_read_past_and_holds_nothing() {
        const MIB: usize = 1024 * 1024;
        let budget = SpillBudget::new(3 * MIB as u64);
        let mut input = Vec::new();
        for (i, len) in [(1, 2 * MIB), (2, 2 * MIB), (3, 40), (4, 2 * MIB)] {
            input.extend_from_slice(&line(i, len, i % 2 == 0));
            input.push(b'\n');
        }
        let mut lines = LineReader::new(input.as_slice(), MIB).spilling(SpillTo {
            dir: std::env::temp_dir(),
            max: 8 * MIB as u64,
            budget: budget.clone(),
        });
        let Some(Line::Spilled(first)) = lines.next().await.unwrap() else {
            panic!("the first line is kept");
        };
        let first = first.finish().await.unwrap();
        assert_eq!(budget.in_use(), 2 * MIB as u64);
        let Some(Line::TooLong(refused)) = lines.next().await.unwrap() else {
            panic!("the second line passes the budget");
        };
        assert_eq!(refused.bytes, 2 * MIB as u64);
        assert_eq!(refused.id.as_deref(), Some("2"));
        let over = refused.over_budget.expect("refused by the budget");
        assert_eq!((over.in_use, over.limit), (2 * MIB as u64, 3 * MIB as u64));
        assert_eq!(
            budget.in_use(),
            2 * MIB as u64,
            "the refused line holds nothing"
        );
        assert!(matches!(lines.next().await.unwrap(), Some(Line::Whole(_))));
        drop(first);
        assert_eq!(budget.in_use(), 0);
        let Some(Line::Spilled(last)) = lines.next().await.unwrap() else {
            panic!("kept again once the first is gone");
        };
        assert_eq!(last.id().as_deref(), Some("4"));
        drop(last.finish().await.unwrap());
        assert_eq!(budget.in_use(), 0);
        assert!(lines.next().await.unwrap().is_none());
    }

    /// A request or notification over the limit is never kept, so never written: read past
    /// from the moment its `method` is known (at once when it comes first), holding nothing
    /// of the budget, and the answer after it is kept as usual.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_notification_is_read_past_without_a_file() {
        const MIB: usize = 1024 * 1024;
        let budget = SpillBudget::new(3 * MIB as u64);
        let data = "x".repeat(6 * MIB);
        let mut input = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":"{data}"}}}}"#
        )
        .into_bytes();
        let notification = input.len() as u64;
        input.push(b'\n');
        // The method after a long start: written until it is read, then given back.
        let late = format!(
            r#"{{"params":{{"data":"{}"}},"jsonrpc":"2.0","method":"notifications/message"}}"#,
            &data[..2 * MIB]
        );
        input.extend_from_slice(late.as_bytes());
        input.push(b'\n');
        input.extend_from_slice(&line(7, 2 * MIB, false));
        input.push(b'\n');
        let mut lines = LineReader::new(input.as_slice(), MIB).spilling(SpillTo {
            dir: std::env::temp_dir(),
            max: 8 * MIB as u64,
            budget: budget.clone(),
        });
        let Some(Line::TooLong(refused)) = lines.next().await.unwrap() else {
            panic!("not read past");
        };
        assert!(refused.has_method);
        assert_eq!(refused.bytes, notification);
        assert_eq!(
            refused.limit, MIB as u64,
            "the in-memory limit, not a spill's"
        );
        assert!(refused.over_budget.is_none(), "it never reached the budget");
        assert_eq!(budget.in_use(), 0, "nothing held");
        let Some(Line::TooLong(refused)) = lines.next().await.unwrap() else {
            panic!("not read past");
        };
        assert!(refused.has_method);
        assert_eq!(refused.bytes, late.len() as u64);
        assert!(refused.over_budget.is_none());
        // What it held goes back once a write in flight has closed its file.
        let started = std::time::Instant::now();
        while budget.in_use() > 0 {
            assert!(started.elapsed() < std::time::Duration::from_secs(30));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let Some(Line::Spilled(answer)) = lines.next().await.unwrap() else {
            panic!("the answer after it is kept");
        };
        assert_eq!(answer.id().as_deref(), Some("7"));
        drop(answer.finish().await.unwrap());
        assert_eq!(budget.in_use(), 0);
    }

    /// Refused partway, with chunks written and a write perhaps in flight: the line is read
    /// past, and its bytes of the budget go back once its file is closed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_line_refused_partway_gives_its_bytes_back_once_its_file_is_closed() {
        const MIB: usize = 1024 * 1024;
        let budget = SpillBudget::new(3 * MIB as u64);
        let mut input = line(9, 6 * MIB, false);
        input.push(b'\n');
        input.extend_from_slice(b"{\"id\":10}\n");
        let mut lines = LineReader::new(input.as_slice(), MIB).spilling(SpillTo {
            dir: std::env::temp_dir(),
            max: 8 * MIB as u64,
            budget: budget.clone(),
        });
        let Some(Line::TooLong(refused)) = lines.next().await.unwrap() else {
            panic!("refused partway");
        };
        assert_eq!(
            (refused.bytes, refused.id.as_deref()),
            (6 * MIB as u64, Some("9"))
        );
        let over = refused.over_budget.expect("refused by the budget");
        assert!(
            over.own > MIB as u64,
            "refused after it had started: {over:?}"
        );
        assert_eq!(over.others(), 0);
        assert!(matches!(lines.next().await.unwrap(), Some(Line::Whole(_))));
        let started = std::time::Instant::now();
        while budget.in_use() > 0 {
            assert!(started.elapsed() < std::time::Duration::from_secs(30));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// `SpilledLine::finish` dropped at any poll (a runtime shutting down, a task aborted):
    /// the write in flight stays with the line, and its bytes of the budget go back once
    /// it has ended, never lost and never held for good.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_finish_dropped_midway_gives_the_bytes_back_once_the_write_ends() {
        const MIB: usize = 1024 * 1024;
        for polls in 0..6 {
            let budget = SpillBudget::default();
            let mut input = line(1, 5 * MIB, false);
            input.push(b'\n');
            let mut lines = LineReader::new(input.as_slice(), MIB).spilling(SpillTo {
                dir: std::env::temp_dir(),
                max: 8 * MIB as u64,
                budget: budget.clone(),
            });
            let Some(Line::Spilled(spilled)) = lines.next().await.unwrap() else {
                panic!("spilled");
            };
            let mut finish = Box::pin(spilled.finish());
            if let Some(done) = poll_up_to(&mut finish, polls).await {
                drop(done.unwrap());
            }
            drop(finish);
            let started = std::time::Instant::now();
            while budget.in_use() > 0 {
                assert!(
                    started.elapsed() < std::time::Duration::from_secs(30),
                    "{polls}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    }
}
