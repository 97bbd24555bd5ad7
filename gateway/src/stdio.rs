//! The stdio client's transport: newline-delimited JSON-RPC over stdin and stdout, where
//! every line the client sends gets an answer or reaches the session (issue 29).
//!
//! rmcp's own stdio transport (3.11) drops a line that is not JSON without a word (invalid
//! JSON, nesting past serde_json's recursion limit) and drops a line over its length cap
//! the same way, so a client that sent one waits for an answer forever. (Valid JSON of the
//! wrong shape, such as a batch array, it does answer, with -32600 and never an `id`.)
//! [`StdioTransport`] answers each such line itself, and the session never sees it:
//!
//! - a line that is not JSON (a syntax error, cut short, or nested deeper than serde_json's
//!   recursion limit of 128: a line of 100,000 `[` is refused there, without a deep
//!   recursion) is answered with a parse error (-32700) without an `id`;
//! - JSON that is not one JSON-RPC message (a batch array, an object without `method`) is
//!   answered with an invalid request (-32600), with the object's `id` when it has one a
//!   request id can be read from. An object with a `method` and no `id` is a notification,
//!   never answered (JSON-RPC 2.0), and is dropped, as rmcp drops notifications it does
//!   not know;
//! - a line longer than [`MAX_LINE`] is read past as it streams, never held whole (memory:
//!   the line up to [`MAX_LINE`], plus the read buffer, and a KiB of scanner that reads its
//!   top-level `id` and `method` as they go by, first or last), and answered with an
//!   invalid request (-32600, "request too large") for its `id` when it is a request (a
//!   notification is dropped; an answer is answered without an `id`);
//! - a line of more than [`MAX_REQUEST_STRUCTURAL_BYTES`] structural bytes is not parsed
//!   (what it would take parsed grows with its values, not its bytes) and is answered
//!   with an invalid request (-32600, [`TOO_COMPLEX`]), with its top-level `id` when it
//!   is a request whose id can be read without parsing it (a notification is dropped);
//! - an empty or blank line is skipped;
//! - before the request that chooses the session's lifecycle (an `initialize`, or a
//!   request of MCP 2026-07-28 with its `_meta`; not a `ping` or `server/discover`), a
//!   notification or an answer is dropped: rmcp's handshake would end the session on it.
//!
//! Without an `id` rmcp's error message leaves the member out (MCP 2026-07-28, "Error
//! Responses"), rather than writing `"id": null`.
//!
//! Answering bad input has a risk rmcp names as the reason it stays silent (rust-sdk issue
//! #938): a peer that echoes what it is sent as more bad input makes an error storm. The
//! answers are capped at [`REPLIES_PER_SECOND`]; past the cap a bad line is dropped and
//! counted, and the next answer sent carries the count as `data.unanswered` (lines answered
//! by nobody since the last answer).
//!
//! # Requests in flight
//!
//! A request passed to the session is in flight until its answer has been written out (or
//! the client cancels it before it is answered: rmcp then sends no answer; an answer being
//! written counts whatever the client says, see [`InFlight`]). At most [`MAX_IN_FLIGHT`]
//! are; a request past that is answered at once with an error (-32000, "too many requests
//! in flight"), and one whose id is that of a request waiting for its answer with an
//! invalid request (-32600), and neither reaches the session, while notifications and the
//! client's answers still pass. Each answer waiting to be written holds its bytes (a `tools/list` of some
//! tens of KB, a resource page of up to 16 MiB), so a client that writes requests and
//! never reads its stdout holds at most [`MAX_IN_FLIGHT`] answers in the gateway, not one
//! per request it wrote; and the error answers go out before the next line is read, so such
//! a client is read no further until it reads. Refused rather than left unread, so that a
//! client whose requests wait on a message it sends later (a cancellation, an answer to an
//! elicitation) is still heard. Progress and logging notifications waiting to be written
//! are bounded apart ([`MAX_WAITING_NOTIFICATIONS`]; one past it is dropped).
//!
//! # Cancel safety
//!
//! rmcp's service loop awaits [`Transport::receive`] inside a `select!` and drops it
//! whenever another branch is ready first, and runs each `send` as a task of its own,
//! aborted when the service ends. Neither loses or tears a message when dropped at any
//! await:
//!
//! - `receive` keeps every byte it has taken from its reader in the transport (the line so
//!   far, whether the line is over the limit), as psych-mcp's reader of a server's stdout
//!   does (issue 27): the only await of the read is `fill_buf`, which takes nothing when
//!   dropped, and the copy into the line and `consume` follow it with no await between. A
//!   dropped `receive` is resumed by the next call where it stopped. A line over
//!   [`JSON_ON_WORKER`] is parsed on a blocking thread, its handle kept in the transport
//!   and awaited before anything else is read, so a dropped `receive` finds it again and
//!   lines keep their order.
//! - Written bytes go through one queue behind a lock. A message is serialized whole
//!   first (one over a MiB on a blocking thread), then appended to the queue under the
//!   lock in one step, so two messages never interleave; the queue is written out with `write` calls whose progress is recorded as
//!   each returns, so a writer dropped mid-way leaves the rest queued, and whoever writes
//!   next (a `send`, or `receive` answering a bad line) writes it first. An answer
//!   `receive` has decided on is kept in the transport until it is queued.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use psych_mcp::InFlight;
use psych_mcp::wire::JSON_ON_WORKER;
use rmcp::RoleServer;
use rmcp::model::{
    ClientJsonRpcMessage, ErrorData, RequestId, ServerJsonRpcMessage, ServerNotification,
};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

use crate::MAX_REQUEST_STRUCTURAL_BYTES;

/// The longest line read from the client, in bytes (without its `\n`): 4 MiB. A longer
/// line is answered with an error and not kept. A request holds tool arguments, not
/// results, so a legitimate one is far smaller; the bound keeps a client's line from
/// taking the gateway's memory.
pub(crate) const MAX_LINE: usize = 4 * 1024 * 1024;

/// The error message answering a line past [`MAX_REQUEST_STRUCTURAL_BYTES`].
pub(crate) const TOO_COMPLEX: &str = "request too complex: over 262144 brackets, braces, commas \
                                      and colons (outside strings), more than the gateway parses";

/// The most bad lines answered in one second; past it, bad lines are dropped and counted
/// (see the module docs, on error storms).
pub(crate) const REPLIES_PER_SECOND: u32 = 16;

/// The most requests of the client in flight at once (see the module docs): a client
/// rarely has more than a few calls running, and past this one is refused, not queued.
pub(crate) const MAX_IN_FLIGHT: usize = psych_mcp::MAX_PEER_REQUESTS;

/// The read buffer: a pipe's default capacity, so one read takes what a writer can queue.
const READ_BUFFER: usize = 64 * 1024;

/// How long closing waits to write out what is still queued (the rest of a message whose
/// send was dropped) before it gives up on a client that does not read.
const CLOSE_WITHIN: Duration = Duration::from_secs(2);

/// A write queue's buffer is given back when it grew past this once written.
const KEEP_QUEUE: usize = 1024 * 1024;

/// The gateway's transport to its one stdio client: JSON-RPC messages, one per line, read
/// from `R` (stdin) and written to `W` (stdout). See the module docs for what it answers
/// itself and why it is cancel-safe.
pub(crate) struct StdioTransport<R, W> {
    reader: BufReader<R>,
    /// The longest line kept ([`MAX_LINE`]).
    limit: usize,
    /// The line read so far (empty while it is over the limit).
    line: Vec<u8>,
    /// Whether the current line is over the limit (its bytes are read past).
    too_long: bool,
    /// The shape of the line read past (its top-level `id` and `method`), found as its
    /// bytes go by: what answers it.
    too_long_shape: psych_mcp::wire::ShapeScanner,
    /// Whether the reader has ended.
    ended: bool,
    /// The parse of a line over [`JSON_ON_WORKER`], on a blocking thread: kept here so
    /// that a `receive` dropped while it runs loses nothing.
    parsing: Option<tokio::task::JoinHandle<Classified>>,
    /// An answer to a bad line, decided and not yet queued for writing.
    reply: Option<ServerJsonRpcMessage>,
    /// Whether an answer was queued and may not be written out yet (its write dropped).
    draining: bool,
    cap: ReplyCap,
    out: Arc<Mutex<Out<W>>>,
    /// The requests passed to the session whose answers are not written out yet.
    in_flight: Arc<InFlight>,
    /// How many notifications wait to be written out ([`MAX_WAITING_NOTIFICATIONS`] at
    /// most: one past it is dropped).
    notifications: Arc<std::sync::atomic::AtomicUsize>,
    /// Whether a request has been passed to the session: before one, a notification or
    /// an answer is dropped (see [`StdioTransport::pass`]).
    started: bool,
    /// Called once, when the input ends.
    on_end: Option<Box<dyn FnOnce() + Send>>,
}

impl<R, W> StdioTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// A transport reading messages from `reader` and writing them to `writer`.
    pub(crate) fn new(reader: R, writer: W) -> Self {
        Self {
            reader: BufReader::with_capacity(READ_BUFFER, reader),
            limit: MAX_LINE,
            line: Vec::new(),
            too_long: false,
            too_long_shape: psych_mcp::wire::ShapeScanner::default(),
            ended: false,
            parsing: None,
            reply: None,
            draining: false,
            cap: ReplyCap::new(REPLIES_PER_SECOND),
            out: Arc::new(Mutex::new(Out {
                writer: Some(writer),
                queue: Vec::new(),
                written: 0,
            })),
            in_flight: InFlight::new(MAX_IN_FLIGHT),
            notifications: Arc::default(),
            started: false,
            on_end: None,
        }
    }

    /// Calls `on_end` once the input has ended (the client closed it, or it failed).
    pub(crate) fn on_end(mut self, on_end: impl FnOnce() + Send + 'static) -> Self {
        self.on_end = Some(Box::new(on_end));
        self
    }

    /// The next line, without its `\n`; `None` at the end of the input (a last line
    /// without `\n` is still returned). Cancel-safe (see the module docs).
    async fn next_line(&mut self) -> io::Result<Option<Line>> {
        loop {
            let available = self.reader.fill_buf().await?;
            // From here to the end of the iteration there is no await.
            if available.is_empty() {
                if std::mem::take(&mut self.too_long) {
                    return Ok(Some(Line::TooLong(self.too_long_shape.shape())));
                }
                if self.line.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(Line::Whole(std::mem::take(&mut self.line))));
            }
            let (len, used, end) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => (i, i + 1, true),
                None => (available.len(), available.len(), false),
            };
            if self.too_long {
                self.too_long_shape.feed(&available[..len]);
            } else {
                let wanted = self.line.len() + len;
                if wanted > self.limit {
                    // Given back now: a line over the limit holds no memory past this point
                    // (but the scanner's KiB, which reads on as the rest goes by).
                    self.too_long_shape = psych_mcp::wire::ShapeScanner::default();
                    self.too_long_shape.feed(&self.line);
                    self.too_long_shape.feed(&available[..len]);
                    self.line = Vec::new();
                    self.too_long = true;
                } else {
                    if wanted > self.line.capacity() {
                        // Grown by doubling, but never past the limit.
                        let capacity = wanted.max(2 * self.line.capacity()).min(self.limit);
                        self.line.reserve_exact(capacity - self.line.len());
                    }
                    self.line.extend_from_slice(&available[..len]);
                }
            }
            self.reader.consume(used);
            if end {
                if std::mem::take(&mut self.too_long) {
                    return Ok(Some(Line::TooLong(self.too_long_shape.shape())));
                }
                return Ok(Some(Line::Whole(std::mem::take(&mut self.line))));
            }
        }
    }

    /// Queues the answer decided on (if any) and writes out the queue. Cancel-safe: until
    /// the lock is taken nothing changes, and a dropped write leaves the rest queued, with
    /// `draining` set so the next call writes it.
    async fn write_reply(&mut self) -> io::Result<()> {
        if self.reply.is_none() && !self.draining {
            return Ok(());
        }
        let mut out = self.out.lock().await;
        if let Some(reply) = self.reply.take() {
            out.push(serialize(&reply)?);
            self.draining = true;
        }
        out.drain().await?;
        self.draining = false;
        Ok(())
    }

    /// What to do with a line classified as `classified`: the message, or nothing (the
    /// answer, if any, in `self.reply`).
    fn take(&mut self, classified: Classified, now: Instant) -> Option<ClientJsonRpcMessage> {
        match classified {
            Classified::Message(message) => return self.pass(*message),
            Classified::Skip => {}
            Classified::Answer((code, message), id) => self.answer(code, message, id, now),
        }
        None
    }

    /// Counts a request in flight, or refuses it past [`MAX_IN_FLIGHT`] (the answer in
    /// `self.reply`, not capped: it is written before the next line is read); a
    /// cancellation takes its request out of the count.
    ///
    /// Until a request has chosen the session's lifecycle ([`chooses_lifecycle`]), a
    /// notification or an answer is dropped: rmcp's handshake answers `ping` and
    /// `server/discover` and waits on, but ends the session on anything that is not a
    /// request (the gateway exited), while a notification is never answered anyway (a
    /// client's cancellation of a request it gave up on, a progress report) and an answer
    /// answers nothing the gateway asked.
    fn pass(&mut self, mut message: ClientJsonRpcMessage) -> Option<ClientJsonRpcMessage> {
        if !self.started {
            match &message {
                rmcp::model::JsonRpcMessage::Request(request) => {
                    self.started = chooses_lifecycle(&request.request);
                }
                _ => return None,
            }
        }
        let busy = |limit| {
            format!(
                "too many requests in flight: {limit} are waiting for their answers; send this \
                 again when one has come"
            )
        };
        match crate::admit::count_in(&self.in_flight, &mut message, busy) {
            Ok(()) => Some(message),
            Err(refusal) => {
                self.reply = Some(*refusal);
                None
            }
        }
    }

    /// Decides on an error answer, if the cap allows one now.
    fn answer(&mut self, code: Code, message: &'static str, id: Option<RequestId>, now: Instant) {
        let Some(unanswered) = self.cap.allow(now) else {
            return;
        };
        let data = (unanswered > 0).then(|| json!({ "unanswered": unanswered }));
        let error = match code {
            Code::Parse => ErrorData::parse_error(message, data),
            Code::InvalidRequest => ErrorData::invalid_request(message, data),
        };
        self.reply = Some(ServerJsonRpcMessage::error(error, id));
    }
}

/// The most progress and logging notifications waiting to be written out to a client at
/// once; one sent past it is dropped. The requests in flight bound the answers a client
/// that reads nothing holds ([`MAX_IN_FLIGHT`]), but not notifications: a call's progress
/// report waits for the output like an answer, and a client that cancels its calls (giving
/// their places back) while it reads nothing would leave one more waiting with each.
/// Progress and log lines say how things go, not what came of them: one dropped when so
/// many wait unread loses nothing the client still needs. Other notifications (a list
/// changed, a resource updated) are few, one per change, and never dropped.
pub(crate) const MAX_WAITING_NOTIFICATIONS: usize = 64;

/// One notification waiting to be written out, counted in the transport's notifications
/// until it is written or dropped.
struct Waiting(Arc<std::sync::atomic::AtomicUsize>);

impl Waiting {
    /// A place among the waiting notifications, or `None` when
    /// [`MAX_WAITING_NOTIFICATIONS`] are waiting.
    fn take(count: &Arc<std::sync::atomic::AtomicUsize>) -> Option<Self> {
        use std::sync::atomic::Ordering::SeqCst;
        count
            .fetch_update(SeqCst, SeqCst, |n| {
                (n < MAX_WAITING_NOTIFICATIONS).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(Arc::clone(count)))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl<R, W> Transport<RoleServer> for StdioTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let out = Arc::clone(&self.out);
        // An answer's request is in flight until this is done or dropped.
        let answered = self.in_flight.answering(&item);
        // A notification past the bound is dropped, not queued: see `Waiting`.
        let waiting = match &item {
            ServerJsonRpcMessage::Notification(note)
                if matches!(
                    note.notification,
                    ServerNotification::ProgressNotification(_)
                        | ServerNotification::LoggingMessageNotification(_)
                ) =>
            {
                Some(Waiting::take(&self.notifications))
            }
            _ => None,
        };
        let dropped = matches!(waiting, Some(None));
        // Serialized whole before it is queued, so a message is queued in one piece: here
        // when short, a long one (a resource page of up to 16 MiB) on a blocking thread.
        let bytes = (!dropped).then(|| psych_mcp::wire::line_on_worker(item));
        async move {
            let (_answered, _waiting) = (answered, waiting);
            let Some(bytes) = bytes else {
                return Ok(());
            };
            let bytes = match bytes? {
                Ok(bytes) => bytes,
                Err(item) => psych_mcp::wire::line_off_worker(item).await?,
            };
            let mut out = out.lock().await;
            if out.writer.is_none() {
                return Err(closed());
            }
            out.push(bytes);
            out.drain().await
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            // An answer to the last bad line goes out before the next line is read.
            self.write_reply().await.ok()?;
            if let Some(parsing) = self.parsing.as_mut() {
                let classified = parsing.await;
                self.parsing = None;
                // A parse that did not finish (a panic in serde_json, the runtime ending)
                // is answered as a line that is not JSON.
                let classified = classified.unwrap_or(Classified::Answer(
                    (Code::Parse, "parse error: not JSON"),
                    None,
                ));
                if let Some(message) = self.take(classified, Instant::now()) {
                    return Some(message);
                }
                continue;
            }
            if self.ended {
                return None;
            }
            let line = match self.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) | Err(_) => {
                    self.ended = true;
                    if let Some(on_end) = self.on_end.take() {
                        on_end();
                    }
                    return None;
                }
            };
            match line {
                Line::Whole(line) if line.len() > JSON_ON_WORKER => {
                    // Awaited at the top of the loop, before anything else is read, so
                    // lines keep their order.
                    self.parsing = Some(tokio::task::spawn_blocking(move || classify(&line)));
                }
                Line::Whole(line) => {
                    if let Some(message) = self.take(classify(&line), Instant::now()) {
                        return Some(message);
                    }
                }
                // A notification is never answered; an answer (to the gateway's own
                // request) is answered without its id, which is not the client's to wait on.
                Line::TooLong(shape) if shape.is_notification() => {}
                Line::TooLong(shape) => {
                    let id = shape
                        .request_id()
                        .and_then(|id| serde_json::from_str::<RequestId>(id).ok());
                    self.answer(
                        Code::InvalidRequest,
                        "request too large",
                        id,
                        Instant::now(),
                    );
                }
            }
        }
    }

    /// Writes out what is queued, within [`CLOSE_WITHIN`], and closes the writer (at once
    /// if it was written out; else when the transport and its sends are dropped).
    async fn close(&mut self) -> Result<(), Self::Error> {
        let closing = async {
            let mut out = self.out.lock().await;
            let drained = out.drain().await;
            out.writer = None;
            drained
        };
        tokio::time::timeout(CLOSE_WITHIN, closing)
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the stdio client did not read what was left to write",
                ))
            })
    }
}

/// One line read.
#[derive(Debug)]
enum Line {
    /// A whole line, without its `\n`.
    Whole(Vec<u8>),
    /// A line over the limit, read past and not kept: what its bytes showed as they went.
    TooLong(psych_mcp::wire::MessageShape),
}

/// The JSON-RPC errors the transport answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    /// -32700: not JSON.
    Parse,
    /// -32600: not a JSON-RPC message.
    InvalidRequest,
}

/// What a line is.
#[derive(Debug)]
enum Classified {
    /// A message for the session (boxed: it is large beside the others).
    Message(Box<ClientJsonRpcMessage>),
    /// Nothing to pass on or answer: a blank line, or a notification of a shape rmcp does
    /// not model.
    Skip,
    /// An error to answer with, and the id it answers.
    Answer((Code, &'static str), Option<RequestId>),
}

/// Whether rmcp's handshake takes `request` as the one that chooses the session's
/// lifecycle (rmcp 3.11's `serve_server`): an `initialize`, or a request other than
/// `ping` and `server/discover` whose `_meta` carries MCP 2026-07-28's keys and a
/// protocol version rmcp knows. rmcp answers any other request and waits on.
fn chooses_lifecycle(request: &rmcp::model::ClientRequest) -> bool {
    use rmcp::model::{ClientRequest, GetMeta, ProtocolVersion};
    match request {
        ClientRequest::InitializeRequest(_) => true,
        ClientRequest::PingRequest(_) | ClientRequest::DiscoverRequest(_) => false,
        request => {
            let meta = request.get_meta();
            meta.missing_required_keys(&ProtocolVersion::V_2026_07_28)
                .is_empty()
                && meta
                    .protocol_version()
                    .is_some_and(|version| ProtocolVersion::KNOWN_VERSIONS.contains(&version))
        }
    }
}

/// Parses one line as rmcp's client message (see the module docs for the answers).
fn classify(line: &[u8]) -> Classified {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // RFC 8259 §8.1 lets a parser ignore a leading byte order mark; rmcp does.
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Classified::Skip;
    }
    if psych_mcp::wire::structure_past(line, MAX_REQUEST_STRUCTURAL_BYTES) {
        // A notification is never answered; an answer (to the gateway's own request) is
        // answered without its id, which is not the client's to wait on.
        let shape = psych_mcp::wire::message_shape(line);
        if shape.is_notification() {
            return Classified::Skip;
        }
        let id = shape
            .request_id()
            .and_then(|id| serde_json::from_str::<RequestId>(id).ok());
        return Classified::Answer((Code::InvalidRequest, TOO_COMPLEX), id);
    }
    let error = match serde_json::from_slice::<ClientJsonRpcMessage>(line) {
        Ok(message) => return Classified::Message(Box::new(message)),
        Err(error) => error,
    };
    use serde_json::error::Category;
    if matches!(
        error.classify(),
        Category::Syntax | Category::Eof | Category::Io
    ) {
        return Classified::Answer((Code::Parse, "parse error: not JSON"), None);
    }
    // Valid JSON (parsed again only on this path): not a message rmcp reads.
    let Ok(value) = serde_json::from_slice::<Value>(line) else {
        return Classified::Answer((Code::Parse, "parse error: not JSON"), None);
    };
    let invalid = (
        Code::InvalidRequest,
        "invalid request: not a JSON-RPC message",
    );
    let Value::Object(object) = value else {
        let message = if value.is_array() {
            (
                Code::InvalidRequest,
                "invalid request: batches are not supported",
            )
        } else {
            invalid
        };
        return Classified::Answer(message, None);
    };
    match object.get("id") {
        None if object.get("method").is_some_and(Value::is_string) => Classified::Skip,
        None => Classified::Answer(invalid, None),
        Some(id) => {
            let id = serde_json::from_value::<RequestId>(id.clone()).ok();
            Classified::Answer(invalid, id)
        }
    }
}

/// A message as it is written: its JSON and `\n`.
fn serialize(message: &ServerJsonRpcMessage) -> io::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec(message).map_err(io::Error::other)?;
    bytes.push(b'\n');
    Ok(bytes)
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the stdio transport is closed")
}

/// The writing side: the writer and the bytes queued for it.
struct Out<W> {
    /// `None` once closed.
    writer: Option<W>,
    /// Whole messages, the first `written` bytes of which are written.
    queue: Vec<u8>,
    written: usize,
}

impl<W: AsyncWrite + Unpin> Out<W> {
    /// Queues one message whole (no await: it cannot be torn).
    fn push(&mut self, bytes: Vec<u8>) {
        if self.queue.is_empty() {
            self.queue = bytes;
        } else {
            self.queue.extend_from_slice(&bytes);
        }
    }

    /// Writes out the queue and flushes. Cancel-safe: a `write` dropped before it returns
    /// wrote nothing (tokio's `poll_write` contract), and each one's progress is recorded
    /// as it returns.
    async fn drain(&mut self) -> io::Result<()> {
        let Some(writer) = self.writer.as_mut() else {
            return Err(closed());
        };
        while self.written < self.queue.len() {
            let n = writer.write(&self.queue[self.written..]).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.written += n;
        }
        if self.queue.capacity() > KEEP_QUEUE {
            self.queue = Vec::new();
        } else {
            self.queue.clear();
        }
        self.written = 0;
        writer.flush().await
    }
}

/// At most `per_second` answers in any one-second window (fixed windows), counting the
/// ones refused.
#[derive(Debug)]
struct ReplyCap {
    per_second: u32,
    window: Option<Instant>,
    sent: u32,
    /// Refused since the last answer allowed.
    refused: u64,
}

impl ReplyCap {
    fn new(per_second: u32) -> Self {
        Self {
            per_second,
            window: None,
            sent: 0,
            refused: 0,
        }
    }

    /// Whether one more answer may go out at `now`: `Some(refused before it)` if so.
    fn allow(&mut self, now: Instant) -> Option<u64> {
        let fresh = self
            .window
            .is_none_or(|start| now.saturating_duration_since(start) >= Duration::from_secs(1));
        if fresh {
            self.window = Some(now);
            self.sent = 0;
        }
        if self.sent >= self.per_second {
            self.refused += 1;
            return None;
        }
        self.sent += 1;
        Some(std::mem::take(&mut self.refused))
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
    use std::task::Poll;

    use rmcp::model::JsonRpcMessage;
    use tokio::io::AsyncReadExt;

    use super::*;

    /// xorshift64*: a seeded generator, so a failure names the seed that reproduces it
    /// (psych-mcp's stdio tests use the same).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        /// Log-uniform in `1..max`: as many tiny sizes as huge ones, per order of size.
        fn size(&mut self, max: u64) -> u64 {
            let bits = self.below(u64::from(max.ilog2()));
            (1u64 << bits) + self.below(1u64 << bits)
        }
    }

    /// Polls `future` up to `polls + 1` times, yielding between polls: its output if it
    /// was ready by then, else `None` (the caller then drops it, as a `select!` would).
    async fn poll_up_to<F: Future + Unpin>(future: &mut F, polls: u64) -> Option<F::Output> {
        for _ in 0..=polls {
            let polled =
                std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut *future).poll(cx)))
                    .await;
            if let Poll::Ready(output) = polled {
                return Some(output);
            }
            tokio::task::yield_now().await;
        }
        None
    }

    type Pipe = tokio::io::DuplexStream;

    /// A transport over two pipes: the client's end of its input, and of its output.
    fn transport() -> (StdioTransport<Pipe, Pipe>, Pipe, Pipe) {
        let (input, reader) = tokio::io::duplex(64 * 1024);
        let (writer, output) = tokio::io::duplex(64 * 1024);
        (StdioTransport::new(reader, writer), input, output)
    }

    /// Every line of `output` until it ends, parsed.
    async fn answers(mut output: Pipe) -> Vec<Value> {
        let mut bytes = Vec::new();
        output.read_to_end(&mut bytes).await.unwrap();
        bytes
            .split(|&b| b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| serde_json::from_slice(line).unwrap())
            .collect()
    }

    /// What the transport makes of `input`: each message the session receives and each
    /// answer the client gets, one per line, in order of the input.
    async fn check(input: &[u8]) -> String {
        let (mut transport, mut client, output) = transport();
        let answers = tokio::spawn(answers(output));
        let input = input.to_vec();
        let writing = tokio::spawn(async move {
            client.write_all(&input).await.unwrap();
        });
        let mut out = String::new();
        while let Some(message) = transport.receive().await {
            out.push_str(&format!(
                "session: {}\n",
                serde_json::to_string(&message).unwrap()
            ));
        }
        writing.await.unwrap();
        transport.close().await.unwrap();
        drop(transport);
        for answer in answers.await.unwrap() {
            out.push_str(&format!("client: {answer}\n"));
        }
        out
    }

    #[tokio::test]
    async fn bad_lines_are_answered_and_good_ones_pass() {
        let deep_open = "[".repeat(100_000);
        let deep_closed = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let input = [
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"[{"jsonrpc":"2.0","id":2,"method":"ping"},{"jsonrpc":"2.0","id":3,"method":"ping"}]"#,
            "{not json",
            &deep_open,
            &deep_closed,
            "",
            "   \t",
            r#"{"jsonrpc":"2.0","id":4}"#,
            r#"{"jsonrpc":"2.0","id":"five","params":{}}"#,
            r#"{"jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":7}"#,
            "42",
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"ping\"}\r",
            r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#,
        ]
        .join("\n");
        let out = check(input.as_bytes()).await;
        assert_eq!(
            out,
            r#"session: {"jsonrpc":"2.0","id":1,"method":"ping"}
session: {"jsonrpc":"2.0","id":6,"method":"ping"}
session: {"jsonrpc":"2.0","id":7,"method":"ping"}
client: {"error":{"code":-32600,"message":"invalid request: batches are not supported"},"jsonrpc":"2.0"}
client: {"error":{"code":-32700,"message":"parse error: not JSON"},"jsonrpc":"2.0"}
client: {"error":{"code":-32700,"message":"parse error: not JSON"},"jsonrpc":"2.0"}
client: {"error":{"code":-32700,"message":"parse error: not JSON"},"jsonrpc":"2.0"}
client: {"error":{"code":-32600,"message":"invalid request: not a JSON-RPC message"},"id":4,"jsonrpc":"2.0"}
client: {"error":{"code":-32600,"message":"invalid request: not a JSON-RPC message"},"id":"five","jsonrpc":"2.0"}
client: {"error":{"code":-32600,"message":"invalid request: not a JSON-RPC message"},"jsonrpc":"2.0"}
client: {"error":{"code":-32600,"message":"invalid request: not a JSON-RPC message"},"jsonrpc":"2.0"}
"#
        );
    }

    /// A notification or an answer before the request that chooses the lifecycle (an
    /// `initialize`; a `ping` does not) is dropped (rmcp's handshake would end the session
    /// on it: the gateway exited with status 3); after it they pass.
    #[tokio::test]
    async fn before_the_first_request_notifications_and_answers_are_dropped() {
        let input = [
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#,
            r#"{"jsonrpc":"2.0","id":9,"result":{}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"0"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":9,"result":{}}"#,
        ]
        .join("\n");
        let out = check(input.as_bytes()).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert_eq!(
            lines[0],
            r#"session: {"jsonrpc":"2.0","id":1,"method":"ping"}"#
        );
        assert!(
            lines[1].starts_with(r#"session: {"jsonrpc":"2.0","id":2,"method":"initialize""#),
            "{out}"
        );
        assert_eq!(
            &lines[2..],
            [
                r#"session: {"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                r#"session: {"jsonrpc":"2.0","id":9,"result":{}}"#,
            ]
        );
    }

    /// A line of 16 MiB (four times the limit) is answered for its id, written first or
    /// last (as the TypeScript SDK writes it), and never held: the line's buffer stays
    /// within the limit; a notification as long is dropped unanswered; the next line is
    /// read as usual. (Before, the answer had no id, and the client waited for its own
    /// deadline.)
    #[tokio::test]
    async fn a_line_over_the_limit_is_answered_without_being_held() {
        let (mut transport, mut client, output) = transport();
        let answers = tokio::spawn(answers(output));
        let writing = tokio::spawn(async move {
            let chunk = vec![b'a'; 1024 * 1024];
            let long = async |client: &mut Pipe, head: &[u8], tail: &[u8]| {
                client.write_all(head).await.unwrap();
                for _ in 0..16 {
                    client.write_all(&chunk).await.unwrap();
                }
                client.write_all(tail).await.unwrap();
            };
            long(
                &mut client,
                br#"{"jsonrpc":"2.0","id":1,"method":"ping","x":""#,
                b"\"}\n",
            )
            .await;
            long(
                &mut client,
                br#"{"jsonrpc":"2.0","method":"ping","params":{"x":""#,
                br#""},"id":"last"}"#,
            )
            .await;
            client.write_all(b"\n").await.unwrap();
            long(
                &mut client,
                br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"x":""#,
                b"\"}}\n",
            )
            .await;
            client
                .write_all(br#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#)
                .await
                .unwrap();
            client.write_all(b"\n").await.unwrap();
        });
        let mut largest = 0;
        let message = loop {
            let polled = {
                let mut receive = pin!(transport.receive());
                poll_up_to(&mut receive, 0).await
            };
            if let Some(message) = polled {
                break message.unwrap();
            }
            largest = largest.max(transport.line.capacity());
        };
        assert!(largest <= MAX_LINE, "the line held {largest} B");
        assert_eq!(
            serde_json::to_string(&message).unwrap(),
            r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#
        );
        writing.await.unwrap();
        transport.close().await.unwrap();
        drop(transport);
        let answers = answers.await.unwrap();
        assert_eq!(
            answers,
            [
                json!({"jsonrpc": "2.0", "id": 1,
                       "error": {"code": -32600, "message": "request too large"}}),
                json!({"jsonrpc": "2.0", "id": "last",
                       "error": {"code": -32600, "message": "request too large"}}),
            ]
        );
    }

    /// Bad lines past the cap in one second go unanswered; the next answer counts them.
    #[test]
    fn answers_are_capped_per_second_and_the_refused_counted() {
        let mut cap = ReplyCap::new(3);
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let allowed: Vec<Option<u64>> = [0, 1, 2, 3, 4, 999, 1000, 1001, 1002, 1003]
            .into_iter()
            .map(|ms| cap.allow(at(ms)))
            .collect();
        assert_eq!(
            allowed,
            [
                Some(0),
                Some(0),
                Some(0),
                None,
                None,
                None,
                Some(3),
                Some(0),
                Some(0),
                None
            ]
        );
    }

    #[tokio::test]
    async fn an_answer_past_the_cap_says_how_many_went_unanswered() {
        let mut input = "x\n".repeat(REPLIES_PER_SECOND as usize + 5);
        input.push_str("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n");
        let (mut transport, mut client, output) = transport();
        let answers = tokio::spawn(answers(output));
        client.write_all(input.as_bytes()).await.unwrap();
        let first = transport.receive().await;
        assert!(first.is_some());
        // A second later, the next bad line is answered, with the count.
        transport.cap.window = transport
            .cap
            .window
            .map(|start| start - Duration::from_secs(1));
        client.write_all(b"x\n").await.unwrap();
        drop(client);
        assert!(transport.receive().await.is_none());
        transport.close().await.unwrap();
        drop(transport);
        let answers = answers.await.unwrap();
        assert_eq!(answers.len(), REPLIES_PER_SECOND as usize + 1);
        assert_eq!(
            answers.last().unwrap()["error"]["data"],
            json!({"unanswered": 5})
        );
    }

    /// Closing gives up within its bound on a client that reads nothing, with the rest of
    /// a dropped send still queued (rmcp closes the transport as the service ends).
    #[tokio::test]
    async fn closing_gives_up_on_a_client_that_does_not_read() {
        let (reader, _input) = tokio::io::duplex(64);
        let (writer, _output) = tokio::io::duplex(64);
        let mut transport = StdioTransport::new(reader, writer);
        let message = ServerJsonRpcMessage::error(
            ErrorData::internal_error("x".repeat(1024), None),
            Some(RequestId::Number(1)),
        );
        {
            let mut send = pin!(transport.send(message));
            assert!(poll_up_to(&mut send, 2).await.is_none(), "the pipe is full");
        }
        assert!(
            transport.out.lock().await.queue.len() > 64,
            "the rest is queued"
        );
        let started = Instant::now();
        let closed = transport.close().await;
        assert_eq!(closed.unwrap_err().kind(), io::ErrorKind::TimedOut);
        // Without its bound it would wait for good; the slack is for a loaded machine.
        let took = started.elapsed();
        assert!(took < CLOSE_WITHIN + Duration::from_secs(10), "{took:?}");
    }

    /// Line `i` of `len` bytes: a `tools/call` whose argument pads it to `len` when that
    /// is long enough, else `len` bytes that are not JSON.
    fn line(i: u64, len: usize) -> Vec<u8> {
        let head = format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"t","arguments":{{"pad":""#
        );
        let tail = r#""}}}"#;
        if len < head.len() + tail.len() {
            return vec![b'x'; len];
        }
        let mut out = head.into_bytes();
        out.resize(len - tail.len(), b'a' + (i % 26) as u8);
        out.extend_from_slice(tail.as_bytes());
        out
    }

    /// A writer sends lines of 1 B to 8 MiB in chunks of random sizes while `receive`
    /// futures are dropped after a random number of polls: every line within the limit
    /// reaches the session whole and in order, and every other one is answered, in order.
    async fn lines_survive_dropped_receives(seed: u64) {
        const MAX: u64 = 8 * 1024 * 1024;
        let mut rng = Rng(seed);
        let count = 24 + rng.below(16);
        let mut sizes: Vec<usize> = (0..count).map(|_| rng.size(MAX) as usize).collect();
        // The extremes, whatever the seed drew.
        sizes[0] = 1;
        sizes[1] = MAX as usize;
        sizes[2] = MAX_LINE + 1;
        sizes[3] = MAX_LINE;
        let (mut transport, mut client, output) = transport();
        transport.cap = ReplyCap::new(u32::MAX);
        let answers = tokio::spawn(answers(output));
        let written = sizes.clone();
        let writer_seed = rng.next() | 1;
        let writing = tokio::spawn(async move {
            let mut rng = Rng(writer_seed);
            for (i, &len) in written.iter().enumerate() {
                let mut bytes = line(i as u64, len);
                bytes.push(b'\n');
                let mut rest = bytes.as_slice();
                while !rest.is_empty() {
                    let take = (rng.size(256 * 1024) as usize).min(rest.len());
                    client.write_all(&rest[..take]).await.unwrap();
                    rest = &rest[take..];
                    if rng.below(4) == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }
        });
        let mut dropped = 0u64;
        let mut want_answers = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let want = line(i as u64, len);
            if len > MAX_LINE {
                want_answers.push(-32600);
                continue;
            }
            if want[0] == b'x' {
                want_answers.push(-32700);
                continue;
            }
            let message = loop {
                let polls = rng.below(6);
                let mut receive = pin!(transport.receive());
                match poll_up_to(&mut receive, polls).await {
                    Some(message) => break message.expect("a message"),
                    None => dropped += 1,
                }
            };
            let message = serde_json::to_value(&message).unwrap();
            assert_eq!(message["id"], json!(i), "seed {seed}: line {i} of {len} B");
            let pad = message["params"]["arguments"]["pad"].as_str().unwrap();
            let want_pad = &want[want.len() - pad.len() - 4..want.len() - 4];
            assert!(
                pad.as_bytes() == want_pad,
                "seed {seed}: line {i} of {len} B came with a pad of {} B",
                pad.len()
            );
        }
        assert!(transport.receive().await.is_none(), "seed {seed}");
        writing.await.unwrap();
        transport.close().await.unwrap();
        drop(transport);
        let codes: Vec<i64> = answers
            .await
            .unwrap()
            .iter()
            .map(|answer| answer["error"]["code"].as_i64().unwrap())
            .collect();
        assert_eq!(codes, want_answers, "seed {seed}");
        assert!(
            dropped > 50,
            "seed {seed}: only {dropped} receives were dropped"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lines_arrive_whole_and_in_order_when_receives_are_dropped() {
        for seed in [0x9E37_79B9_7F4A_7C15, 7, 0xDEAD_BEEF] {
            lines_survive_dropped_receives(seed).await;
        }
    }

    /// A client that reads nothing: notifications past [`MAX_WAITING_NOTIFICATIONS`]
    /// waiting are dropped at once, so what waits stays bounded however many are sent
    /// (before, each waited with its bytes until the client read); those that waited are
    /// written whole once it reads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn notifications_waiting_for_a_client_that_reads_nothing_are_bounded() {
        let (mut transport, _client, output) = transport();
        let mut sending = tokio::task::JoinSet::new();
        for i in 0..400u32 {
            let mut note = rmcp::model::ProgressNotificationParam::new(
                rmcp::model::ProgressToken(rmcp::model::NumberOrString::Number(i.into())),
                1.0,
            );
            // 4 KiB each: 16 fill the pipe.
            note.message = Some("m".repeat(4096));
            let message = ServerJsonRpcMessage::notification(
                rmcp::model::ServerNotification::ProgressNotification(
                    rmcp::model::Notification::new(note),
                ),
            );
            sending.spawn(transport.send(message));
        }
        // Those written into the pipe and those dropped finish; the rest wait. (Waited for
        // until at most the bound wait, or 30 s: before, all but the pipe's few waited.)
        let mut finished = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while sending.len() > MAX_WAITING_NOTIFICATIONS && Instant::now() < deadline {
            if let Ok(Some(sent)) =
                tokio::time::timeout(Duration::from_millis(100), sending.join_next()).await
            {
                sent.unwrap().unwrap();
                finished += 1;
            }
        }
        let waiting = sending.len();
        assert!(
            waiting > 0 && waiting <= MAX_WAITING_NOTIFICATIONS,
            "{waiting} waiting, {finished} finished"
        );
        assert!(
            transport
                .notifications
                .load(std::sync::atomic::Ordering::SeqCst)
                <= MAX_WAITING_NOTIFICATIONS
        );
        // The client reads: every notification that waited is written, whole.
        let reading = tokio::spawn(answers(output));
        while let Some(sent) = sending.join_next().await {
            sent.unwrap().unwrap();
        }
        drop(transport);
        let written = reading.await.unwrap();
        assert!(
            written.len() > waiting && written.len() < 400,
            "{}",
            written.len()
        );
        assert!(
            written
                .iter()
                .all(|note| note["params"]["message"].as_str().is_some())
        );
    }

    /// Sends of 1 B to 2 MiB at once, some dropped after a few polls (as rmcp aborts its
    /// send tasks when it ends), through a pipe far smaller than a message: every line
    /// written is one whole message, and every send that finished is among them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sends_never_interleave_even_when_dropped() {
        let (mut transport, _client, output) = transport();
        let answers = tokio::spawn(answers(output));
        let mut rng = Rng(0x5EED);
        let mut finished = Vec::new();
        let mut sending = tokio::task::JoinSet::new();
        for i in 0..200u64 {
            // Up to 2 MiB: past a MiB a message is serialized off the worker.
            let pad = "p".repeat(rng.size(2 * 1024 * 1024) as usize);
            let message = ServerJsonRpcMessage::error(
                ErrorData::internal_error(pad, None),
                Some(RequestId::Number(i as i64)),
            );
            let send = transport.send(message);
            let polls = if rng.below(3) == 0 {
                Some(rng.below(4))
            } else {
                None
            };
            sending.spawn(async move {
                let mut send = pin!(send);
                match polls {
                    Some(polls) => poll_up_to(&mut send, polls).await.map(|sent| (i, sent)),
                    None => Some((i, send.await)),
                }
            });
        }
        while let Some(sent) = sending.join_next().await {
            if let Some((i, sent)) = sent.unwrap() {
                sent.unwrap();
                finished.push(i);
            }
        }
        transport.close().await.unwrap();
        drop(transport);
        let ids: Vec<u64> = answers
            .await
            .unwrap()
            .iter()
            .map(|answer| {
                let message = answer["error"]["message"].as_str().unwrap();
                assert!(message.bytes().all(|b| b == b'p'));
                answer["id"].as_u64().unwrap()
            })
            .collect();
        for i in finished {
            assert!(ids.contains(&i), "send {i} finished and was not written");
        }
    }

    /// A request whose string id is over [`psych_mcp::MAX_REQUEST_ID_BYTES`] (which every
    /// answer would echo, and the count of requests in flight would hold) is refused as
    /// invalid, with its id, and never reaches the session.
    #[tokio::test]
    async fn a_request_with_an_over_long_id_is_refused_as_invalid() {
        let (mut transport, mut client, output) = transport();
        let answers = tokio::spawn(answers(output));
        let long = "x".repeat(psych_mcp::MAX_REQUEST_ID_BYTES + 1);
        let input = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":\"{long}\",\"method\":\"ping\"}}\n\
             {{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\"}}\n"
        );
        client.write_all(input.as_bytes()).await.unwrap();
        match transport.receive().await.unwrap() {
            JsonRpcMessage::Request(request) => assert_eq!(request.id, RequestId::Number(7)),
            other => panic!("not the second ping: {other:?}"),
        }
        assert_eq!(transport.in_flight.len(), 1);
        drop(client);
        assert!(transport.receive().await.is_none());
        transport.close().await.unwrap();
        drop(transport);
        let answers = answers.await.unwrap();
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert_eq!(answers[0]["id"], long.as_str());
        assert_eq!(answers[0]["error"]["code"], -32600);
        let message = answers[0]["error"]["message"].as_str().unwrap();
        assert!(message.contains("at most 256 bytes"), "{message}");
    }

    /// A request of more than [`MAX_REQUEST_STRUCTURAL_BYTES`] structural bytes is refused
    /// unparsed, with its id, and one at the bound reaches the session; the same as a
    /// notification is dropped, and as an answer refused without its id (the gateway's own
    /// request's).
    #[tokio::test]
    async fn a_request_past_the_structural_bound_is_refused_with_its_id() {
        // What the client reads after writing `lines` (written as the transport reads:
        // the pipe holds 64 KiB), and the ids of the requests that reached the session.
        let run = async |lines: Vec<String>| {
            let (mut transport, mut client, output) = transport();
            let answers = tokio::spawn(answers(output));
            let writing = tokio::spawn(async move {
                for line in lines {
                    client.write_all(line.as_bytes()).await.unwrap();
                }
            });
            let mut passed = Vec::new();
            while let Some(message) = transport.receive().await {
                match message {
                    JsonRpcMessage::Request(request) => passed.push(request.id),
                    other => panic!("{other:?}"),
                }
            }
            writing.await.unwrap();
            transport.close().await.unwrap();
            drop(transport);
            (answers.await.unwrap(), passed)
        };
        // `{"jsonrpc":…,"method":…,"params":{"name":"t","arguments":{"a":[0,…,0]}},"id":N}`:
        // 14 structural bytes besides the array's `values - 1` commas.
        let call = |id: u64, values: u64| {
            let zeros = vec!["0"; usize::try_from(values).unwrap()].join(",");
            format!(
                "{{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"params\":{{\"name\":\"t\",\
                 \"arguments\":{{\"a\":[{zeros}]}}}},\"id\":{id}}}\n"
            )
        };
        let max = MAX_REQUEST_STRUCTURAL_BYTES;
        let over = call(1, max - 14 + 1);
        assert!(psych_mcp::wire::structure_past(over.as_bytes(), max));
        let at = call(2, max - 14);
        assert!(!psych_mcp::wire::structure_past(at.as_bytes(), max));
        let (answers, passed) = run(vec![over, at]).await;
        assert_eq!(passed, [RequestId::Number(2)]);
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert_eq!(answers[0]["id"], 1);
        assert_eq!(answers[0]["error"]["code"], -32600);
        assert_eq!(answers[0]["error"]["message"], TOO_COMPLEX);
        assert!(TOO_COMPLEX.contains(&format!(" {max} ")));
        // As a notification: dropped.
        let notification = call(1, max).replace(",\"id\":1}", "}");
        assert!(psych_mcp::wire::structure_past(
            notification.as_bytes(),
            max
        ));
        let (answers, passed) = run(vec![notification]).await;
        assert!(answers.is_empty() && passed.is_empty(), "{answers:?}");
        // As an answer: refused without its id.
        let zeros = vec!["0"; usize::try_from(max).unwrap()].join(",");
        let answer = format!("{{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{{\"a\":[{zeros}]}}}}\n");
        let (answers, _) = run(vec![answer]).await;
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert!(answers[0].get("id").is_none(), "{}", answers[0]);
        assert_eq!(answers[0]["error"]["message"], TOO_COMPLEX);
    }

    /// What a handler keeps for its request (a budget's reservation, in `resources/read`)
    /// is held until its answer has been written out, not until the handler returns:
    /// through rmcp's service, whose request contexts carry the extensions the transport
    /// put on the request.
    #[tokio::test]
    async fn what_a_handler_keeps_is_held_until_its_answer_is_written() {
        use std::sync::atomic::{AtomicBool, Ordering};

        use rmcp::ServiceExt;
        use rmcp::model::{
            ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ResourceContents,
        };
        use rmcp::service::RequestContext;

        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        struct Handler {
            dropped: Arc<AtomicBool>,
            returned: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
        }
        impl rmcp::ServerHandler for Handler {
            async fn read_resource(
                &self,
                request: ReadResourceRequestParams,
                context: RequestContext<RoleServer>,
            ) -> Result<ReadResourceResponse, ErrorData> {
                let hold = context.extensions.get::<psych_mcp::AnswerHold>().unwrap();
                assert!(hold.keep(Box::new(Flag(Arc::clone(&self.dropped)))).is_ok());
                if let Some(returned) = self.returned.lock().unwrap().take() {
                    let _ = returned.send(());
                }
                // Sixteen times the pipe's buffer: written only as the client reads.
                let text = "x".repeat(1024 * 1024);
                Ok(ReadResourceResult::new(vec![ResourceContents::text(text, request.uri)]).into())
            }
        }

        let (transport, mut client, mut output) = transport();
        let dropped = Arc::new(AtomicBool::new(false));
        let (returned, handler_returned) = tokio::sync::oneshot::channel();
        let handler = Handler {
            dropped: Arc::clone(&dropped),
            returned: std::sync::Mutex::new(Some(returned)),
        };
        let service = tokio::spawn(async move {
            let running = handler.serve(transport).await.unwrap();
            running.waiting().await.unwrap();
        });
        client
            .write_all(
                concat!(
                    r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
                    "\n",
                    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                    "\n",
                    r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"psych://result/h:1"}}"#,
                    "\n",
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        // Bounded waits: a handler that failed (its hold missing) fails the test, not hangs.
        tokio::time::timeout(Duration::from_secs(60), handler_returned)
            .await
            .expect("the handler did not return within 60 s")
            .unwrap();
        // The answer cannot be written while the client reads nothing: what was kept holds.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !dropped.load(Ordering::SeqCst),
            "dropped before the answer was written"
        );
        // Read until the answer's line has come whole: then it is dropped.
        let read = async {
            let mut bytes = Vec::new();
            let mut buffer = vec![0; 64 * 1024];
            while bytes.iter().filter(|&&b| b == b'\n').count() < 2 {
                let n = output.read(&mut buffer).await.unwrap();
                assert!(n > 0, "the output ended before the answer");
                bytes.extend_from_slice(&buffer[..n]);
            }
            bytes
        };
        let bytes = tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("the answer did not come within 60 s");
        let answer: Value =
            serde_json::from_slice(bytes.split(|&b| b == b'\n').nth(1).unwrap()).unwrap();
        assert_eq!(answer["id"], 1);
        let released = async {
            while !dropped.load(Ordering::SeqCst) {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), released)
            .await
            .expect("what was kept was not dropped within 60 s");
        drop(client);
        service.await.unwrap();
    }

    /// Past [`MAX_IN_FLIGHT`] requests waiting for their answers, a request is refused at
    /// once, with its id, and never reaches the session (as is one reusing the id of a
    /// request waiting for its answer); a cancellation, or an answer written, lets the next
    /// one in; notifications pass all along.
    #[tokio::test]
    async fn requests_past_the_limit_in_flight_are_refused_until_one_is_answered() {
        let (mut transport, mut client, output) = transport();
        let answers = tokio::spawn(answers(output));
        let ping = |id: usize| format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}\n");
        // The session's `initialize` first (before it, a notification would be dropped).
        let mut input = String::from(
            "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"c\",\"version\":\"0\"}}}\n",
        );
        for id in 1..MAX_IN_FLIGHT + 2 {
            input += &ping(id);
        }
        input += "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":1}}\n";
        input += &ping(100);
        client.write_all(input.as_bytes()).await.unwrap();
        let id = |message: &ClientJsonRpcMessage| match message {
            JsonRpcMessage::Request(request) => request.id.clone(),
            other => panic!("not a request: {other:?}"),
        };
        for expected in 0..MAX_IN_FLIGHT {
            let message = transport.receive().await.unwrap();
            assert_eq!(id(&message), RequestId::Number(expected as i64));
        }
        assert_eq!(transport.in_flight.len(), MAX_IN_FLIGHT);
        // The two past the limit are answered, and the cancellation passes and frees its
        // request's place, which ping 100 takes.
        let cancel = transport.receive().await.unwrap();
        assert!(
            matches!(cancel, JsonRpcMessage::Notification(_)),
            "{cancel:?}"
        );
        assert_eq!(
            id(&transport.receive().await.unwrap()),
            RequestId::Number(100)
        );
        assert_eq!(transport.in_flight.len(), MAX_IN_FLIGHT);
        // An answer written frees its place.
        transport
            .send(ServerJsonRpcMessage::response(
                rmcp::model::ServerResult::empty(()),
                RequestId::Number(0),
            ))
            .await
            .unwrap();
        assert_eq!(transport.in_flight.len(), MAX_IN_FLIGHT - 1);
        client
            .write_all(format!("{}{}{}", ping(101), ping(102), ping(101)).as_bytes())
            .await
            .unwrap();
        drop(client);
        assert_eq!(
            id(&transport.receive().await.unwrap()),
            RequestId::Number(101)
        );
        assert!(transport.receive().await.is_none());
        transport.close().await.unwrap();
        drop(transport);
        let answers = answers.await.unwrap();
        let refused: Vec<_> = answers
            .iter()
            .filter(|answer| answer["error"]["code"] == -32000)
            .map(|answer| answer["id"].as_u64().unwrap())
            .collect();
        let limit = MAX_IN_FLIGHT as u64;
        assert_eq!(refused, [limit, limit + 1, 102]);
        assert_eq!(answers.len(), 5, "{answers:?}");
        // The same id as a request waiting for its answer is refused as invalid.
        assert_eq!(answers[4]["id"], 101);
        assert_eq!(answers[4]["error"]["code"], -32600);
        assert_eq!(
            answers[0]["error"]["message"],
            "too many requests in flight: 64 are waiting for their answers; send this \
             again when one has come"
        );
        assert_eq!(answers[0]["error"]["data"]["inFlight"], 64);
        assert_eq!(answers[2]["id"], 0, "{answers:?}");
    }
}
