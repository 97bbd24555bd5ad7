//! The events of a POST's `text/event-stream` answer, read as rmcp's client reads them
//! (the `sse_stream` parser's fields, errors and joining of data lines; rmcp's count of an
//! event's size), with three differences:
//!
//! - **An event over the limit that answers a call is kept in a file**, not refused: when
//!   the POST carries a request whose result the [`Tap`] awaits, an event whose size passes
//!   `max_event_size` has its data written to an unnamed file as it arrives (in chunks of
//!   [`WRITE_BUFFER`], each on a blocking thread), up to
//!   [`MAX_SPILLED_ANSWER`](crate::MAX_SPILLED_ANSWER) and within the
//!   [`SpillBudget`] (each byte reserved as it is counted; past the budget the stream fails
//!   with [`EventsError::OverBudget`], and its request with the typed refusal); when the
//!   event ends, the answer is
//!   read back as a spilled stdio line or JSON body is ([`read_answer`]): its long texts
//!   stay in files, its result is kept in the tap, and rmcp gets the tap's stand-in. An
//!   answer that cannot be read back answers its request with what happened
//!   ([`Fault::SpilledUnreadable`]); the stream goes on. Without such a request, an event
//!   over the limit ends the stream with [`EventsError::EventTooLarge`], as rmcp would.
//! - **Invalid UTF-8 in an event's data is repaired**, as a stdio line's is: replaced by
//!   U+FFFD and recorded in the result's `_meta` (`psych/lossy`), where `sse_stream` fails
//!   the stream. Data that does not parse even repaired is still an error. An event over
//!   [`JSON_ON_WORKER`](crate::wire::JSON_ON_WORKER) is repaired on a blocking thread.
//! - **Comment lines are not held**: `sse_stream` buffers a line whole before it looks at
//!   it, so one comment line without an end would grow without bound.
//!
//! # Memory
//!
//! At most one event of `max_event_size` (as rmcp counts it) plus the line being read; a
//! spilled event holds its non-data fields (each line at most `max_event_size`) and one
//! write buffer of [`WRITE_BUFFER`] plus one chunk of the body.
//!
//! # Cancel safety
//!
//! Everything read lives in the stream (the parser, the file, a write in progress): the
//! stream is an `unfold` whose pending future is kept by the stream, so a `next()` dropped
//! at any point loses nothing (`remote::tests::events_survive_next_dropped_at_random_points`
//! and `a_spilled_event_survives_next_dropped_at_random_points`).

use std::collections::VecDeque;
use std::fs::File;
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use rmcp::model::RequestId;
use sse_stream::{Error as SseError, Sse};

use crate::budget::{OverBudget, Reservation, SpillBudget};
use crate::remote::Fault;
use crate::spill::{Refused, WRITE_BUFFER, append, read_answer};
use crate::tap::Tap;

const BOM: &[u8] = b"\xEF\xBB\xBF";
/// A data line of a spilled event longer than this goes to the file as it arrives; a
/// shorter one is taken whole at its end.
const STREAM_LINE_AT: usize = 64 * 1024;

/// Why an event stream ended early (the `Body` error of `sse_stream`'s type, which rmcp's
/// stream carries).
#[derive(Debug, thiserror::Error)]
pub(crate) enum EventsError {
    /// Reading the body failed.
    #[error(transparent)]
    Source(reqwest::Error),
    /// An event was over the limit.
    #[error("SSE event exceeded the maximum size of {max_size} bytes")]
    EventTooLarge { max_size: usize },
    /// The body ended inside an event (the SSE parser drops such an event silently).
    #[error("the stream ended in the middle of an event ({bytes} bytes of it read)")]
    EndedMidEvent { bytes: usize },
    /// An event answering a call, over the memory limit, would have passed the spill
    /// budget in its file: the event's bytes read by then.
    #[error("an event over {} MiB was not kept after {bytes} bytes: {refused}", max >> 20)]
    OverBudget {
        /// The memory limit.
        max: usize,
        /// The event's bytes read when the budget refused more.
        bytes: u64,
        /// The refusal.
        refused: OverBudget,
    },
    /// An event answering a call, over the memory limit, could not be written to a file.
    #[error("an event over {} MiB could not be written to a file in {dir}: {source}", max >> 20)]
    Spill {
        /// The memory limit.
        max: usize,
        /// Where the file was to be.
        dir: String,
        /// What failed.
        source: std::io::Error,
    },
}

/// What an event stream's error says happened to the answer it was to carry.
pub(crate) fn fault_of_stream(error: &SseError) -> Fault {
    if let SseError::Body(body) = error
        && let Some(events) = body.downcast_ref::<EventsError>()
    {
        return match events {
            EventsError::EventTooLarge { max_size } => Fault::EventTooLarge { max: *max_size },
            EventsError::EndedMidEvent { bytes } => Fault::EndedMidEvent { bytes: *bytes },
            EventsError::Source(source) => {
                Fault::Broke(crate::remote::with_causes_of(source.to_string(), source))
            }
            spill @ EventsError::Spill { .. } => Fault::SpilledUnreadable(spill.to_string()),
            EventsError::OverBudget { bytes, refused, .. } => Fault::OverBudget {
                bytes: *bytes,
                refused: *refused,
            },
        };
    }
    Fault::Broke(error.to_string())
}

/// Where an event over the limit goes: the request the POST carries, whose result `tap`
/// awaits (the files are made in the tap's spill folder).
pub(crate) struct SpillTo {
    /// The connection's tap, holding the request's open slot.
    pub(crate) tap: Arc<Tap>,
    /// The request the POST carries.
    pub(crate) id: RequestId,
}

type Events = BoxStream<'static, Result<Sse, SseError>>;

/// The events of `response`, each at most `max_event_size` bytes as rmcp counts them, or,
/// with `spill`, kept in a file past that (see the module docs); the stream ends with an
/// error at the first one it cannot read.
pub(crate) fn events(
    response: reqwest::Response,
    max_event_size: usize,
    spill: Option<SpillTo>,
) -> Events {
    let state = State {
        response: Some(response),
        parser: Parser::new(
            max_event_size,
            spill.as_ref().map(|spill| spill.tap.budget().clone()),
        ),
        file: None,
        shape: crate::wire::ShapeScanner::default(),
        spill,
    };
    futures_util::stream::unfold(Some(state), |state| async move {
        let mut state = state?;
        loop {
            if let Some(out) = state.parser.out.pop_front() {
                match out {
                    Out::Event(event) => return Some((Ok(event), Some(state))),
                    Out::Error(error) => {
                        state.close_spill().await;
                        return Some((Err(error), None));
                    }
                    Out::Write(bytes) => {
                        if let Err(error) = state.write(bytes).await {
                            state.close_spill().await;
                            return Some((Err(error), None));
                        }
                    }
                    Out::Spilled(event, held) => {
                        let event = state.read_back(event, held).await;
                        return Some((Ok(event), Some(state)));
                    }
                    Out::Undecoded(mut event, data, why) => {
                        let decoded = tokio::task::spawn_blocking(move || decode(&data, why))
                            .await
                            .unwrap_or_else(|error| {
                                Err(SseError::Body(Box::new(std::io::Error::other(error))))
                            });
                        return Some(match decoded {
                            Ok(data) => {
                                event.data = Some(data);
                                (Ok(event), Some(state))
                            }
                            Err(error) => (Err(error), None),
                        });
                    }
                }
                continue;
            }
            let response = state.response.as_mut()?;
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let under_way = state.parser.in_event();
                    state.parser.feed(&chunk);
                    // Part of an event on the stream of a call still awaiting its answer
                    // has arrived, or ended one (a keep-alive comment is no answer arriving).
                    if let Some(spill) = &state.spill
                        && (under_way || state.parser.in_event())
                        && spill.tap.awaits(&spill.id)
                    {
                        spill.tap.transfer().note();
                    }
                }
                Ok(None) => {
                    state.response = None;
                    state.parser.finish();
                }
                Err(error) => {
                    return Some((
                        Err(SseError::Body(Box::new(EventsError::Source(error)))),
                        None,
                    ));
                }
            }
        }
    })
    .boxed()
}

/// The stream's state: all of it lives in the stream between polls.
struct State {
    response: Option<reqwest::Response>,
    parser: Parser,
    /// The spilled event's file, while one is being written.
    file: Option<File>,
    /// The shape of the spilled event's data so far: whether it answers the request.
    shape: crate::wire::ShapeScanner,
    spill: Option<SpillTo>,
}

impl Drop for State {
    /// A spilled event's file given up on (the event refused, the stream failed or dropped)
    /// is closed off the worker, then its bytes of the budget go back.
    fn drop(&mut self) {
        drop(crate::spill::close_spilled(
            self.file.take(),
            self.parser.held.take(),
        ));
    }
}

impl State {
    /// Closes a spilled event's file given up on, then gives its bytes of the budget back,
    /// and waits for both: the request it answered is answered with the refusal, and may
    /// be asked again at once.
    async fn close_spill(&mut self) {
        crate::spill::close_spilled_now(self.file.take(), self.parser.held.take()).await;
    }

    /// Appends `bytes` to the spilled event's file (made on the first write), on a blocking
    /// thread.
    async fn write(&mut self, bytes: Vec<u8>) -> Result<(), SseError> {
        let Some(spill) = &self.spill else {
            return Ok(());
        };
        self.shape.feed(&bytes);
        let tap = Arc::clone(&spill.tap);
        let file = self.file.take();
        let written = tokio::task::spawn_blocking(move || append(file, tap.spill_dir(), &bytes))
            .await
            .map_err(std::io::Error::other)
            .and_then(|written| written);
        match written {
            Ok(file) => {
                self.file = Some(file);
                Ok(())
            }
            Err(source) => Err(SseError::Body(Box::new(EventsError::Spill {
                max: self.parser.max,
                dir: spill.tap.spill_dir().display().to_string(),
                source,
            }))),
        }
    }

    /// The spilled event whose fields are `event` (its data in the file), its answer read
    /// back: the message for rmcp (the tap's stand-in when the tap kept its result), or
    /// the error answering the request with why it could not be read.
    async fn read_back(&mut self, mut event: Sse, held: Option<Reservation>) -> Sse {
        let Some(spill) = &self.spill else {
            return event;
        };
        let file = self.file.take();
        let tap = Arc::clone(&spill.tap);
        let bytes = held.as_ref().map_or(0, Reservation::bytes);
        // Read back and written as the event's data there: the message left in memory may
        // be large (the tap keeps a call's result, not an error's nor another message).
        let read = tokio::task::spawn_blocking(move || match (file, held) {
            (Some(file), Some(held)) => {
                read_answer(file, held, &tap).map(|message| serde_json::to_string(&message))
            }
            _ => Err(Refused::Io(std::io::Error::other("no file was written"))),
        })
        .await
        .map_err(|error| Refused::Io(std::io::Error::other(error)))
        .and_then(|read| read);
        // Only the request's answer is answered with why it could not be read back: another
        // message on its stream (a notification, a request of the server's) that cannot be
        // is skipped, and the answer still awaited. Skipped only when known to be another:
        // an answer whose id was not found (written last, after a result cut short) still
        // answers with why.
        let shape = std::mem::take(&mut self.shape).shape();
        let expected = serde_json::to_string(&spill.id).ok();
        let answers = !shape.has_method && shape.id.is_none_or(|id| Some(id) == expected);
        let fault = match read {
            Ok(Ok(data)) => {
                event.data = Some(data);
                return event;
            }
            _ if !answers => {
                event.data = None;
                return event;
            }
            Ok(Err(error)) => Fault::SpilledUnreadable(error.to_string()),
            Err(Refused::OverBudget(refused)) => Fault::OverBudget { bytes, refused },
            Err(Refused::TooComplex) => Fault::TooComplex { bytes },
            Err(refused) => match refused.reason() {
                Some(reason) => Fault::SpilledUnreadable(reason),
                None => Fault::EventTooLarge {
                    max: crate::spill::MAX_IN_MEMORY,
                },
            },
        };
        event.data = Some(fault.answer(&spill.id).to_string());
        event
    }
}

/// What the parser has made of the bytes so far, in order.
enum Out {
    /// An event read whole.
    Event(Sse),
    /// The next bytes of the spilled event's data.
    Write(Vec<u8>),
    /// The spilled event ended: its fields but its data, which is in the file, and the
    /// file's bytes of the budget (held from the event's first spilled byte).
    Spilled(Sse, Option<Reservation>),
    /// An event read whole whose data, over [`JSON_ON_WORKER`](crate::wire::JSON_ON_WORKER)
    /// bytes, is not valid UTF-8: its fields but its data, and the data, to decode (and
    /// repair) on a blocking thread ([`decode`]).
    Undecoded(Sse, Vec<u8>, std::str::Utf8Error),
    /// The stream cannot be read further.
    Error(SseError),
}

/// What the line being read is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// Held in `line` until it ends.
    Held,
    /// A comment: its bytes are not kept.
    Comment,
    /// A data line of a spilled event: its bytes go to the file as they arrive.
    Streamed,
}

/// The event being read.
#[derive(Debug, Default)]
struct Pending {
    /// Whether a field was read (an event of only comments is none).
    started: bool,
    event: Option<String>,
    /// The data lines joined by `\n`, as bytes (checked or repaired at the end); empty
    /// while the data is spilled.
    data: Option<Vec<u8>>,
    id: Option<String>,
    retry: Option<u64>,
}

impl Pending {
    fn into_sse(self, data: Option<String>) -> Sse {
        Sse {
            event: self.event,
            data,
            id: self.id,
            retry: self.retry,
        }
    }
}

/// The event-stream parser: bytes in, [`Out`]s queued.
struct Parser {
    max: usize,
    /// What a spilled event's file may hold, when events may be spilled.
    budget: Option<SpillBudget>,
    /// The spilled event's bytes of the budget, reserved as they are counted.
    held: Option<Reservation>,
    out: VecDeque<Out>,
    line: Vec<u8>,
    kind: Line,
    /// The bytes of the line being read (all of them, held or not).
    line_len: usize,
    /// Whether the line being read is the stream's first (a BOM may open it).
    first_line: bool,
    skip_leading_lf: bool,
    /// rmcp's count of the event's finished lines: each non-comment line and one more.
    retained: usize,
    pending: Pending,
    /// While the event's data goes to a file: the bytes not yet handed out for writing,
    /// and how many were in all.
    spilled: Option<(Vec<u8>, u64)>,
    /// Whether the spilled event had a data line yet (a later one is joined by `\n`).
    spilled_data: bool,
    failed: bool,
}

impl Parser {
    /// Whether an event has begun and not ended (a field read, or a line other than a
    /// comment under way).
    fn in_event(&self) -> bool {
        self.pending.started
            || self.spilled.is_some()
            || (self.line_len > 0 && !matches!(self.kind, Line::Comment))
    }

    /// A parser of events of at most `max` bytes, or, with `spill`, past that with their
    /// data handed out for a file within that budget.
    fn new(max: usize, spill: Option<SpillBudget>) -> Self {
        Self {
            max,
            budget: spill,
            held: None,
            out: VecDeque::new(),
            line: Vec::new(),
            kind: Line::Held,
            line_len: 0,
            first_line: true,
            skip_leading_lf: false,
            retained: 0,
            pending: Pending::default(),
            spilled: None,
            spilled_data: false,
            failed: false,
        }
    }

    fn fail(&mut self, error: SseError) {
        if !self.failed {
            self.failed = true;
            self.out.push_back(Out::Error(error));
        }
    }

    fn too_large(&mut self, max_size: usize) {
        self.fail(SseError::Body(Box::new(EventsError::EventTooLarge {
            max_size,
        })));
    }

    /// The line without the BOM that may open the stream.
    fn line_body(&self) -> &[u8] {
        if self.first_line {
            self.line.strip_prefix(BOM).unwrap_or(&self.line)
        } else {
            &self.line
        }
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        if self.failed || bytes.is_empty() {
            return;
        }
        if self.skip_leading_lf {
            self.skip_leading_lf = false;
            if bytes[0] == b'\n' {
                bytes = &bytes[1..];
            }
        }
        while !bytes.is_empty() && !self.failed {
            match memchr::memchr2(b'\n', b'\r', bytes) {
                None => {
                    self.take_part(bytes);
                    bytes = &[];
                }
                Some(end) => {
                    self.take_part(&bytes[..end]);
                    if self.failed {
                        return;
                    }
                    self.end_line();
                    let delimiter = bytes[end];
                    bytes = &bytes[end + 1..];
                    if delimiter == b'\r' {
                        if bytes.first() == Some(&b'\n') {
                            bytes = &bytes[1..];
                        } else if bytes.is_empty() {
                            self.skip_leading_lf = true;
                        }
                    }
                }
            }
        }
        self.hand_out(WRITE_BUFFER);
    }

    /// Hands the spilled bytes out for writing once there are at least `at` of them.
    fn hand_out(&mut self, at: usize) {
        if let Some((buffer, _)) = &mut self.spilled
            && !buffer.is_empty()
            && buffer.len() >= at
        {
            let bytes = std::mem::take(buffer);
            self.out.push_back(Out::Write(bytes));
        }
    }

    /// Counts `len` more spilled bytes; says whether they are within the cap on a kept
    /// answer (past it, the stream fails).
    fn count_spilled(&mut self, len: usize) -> bool {
        if self.failed {
            return false;
        }
        let Some((_, total)) = &mut self.spilled else {
            return false;
        };
        *total += len as u64;
        let total = *total;
        if total > crate::MAX_SPILLED_ANSWER {
            self.too_large(usize::try_from(crate::MAX_SPILLED_ANSWER).unwrap_or(usize::MAX));
            return false;
        }
        self.reserve(total)
    }

    /// Holds `total` bytes of the budget for the spilled event; past it, the stream fails
    /// (its request answered with the refusal), and what was held goes back.
    fn reserve(&mut self, total: u64) -> bool {
        let Some(held) = self.held.as_mut() else {
            return true;
        };
        let Err(refused) = held.grow(total.saturating_sub(held.bytes())) else {
            return true;
        };
        // What it holds goes back with the stream's state, after the writes queued before
        // the failure, and with its file.
        self.fail(SseError::Body(Box::new(EventsError::OverBudget {
            max: self.max,
            bytes: total,
            refused,
        })));
        false
    }

    /// Adds `bytes` to the spilled data, within the cap on a kept answer.
    fn spill(&mut self, bytes: &[u8]) {
        if self.count_spilled(bytes.len())
            && let Some((buffer, _)) = &mut self.spilled
        {
            buffer.extend_from_slice(bytes);
        }
    }

    /// [`Parser::spill`] for bytes already in a buffer of their own (the spilled ones
    /// before them handed out already), handed out as they are.
    fn spill_owned(&mut self, bytes: Vec<u8>) {
        if self.count_spilled(bytes.len()) && !bytes.is_empty() {
            self.out.push_back(Out::Write(bytes));
        }
    }

    /// Part of a line (no line end in it).
    fn take_part(&mut self, part: &[u8]) {
        if part.is_empty() {
            return;
        }
        let starts = self.line_len == 0;
        self.line_len = self.line_len.saturating_add(part.len());
        match self.kind {
            Line::Comment => return,
            Line::Streamed => {
                self.spill(part);
                return;
            }
            Line::Held => {}
        }
        let before = self.line.len();
        self.line.extend_from_slice(part);
        // A comment is known by its first byte (after the BOM that may open the stream).
        if (starts || (self.first_line && before <= BOM.len()))
            && self.line_body().first() == Some(&b':')
        {
            self.kind = Line::Comment;
            self.line.clear();
            return;
        }
        let over = self.retained.saturating_add(self.line_len) > self.max;
        if self.spilled.is_none() {
            if !over {
                return;
            }
            if self.budget.is_none() || !self.start_spilling() {
                self.too_large(self.max);
                return;
            }
        }
        // Spilling: a long data line goes to the file as it arrives; any other line is
        // held, up to the limit.
        if self.line.len() > STREAM_LINE_AT || over {
            // `data:` alone may be followed by the space to strip: wait for one more byte.
            if let Some(value) = data_value(self.line_body())
                && self.line_body().len() > b"data:".len()
            {
                // The line's own bytes go out, not a copy: it may be the whole limit.
                let start = self.line.len() - value.len();
                let mut value = std::mem::take(&mut self.line);
                value.drain(..start);
                self.join_spilled_line();
                self.hand_out(1);
                self.spill_owned(value);
                self.kind = Line::Streamed;
            } else if self.line.len() > self.max {
                self.too_large(self.max);
            }
        }
    }

    /// Starts keeping the event's data in a file: the data read so far goes first. Says
    /// whether it could (an event with no data so far is over the limit in fields that
    /// cannot be spilled, unless the line being read is a data line).
    fn start_spilling(&mut self) -> bool {
        let data = self.pending.data.take();
        if data.is_none() && data_value(self.line_body()).is_none() {
            return false;
        }
        self.spilled_data = data.is_some();
        let data = data.unwrap_or_default();
        let len = data.len() as u64;
        self.spilled = Some((data, len));
        self.pending.started = true;
        self.held = self.budget.as_ref().map(SpillBudget::reserve);
        // Refused, the stream has failed: nothing more is read, and it was "spilling".
        self.reserve(len);
        true
    }

    /// A `\n` before a data line of a spilled event that had one.
    fn join_spilled_line(&mut self) {
        if self.spilled_data {
            self.spill(b"\n");
        }
        self.spilled_data = true;
    }

    fn end_line(&mut self) {
        let kind = std::mem::replace(&mut self.kind, Line::Held);
        let len = std::mem::take(&mut self.line_len);
        let mut line = std::mem::take(&mut self.line);
        let first = std::mem::replace(&mut self.first_line, false);
        match kind {
            Line::Comment => {}
            Line::Streamed => self.retained = self.retained.saturating_add(len + 1),
            Line::Held => {
                let body = if first {
                    line.strip_prefix(BOM).unwrap_or(&line)
                } else {
                    &line[..]
                };
                if body.is_empty() {
                    self.dispatch();
                } else {
                    self.retained = self.retained.saturating_add(len + 1);
                    if let Err(error) = self.field(body) {
                        self.fail(error);
                    }
                }
            }
        }
        line.clear();
        self.line = line;
        if self.spilled.is_none()
            && self.retained > self.max
            && !(self.budget.is_some() && self.start_spilling())
        {
            self.too_large(self.max);
        }
    }

    /// One field line, as `sse_stream` reads it.
    fn field(&mut self, line: &[u8]) -> Result<(), SseError> {
        let Some(colon) = memchr::memchr(b':', line) else {
            return Err(SseError::InvalidLine);
        };
        let name = &line[..colon];
        let value = &line[colon + 1..];
        let value = value.strip_prefix(b" ").unwrap_or(value);
        let text = || std::str::from_utf8(value).map_err(SseError::Utf8Parse);
        match name {
            b"data" => {
                self.pending.started = true;
                if self.spilled.is_some() {
                    self.join_spilled_line();
                    self.spill(value);
                } else if let Some(data) = &mut self.pending.data {
                    data.push(b'\n');
                    data.extend_from_slice(value);
                } else {
                    self.pending.data = Some(value.to_vec());
                }
            }
            b"event" => {
                let event = text()?.to_owned();
                self.pending.started = true;
                if self.pending.event.replace(event).is_some() {
                    return Err(SseError::DuplicatedEventLine);
                }
            }
            b"id" => {
                // A value holding NUL is ignored, as the SSE spec says.
                if memchr::memchr(0, value).is_some() {
                    return Ok(());
                }
                let id = text()?.to_owned();
                self.pending.started = true;
                if self.pending.id.replace(id).is_some() {
                    return Err(SseError::DuplicatedIdLine);
                }
            }
            b"retry" => {
                let retry = text()?
                    .trim_ascii()
                    .parse::<u64>()
                    .map_err(SseError::IntParse)?;
                self.pending.started = true;
                if self.pending.retry.replace(retry).is_some() {
                    return Err(SseError::DuplicatedRetry);
                }
            }
            b"" => {}
            _ => return Err(SseError::InvalidLine),
        }
        Ok(())
    }

    /// A blank line: the event read goes out.
    fn dispatch(&mut self) {
        self.retained = 0;
        let mut pending = std::mem::take(&mut self.pending);
        if self.spilled.is_some() {
            self.hand_out(1);
            self.spilled = None;
            self.spilled_data = false;
            let held = self.held.take();
            self.out
                .push_back(Out::Spilled(pending.into_sse(None), held));
            return;
        }
        if !pending.started {
            return;
        }
        let data = match pending.data.take().map(String::from_utf8) {
            None => None,
            Some(Ok(data)) => Some(data),
            // A repair parses the whole event and writes it again: a large one's on a
            // blocking thread, as the stream hands it out.
            Some(Err(error)) if error.as_bytes().len() > crate::wire::JSON_ON_WORKER => {
                let why = error.utf8_error();
                let data = error.into_bytes();
                self.out
                    .push_back(Out::Undecoded(pending.into_sse(None), data, why));
                return;
            }
            Some(Err(error)) => match decode(error.as_bytes(), error.utf8_error()) {
                Ok(data) => Some(data),
                Err(error) => {
                    self.fail(error);
                    return;
                }
            },
        };
        self.out.push_back(Out::Event(pending.into_sse(data)));
    }

    /// The body ended: an event cut short is an error (`sse_stream` would drop it), its
    /// size counted as rmcp counts it (a comment line being read included).
    fn finish(&mut self) {
        let bytes = self.retained.saturating_add(self.line_len);
        if bytes > 0 {
            self.fail(SseError::Body(Box::new(EventsError::EndedMidEvent {
                bytes,
            })));
        }
    }
}

/// An event's data that is not valid UTF-8, as rmcp gets it: a JSON-RPC message repaired
/// (its invalid bytes replaced, and said in the message), or, with too many values to
/// parse for a repair, the data lossily decoded as it is (for the tap's transport to
/// answer its request without parsing it); else the stream's error, `why` the data is not
/// UTF-8. Parses the whole data: blocks for a large one.
fn decode(data: &[u8], why: std::str::Utf8Error) -> Result<String, SseError> {
    if crate::wire::too_complex(data) {
        return Ok(String::from_utf8_lossy(data).into_owned());
    }
    match crate::stdio::repair::repair(data) {
        Some((mut message, note)) => {
            crate::stdio::repair::record(&mut message, &note);
            Ok(message.to_string())
        }
        None => Err(SseError::Utf8Parse(why)),
    }
}

/// The value of a data line (`data:` and one space stripped), if `line` is one.
fn data_value(line: &[u8]) -> Option<&[u8]> {
    let value = line.strip_prefix(b"data:")?;
    Some(value.strip_prefix(b" ").unwrap_or(value))
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on bad data")]

    use std::task::Poll;

    use http_body_util::StreamBody;
    use hyper::body::{Bytes, Frame};
    use proptest::prelude::*;
    use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest, JsonRpcMessage};
    use serde_json::{Value, json};

    use super::*;

    /// A deterministic xorshift: the same "random" points on every run.
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            usize::try_from(self.0 % n as u64).unwrap()
        }
    }

    /// A response whose body is `wire`, sent in chunks of 1 B to 16 KiB by another task
    /// with a yield between chunks.
    pub(crate) fn response_of(wire: Vec<u8>, seed: u64) -> reqwest::Response {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        tokio::spawn(async move {
            let mut rng = Rng(seed);
            let mut at = 0;
            while at < wire.len() {
                let end = (at + 1 + rng.below(16 * 1024)).min(wire.len());
                if tx
                    .send(Bytes::copy_from_slice(&wire[at..end]))
                    .await
                    .is_err()
                {
                    return;
                }
                at = end;
                tokio::task::yield_now().await;
            }
        });
        let chunks = futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx)
                .map(|chunk| chunk.map(|c| Ok::<_, std::io::Error>(Frame::data(c))))
        });
        http::Response::new(reqwest::Body::wrap(StreamBody::new(chunks))).into()
    }

    /// What the parser makes of `wire` fed in `chunks`: each event (`Spilled` ones with
    /// their written data as their data), then the first error.
    fn parse(wire: &[u8], chunks: &[usize], max: usize, may_spill: bool) -> Vec<String> {
        let mut parser = Parser::new(max, may_spill.then(SpillBudget::default));
        let mut at = 0;
        for &len in chunks.iter().chain(std::iter::once(&usize::MAX)) {
            let end = at + len.min(wire.len() - at);
            parser.feed(&wire[at..end]);
            at = end;
            if at == wire.len() {
                break;
            }
        }
        parser.finish();
        let mut read = Vec::new();
        let mut written = Vec::new();
        for out in parser.out {
            match out {
                Out::Event(event) => read.push(format!("{event:?}")),
                Out::Write(bytes) => written.extend(bytes),
                Out::Spilled(mut event, _) => {
                    event.data = Some(String::from_utf8(std::mem::take(&mut written)).unwrap());
                    read.push(format!("spilled {event:?}"));
                }
                Out::Error(error) => read.push(format!("error: {error}")),
                // As the stream does on a blocking thread.
                Out::Undecoded(mut event, data, why) => match decode(&data, why) {
                    Ok(data) => {
                        event.data = Some(data);
                        read.push(format!("{event:?}"));
                    }
                    Err(error) => read.push(format!("error: {error}")),
                },
            }
        }
        read
    }

    /// What `sse_stream` (with rmcp's count of an event's size before it, as psych-mcp
    /// had it) makes of the same: its events, then its first error.
    fn reference(wire: &[u8], chunks: &[usize]) -> Vec<String> {
        let mut parts = Vec::new();
        let mut at = 0;
        for &len in chunks {
            if at == wire.len() {
                break;
            }
            let end = at + len.min(wire.len() - at);
            parts.push(Ok::<_, std::io::Error>(Bytes::copy_from_slice(
                &wire[at..end],
            )));
            at = end;
        }
        if at < wire.len() {
            parts.push(Ok(Bytes::copy_from_slice(&wire[at..])));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut events =
                sse_stream::SseStream::from_bytes_stream(futures_util::stream::iter(parts));
            let mut read = Vec::new();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => read.push(format!("{event:?}")),
                    Err(error) => {
                        read.push(format!("error: {error}"));
                        break;
                    }
                }
            }
            read
        })
    }

    #[test]
    fn an_event_is_counted_as_rmcp_counts_it() {
        // A comment line is not kept; a blank line (LF, CR or CRLF) starts a new event.
        let wire = b": note\ndata: 12\n\ndata: 1\r\n\r\ndata: 12345\n\n";
        let read = parse(wire, &[3, 5, 7], 10, false);
        assert_eq!(read.len(), 3, "{read:?}");
        assert_eq!(
            read[2],
            "error: body error: SSE event exceeded the maximum size of 10 bytes"
        );
        // A comment line of any length holds nothing and counts for nothing.
        let mut wire = b":".to_vec();
        wire.extend(std::iter::repeat_n(b'x', 1 << 20));
        wire.extend_from_slice(b"\ndata: 1\n\n");
        let mut parser = Parser::new(10, None);
        for chunk in wire.chunks(1000) {
            parser.feed(chunk);
            assert!(parser.line.capacity() <= 1000);
        }
        assert!(matches!(parser.out.pop_front(), Some(Out::Event(_))));
    }

    #[test]
    fn a_cut_event_is_said_with_its_size() {
        let read = parse(b"data: whole\n\ndata: cut", &[4], 1 << 20, false);
        assert_eq!(
            read[1],
            "error: body error: the stream ended in the middle of an event (9 bytes of it read)"
        );
        assert_eq!(read.len(), 2);
    }

    #[test]
    fn invalid_utf8_in_a_message_is_repaired_and_said() {
        let wire = b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"a\xffb\"}]}}\n\n";
        let mut parser = Parser::new(1 << 20, None);
        parser.feed(wire);
        let Some(Out::Event(event)) = parser.out.pop_front() else {
            panic!("no event");
        };
        let message: Value = serde_json::from_str(event.data.as_deref().unwrap()).unwrap();
        assert_eq!(message["result"]["content"][0]["text"], "a\u{fffd}b");
        assert!(
            message["result"]["_meta"]["psych/lossy"].is_string(),
            "{message}"
        );
        // Not a message: still an error.
        let read = parse(b"data: \xff\n\n", &[], 1 << 20, false);
        assert!(read[0].starts_with("error: utf8 parse error"), "{read:?}");
    }

    /// An event over 1 MiB whose data is not UTF-8 is handed out undecoded, for the stream
    /// to repair on a blocking thread (a repair parses and writes the whole event: tens of
    /// milliseconds at 16 MiB); it is repaired there as a small one is, or is the same
    /// error. (Before, the parser repaired it inside the stream's poll, on the worker.)
    #[test]
    fn a_large_event_not_in_utf8_is_decoded_off_the_worker() {
        let text = format!("a_{}", "b".repeat(2 << 20));
        let mut wire =
            br#"data: {"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":""#
                .to_vec();
        wire.extend_from_slice(text.as_bytes());
        // One byte that is not UTF-8 in place of the `_`.
        let bad = wire.len() - text.len() + 1;
        wire[bad] = 0xff;
        wire.extend_from_slice(b"\"}]}}\n\n");
        let mut parser = Parser::new(4 << 20, None);
        parser.feed(&wire);
        let Some(Out::Undecoded(_, data, why)) = parser.out.pop_front() else {
            panic!("not decoded in the parser");
        };
        let message: Value = serde_json::from_str(&decode(&data, why).unwrap()).unwrap();
        let repaired = message["result"]["content"][0]["text"].as_str().unwrap();
        assert!(repaired.starts_with("a\u{fffd}bbb"), "{:.20}", repaired);
        assert!(message["result"]["_meta"]["psych/lossy"].is_string());
        let mut wire = b"data: \xff".to_vec();
        wire.extend(std::iter::repeat_n(b'x', 2 << 20));
        wire.extend_from_slice(b"\n\n");
        let read = parse(&wire, &[], 4 << 20, false);
        assert!(
            read[0].starts_with("error: utf8 parse error"),
            "{:.80}",
            read[0]
        );
    }

    /// An event repaired on a blocking thread ([`Out::Undecoded`]) between two others, the
    /// stream's `next()` polled once and dropped whenever it is pending (the repair under
    /// way included): every event comes, in order, the repaired one whole.
    #[tokio::test]
    async fn an_event_repaired_off_the_worker_survives_next_dropped_at_random_points() {
        let text = format!("a_{}", "b".repeat(2 << 20));
        let mut wire =
            b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n".to_vec();
        wire.extend_from_slice(
            br#"data: {"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":""#,
        );
        let bad = wire.len() + 1;
        wire.extend_from_slice(text.as_bytes());
        wire[bad] = 0xff;
        wire.extend_from_slice(b"\"}]}}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\n");
        let events = events(response_of(wire, 21), 4 << 20, None);
        let read = read_dropping_next(events, 22).await;
        assert_eq!(read.len(), 3);
        let repaired: Value = serde_json::from_str(read[1].data.as_deref().unwrap()).unwrap();
        let repaired_text = repaired["result"]["content"][0]["text"].as_str().unwrap();
        assert_eq!(repaired_text.len(), text.len() + 2, "the U+FFFD is 3 bytes");
        assert!(repaired_text.starts_with("a\u{fffd}bbb"));
        assert_eq!(
            read[2].data.as_deref(),
            Some(r#"{"jsonrpc":"2.0","id":2,"result":{}}"#)
        );
    }

    /// SSE-like text from pieces that exercise every field, line end and error.
    fn wire() -> impl Strategy<Value = Vec<u8>> {
        let line = prop_oneof![
            Just(b"data: x".to_vec()),
            Just(b"data:y z".to_vec()),
            Just(b"data".to_vec()),
            Just(b"data:".to_vec()),
            Just(b"event: e".to_vec()),
            Just(b"id: 1".to_vec()),
            Just(b"id: a\0b".to_vec()),
            Just(b"retry: 30".to_vec()),
            Just(b"retry: x".to_vec()),
            Just(b": a comment".to_vec()),
            Just(b"bogus: 1".to_vec()),
            Just(b"data: \xc3\xa9".to_vec()),
            Just(Vec::new()),
            Just(Vec::new()),
            "[a-z :]{0,12}".prop_map(String::into_bytes),
        ];
        let end = prop_oneof![Just(&b"\n"[..]), Just(&b"\r"[..]), Just(&b"\r\n"[..])];
        (any::<bool>(), proptest::collection::vec((line, end), 0..16)).prop_map(|(bom, lines)| {
            let mut wire = if bom { BOM.to_vec() } else { Vec::new() };
            for (line, end) in lines {
                wire.extend(line);
                wire.extend_from_slice(end);
            }
            wire
        })
    }

    proptest! {
        /// Under the limit, the parser reads what `sse_stream` reads: the same events and
        /// the same first error, however the bytes are cut.
        #[test]
        fn events_under_the_limit_read_as_sse_stream_reads_them(
            wire in wire(),
            chunks in proptest::collection::vec(1usize..8, 0..64),
        ) {
            let ours = parse(&wire, &chunks, 1 << 20, true);
            let theirs = reference(&wire, &chunks);
            // At the end, a cut event is an error of ours (sse_stream drops it silently).
            let ours: Vec<String> = ours
                .into_iter()
                .filter(|read| !read.contains("ended in the middle of an event"))
                .collect();
            match theirs.last() {
                Some(error) if error.starts_with("error: ") => {
                    // sse_stream reports an error in a chunk before the events read from
                    // the same chunk; this parser keeps the stream's order. The same
                    // error ends both, and what sse_stream gave before it is ours too.
                    prop_assert_eq!(ours.last(), Some(error));
                    let before = &theirs[..theirs.len() - 1];
                    prop_assert_eq!(&ours[..before.len()], before);
                }
                _ => prop_assert_eq!(ours, theirs),
            }
        }
    }

    #[test]
    fn an_event_over_the_limit_goes_out_in_writes_with_its_fields() {
        let mut wire = Vec::from(&b"\xEF\xBB\xBFevent: message\r\ndata: first\r\n"[..]);
        wire.extend_from_slice(b"id: 9\ndata: ");
        let long = "0123456789".repeat(30_000);
        wire.extend_from_slice(long.as_bytes());
        wire.extend_from_slice(b"\n: comment\ndata:last\n\ndata: small\n\n");
        for chunks in [vec![], vec![1], vec![7, 3, 1000], vec![65_536]] {
            let read = parse(&wire, &chunks, 100, true);
            assert_eq!(read.len(), 2, "{chunks:?}: {read:?}");
            let expected = Sse {
                event: Some("message".into()),
                data: Some(format!("first\n{long}\nlast")),
                id: Some("9".into()),
                retry: None,
            };
            assert!(read[0] == format!("spilled {expected:?}"), "{chunks:?}");
            assert_eq!(read[1], format!("{:?}", Sse::default().data("small")));
            // Without a call awaiting it, the same event is refused.
            let read = parse(&wire, &chunks, 100, false);
            assert_eq!(
                read,
                ["error: body error: SSE event exceeded the maximum size of 100 bytes"]
            );
        }
        // Over the limit in fields alone: refused, call or not.
        let mut wire = b"id: ".to_vec();
        wire.extend(std::iter::repeat_n(b'1', 200));
        let read = parse(&wire, &[], 100, true);
        assert_eq!(
            read,
            ["error: body error: SSE event exceeded the maximum size of 100 bytes"]
        );
    }

    fn call(id: i64) -> rmcp::model::ClientJsonRpcMessage {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("echo"),
        ));
        JsonRpcMessage::request(request, RequestId::Number(id))
    }

    /// Every event of `events`, each `next()` polled once and dropped if pending, 0 to 2
    /// yields between (`seed` picks them); more than 20 dropped. Panics on an error.
    async fn read_dropping_next(mut events: Events, seed: u64) -> Vec<Sse> {
        let mut rng = Rng(seed);
        let (mut read, mut dropped) = (Vec::new(), 0);
        loop {
            let item = match futures_util::poll!(events.next()) {
                Poll::Ready(item) => item,
                Poll::Pending => {
                    dropped += 1;
                    for _ in 0..rng.below(3) {
                        tokio::task::yield_now().await;
                    }
                    continue;
                }
            };
            match item {
                Some(Ok(event)) => read.push(event),
                Some(Err(error)) => panic!("{error}"),
                None => break,
            }
        }
        assert!(dropped > 20, "only {dropped} futures dropped");
        read
    }

    // One thread: the reader and the writer take turns, so reads are often pending.
    #[tokio::test]
    async fn a_spilled_event_survives_next_dropped_at_random_points() {
        let tap = Arc::new(Tap::default());
        tap.want_request(&call(7));
        let claim = tap.claim(RequestId::Number(7));
        let text: String = (0..60_000).map(|i| format!("line {i}: é\n")).collect();
        let answer = json!({
            "jsonrpc": "2.0", "id": 7,
            "result": {"content": [{"type": "text", "text": text}], "isError": false},
        });
        let mut wire = Vec::new();
        for i in 0..3 {
            let progress = json!({
                "jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": 1, "progress": i},
            });
            wire.extend_from_slice(format!("data: {progress}\n\n").as_bytes());
        }
        wire.extend_from_slice(format!("id: 4\ndata: {answer}\r\n\r\n").as_bytes());
        let spill = SpillTo {
            tap: Arc::clone(&tap),
            id: RequestId::Number(7),
        };
        let events = events(response_of(wire, 11), 64 * 1024, Some(spill));
        let read = read_dropping_next(events, 12).await;
        assert_eq!(read.len(), 4);
        // rmcp gets the stand-in; the tap holds the result, its text in a file.
        let stand_in: Value = serde_json::from_str(read[3].data.as_deref().unwrap()).unwrap();
        assert_eq!(stand_in["result"], json!({"content": []}));
        assert_eq!(read[3].id.as_deref(), Some("4"));
        let kept = claim.take().unwrap().unwrap();
        assert_eq!(kept.spilled.len(), 1);
        let file = &kept.spilled[0].text;
        assert_eq!(file.len(), text.len() as u64);
        let mut back = vec![0; text.len()];
        assert_eq!(file.read_at(0, &mut back).unwrap(), text.len());
        assert!(back == text.as_bytes(), "the text read back differs");
        assert_eq!(kept.value["isError"], false);
    }

    /// The events of `wire` (in 5-byte chunks, 1 KiB held in memory) on the stream of a
    /// call of id 3 whose answer the tap awaits.
    async fn read_for_call_3(wire: Vec<u8>) -> Vec<Result<Sse, SseError>> {
        let tap = Arc::new(Tap::default());
        tap.want_request(&call(3));
        let spill = SpillTo {
            tap,
            id: RequestId::Number(3),
        };
        events(response_of(wire, 5), 1024, Some(spill))
            .collect()
            .await
    }

    #[tokio::test]
    async fn a_spilled_answer_that_does_not_parse_fails_its_call_and_the_stream_goes_on() {
        let mut wire = b"data: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[".to_vec();
        wire.extend(std::iter::repeat_n(b'x', 200_000));
        wire.extend_from_slice(b"]}}\n\ndata: after\n\n");
        let read = read_for_call_3(wire).await;
        assert_eq!(read.len(), 2);
        let fault: Value =
            serde_json::from_str(read[0].as_ref().unwrap().data.as_deref().unwrap()).unwrap();
        assert_eq!(fault["id"], 3);
        let message = fault["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("the answer, kept in a file for its size, is unreadable:"),
            "{message}"
        );
        assert_eq!(read[1].as_ref().unwrap().data.as_deref(), Some("after"));
    }

    /// An event over the limit on a call's stream that is not its answer (a server's
    /// notification), and cannot be read back, is skipped: the answer after it still
    /// answers the call. (Before, the call was failed with the notification's fault.)
    #[tokio::test]
    async fn a_spilled_event_that_is_not_the_answer_never_fails_the_call() {
        let mut wire =
            b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":["
                .to_vec();
        wire.extend(std::iter::repeat_n(b'x', 200_000));
        wire.extend_from_slice(b"]}}\n\n");
        let answer = json!({"jsonrpc": "2.0", "id": 3, "result": {"content": []}});
        wire.extend_from_slice(format!("data: {answer}\n\n").as_bytes());
        let read = read_for_call_3(wire).await;
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].as_ref().unwrap().data, None, "skipped, not a fault");
        let answered: Value =
            serde_json::from_str(read[1].as_ref().unwrap().data.as_deref().unwrap()).unwrap();
        assert_eq!(answered, answer);
    }
}
