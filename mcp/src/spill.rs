//! Answers too large to hold in memory, kept in files: a JSON-RPC line past [`SPILL_AT`] is
//! written to an unnamed file as it is read (`stdio/lines.rs`), and once it has ended,
//! [`split`] reads it back on a blocking thread, decoding each long text of
//! `result.content[i].text` into a file of its own (a [`SpilledText`]) and keeping the rest
//! of the answer in memory, with the text's
//! [placeholder](SpilledText::placeholder) in its place.
//!
//! The decoding is what serde_json and the in-memory repair (`stdio/repair.rs`) give: JSON
//! escapes decoded, surrogate pairs joined, lone surrogate escapes and invalid UTF-8
//! replaced by U+FFFD and counted ([`Lossy`]), a raw control character or a bad escape an
//! error. Disk: the answer's file holds its bytes of the [`SpillBudget`] until its texts are
//! split off, and each text what it decodes until it is dropped (the reservation travels
//! with its [`SpilledText`]); a text the budget refuses fails the answer
//! ([`Refused::OverBudget`]). Memory: the rest of the answer (at most the in-memory cap the caller gives, else
//! [`SplitError::TooLarge`]), the reader's buffer and one write buffer of [`WRITE_BUFFER`]
//! per text being decoded: a few MiB whatever the texts' sizes. Every call here blocks
//! (file I/O): call it from a blocking thread.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;

use psych_types::SpilledText;

use crate::budget::{OverBudget, Reservation, SpillBudget};

/// A line of a server's output longer than this (16 MiB) is written to a file as it is
/// read, not kept in memory; once it has ended, its long texts stay in files and the rest
/// of it is parsed in memory.
pub const SPILL_AT: usize = 16 * 1024 * 1024;
/// The longest answer kept in a file (4 GiB): a longer one is read past without being
/// kept, and fails its request with [`McpError::AnswerTooLarge`](crate::McpError) once it
/// has gone by. Disk is not infinite.
pub const MAX_SPILLED_ANSWER: u64 = 4 * 1024 * 1024 * 1024;
/// A text of a spilled answer's `result.content` whose JSON string is longer than this
/// (64 KiB) is decoded into a file of its own; a shorter one stays in memory.
pub const SPILL_TEXT_AT: usize = 64 * 1024;
/// The most texts of one answer kept in files; the texts past it stay in memory, counted
/// against the in-memory cap. Each holds a file descriptor open until the result is
/// logged, so this bounds what a server's answers in flight hold: 16 per call.
pub const MAX_SPILLED_TEXTS: usize = 16;
/// The write buffer of each text being decoded, and the size of the chunks a spilling line
/// is written in.
pub(crate) const WRITE_BUFFER: usize = 1024 * 1024;

/// A file that has no name, in `dir`: `O_TMPFILE` where the kernel and file system have
/// it, else created readable by this user alone (0600) under a random name and unlinked at
/// once (`tempfile::tempfile_in`). It goes when its last handle does. Blocks.
pub(crate) fn unnamed_file(dir: &Path) -> io::Result<File> {
    tempfile::tempfile_in(dir)
}

/// What the decoding replaced by U+FFFD, counted as the in-memory repair counts it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lossy {
    /// Maximal invalid UTF-8 sequences.
    pub(crate) invalid_utf8: usize,
    /// Lone surrogate escapes.
    pub(crate) lone_surrogates: usize,
}

impl Lossy {
    /// Both counts added.
    pub(crate) fn add(self, other: Self) -> Self {
        Self {
            invalid_utf8: self.invalid_utf8 + other.invalid_utf8,
            lone_surrogates: self.lone_surrogates + other.lone_surrogates,
        }
    }

    /// The note for `_meta["psych/lossy"]`, in the repair's words; `None` if nothing was
    /// replaced.
    pub(crate) fn note(self) -> Option<String> {
        let mut notes = Vec::new();
        if self.invalid_utf8 > 0 {
            notes.push(format!(
                "invalid UTF-8 replaced by U+FFFD at {} places",
                self.invalid_utf8
            ));
        }
        if self.lone_surrogates > 0 {
            let places = if self.lone_surrogates == 1 {
                "1 place".to_owned()
            } else {
                format!("{} places", self.lone_surrogates)
            };
            notes.push(format!(
                "lone surrogate escapes replaced by U+FFFD at {places}"
            ));
        }
        (!notes.is_empty()).then(|| notes.join("; "))
    }
}

/// A spilled answer read back: what stays in memory, and the texts in files.
#[derive(Debug)]
pub(crate) struct Split {
    /// The answer's JSON text with each spilled text's string replaced by its
    /// placeholder's (still raw: not yet repaired).
    pub(crate) rest: Vec<u8>,
    /// The spilled texts: the block of `result.content` each was the `text` of.
    pub(crate) texts: Vec<(usize, SpilledText)>,
    /// What decoding the spilled texts replaced.
    pub(crate) lossy: Lossy,
}

/// Why a spilled answer could not be split.
#[derive(Debug)]
pub(crate) enum SplitError {
    /// What stays in memory is over the cap.
    TooLarge,
    /// A spilled text's string is not valid JSON (a bad escape, a raw control character).
    Malformed(String),
    /// Reading the answer or writing a text failed.
    Io(io::Error),
    /// A text's next bytes would pass the spill budget.
    OverBudget(OverBudget),
}

impl From<OverBudget> for SplitError {
    fn from(refused: OverBudget) -> Self {
        Self::OverBudget(refused)
    }
}

impl From<io::Error> for SplitError {
    fn from(error: io::Error) -> Self {
        Self::Io(error)
    }
}

/// Why a spilled answer was not delivered.
#[derive(Debug)]
pub(crate) enum Refused {
    /// What stays in memory is over [`MAX_IN_MEMORY`], or a long `text` is in a block that
    /// is not a text block.
    TooLarge,
    /// What stays in memory holds more structural bytes than psych-mcp parses
    /// ([`MAX_JSON_STRUCTURAL_BYTES`](crate::MAX_JSON_STRUCTURAL_BYTES)).
    TooComplex,
    /// A spilled text's string is not valid JSON.
    Malformed(String),
    /// What stays in memory does not parse, even repaired: it, and serde's error.
    Unreadable { rest: Vec<u8>, error: String },
    /// Reading the answer or writing a text failed.
    Io(io::Error),
    /// Keeping a text in a file would pass the spill budget.
    OverBudget(OverBudget),
}

impl Refused {
    /// Why the answer cannot be delivered, for its call (an unreadable rest quoted from
    /// its start); `None` for [`Refused::TooLarge`], [`Refused::TooComplex`] and
    /// [`Refused::OverBudget`], which each transport says with its own limit and the
    /// answer's size.
    pub(crate) fn reason(self) -> Option<String> {
        match self {
            Self::TooLarge | Self::TooComplex | Self::OverBudget(_) => None,
            Self::Malformed(reason) => Some(reason),
            Self::Unreadable { rest, error } => {
                Some(format!("{error}: {}", crate::post::preview(&rest)))
            }
            Self::Io(error) => Some(error.to_string()),
        }
    }
}

/// Closes a spilling answer's file, then gives its bytes of the budget back (in that order:
/// the bytes are free once the file is), on a blocking thread when a runtime is there:
/// closing an unlinked file of up to 4 GiB frees its blocks, which may take a while. For a
/// file given up on (an answer refused, cut, or dropped with its reader). Returns the
/// blocking task doing it, if one was started.
pub(crate) fn close_spilled(
    file: Option<File>,
    held: Option<crate::budget::Reservation>,
) -> Option<tokio::task::JoinHandle<()>> {
    file.as_ref()?;
    let close = move || {
        drop(file);
        drop(held);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => Some(runtime.spawn_blocking(close)),
        Err(_) => {
            close();
            None
        }
    }
}

/// A spilling answer's file and its bytes of the budget, closed by [`close_spilled`] when
/// dropped: whatever way its reader ends (an error, a refusal, the future dropped), the
/// file is never closed on an async worker.
#[derive(Default)]
pub(crate) struct Spilling {
    /// The file, while no write owns it.
    pub(crate) file: Option<File>,
    /// The file's bytes of the budget, while no write holds them.
    pub(crate) held: Option<crate::budget::Reservation>,
}

impl Spilling {
    /// Closes the file, then gives its bytes of the budget back, on a blocking thread, and
    /// waits until both are done: for a reader ending with a refusal or an error, whose
    /// caller may ask again at once and should find the budget as the refusal left it.
    pub(crate) async fn close(&mut self) {
        close_spilled_now(self.file.take(), self.held.take()).await;
    }
}

/// [`close_spilled`], waited for.
pub(crate) async fn close_spilled_now(
    file: Option<File>,
    held: Option<crate::budget::Reservation>,
) {
    if let Some(closing) = close_spilled(file, held) {
        let _ = closing.await;
    }
}

impl Drop for Spilling {
    fn drop(&mut self) {
        drop(close_spilled(self.file.take(), self.held.take()));
    }
}

/// Appends `bytes` to `file`, or to a new [`unnamed_file`] in `dir` when there is none yet:
/// one write of a spilling answer. Blocks.
pub(crate) fn append(file: Option<File>, dir: &Path, bytes: &[u8]) -> io::Result<File> {
    use std::io::Write as _;
    let mut file = match file {
        Some(file) => file,
        None => unnamed_file(dir)?,
    };
    file.write_all(bytes)?;
    Ok(file)
}

/// The most of a spilled answer parsed in memory: the stdio transport's line cap.
pub(crate) const MAX_IN_MEMORY: usize = crate::stdio::MAX_LINE;

/// A reader noting each read on a transfer clock.
struct Noting<'a, R> {
    inner: R,
    clock: &'a crate::tap::TransferClock,
}

impl<R: Read> Read for Noting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.clock.note();
        self.inner.read(buf)
    }
}

/// Reads back the spilled answer in `file` (rewound to its start first; `held`, its share
/// of the budget, given back once it is read) to a request whose
/// slot in `tap` is open: its long texts split into files in the tap's
/// [spill folder](crate::tap::Tap::spill_dir) ([`split`]), the rest parsed
/// (repaired if need be, the lossy note in its `_meta`), its result kept in the tap with
/// the texts. Returns the message for rmcp, with the tap's stand-in for its result; if the
/// tap did not keep it (the request gave up meanwhile, or the answer is an error), the
/// texts are dropped, their files gone, and the message is returned as read. Blocks.
///
/// # Errors
///
/// [`Refused`] says why the answer cannot be delivered.
pub(crate) fn read_answer(
    mut file: File,
    held: Reservation,
    tap: &crate::tap::Tap,
) -> Result<serde_json::Value, Refused> {
    use serde_json::Value;
    use std::io::Seek as _;
    file.rewind().map_err(Refused::Io)?;
    let dir = tap.spill_dir();
    // Reading it back (up to MAX_SPILLED_ANSWER) is part of its arrival for the deadline.
    let file = Noting {
        inner: file,
        clock: tap.transfer(),
    };
    let input = io::BufReader::with_capacity(WRITE_BUFFER, file);
    let split = split(input, dir, tap.budget(), SPILL_TEXT_AT, MAX_IN_MEMORY);
    // The answer's file is gone: its bytes of the budget go back.
    let file_bytes = held.bytes();
    drop(held);
    let split = match split {
        Ok(split) => split,
        Err(SplitError::TooLarge) => return Err(Refused::TooLarge),
        Err(SplitError::Malformed(reason)) => return Err(Refused::Malformed(reason)),
        Err(SplitError::Io(error)) => return Err(Refused::Io(error)),
        Err(SplitError::OverBudget(refused)) => {
            return Err(Refused::OverBudget(refused.holding(file_bytes)));
        }
    };
    if crate::wire::too_complex(&split.rest) {
        return Err(Refused::TooComplex);
    }
    let (mut value, lossy) = match serde_json::from_slice::<Value>(&split.rest) {
        Ok(value) => (value, Lossy::default()),
        Err(error) => match crate::stdio::repair::repair_counted(&split.rest) {
            Some(repaired) => repaired,
            None => {
                return Err(Refused::Unreadable {
                    rest: split.rest,
                    error: error.to_string(),
                });
            }
        },
    };
    if let Some(note) = lossy.add(split.lossy).note() {
        crate::stdio::repair::record(&mut value, &note);
    }
    // A block whose `text` key is repeated has several texts split off: serde keeps the
    // last, and so does this (in document order, the last one of each block wins).
    let mut last: std::collections::BTreeMap<usize, SpilledText> =
        std::collections::BTreeMap::new();
    for (block, text) in split.texts {
        last.insert(block, text);
    }
    let mut blocks = Vec::new();
    for (block, text) in last {
        let content = &value["result"]["content"][block];
        if content.get("text").and_then(Value::as_str) != Some(text.placeholder().as_str()) {
            // Replaced by a later `text` key of the same block: not the block's text.
            continue;
        }
        if content.get("type").and_then(Value::as_str) != Some("text") {
            // A long `text` in a block that is not a text block: not something a spilled
            // output can hold.
            return Err(Refused::TooLarge);
        }
        // What psych-types makes of the block must be a text block too (a block with
        // `_meta` or `annotations` of the wrong shape reads as an unknown block), or the
        // record log could not store the spilled text in it.
        let parsed = content
            .as_object()
            .map(|object| psych_types::ContentBlock::from_object(object.clone()));
        if !matches!(parsed, Some(psych_types::ContentBlock::Text(_))) {
            return Err(Refused::Malformed(format!(
                "result.content[{block}] holds a long text but does not read as a text block"
            )));
        }
        blocks.push(psych_types::SpilledBlock {
            block,
            text: std::sync::Arc::new(text),
        });
    }
    // Not kept (the request gave up meanwhile, or the answer is an error): the texts go
    // now, and the message goes to rmcp as it is.
    tap.keep_spilled(&mut value, blocks);
    Ok(value)
}

/// The most bytes of a key remembered (`content` is the longest of the path).
const MAX_KEY: usize = 8;
/// The depth of `result.content[i].text`'s object: frames kept above it are not needed.
const PATH_DEPTH: usize = 4;

/// An object or array the lexer is inside.
#[derive(Debug, Clone, Copy)]
enum Frame {
    Object {
        /// A string here is a key (after `{` or `,`), not a value (after `:`).
        expect_key: bool,
        key: [u8; MAX_KEY],
        /// The current key's length, or `MAX_KEY + 1` if longer.
        key_len: usize,
    },
    Array {
        index: usize,
    },
}

impl Frame {
    fn key_is(&self, want: &[u8]) -> bool {
        matches!(self, Self::Object { key, key_len, .. } if *key_len == want.len() && &key[..*key_len] == want)
    }
}

/// Where the lexer is.
enum State {
    /// Between tokens.
    Between,
    /// Inside a string copied to the rest: a key (its bytes remembered) or a value
    /// (`candidate`: the rest's offset of the opening quote of a text that may be spilled).
    Str {
        key: bool,
        candidate: Option<usize>,
        escape: bool,
    },
    /// Inside a text decoded into a file, for block `block`.
    Spilling { block: usize, decoder: Box<Decoder> },
}

/// Reads the spilled answer `input` (a JSON-RPC response) and decodes each string of
/// `result.content[i].text` longer than `text_at` bytes (as written, escapes included)
/// into an unnamed file in `dir`, at most [`MAX_SPILLED_TEXTS`] of them, each holding of
/// `budget` what it decodes. Blocks.
///
/// # Errors
///
/// [`SplitError::TooLarge`] when what stays in memory passes `max_rest` bytes,
/// [`SplitError::Malformed`] for a spilled string that is not valid JSON,
/// [`SplitError::OverBudget`] when a text would pass `budget`, and I/O errors.
pub(crate) fn split(
    mut input: impl Read,
    dir: &Path,
    budget: &SpillBudget,
    text_at: usize,
    max_rest: usize,
) -> Result<Split, SplitError> {
    let mut lexer = Lexer {
        rest: Vec::new(),
        frames: Vec::new(),
        deep: 0,
        state: State::Between,
        texts: Vec::new(),
        lossy: Lossy::default(),
        dir,
        budget,
        text_at,
        started: false,
        results: 0,
        content_arrays: 0,
    };
    let mut buffer = vec![0u8; WRITE_BUFFER];
    loop {
        let n = match input.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error.into()),
        };
        match lexer.feed(&buffer[..n]) {
            Ok(()) => {}
            // What the answer's texts already held is its own too.
            Err(SplitError::OverBudget(refused)) => {
                let texts = lexer.texts.iter().map(|(_, text)| text.len()).sum();
                return Err(SplitError::OverBudget(refused.holding(texts)));
            }
            Err(error) => return Err(error),
        }
        if lexer.rest.len() > max_rest {
            return Err(SplitError::TooLarge);
        }
    }
    if (lexer.results > 1 || lexer.content_arrays > 1) && !lexer.texts.is_empty() {
        // serde keeps the last `result` or `content`: a text spilled from an earlier one
        // could be matched to a later block standing in for it.
        return Err(malformed(
            "the answer repeats its `result` or `result.content` key",
        ));
    }
    if let State::Spilling { .. } = lexer.state {
        // The answer ends inside a spilled text: what stays in memory says so to serde.
        lexer.rest.extend_from_slice(b"\"");
    }
    Ok(Split {
        rest: lexer.rest,
        texts: lexer.texts,
        lossy: lexer.lossy,
    })
}

struct Lexer<'a> {
    rest: Vec<u8>,
    /// The objects and arrays entered, down to [`PATH_DEPTH`].
    frames: Vec<Frame>,
    /// How many levels deeper than the frames kept.
    deep: u64,
    state: State,
    texts: Vec<(usize, SpilledText)>,
    lossy: Lossy,
    dir: &'a Path,
    budget: &'a SpillBudget,
    text_at: usize,
    /// Past a leading byte order mark.
    started: bool,
    /// `result` objects entered (a repeated key makes more than one).
    results: u32,
    /// `result.content` arrays entered.
    content_arrays: u32,
}

impl Lexer<'_> {
    fn feed(&mut self, mut bytes: &[u8]) -> Result<(), SplitError> {
        if !self.started {
            // A byte order mark before the line (split over reads only if a read returned
            // fewer than 3 bytes at the start, which a file read does not).
            bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
            self.started = true;
        }
        while !bytes.is_empty() {
            let used = match &mut self.state {
                State::Between => self.between(bytes[0]),
                State::Str { .. } => self.string(bytes)?,
                State::Spilling { decoder, .. } => match decoder.feed(bytes)? {
                    None => bytes.len(),
                    Some(used) => {
                        self.end_spill()?;
                        used
                    }
                },
            };
            bytes = &bytes[used..];
        }
        Ok(())
    }

    /// One byte between tokens; returns 1.
    fn between(&mut self, byte: u8) -> usize {
        self.rest.push(byte);
        match byte {
            b'"' => {
                let key = matches!(
                    (self.deep, self.frames.last()),
                    (
                        0,
                        Some(Frame::Object {
                            expect_key: true,
                            ..
                        })
                    )
                );
                if key && let Some(Frame::Object { key_len, .. }) = self.frames.last_mut() {
                    *key_len = 0;
                }
                let candidate = (!key && self.on_path()).then(|| self.rest.len() - 1);
                self.state = State::Str {
                    key,
                    candidate,
                    escape: false,
                };
            }
            b'{' | b'[' => {
                if self.deep == 0 {
                    match (self.frames.len(), byte) {
                        (1, b'{') if self.frames[0].key_is(b"result") => self.results += 1,
                        (2, b'[')
                            if self.frames[0].key_is(b"result")
                                && self.frames[1].key_is(b"content") =>
                        {
                            self.content_arrays += 1;
                        }
                        _ => {}
                    }
                }
                if self.deep == 0 && self.frames.len() < PATH_DEPTH {
                    self.frames.push(if byte == b'{' {
                        Frame::Object {
                            expect_key: true,
                            key: [0; MAX_KEY],
                            key_len: 0,
                        }
                    } else {
                        Frame::Array { index: 0 }
                    });
                } else {
                    self.deep += 1;
                }
            }
            b'}' | b']' => {
                if self.deep > 0 {
                    self.deep -= 1;
                } else {
                    self.frames.pop();
                }
            }
            b':' if self.deep == 0 => {
                if let Some(Frame::Object { expect_key, .. }) = self.frames.last_mut() {
                    *expect_key = false;
                }
            }
            b',' if self.deep == 0 => match self.frames.last_mut() {
                Some(Frame::Object { expect_key, .. }) => *expect_key = true,
                Some(Frame::Array { index }) => *index += 1,
                None => {}
            },
            _ => {}
        }
        1
    }

    /// Whether a value string starting here is `result.content[i].text`.
    fn on_path(&self) -> bool {
        self.deep == 0
            && self.frames.len() == PATH_DEPTH
            && self.texts.len() < MAX_SPILLED_TEXTS
            && self.frames[0].key_is(b"result")
            && self.frames[1].key_is(b"content")
            && matches!(self.frames[2], Frame::Array { .. })
            && self.frames[3].key_is(b"text")
    }

    /// Bytes inside a string copied to the rest; returns how many were taken.
    fn string(&mut self, bytes: &[u8]) -> Result<usize, SplitError> {
        let State::Str {
            key,
            candidate,
            escape,
        } = &mut self.state
        else {
            return Ok(0);
        };
        let (key, candidate) = (*key, *candidate);
        let (used, ended) = if *escape {
            *escape = false;
            (1, false)
        } else {
            match memchr::memchr2(b'"', b'\\', bytes) {
                Some(i) if bytes[i] == b'\\' => {
                    *escape = true;
                    (i + 1, false)
                }
                Some(i) => (i + 1, true),
                None => (bytes.len(), false),
            }
        };
        let (used, ended) = match candidate {
            // A long text ending here: its closing quote goes to the decoder.
            Some(start) if ended && self.rest.len() + used - 2 - start > self.text_at => {
                (used - 1, false)
            }
            _ => (used, ended),
        };
        let taken = &bytes[..used];
        self.rest.extend_from_slice(taken);
        if key
            && let Some(Frame::Object {
                key: k, key_len, ..
            }) = self.frames.last_mut()
        {
            let body = if ended {
                &taken[..taken.len() - 1]
            } else {
                taken
            };
            for &byte in body {
                if *key_len < MAX_KEY {
                    k[*key_len] = byte;
                }
                *key_len = (*key_len + 1).min(MAX_KEY + 1);
            }
        }
        if ended {
            self.state = State::Between;
        } else if let Some(start) = candidate
            && self.rest.len() - start - 1 > self.text_at
        {
            self.start_spill(start)?;
        }
        Ok(used)
    }

    /// The candidate text whose opening quote is at `start` in the rest is long: what of
    /// it is in the rest goes to a decoder writing a file, and the rest of it follows.
    fn start_spill(&mut self, start: usize) -> Result<(), SplitError> {
        let block = match self.frames[2] {
            Frame::Array { index } => index,
            Frame::Object { .. } => 0,
        };
        let body = self.rest.split_off(start + 1);
        self.rest.truncate(start);
        let mut decoder = Box::new(Decoder::new(unnamed_file(self.dir)?, self.budget.reserve()));
        // The body holds no closing quote (the string goes on).
        decoder.feed(&body)?;
        self.state = State::Spilling { block, decoder };
        Ok(())
    }

    /// The spilled text has ended: its file becomes a [`SpilledText`], its placeholder's
    /// string goes in the rest.
    fn end_spill(&mut self) -> Result<(), SplitError> {
        let State::Spilling { block, decoder } = std::mem::replace(&mut self.state, State::Between)
        else {
            return Ok(());
        };
        let (file, len, lossy, held) = decoder.finish()?;
        let text = SpilledText::new(file, len).holding(held);
        let placeholder = serde_json::to_vec(&text.placeholder()).map_err(io::Error::other)?;
        self.rest.extend_from_slice(&placeholder);
        self.lossy = self.lossy.add(lossy);
        self.texts.push((block, text));
        Ok(())
    }
}

/// Where the decoder is in an escape.
#[derive(Debug, Clone, Copy)]
enum Escape {
    None,
    /// After a backslash.
    Backslash,
    /// Inside `\uXXXX`: the code unit so far and how many digits were read.
    Unicode(u16, u8),
}

/// A JSON string's body decoded into a file, as serde_json plus the repair decode it.
pub(crate) struct Decoder {
    out: BufWriter<File>,
    len: u64,
    /// The budget's bytes held for the file: `len` or up to a step more.
    held: Reservation,
    escape: Escape,
    /// A lead surrogate escape waiting for its trail.
    lead: Option<u16>,
    /// The start of a UTF-8 sequence cut by the end of a read (at most 3 bytes).
    tail: Vec<u8>,
    /// The tail and the next run, when a tail is waiting.
    scratch: Vec<u8>,
    lossy: Lossy,
}

const LEAD: std::ops::Range<u16> = 0xD800..0xDC00;
const TRAIL: std::ops::Range<u16> = 0xDC00..0xE000;
const REPLACEMENT: &[u8] = "\u{FFFD}".as_bytes();

impl Decoder {
    /// A decoder writing to `file`, holding of the budget what it writes in `held`.
    pub(crate) fn new(file: File, held: Reservation) -> Self {
        Self {
            out: BufWriter::with_capacity(WRITE_BUFFER, file),
            len: 0,
            held,
            escape: Escape::None,
            lead: None,
            tail: Vec::new(),
            scratch: Vec::new(),
            lossy: Lossy::default(),
        }
    }

    /// Decodes the next bytes of the string's body; returns `Some(used)` when the closing
    /// quote is among them (`used` counts it), `None` when all were taken.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, SplitError> {
        let mut i = 0;
        while i < bytes.len() {
            match self.escape {
                Escape::Unicode(unit, digits) => {
                    let digit = char::from(bytes[i]).to_digit(16).ok_or_else(|| {
                        malformed("a \\u escape with a character that is not hex")
                    })?;
                    let unit = unit * 16 + digit as u16;
                    i += 1;
                    if digits == 3 {
                        self.escape = Escape::None;
                        self.unit(unit)?;
                    } else {
                        self.escape = Escape::Unicode(unit, digits + 1);
                    }
                }
                Escape::Backslash => {
                    let byte = match bytes[i] {
                        b'u' => None,
                        b'"' => Some(b'"'),
                        b'\\' => Some(b'\\'),
                        b'/' => Some(b'/'),
                        b'b' => Some(0x08),
                        b'f' => Some(0x0C),
                        b'n' => Some(b'\n'),
                        b'r' => Some(b'\r'),
                        b't' => Some(b'\t'),
                        _ => return Err(malformed("an invalid escape in a string")),
                    };
                    i += 1;
                    match byte {
                        None => self.escape = Escape::Unicode(0, 0),
                        Some(byte) => {
                            self.escape = Escape::None;
                            self.end_lead()?;
                            self.write(&[byte])?;
                        }
                    }
                }
                Escape::None => {
                    let run = &bytes[i..];
                    let end = memchr::memchr2(b'"', b'\\', run).unwrap_or(run.len());
                    let run = &run[..end];
                    if !run.is_empty() {
                        if run.iter().any(|&b| b < 0x20) {
                            return Err(malformed("a control character in a string"));
                        }
                        self.end_lead()?;
                        self.raw(run)?;
                    }
                    i += end;
                    let Some(&stop) = bytes.get(i) else {
                        break;
                    };
                    i += 1;
                    self.end_tail()?;
                    if stop == b'"' {
                        self.end_lead()?;
                        return Ok(Some(i));
                    }
                    self.escape = Escape::Backslash;
                }
            }
        }
        Ok(None)
    }

    /// The file, the text's length, what was replaced, and the budget's bytes it holds
    /// (exactly its length). Blocks (flushes the file).
    pub(crate) fn finish(mut self) -> Result<(File, u64, Lossy, Reservation), SplitError> {
        self.end_tail()?;
        self.end_lead()?;
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        self.held.shrink_to(self.len);
        Ok((file, self.len, self.lossy, self.held))
    }

    /// One `\uXXXX` code unit.
    fn unit(&mut self, unit: u16) -> Result<(), SplitError> {
        if let Some(lead) = self.lead.take() {
            if TRAIL.contains(&unit) {
                let code =
                    0x10000 + ((u32::from(lead) - 0xD800) << 10) + (u32::from(unit) - 0xDC00);
                let c = char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
                return self.write(c.encode_utf8(&mut [0; 4]).as_bytes());
            }
            self.lone()?;
        }
        if LEAD.contains(&unit) {
            self.lead = Some(unit);
            Ok(())
        } else if TRAIL.contains(&unit) {
            self.lone()
        } else {
            let c = char::from_u32(u32::from(unit)).unwrap_or(char::REPLACEMENT_CHARACTER);
            self.write(c.encode_utf8(&mut [0; 4]).as_bytes())
        }
    }

    fn lone(&mut self) -> Result<(), SplitError> {
        self.lossy.lone_surrogates += 1;
        self.write(REPLACEMENT)
    }

    /// A lead surrogate followed by anything but a trail escape is lone.
    fn end_lead(&mut self) -> Result<(), SplitError> {
        if self.lead.take().is_some() {
            self.lone()?;
        }
        Ok(())
    }

    /// A UTF-8 sequence cut by a quote or a backslash is invalid.
    fn end_tail(&mut self) -> Result<(), SplitError> {
        if !self.tail.is_empty() {
            let tail = std::mem::take(&mut self.tail);
            self.utf8(&tail, true)?;
        }
        Ok(())
    }

    /// Raw bytes of the string: UTF-8, or replaced where they are not.
    fn raw(&mut self, run: &[u8]) -> Result<(), SplitError> {
        if self.tail.is_empty() {
            let used = self.utf8(run, false)?;
            self.tail.extend_from_slice(&run[used..]);
            return Ok(());
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.append(&mut self.tail);
        scratch.extend_from_slice(run);
        let used = self.utf8(&scratch, false)?;
        self.tail.extend_from_slice(&scratch[used..]);
        if scratch.capacity() <= WRITE_BUFFER {
            self.scratch = scratch;
        }
        Ok(())
    }

    /// Writes `bytes` as UTF-8, each maximal invalid sequence replaced by U+FFFD (as
    /// `String::from_utf8_lossy` does); an incomplete sequence at the end is left (returns
    /// how many bytes were taken) unless `last`.
    fn utf8(&mut self, bytes: &[u8], last: bool) -> Result<usize, SplitError> {
        let mut i = 0;
        loop {
            match std::str::from_utf8(&bytes[i..]) {
                Ok(valid) => {
                    self.write(valid.as_bytes())?;
                    return Ok(bytes.len());
                }
                Err(error) => {
                    let valid = error.valid_up_to();
                    self.write(&bytes[i..i + valid])?;
                    i += valid;
                    match error.error_len() {
                        Some(n) => i += n,
                        None if !last => return Ok(i),
                        None => i = bytes.len(),
                    }
                    self.lossy.invalid_utf8 += 1;
                    self.write(REPLACEMENT)?;
                }
            }
        }
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), SplitError> {
        self.held.cover(self.len + bytes.len() as u64)?;
        self.out.write_all(bytes)?;
        self.len += bytes.len() as u64;
        Ok(())
    }
}

fn malformed(what: &str) -> SplitError {
    SplitError::Malformed(what.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::stdio::repair;

    /// A spilling answer given up on: in a runtime its file is closed on a blocking thread
    /// and its bytes of the budget go back after; with none, at once. Either way nothing
    /// stays held.
    #[test]
    fn a_spilling_answer_dropped_gives_its_file_and_bytes_back() {
        let budget = crate::SpillBudget::new(1 << 20);
        let spilling = |bytes: u64| {
            let mut held = budget.reserve();
            held.grow(bytes).unwrap();
            Spilling {
                file: Some(tempfile::tempfile().unwrap()),
                held: Some(held),
            }
        };
        drop(spilling(1000));
        assert_eq!(budget.in_use(), 0);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            drop(spilling(2000));
            for _ in 0..200 {
                if budget.in_use() == 0 {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            panic!("{} bytes still held", budget.in_use());
        });
    }

    /// Reads `bytes` in chunks of `size`.
    struct Chunks<'a> {
        bytes: &'a [u8],
        size: usize,
    }

    impl Read for Chunks<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.size.min(buf.len()).min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    /// The answer as the in-memory path reads it: serde, else the repair with its note.
    fn in_memory(line: &[u8]) -> Option<Value> {
        if let Ok(value) = serde_json::from_slice(line) {
            return Some(value);
        }
        let (mut value, note) = repair::repair(line)?;
        repair::record(&mut value, &note);
        Some(value)
    }

    /// The answer split with texts over `text_at` spilled, read in chunks of `chunk`, then
    /// put back together: the rest parsed (and repaired), each spilled text read from its
    /// file into its block, the note of everything replaced in `_meta`. Also how many texts
    /// were spilled.
    fn through_split(line: &[u8], text_at: usize, chunk: usize) -> Option<(Value, usize)> {
        let input = Chunks {
            bytes: line,
            size: chunk,
        };
        let budget = SpillBudget::default();
        let split = split(input, &std::env::temp_dir(), &budget, text_at, usize::MAX).ok()?;
        let (mut value, lossy) = match serde_json::from_slice(&split.rest) {
            Ok(value) => (value, Lossy::default()),
            Err(_) => repair::repair_counted(&split.rest)?,
        };
        let spilled = split.texts.len();
        for (block, text) in split.texts {
            let slot = &mut value["result"]["content"][block]["text"];
            assert_eq!(*slot, json!(text.placeholder()), "block {block}");
            *slot = Value::String(text.read_to_string().unwrap());
        }
        if let Some(note) = lossy.add(split.lossy).note() {
            repair::record(&mut value, &note);
        }
        Some((value, spilled))
    }

    /// A piece of a JSON string's body as written.
    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            4 => "[a-z ]{1,40}".prop_map(String::into_bytes),
            1 => Just(br#"\n\t\"\\\/"#.to_vec()),
            1 => Just(br"\u00e9\u20AC".to_vec()),
            1 => Just(br"\uD83D\uDE00".to_vec()),
            1 => Just(br"\ud83d".to_vec()),
            1 => Just(br"\uDE00".to_vec()),
            1 => Just("é€😀".as_bytes().to_vec()),
            1 => Just(b"\xFF".to_vec()),
            1 => Just(b"\xC3".to_vec()),
            1 => Just(b"\xE2\x82".to_vec()),
        ]
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(piece(), 0..24).prop_map(|pieces| pieces.concat())
    }

    /// A content block: a text block (`type` first or last), or an image.
    fn block() -> impl Strategy<Value = Vec<u8>> {
        (body(), 0..3u8).prop_map(|(body, kind)| {
            let mut out = Vec::new();
            match kind {
                0 => {
                    out.extend_from_slice(br#"{"type":"text","text":""#);
                    out.extend_from_slice(&body);
                    out.extend_from_slice(br#""}"#);
                }
                1 => {
                    out.extend_from_slice(br#"{ "text" : ""#);
                    out.extend_from_slice(&body);
                    out.extend_from_slice(br#"", "type": "text", "_meta": {"text": "x"}}"#);
                }
                _ => {
                    out.extend_from_slice(br#"{"type":"image","mimeType":"image/png","data":""#);
                    out.extend_from_slice(&body);
                    out.extend_from_slice(br#""}"#);
                }
            }
            out
        })
    }

    fn response() -> impl Strategy<Value = Vec<u8>> {
        (prop::collection::vec(block(), 0..5), body(), any::<bool>()).prop_map(
            |(blocks, meta, id_last)| {
                let mut out = Vec::new();
                out.extend_from_slice(if id_last {
                    b"{".as_slice()
                } else {
                    br#"{"jsonrpc":"2.0","id":7,"#
                });
                out.extend_from_slice(br#""result":{"structuredContent":{"text":""#);
                out.extend_from_slice(&meta);
                out.extend_from_slice(br#"","content":[{"text":"nested"}]},"content":["#);
                out.extend_from_slice(&blocks.join(&b',')[..]);
                out.extend_from_slice(b"]}");
                if id_last {
                    out.extend_from_slice(br#","jsonrpc":"2.0","id":7"#);
                }
                out.extend_from_slice(b"}");
                out
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The spilled texts and the rest parsed give what serde plus the repair give in
        /// memory, whatever the chunk boundaries.
        #[test]
        fn splitting_gives_what_serde_and_the_repair_give(
            line in response(),
            text_at in 0usize..48,
            chunk in 1usize..40,
        ) {
            let want = in_memory(&line);
            let got = through_split(&line, text_at, chunk).map(|(value, _)| value);
            prop_assert_eq!(got, want, "{}", String::from_utf8_lossy(&line));
        }
    }

    #[test]
    fn long_texts_of_the_content_alone_are_spilled_and_bad_strings_refused() {
        let long = "x".repeat(100);
        let line = json!({"jsonrpc": "2.0", "id": 1, "result": {
            "structuredContent": {"content": [{"text": long}]},
            "content": [{"type": "text", "text": "short"}, {"type": "text", "text": long},
                        {"type": "resource", "resource": {"uri": "a:b", "text": long}}]}})
        .to_string();
        for chunk in [1, 7, 4096] {
            let (value, spilled) = through_split(line.as_bytes(), 64, chunk).unwrap();
            assert_eq!(spilled, 1, "only content[1].text");
            assert_eq!(value, serde_json::from_str::<Value>(&line).unwrap());
        }
        let budget = SpillBudget::default();
        let small = split(line.as_bytes(), &std::env::temp_dir(), &budget, 64, 300);
        assert!(matches!(small, Err(SplitError::TooLarge)), "{small:?}");
        for bad in [&b"\\x"[..], b"\x01", b"\\u12G4"] {
            let mut line = br#"{"id":1,"result":{"content":[{"type":"text","text":""#.to_vec();
            line.extend_from_slice(&[b'a'; 80]);
            line.extend_from_slice(bad);
            line.extend_from_slice(br#""}]}}"#);
            let refused = split(
                line.as_slice(),
                &std::env::temp_dir(),
                &budget,
                64,
                usize::MAX,
            );
            assert!(
                matches!(refused, Err(SplitError::Malformed(_))),
                "{refused:?}"
            );
            assert!(in_memory(&line).is_none());
        }
    }

    /// `line`, an answer to call 1, read back through [`read_answer`] with the call's slot
    /// open: what the call takes from the tap.
    fn answer_of(line: &str) -> Result<Option<crate::tap::Kept>, Refused> {
        answer_within(line, &SpillBudget::default())
    }

    /// [`answer_of`] with the tap's spill budget `budget`.
    fn answer_within(
        line: &str,
        budget: &SpillBudget,
    ) -> Result<Option<crate::tap::Kept>, Refused> {
        use rmcp::model::{
            CallToolRequest, CallToolRequestParams, ClientRequest, JsonRpcMessage, RequestId,
        };
        let tap = std::sync::Arc::new(crate::tap::Tap::new(std::env::temp_dir(), budget.clone()));
        let request =
            ClientRequest::CallToolRequest(CallToolRequest::new(CallToolRequestParams::new("t")));
        tap.want_request(&JsonRpcMessage::request(request, RequestId::Number(1)));
        let claim = tap.claim(RequestId::Number(1));
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(line.as_bytes()).unwrap();
        use std::io::Seek as _;
        file.rewind().unwrap();
        let mut held = budget.reserve();
        held.grow(line.len() as u64)
            .expect("the answer's file fits the budget");
        read_answer(file, held, &tap)?;
        Ok(claim.take().and_then(Result::ok))
    }

    #[test]
    fn a_repeated_key_or_a_block_that_is_not_text_never_misplaces_a_spilled_text() {
        let (a, b) = (
            "a".repeat(SPILL_TEXT_AT + 10),
            "b".repeat(SPILL_TEXT_AT + 10),
        );
        // A repeated `text` of the same length: serde keeps the last, and so does the split.
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":"{a}","text":"{b}"}}]}}}}"#
        );
        let kept = answer_of(&line).unwrap().unwrap();
        assert_eq!(kept.spilled.len(), 1);
        assert_eq!(kept.spilled[0].block, 0);
        assert_eq!(kept.spilled[0].text.read_to_string().unwrap(), b);

        // A repeated `content` whose later one stands in a placeholder for an earlier text.
        let placeholder = format!(
            "[{} bytes of text, too large to hold in memory: the record log stores it whole]",
            a.len()
        );
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":"{a}"}}],"content":[{{"type":"text","text":"{placeholder}"}}]}}}}"#
        );
        assert!(matches!(answer_of(&line), Err(Refused::Malformed(_))));

        // A long text in a block psych-types does not read as a text block.
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":"{a}","_meta":1}}]}}}}"#
        );
        assert!(matches!(answer_of(&line), Err(Refused::Malformed(_))));
    }

    #[test]
    fn spilled_texts_hold_their_bytes_of_the_budget_until_dropped() {
        let (a, b) = (
            "a".repeat(SPILL_TEXT_AT + 10),
            "b".repeat(3 * SPILL_TEXT_AT),
        );
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":"{a}"}},{{"type":"text","text":"{b}"}}]}}}}"#
        );
        let texts = (a.len() + b.len()) as u64;
        // Room for the answer's file and its texts together (the texts fit in the step of
        // slack past the file).
        let budget = SpillBudget::new(line.len() as u64 + 1024 * 1024);
        let kept = answer_within(&line, &budget).unwrap().unwrap();
        assert_eq!(kept.spilled.len(), 2);
        assert_eq!(budget.in_use(), texts, "exactly the texts' bytes");
        drop(kept);
        assert_eq!(budget.in_use(), 0);

        // Texts that would pass the budget alongside what others hold: refused, nothing kept.
        let other = {
            let mut other = budget.reserve();
            other
                .grow(budget.limit() - line.len() as u64 - 1000)
                .unwrap();
            other
        };
        let refused = answer_within(&line, &budget).map(|kept| kept.is_some());
        assert!(
            matches!(refused, Err(Refused::OverBudget(_))),
            "{refused:?}"
        );
        assert_eq!(
            budget.in_use(),
            other.bytes(),
            "the refused answer holds nothing"
        );
        drop(other);
        assert_eq!(budget.in_use(), 0);
    }

    #[test]
    fn an_unnamed_file_leaves_no_name_behind() {
        let dir = std::env::temp_dir().join(format!("psych-spill-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut file = unnamed_file(&dir).unwrap();
        file.write_all(b"kept while open").unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        drop(file);
        std::fs::remove_dir(&dir).unwrap();
    }
}
