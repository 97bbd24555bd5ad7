//! Bounds on what HTTP clients hold in the gateway at once: connections, and POSTs being
//! handled (each up to rmcp's 4 MiB body while it is read, then a task and the answer
//! while it is made and sent).
//!
//! - At most [`MAX_CONNECTIONS`] connections are open; past it the gateway accepts no more
//!   until one closes (the rest wait in the listen backlog, as on any busy server). A
//!   connection that sends no request head for 30 s, idle between requests included, is
//!   closed, so idle connections cannot hold every place; so is one whose write (of an
//!   answer, of an event stream) has waited [`WRITE_WITHIN`] with nothing written, so
//!   that a client that stops reading gives back its connection's place and its POST's
//!   once the socket's buffers are full and the deadline has passed. The deadline is per
//!   write: a client whose reading lets each write proceed within 30 s is not cut, and
//!   holds what it holds as long as it keeps reading so.
//! - At most [`MAX_REQUESTS`] POSTs are in flight across every client, and at most
//!   [`MAX_REQUESTS_PER_SESSION`] within one session (by its `Mcp-Session-Id`) and for one
//!   identity when the gateway has tokens (all its sessions together); past either a POST
//!   is answered at once with `429 Too Many Requests` and a JSON-RPC error saying which. A
//!   POST is in flight from its headers until its answer's body is sent or dropped (an
//!   event stream of progress included). Every POST's body must arrive within
//!   [`BODY_WITHIN`] of its head, or it fails.
//! - A refused POST's body is read up to [`PEEK`] bytes (at most 32 at once, 4 of one
//!   session or identity, each read and handled within 5 s): if it is a notification or
//!   an answer it passes uncounted, so a client in a session at its bound can still cancel
//!   what holds its places or answer an elicitation. (Without a session, MCP 2026-07-28
//!   has no notification that cancels: a client cancels by closing the request's
//!   connection, which frees its place.)
//!
//! Requests without a session (MCP 2026-07-28's, an `initialize`) from the loopback
//! identity share the global bound only (each also holds a session slot while it runs, so
//! [`GatewaySettings::max_sessions`](crate::GatewaySettings::max_sessions) bounds them
//! first by default). Event streams (GETs in a session: rmcp keeps one and up to 32 more
//! per session) are bounded apart: at most [`MAX_STREAMS`] open in all,
//! [`MAX_LISTENS`](crate::MAX_LISTENS) within one session, and, when the gateway has
//! tokens, two per session one identity may hold (at least
//! [`MAX_LISTENS`](crate::MAX_LISTENS)); past any a GET is answered `429 Too Many
//! Requests`. A stream
//! holds its count until its body is sent or dropped. (MCP 2026-07-28's
//! `subscriptions/listen` streams, POSTs, are counted per identity apart, also up to
//! [`MAX_LISTENS`](crate::MAX_LISTENS).) A request without a known token is answered 401
//! and its connection closed, so that requests without a token hold no place.
//!
//! A POST's place ends with its connection, but in a session its request goes on in the
//! session's worker when its client goes away. So a session's transport ([`Bounded`])
//! also counts its requests in flight, as the stdio transport does ([`InFlight`]): past
//! [`MAX_REQUESTS_PER_SESSION`] unanswered or being answered, a request is answered at
//! once with an error (-32000) and never reaches the handler.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use psych_mcp::{InFlight, Refusal};
use rmcp::RoleServer;
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ErrorCode, ErrorData, GetExtensions, JsonRpcMessage,
    JsonRpcNotification, ServerJsonRpcMessage,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

use crate::raw::HttpBody;

/// The most HTTP connections open at once, under the usual soft limit of 1,024 file
/// descriptors with room for the gateway's own. An idle connection holds a task and
/// hyper's buffers (some KB); the requests on them are bounded apart.
pub const MAX_CONNECTIONS: usize = 512;

/// The most event streams (GETs in a session) open at once across every HTTP client: half
/// of [`MAX_CONNECTIONS`], so that streams held open leave places for requests. Within one
/// session at most [`MAX_LISTENS`](crate::MAX_LISTENS); for one identity when the gateway
/// has tokens (all its sessions together), two per session it may hold
/// ([`GatewaySettings::max_sessions_per_identity`](crate::GatewaySettings::max_sessions_per_identity)),
/// at least [`MAX_LISTENS`](crate::MAX_LISTENS).
pub const MAX_STREAMS: usize = MAX_CONNECTIONS / 2;

/// The most of a refused POST's body read to see whether it is a request: 64 KiB (a
/// cancellation or an elicitation's answer is far smaller).
pub const PEEK: usize = 64 * 1024;

/// The longest session id or identity kept as a key; a longer header (no session's) is
/// cut, so a key costs little whatever the client sends.
const MAX_KEY: usize = 128;

/// The most POSTs in flight at once across every HTTP client: what their bodies may hold
/// while read is at most this many times rmcp's 4 MiB.
pub const MAX_REQUESTS: usize = 256;

/// The most POSTs in flight at once within one session, so that one client cannot take
/// every place of [`MAX_REQUESTS`]; as many as a stdio client may have in flight.
pub const MAX_REQUESTS_PER_SESSION: usize = psych_mcp::MAX_PEER_REQUESTS;

/// A session's transport that counts its requests in flight (see the module docs).
pub(crate) struct Bounded<T> {
    inner: T,
    in_flight: Arc<InFlight>,
    activity: Arc<Activity>,
}

impl<T> Bounded<T> {
    /// `inner`, with at most [`MAX_REQUESTS_PER_SESSION`] requests in flight.
    pub(crate) fn new(inner: T) -> Self {
        let in_flight = InFlight::new(MAX_REQUESTS_PER_SESSION);
        Self {
            inner,
            activity: Arc::new(Activity {
                in_flight: Arc::clone(&in_flight),
                last: Mutex::new(std::time::Instant::now()),
            }),
            in_flight,
        }
    }

    /// The session's [`Activity`], for whoever closes idle sessions.
    pub(crate) fn activity(&self) -> Arc<Activity> {
        Arc::clone(&self.activity)
    }
}

/// When a session's transport last carried a message either way (or an HTTP request for
/// the session arrived: [`RawSessions`](crate::raw::RawSessions)' `has_session`), and its
/// requests in flight: a session is idle while no request of its is in flight (a call may
/// run longer than any idle limit without a message: rmcp's own keep-alive cut such calls,
/// counting only messages) and from its last message or HTTP request on.
#[derive(Debug)]
pub(crate) struct Activity {
    in_flight: Arc<InFlight>,
    last: Mutex<std::time::Instant>,
}

impl Activity {
    /// A message went through now (or a request arrived for the session).
    pub(crate) fn touch(&self) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = std::time::Instant::now();
    }

    /// How long the session has been idle at `now`: `None` while a request of its is in
    /// flight (its answer not yet written out).
    pub(crate) fn idle_for(&self, now: std::time::Instant) -> Option<Duration> {
        if !self.in_flight.is_empty() {
            return None;
        }
        let last = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
        Some(now.saturating_duration_since(last))
    }
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for Bounded<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.activity.touch();
        let answering = self.in_flight.answering(&item);
        let sending = answering.during(self.inner.send(item));
        let activity = Arc::clone(&self.activity);
        async move {
            let sent = sending.await;
            // Idle from the end of a long answer's write, not from its start.
            activity.touch();
            sent
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let mut message = self.inner.receive().await?;
            // No await from here on: a dropped `receive` loses nothing it took.
            self.activity.touch();
            if let Err(refusal) = count_in(&self.in_flight, &mut message, session_busy) {
                // Answered to the request's own stream, by the session's worker.
                drop(tokio::spawn(self.inner.send(*refusal)));
                continue;
            }
            return Some(message);
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// What a request refused for its session's bound is told.
fn session_busy(limit: usize) -> String {
    format!("too many requests in flight: a session may have {limit} at once")
}

/// The error code of a request refused because too many are in flight: JSON-RPC's range
/// for a server's own errors.
const BUSY: ErrorCode = ErrorCode(-32000);

/// Counts a client's `message` in `in_flight`: a request in, a cancellation's request out
/// (while it is unanswered). `Err` is the answer refusing a request instead (never passed
/// on): -32000 with `busy(limit)` past the limit (made only then), -32600 for the id of a
/// request waiting for its answer. A request counted in carries its
/// [`AnswerHold`](psych_mcp::AnswerHold) in its extensions, for its handler.
pub(crate) fn count_in(
    in_flight: &Arc<InFlight>,
    message: &mut ClientJsonRpcMessage,
    busy: fn(usize) -> String,
) -> Result<(), Box<ServerJsonRpcMessage>> {
    match message {
        JsonRpcMessage::Request(request) => match in_flight.enter(&request.id) {
            Ok(hold) => {
                request.request.extensions_mut().insert(hold);
            }
            Err(refusal) => {
                let error = match refusal {
                    Refusal::SameId => ErrorData::invalid_request(
                        "invalid request: a request with this id is waiting for its answer",
                        None,
                    ),
                    Refusal::LongId => ErrorData::invalid_request(
                        format!(
                            "invalid request: a request id may be at most {} bytes",
                            psych_mcp::MAX_REQUEST_ID_BYTES
                        ),
                        None,
                    ),
                    _ => ErrorData::new(
                        BUSY,
                        busy(in_flight.limit()),
                        Some(serde_json::json!({ "inFlight": in_flight.limit() })),
                    ),
                };
                return Err(Box::new(ServerJsonRpcMessage::error(
                    error,
                    Some(request.id.clone()),
                )));
            }
        },
        JsonRpcMessage::Notification(JsonRpcNotification {
            notification: ClientNotification::CancelledNotification(cancelled),
            ..
        }) => {
            if let Some(id) = &cancelled.params.request_id {
                in_flight.forget(id);
            }
        }
        _ => {}
    }
    Ok(())
}

/// What a POST is counted under, each to [`MAX_REQUESTS_PER_SESSION`]: its session if it
/// names one, and its identity when a token named it (not the shared loopback one), so
/// an identity's sessions together have no more than one session may.
pub(crate) fn keys(session: Option<&str>, identity: Option<&str>) -> Vec<String> {
    // Cut before the two-byte prefix is put on, so a key is made once.
    fn cut(name: &str) -> &str {
        &name[..name.floor_char_boundary(MAX_KEY - 2)]
    }
    let mut keys = Vec::new();
    if let Some(session) = session {
        keys.push(format!("s:{}", cut(session)));
    }
    if let Some(identity) = identity {
        keys.push(format!("i:{}", cut(identity)));
    }
    keys
}

/// How long a POST's body may take to arrive, from its head: 30 s (a 4 MiB body at
/// 140 KB/s). A body still coming then fails, so a client sending it a byte at a time
/// cannot hold its connection and place for good.
pub const BODY_WITHIN: Duration = Duration::from_secs(30);

/// How long a refused POST that is not a request may take to be read and handled (see
/// [`not_a_request`]) before it is answered as refused (429): 5 s.
pub(crate) const PASS_WITHIN: Duration = Duration::from_secs(5);

/// The most refused POSTs whose bodies are read at once to see whether they are requests;
/// one more is refused without reading.
pub(crate) const MAX_PEEKS: usize = 32;

/// The most of those [`MAX_PEEKS`] one session, or one identity with tokens, may have at
/// once, so that a client at its bound sending slow bodies cannot take every peek from
/// another client at its bound that needs one to cancel. (Without tokens every client is
/// the one identity `loopback` and names its session itself, so this holds among clients
/// that keep to their sessions.)
pub(crate) const PEEKS_PER_KEY: usize = 4;

/// The most of a POST's body kept as it is read ([`Deadline::recording`]), to answer a
/// request the gateway refuses after rmcp has read it with the request's `id`: 4 KiB, more
/// than a request opening a session or a usual call takes.
pub(crate) const HEAD: usize = 4 * 1024;

/// What a POST's body showed as it was read ([`Deadline::recording`]).
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Its first bytes: [`HEAD`] of them, and one more if there are more.
    pub(crate) head: Vec<u8>,
    /// Why it was refused unparsed, if it was.
    pub(crate) refused: Option<Unread>,
}

/// Why a recording body was refused before rmcp parsed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unread {
    /// It held more than
    /// [`MAX_REQUEST_STRUCTURAL_BYTES`](crate::MAX_REQUEST_STRUCTURAL_BYTES) structural
    /// bytes.
    TooComplex,
    /// It held more than [`BODY_BYTES`] bytes.
    TooLarge,
}

impl Unread {
    /// The body's error for it.
    fn error(self) -> BodyError {
        match self {
            Unread::TooComplex => BodyError::TooComplex(crate::MAX_REQUEST_STRUCTURAL_BYTES),
            Unread::TooLarge => BodyError::TooLarge(BODY_BYTES),
        }
    }
}

/// A body that fails if it has not ended within its deadline, and may keep its first
/// bytes as they are read and fail past the structural bound or [`BODY_BYTES`]
/// ([`Deadline::recording`]).
pub(crate) struct Deadline<B> {
    body: B,
    within: Duration,
    until: Pin<Box<tokio::time::Sleep>>,
    /// What it shows as it is read, for a recording body.
    seen: Option<Arc<Mutex<Seen>>>,
    /// Whether [`HEAD`] and one more bytes are kept already.
    head_kept: bool,
    /// Its structural bytes so far, for a recording body.
    structure: psych_mcp::wire::Structure,
    /// Its bytes passed on so far, for a recording body.
    passed: usize,
    /// Once it is refused, why, and how many of its bytes were read since: the rest is
    /// read and dropped to its end (at most [`BODY_BYTES`] more, within its deadline)
    /// before the refusal, so that the answer is not lost to a connection reset by bytes
    /// left unread.
    draining: Option<(Unread, usize)>,
    /// Whether it has failed (too slow, a failed read, refused): nothing more is read.
    failed: bool,
}

/// The most bytes of a POST's body rmcp reads (its default, which the gateway sets
/// explicitly): 4 MiB. A recording body refuses a larger one itself, draining it
/// ([`Deadline::recording`]): rmcp would answer it at once with the rest unread, and a
/// connection closed with bytes unread is reset, which may lose the answer on its way.
pub(crate) const BODY_BYTES: usize = 4 * 1024 * 1024;

impl<B> Deadline<B> {
    /// `body`, to end within `within` from now.
    pub(crate) fn new(body: B, within: Duration) -> Self {
        Self {
            body,
            within,
            until: Box::pin(tokio::time::sleep(within)),
            seen: None,
            head_kept: false,
            structure: psych_mcp::wire::Structure::default(),
            passed: 0,
            draining: None,
            failed: false,
        }
    }

    /// Fails with `error`: nothing more is read.
    fn fail(
        &mut self,
        error: BodyError,
    ) -> Poll<Option<Result<Frame<hyper::body::Bytes>, BodyError>>> {
        self.failed = true;
        Poll::Ready(Some(Err(error)))
    }

    /// Also keeps the body's first bytes in `seen` as they are read: [`HEAD`] of them, and
    /// one more if there are more (so a body longer than [`HEAD`] is seen as such); and
    /// counts its structural bytes and its bytes as they pass: past
    /// [`MAX_REQUEST_STRUCTURAL_BYTES`](crate::MAX_REQUEST_STRUCTURAL_BYTES) structural
    /// bytes, or [`BODY_BYTES`] bytes, nothing more is passed on, the rest is read and
    /// dropped (at most [`BODY_BYTES`] more, within the deadline), and the body fails
    /// (saying why in `seen`) before rmcp parses it.
    pub(crate) fn recording(mut self, seen: Arc<Mutex<Seen>>) -> Self {
        self.seen = Some(seen);
        self
    }
}

/// The `id` of the request whose body began with `head` ([`Seen::head`]), if the
/// whole body is there and is one JSON-RPC request other than `server/discover`: an error
/// answering a client's discover probe would tell it the gateway is of an earlier
/// revision (rmcp's client, in its `Auto` mode, then falls back to `initialize`), where a
/// bare 503 tells it to come back.
pub(crate) fn request_id(head: &[u8]) -> Option<serde_json::Value> {
    if head.len() > HEAD {
        return None;
    }
    let message: serde_json::Value = serde_json::from_slice(head).ok()?;
    let message = message.as_object()?;
    if message.get("method")?.as_str()? == "server/discover" {
        return None;
    }
    message.get("id").filter(|id| !id.is_null()).cloned()
}

/// Why a POST body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// It did not arrive within its deadline.
    #[error("the request body did not arrive within {0:?}")]
    TooSlow(Duration),
    /// Reading it failed.
    #[error("reading the request body")]
    Read(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// It holds more structural bytes than the gateway parses.
    #[error("the request body holds over {0} brackets, braces, commas and colons")]
    TooComplex(u64),
    /// It holds more bytes than the gateway reads.
    #[error("the request body is over {0} bytes")]
    TooLarge(usize),
}

impl<B> Body for Deadline<B>
where
    B: Body<Data = hyper::body::Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = hyper::body::Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let bound = crate::MAX_REQUEST_STRUCTURAL_BYTES;
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        while let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            if let Some((why, read)) = this.draining.as_mut() {
                // Refused: read and dropped to its end, a failed read, or the cap.
                if let Some(Ok(frame)) = &frame {
                    *read = read.saturating_add(frame.data_ref().map_or(0, |data| data.len()));
                    if *read <= BODY_BYTES {
                        continue;
                    }
                }
                let error = why.error();
                return this.fail(error);
            }
            if let (Some(seen), Some(Ok(frame))) = (&this.seen, &frame)
                && let Some(data) = frame.data_ref()
            {
                if !this.head_kept {
                    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
                    let room = (HEAD + 1).saturating_sub(seen.head.len());
                    seen.head.extend_from_slice(&data[..data.len().min(room)]);
                    this.head_kept = seen.head.len() > HEAD;
                }
                this.passed = this.passed.saturating_add(data.len());
                let refused = if this.passed > BODY_BYTES {
                    Some(Unread::TooLarge)
                } else if this.structure.feed(data, bound) {
                    Some(Unread::TooComplex)
                } else {
                    None
                };
                if let Some(why) = refused {
                    seen.lock().unwrap_or_else(PoisonError::into_inner).refused = Some(why);
                    this.seen = None;
                    this.draining = Some((why, 0));
                    continue;
                }
            }
            let frame = frame.map(|frame| frame.map_err(|e| BodyError::Read(e.into())));
            this.failed = matches!(frame, Some(Err(_)));
            return Poll::Ready(frame);
        }
        match this.until.as_mut().poll(cx) {
            Poll::Ready(()) => match this.draining {
                Some((why, _)) => this.fail(why.error()),
                None => this.fail(BodyError::TooSlow(this.within)),
            },
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        // While draining, its refusal is still owed.
        self.failed || (self.draining.is_none() && self.body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// `request` with its body read, if that body is at most [`PEEK`] bytes of one JSON-RPC
/// message that is not a request (a notification, an answer); `None` otherwise.
pub(crate) async fn not_a_request<B>(
    request: hyper::Request<B>,
) -> Option<hyper::Request<http_body_util::Full<hyper::body::Bytes>>>
where
    B: Body<Data = hyper::body::Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use http_body_util::BodyExt;
    let (parts, body) = request.into_parts();
    let bytes = http_body_util::Limited::new(body, PEEK)
        .collect()
        .await
        .ok()?
        .to_bytes();
    let message: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let message = message.as_object()?;
    if message.contains_key("method") && message.contains_key("id") {
        return None;
    }
    Some(hyper::Request::from_parts(
        parts,
        http_body_util::Full::new(bytes),
    ))
}

/// The counts of POSTs in flight, in all and per session.
#[derive(Debug)]
pub(crate) struct Admission {
    total_limit: usize,
    session_limit: usize,
    identity_limit: usize,
    counts: Mutex<Counts>,
    /// Told each time the count comes back to none ([`Admission::drained`]).
    emptied: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    /// Only keys (sessions, identities) with a POST in flight: at most twice `total`
    /// entries.
    sessions: HashMap<String, usize>,
}

/// Which bound refused a POST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// [`MAX_REQUESTS`] across every client.
    Total(usize),
    /// [`MAX_REQUESTS_PER_SESSION`] in the POST's session.
    Session(usize),
    /// [`MAX_REQUESTS_PER_SESSION`] for the POST's identity (with tokens).
    Identity(usize),
}

impl Refused {
    /// The bound that refused.
    pub(crate) fn limit(self) -> usize {
        match self {
            Self::Total(limit) | Self::Session(limit) | Self::Identity(limit) => limit,
        }
    }
}

impl Admission {
    /// Counts with the gateway's bounds.
    pub(crate) fn new() -> Arc<Self> {
        Self::with_limits(MAX_REQUESTS, MAX_REQUESTS_PER_SESSION)
    }

    /// Counts of refused POSTs being peeked: [`MAX_PEEKS`] in all, [`PEEKS_PER_KEY`] per
    /// session or identity.
    pub(crate) fn peeks() -> Arc<Self> {
        Self::with_limits(MAX_PEEKS, PEEKS_PER_KEY)
    }

    /// Counts of event streams (GETs) open: [`MAX_STREAMS`] in all,
    /// [`MAX_LISTENS`](crate::MAX_LISTENS) per session, and two per session an identity
    /// may hold (`identity_sessions`; at least [`MAX_LISTENS`](crate::MAX_LISTENS)) per
    /// identity: a client keeps one open, and one more while it reconnects.
    pub(crate) fn streams(identity_sessions: usize) -> Arc<Self> {
        Arc::new(Self {
            total_limit: MAX_STREAMS,
            session_limit: crate::MAX_LISTENS,
            identity_limit: identity_sessions.saturating_mul(2).max(crate::MAX_LISTENS),
            counts: Mutex::new(Counts::default()),
            emptied: tokio::sync::Notify::new(),
        })
    }

    /// `total_limit` in all, `key_limit` per session and per identity.
    fn with_limits(total_limit: usize, key_limit: usize) -> Arc<Self> {
        Arc::new(Self {
            total_limit,
            session_limit: key_limit,
            identity_limit: key_limit,
            counts: Mutex::new(Counts::default()),
            emptied: tokio::sync::Notify::new(),
        })
    }

    /// Counts one POST in (of `session`, if it names one), or says which bound it is past.
    pub(crate) fn admit(self: &Arc<Self>, keys: Vec<String>) -> Result<Admitted, Refused> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.total >= self.total_limit {
            return Err(Refused::Total(self.total_limit));
        }
        for key in &keys {
            let (limit, refused): (usize, fn(usize) -> Refused) = if key.starts_with("i:") {
                (self.identity_limit, Refused::Identity)
            } else {
                (self.session_limit, Refused::Session)
            };
            if counts.sessions.get(key).copied().unwrap_or(0) >= limit {
                return Err(refused(limit));
            }
        }
        for key in &keys {
            match counts.sessions.get_mut(key) {
                Some(count) => *count += 1,
                None => {
                    counts.sessions.insert(key.clone(), 1);
                }
            }
        }
        counts.total += 1;
        Ok(Admitted {
            admission: Arc::clone(self),
            keys,
        })
    }

    /// How many are counted in now.
    pub(crate) fn total(&self) -> usize {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }

    /// Returns once none is counted in (woken as the last place is given back): for a
    /// shutdown that lets the answers on their way out be sent. Cancel-safe (it only
    /// looks and waits).
    pub(crate) async fn drained(&self) {
        loop {
            // Listening before looking, so that a place given back between the two wakes it.
            let emptied = self.emptied.notified();
            let mut emptied = std::pin::pin!(emptied);
            emptied.as_mut().enable();
            if self.total() == 0 {
                return;
            }
            emptied.await;
        }
    }
}

/// A POST's place, given back when dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    keys: Vec<String>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self
            .admission
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        counts.total = counts.total.saturating_sub(1);
        for key in &self.keys {
            if let Some(count) = counts.sessions.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    counts.sessions.remove(key);
                }
            }
        }
        if counts.total == 0 {
            self.admission.emptied.notify_waiters();
        }
    }
}

/// The answer to a POST refused by `refused`: 429, with a JSON-RPC error without an `id`
/// (the body was not read) and `Retry-After: 1`.
pub(crate) fn too_many(refused: Refused) -> hyper::Response<HttpBody> {
    let limit = refused.limit();
    let message = match refused {
        Refused::Total(_) => {
            format!("too many requests in flight: the gateway handles {limit} at once")
        }
        Refused::Session(_) => session_busy(limit),
        Refused::Identity(_) => format!(
            "too many requests in flight: an identity may have {limit} at once, all its \
             sessions together"
        ),
    };
    retry_after(busy_error(
        hyper::StatusCode::TOO_MANY_REQUESTS,
        None,
        message,
        serde_json::json!({"inFlight": limit}),
    ))
}

/// The answer to a GET (an event stream) past a bound of [`Admission::streams`]:
/// `429 Too Many Requests`, saying which.
pub(crate) fn too_many_streams(refused: Refused) -> hyper::Response<HttpBody> {
    let limit = refused.limit();
    let message = match refused {
        Refused::Total(_) => {
            format!("too many event streams open: the gateway keeps {limit} at once")
        }
        Refused::Session(_) => format!(
            "too many event streams open: a session may have {limit} at once; close one first"
        ),
        Refused::Identity(_) => format!(
            "too many event streams open: an identity may have {limit} at once, all its \
             sessions together; close one first"
        ),
    };
    retry_after(busy_error(
        hyper::StatusCode::TOO_MANY_REQUESTS,
        None,
        message,
        serde_json::json!({"streams": limit}),
    ))
}

/// An HTTP answer of `status` carrying a JSON-RPC error of the gateway's own (-32000) with
/// `message` and `data`: for `id`, or without one when the request's body was not read.
pub(crate) fn busy_error(
    status: hyper::StatusCode,
    id: Option<serde_json::Value>,
    message: String,
    data: serde_json::Value,
) -> hyper::Response<HttpBody> {
    error_answer(status, BUSY, id, message, data)
}

/// An HTTP answer of `status` carrying the JSON-RPC error `code` with `message` and
/// `data`: for `id`, or without one.
pub(crate) fn error_answer(
    status: hyper::StatusCode,
    code: ErrorCode,
    id: Option<serde_json::Value>,
    message: String,
    data: serde_json::Value,
) -> hyper::Response<HttpBody> {
    let mut body = serde_json::json!({
        "jsonrpc": "2.0",
        "error": {"code": code.0, "message": message, "data": data},
    });
    if let Some(id) = id {
        body["id"] = id;
    }
    crate::http_answer(status, "application/json", body.to_string())
}

/// `response` with `Retry-After: 1`: a place or a slot frees within about a second.
pub(crate) fn retry_after(mut response: hyper::Response<HttpBody>) -> hyper::Response<HttpBody> {
    response.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from_static("1"),
    );
    response
}

/// The largest piece of a response body given to hyper at once: hyper queues a frame
/// whole, and takes more only while its write buffer holds under ~408 KiB.
pub(crate) const BODY_PIECE: usize = 64 * 1024;

/// `response` with `admitted` held until its body has been sent or dropped.
///
/// Sent means written but for at most ~470 KiB: the body is given to hyper in pieces of
/// at most [`BODY_PIECE`], each a copy (a slice would keep the whole answer's buffer alive
/// after the body is dropped), and does not say it has ended with its last piece. hyper
/// takes pieces while its write buffer holds under ~408 KiB and then writes it all before
/// taking more, so when it drops the body (its length reached, or polled to its end) at
/// most that buffer and one piece are unwritten. A body of one frame (an answer's JSON)
/// said it had ended with that frame, and hyper dropped it, and the place, as soon as it
/// had queued the frame whole, however slowly the client read it.
///
/// So a client that stops reading a large answer holds its place until its connection
/// ends: at the latest [`WRITE_WITHIN`] after the socket's buffers have filled
/// ([`WriteDeadline`]), as one that stops reading its session's stream does; bounded by
/// the places, per session, per identity and in all.
pub(crate) fn hold(
    response: hyper::Response<HttpBody>,
    admitted: Admitted,
) -> hyper::Response<HttpBody> {
    use http_body_util::BodyExt;
    response.map(|body| {
        Held {
            body,
            rest: None,
            owed: false,
            _admitted: admitted,
        }
        .boxed()
    })
}

/// A body that holds a POST's place while it is sent ([`hold`]).
struct Held {
    body: HttpBody,
    /// What is left of a data frame over [`BODY_PIECE`].
    rest: Option<hyper::body::Bytes>,
    /// Whether a piece was given and the body not polled since: until it is, the body
    /// does not say it has ended (which would make hyper drop it with the piece queued).
    owed: bool,
    _admitted: Admitted,
}

impl Held {
    /// The next piece of `bytes`, keeping the rest for the next poll. A piece of a larger
    /// frame is a copy, so that what hyper still holds when the body is dropped does not
    /// keep the frame's whole buffer.
    fn piece(&mut self, bytes: hyper::body::Bytes) -> Frame<hyper::body::Bytes> {
        self.owed = true;
        if bytes.len() <= BODY_PIECE {
            return Frame::data(bytes);
        }
        let piece = hyper::body::Bytes::copy_from_slice(&bytes[..BODY_PIECE]);
        self.rest = Some(bytes.slice(BODY_PIECE..));
        Frame::data(piece)
    }
}

impl Body for Held {
    type Data = hyper::body::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.owed = false;
        if let Some(rest) = self.rest.take() {
            return Poll::Ready(Some(Ok(self.piece(rest))));
        }
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(bytes) => Poll::Ready(Some(Ok(self.piece(bytes)))),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        !self.owed && self.rest.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.as_ref().map_or(0, |rest| rest.len() as u64);
        let inner = self.body.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper().and_then(|upper| upper.checked_add(rest)) {
            hint.set_upper(upper);
        }
        hint
    }
}

/// How long a write of a connection (an answer, an event stream) may wait with nothing
/// written, its client reading nothing and the socket's buffers full, before the
/// connection is closed: 30 s.
pub const WRITE_WITHIN: Duration = Duration::from_secs(30);

/// A connection whose writes fail once one has waited [`WRITE_WITHIN`] with nothing
/// written (hyper has no write deadline of its own). A client that stops reading then
/// gives back what its connection holds (its place among the connections, a POST's place
/// held until its answer is sent, the answer's bytes in hyper's buffer) once the socket's
/// buffers (the client's receive buffer and ours to send, up to some MB) have filled and
/// the deadline has passed, not when it closes the connection. The deadline is per write:
/// a client whose reading lets each write proceed within it is not cut, however long the
/// whole takes, and holds its places as long as it goes on so.
///
/// A flush or shutdown that proceeds ends a wait as a write does: hyper flushes the socket
/// only once its own buffer is written, so none proceeds while a write is blocked.
pub(crate) struct WriteDeadline<T> {
    io: T,
    within: Duration,
    /// The deadline of the write waiting now, when `waiting`: made when a write (or flush,
    /// or shutdown) first could not proceed, and reset when a later one starts waiting,
    /// so that a slow reader does not cost an allocation per wait.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether a write is waiting since the last one that proceeded.
    waiting: bool,
}

impl<T> WriteDeadline<T> {
    /// `io`, its writes failing once one has waited `within`.
    pub(crate) fn new(io: T, within: Duration) -> Self {
        Self {
            io,
            within,
            deadline: None,
            waiting: false,
        }
    }

    /// `polled` (a write's, a flush's or a shutdown's), or past the deadline of a write
    /// that could not proceed, a failure. Waiting, it is woken by the deadline too.
    fn within<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        if polled.is_ready() {
            self.waiting = false;
            return polled;
        }
        let within = self.within;
        let deadline = match &mut self.deadline {
            Some(deadline) => {
                if !self.waiting {
                    deadline
                        .as_mut()
                        .reset(tokio::time::Instant::now() + within);
                }
                deadline
            }
            None => self.deadline.insert(Box::pin(tokio::time::sleep(within))),
        };
        self.waiting = true;
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("a write waited {within:?} with nothing written"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.within(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.within(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.within(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.within(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use http_body_util::BodyExt;

    use super::*;

    /// `drained` waits while a place is held and returns as the last is given back (two
    /// held, given back one after the other), and at once when none is.
    #[tokio::test]
    async fn drained_returns_as_the_last_place_is_given_back() {
        let admission = Admission::with_limits(5, 2);
        tokio::time::timeout(Duration::from_secs(5), admission.drained())
            .await
            .expect("none held: at once");
        let first = admission.admit(Vec::new()).unwrap();
        let second = admission.admit(Vec::new()).unwrap();
        // A wait given up while places are held (as a deadline drops it) leaves nothing.
        let given_up = tokio::time::timeout(Duration::from_millis(20), admission.drained()).await;
        assert!(given_up.is_err(), "places held: it waits");
        let waiting = tokio::spawn({
            let admission = Arc::clone(&admission);
            async move { admission.drained().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(first);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "one place still held");
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken as the last place came back")
            .unwrap();
    }

    #[test]
    fn posts_past_either_bound_are_refused_and_places_come_back() {
        let admission = Admission::with_limits(5, 2);
        let one = |key: &str| vec![key.to_owned()];
        let a1 = admission.admit(one("a")).unwrap();
        let a2 = admission.admit(one("a")).unwrap();
        assert_eq!(admission.admit(one("a")).unwrap_err(), Refused::Session(2));
        let b = admission.admit(one("b")).unwrap();
        let none: Vec<_> = (0..2)
            .map(|_| admission.admit(Vec::new()).unwrap())
            .collect();
        assert_eq!(admission.admit(Vec::new()).unwrap_err(), Refused::Total(5));
        assert_eq!(admission.admit(one("c")).unwrap_err(), Refused::Total(5));
        drop(a1);
        let a3 = admission.admit(one("a")).unwrap();
        drop((a2, a3, b, none));
        assert_eq!(admission.total(), 0);
        // Under two keys, each is bounded: a second session of one identity shares its
        // identity's count.
        let both = |session: &str| vec![format!("s:{session}"), "i:alice".to_owned()];
        let first = admission.admit(both("1")).unwrap();
        let second = admission.admit(both("2")).unwrap();
        assert_eq!(
            admission.admit(both("3")).unwrap_err(),
            Refused::Identity(2)
        );
        drop((first, second));
        assert_eq!(admission.total(), 0);
        assert!(
            admission.counts.lock().unwrap().sessions.is_empty(),
            "a session with nothing in flight holds no entry"
        );
    }

    /// Peeks are bounded per session (or identity) below their total, so that one client
    /// at its bound cannot take them all.
    #[test]
    fn one_client_takes_at_most_its_share_of_the_peeks() {
        let peeks = Admission::peeks();
        let session = |name: &str| keys(Some(name), None);
        let held: Vec<Admitted> = (0..PEEKS_PER_KEY)
            .map(|_| peeks.admit(session("greedy")).unwrap())
            .collect();
        assert_eq!(
            peeks.admit(session("greedy")).unwrap_err(),
            Refused::Session(PEEKS_PER_KEY)
        );
        let other = peeks.admit(session("other")).unwrap();
        drop((held, other));
        assert_eq!(peeks.total(), 0);
    }

    #[test]
    fn a_post_is_counted_under_its_session_and_a_named_identity() {
        assert_eq!(keys(Some("abc"), Some("alice")), ["s:abc", "i:alice"]);
        assert_eq!(keys(None, Some("alice")), ["i:alice"]);
        assert!(keys(None, None).is_empty());
        let long = "é".repeat(1000);
        let cut = &keys(Some(&long), None)[0];
        assert!(
            cut.len() <= MAX_KEY && cut.len() >= MAX_KEY - 1,
            "{}",
            cut.len()
        );
    }

    /// A body that stops coming fails at its deadline rather than waiting for good.
    #[tokio::test]
    async fn a_body_that_stops_coming_fails_at_its_deadline() {
        use futures_util::StreamExt;
        let first = Ok::<_, std::io::Error>(Frame::data(hyper::body::Bytes::from_static(b"{")));
        let frames = futures_util::stream::iter([first]).chain(futures_util::stream::pending());
        let slow = Deadline::new(
            http_body_util::StreamBody::new(frames),
            Duration::from_millis(50),
        );
        let error = slow.collect().await.err().unwrap();
        assert!(matches!(error, BodyError::TooSlow(_)), "{error}");
    }

    /// A recording body passes nothing on after the frame that takes it past
    /// [`MAX_REQUEST_STRUCTURAL_BYTES`](crate::MAX_REQUEST_STRUCTURAL_BYTES), counted across
    /// frames (a string split between two included), reads the rest to its end and fails
    /// saying so; one at the bound is read whole.
    #[tokio::test]
    async fn a_recording_body_fails_past_the_structural_bound() {
        let max = usize::try_from(crate::MAX_REQUEST_STRUCTURAL_BYTES).unwrap();
        // `{"id":1,"s":"[[…]]","a":[0,…,0]}`: 7 structural bytes to the array's `[`,
        // then `commas` commas.
        let json = |commas: usize| {
            let mut json =
                format!("{{\"id\":1,\"s\":\"{}\",\"a\":[0", "[".repeat(990)).into_bytes();
            json.extend(std::iter::repeat_n(&b",0"[..], commas).flatten());
            json.extend_from_slice(b"]}");
            // Blanks after it: the rest of a body refused is read and dropped.
            json.extend(std::iter::repeat_n(b' ', 10_000));
            json
        };
        // Frames of 1,000 bytes, the first cutting a string with brackets in it.
        let at = json(max - 7);
        let read = read_recording(&at, 1000).await;
        assert_eq!(read.passed, at, "passed whole");
        assert!(read.ended.is_ok() && read.refused.is_none() && read.whole);
        let over = json(max - 6);
        let read = read_recording(&over, 1000).await;
        assert!(
            matches!(read.ended, Err(BodyError::TooComplex(bound)) if bound == max as u64),
            "{:?}",
            read.ended
        );
        assert_eq!(read.refused, Some(Unread::TooComplex));
        assert!(read.whole, "read to its end");
        assert!(
            over.starts_with(&read.passed),
            "what passed is the body's start"
        );
        let mut passed = psych_mcp::wire::Structure::default();
        passed.feed(&read.passed, u64::MAX);
        assert!(
            passed.count() <= max as u64,
            "nothing passed past the bound"
        );
        assert_eq!(read.head, HEAD + 1);
    }

    /// A recording body over 4 MiB is refused before rmcp reads past it: what passes is at
    /// most 4 MiB, the rest is read and dropped (at most 4 MiB more), and the refusal says
    /// why; a body of 4 MiB passes whole.
    #[tokio::test]
    async fn a_recording_body_over_4_mib_is_refused_and_drained() {
        let read = async |len: usize| read_recording(&vec![b' '; len], 64 * 1024 + 1).await;
        let at = read(BODY_BYTES).await;
        assert_eq!(at.passed.len(), BODY_BYTES);
        assert!(at.ended.is_ok() && at.refused.is_none() && at.whole);
        let refused = |read: &Recorded| {
            assert!(
                read.passed.len() <= BODY_BYTES,
                "rmcp was given {}",
                read.passed.len()
            );
            assert!(
                matches!(read.ended, Err(BodyError::TooLarge(BODY_BYTES))),
                "{:?}",
                read.ended
            );
            assert_eq!(read.refused, Some(Unread::TooLarge));
        };
        let over = read(BODY_BYTES + 1).await;
        refused(&over);
        assert!(over.whole, "read to its end");
        let far = read(3 * BODY_BYTES).await;
        refused(&far);
        assert!(!far.whole, "not read past what is drained");
    }

    /// What reading a recording body showed ([`read_recording`]).
    struct Recorded {
        /// The bytes it passed on.
        passed: Vec<u8>,
        /// How it ended.
        ended: Result<(), BodyError>,
        /// Why it was refused, as it said in its [`Seen`].
        refused: Option<Unread>,
        /// How many of its first bytes it kept.
        head: usize,
        /// Whether its source was read to its end.
        whole: bool,
    }

    /// `bytes` in frames of at most `frame` bytes read through a recording body, frame by
    /// frame as rmcp reads it.
    async fn read_recording(bytes: &[u8], frame: usize) -> Recorded {
        let frames: Vec<Result<Frame<hyper::body::Bytes>, std::io::Error>> = bytes
            .chunks(frame)
            .map(|bytes| Ok(Frame::data(hyper::body::Bytes::copy_from_slice(bytes))))
            .collect();
        let (all, taken) = (frames.len(), Arc::new(Mutex::new(0)));
        let counting = Arc::clone(&taken);
        let frames =
            futures_util::StreamExt::inspect(futures_util::stream::iter(frames), move |_| {
                *counting.lock().unwrap() += 1
            });
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut body = Deadline::new(
            http_body_util::StreamBody::new(frames),
            Duration::from_secs(5),
        )
        .recording(Arc::clone(&seen));
        let mut passed = Vec::new();
        let ended = loop {
            match body.frame().await {
                Some(Ok(frame)) => passed.extend_from_slice(frame.data_ref().unwrap()),
                Some(Err(error)) => break Err(error),
                None => break Ok(()),
            }
        };
        let whole = *taken.lock().unwrap() == all;
        let seen = seen.lock().unwrap();
        Recorded {
            passed,
            ended,
            refused: seen.refused,
            head: seen.head.len(),
            whole,
        }
    }

    /// A body refused (past the structural bound, or past 4 MiB) is drained from a source
    /// that makes it wait (as a connection does), within its deadline, and no more than
    /// 4 MiB of it; nothing after the refusal reaches the reader.
    #[tokio::test]
    async fn a_refused_body_is_drained_within_its_deadline_and_cap() {
        let max = usize::try_from(crate::MAX_REQUEST_STRUCTURAL_BYTES).unwrap();
        let complex = {
            let mut json = b"[0".to_vec();
            json.extend(std::iter::repeat_n(&b",0"[..], max).flatten());
            json
        };
        // A body fed by a channel: each frame waits for the test to send it.
        let body = |within: Duration| {
            let (sender, receiver) = tokio::sync::mpsc::unbounded_channel::<hyper::body::Bytes>();
            let frames = futures_util::stream::unfold(receiver, |mut receiver| async move {
                let bytes = receiver.recv().await?;
                Some((Ok::<_, std::io::Error>(Frame::data(bytes)), receiver))
            });
            let seen = Arc::new(Mutex::new(Seen::default()));
            let body = Deadline::new(http_body_util::StreamBody::new(Box::pin(frames)), within)
                .recording(Arc::clone(&seen));
            (sender, body)
        };
        let reading = |body: Deadline<_>| {
            tokio::spawn(async move { body.collect().await.map(|whole| whole.to_bytes().len()) })
        };
        for (over, why) in [
            (complex, Unread::TooComplex),
            (vec![b' '; BODY_BYTES + 1], Unread::TooLarge),
        ] {
            let refused = |error: &BodyError| match why {
                Unread::TooComplex => matches!(error, BodyError::TooComplex(_)),
                Unread::TooLarge => matches!(error, BodyError::TooLarge(_)),
            };
            // Drained to its end, frames arriving after the refusal.
            let (sender, drained) = body(Duration::from_secs(5));
            let read = reading(drained);
            sender.send(over.clone().into()).unwrap();
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                sender.send(vec![b' '; 1000].into()).unwrap();
            }
            assert!(!read.is_finished(), "still draining");
            drop(sender);
            let error = read.await.unwrap().unwrap_err();
            assert!(refused(&error), "{error}");
            // A body that never ends fails at its deadline, saying why it was refused.
            let (sender, slow) = body(Duration::from_millis(200));
            let read = reading(slow);
            sender.send(over.clone().into()).unwrap();
            let error = read.await.unwrap().unwrap_err();
            assert!(refused(&error), "{error}");
            // Past 4 MiB more, it fails with the rest unread, long before its deadline.
            let (sender, endless) = body(Duration::from_secs(600));
            let read = reading(endless);
            sender.send(over.into()).unwrap();
            let mib = hyper::body::Bytes::from(vec![b' '; 1 << 20]);
            for _ in 0..=BODY_BYTES >> 20 {
                sender.send(mib.clone()).unwrap();
            }
            let error = tokio::time::timeout(Duration::from_secs(60), read)
                .await
                .expect("refused at the cap, not the deadline")
                .unwrap()
                .unwrap_err();
            assert!(refused(&error), "{error}");
            drop(sender);
        }
    }

    /// A recording body keeps its first bytes across frames (trailers skipped) and one
    /// past [`HEAD`] when there are more; a request read whole gives its id, one cut short
    /// or a discover probe none.
    #[tokio::test]
    async fn a_recording_body_keeps_its_head_across_frames() {
        let read = async |frames: Vec<Vec<u8>>| {
            let mut stream: Vec<Result<Frame<hyper::body::Bytes>, std::io::Error>> = frames
                .into_iter()
                .map(|bytes| Ok(Frame::data(hyper::body::Bytes::from(bytes))))
                .collect();
            stream.push(Ok(Frame::trailers(hyper::HeaderMap::new())));
            let seen = Arc::new(Mutex::new(Seen::default()));
            let body = Deadline::new(
                http_body_util::StreamBody::new(futures_util::stream::iter(stream)),
                Duration::from_secs(5),
            )
            .recording(Arc::clone(&seen));
            let whole = body.collect().await.unwrap().to_bytes();
            let kept = seen.lock().unwrap().head.clone();
            (whole, kept)
        };
        // Exactly HEAD bytes, in three frames: kept whole, its id found.
        let mut call = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"a":""#.to_vec();
        call.resize(HEAD - 3, b'x');
        call.extend_from_slice(br#""}}"#);
        assert_eq!(call.len(), HEAD);
        let frames = vec![
            call[..2000].to_vec(),
            call[2000..4000].to_vec(),
            call[4000..].to_vec(),
        ];
        let (whole, kept) = read(frames).await;
        assert_eq!(&whole[..], &call[..]);
        assert_eq!(kept, call);
        assert_eq!(request_id(&kept), Some(serde_json::json!(7)));
        // One byte more: HEAD + 1 kept, no id.
        let mut longer = call.clone();
        longer.insert(longer.len() - 3, b'x');
        let (whole, kept) = read(vec![longer.clone()]).await;
        assert_eq!(&whole[..], &longer[..]);
        assert_eq!(kept, longer[..HEAD + 1]);
        assert_eq!(request_id(&kept), None);
        let discover = br#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}"#;
        assert_eq!(request_id(discover), None);
        let answer = br#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
        assert_eq!(request_id(answer), None);
        assert_eq!(
            request_id(br#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#),
            Some(serde_json::json!("a"))
        );
    }

    /// A one-frame answer is given to hyper in pieces, and the body says it has ended only
    /// once it has been polled after its last piece: until then its place is held.
    #[tokio::test]
    async fn a_large_answer_is_given_in_pieces_and_holds_its_place_to_the_end() {
        let admission = Admission::with_limits(2, 2);
        let admitted = admission.admit(Vec::new()).unwrap();
        let size = 3 * BODY_PIECE + 10;
        let text: String = (0..size)
            .map(|i| char::from(b'a' + u8::try_from(i % 26).unwrap()))
            .collect();
        let answer = crate::http_answer(hyper::StatusCode::OK, "application/json", text.clone());
        let mut body = hold(answer, admitted).into_body();
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(size as u64));
        let mut pieces = Vec::new();
        let mut sent = Vec::new();
        loop {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
            let Some(frame) = frame else { break };
            let bytes = frame.unwrap().into_data().unwrap();
            pieces.push(bytes.len());
            sent.extend_from_slice(&bytes);
            // As hyper asks after each piece: never ended with a piece just given, and
            // what is left is known exactly.
            assert!(!body.is_end_stream(), "ended after a piece");
            assert_eq!(body.size_hint().exact(), Some((size - sent.len()) as u64));
        }
        assert_eq!(pieces, [BODY_PIECE, BODY_PIECE, BODY_PIECE, 10]);
        assert_eq!(sent, text.as_bytes(), "in order, nothing lost or repeated");
        assert_eq!(
            admission.total(),
            1,
            "the place is held while the body lives"
        );
        assert!(body.is_end_stream());
        drop(body);
        assert_eq!(admission.total(), 0);
    }

    /// A write that waits past its deadline fails; a client reading slowly, each write
    /// proceeding within it, is never cut, however long the whole takes.
    #[tokio::test(start_paused = true)]
    async fn a_write_waiting_past_its_deadline_fails_and_a_slow_reader_is_not_cut() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let within = Duration::from_secs(30);
        // How long a write of 4 KiB waits before it fails (it must fail by 10 deadlines).
        let fails_after = async |near: &mut WriteDeadline<tokio::io::DuplexStream>| {
            let began = tokio::time::Instant::now();
            let error = tokio::time::timeout(10 * within, near.write_all(&[7; 4096]))
                .await
                .expect("the write failed by its deadline")
                .unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
            began.elapsed()
        };
        let (near, _far) = tokio::io::duplex(1024);
        let mut near = WriteDeadline::new(near, within);
        assert_eq!(
            fails_after(&mut near).await,
            within,
            "failed at its deadline, not before"
        );

        // Vectored writes (a TCP stream's, as hyper makes them) wait and fail the same way.
        let (near, _far) = tokio::io::duplex(1024);
        let mut near = WriteDeadline::new(near, within);
        let began = tokio::time::Instant::now();
        let slices = [
            std::io::IoSlice::new(&[1; 512]),
            std::io::IoSlice::new(&[2; 512]),
        ];
        let error = tokio::time::timeout(10 * within, async {
            loop {
                if let Err(error) = near.write_vectored(&slices).await {
                    break error;
                }
            }
        })
        .await
        .expect("the write failed by its deadline");
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(began.elapsed(), within);

        // A write that proceeds sets the deadline again: the next wait has all of it.
        let (near, mut far) = tokio::io::duplex(1024);
        let mut near = WriteDeadline::new(near, within);
        let reader = tokio::spawn(async move {
            tokio::time::sleep(within - Duration::from_secs(10)).await;
            let mut buf = [0; 1024];
            far.read_exact(&mut buf).await.unwrap();
            far
        });
        assert_eq!(
            fails_after(&mut near).await,
            within - Duration::from_secs(10) + within,
            "a whole deadline after the write that proceeded"
        );
        drop(reader.await.unwrap());

        let (near, mut far) = tokio::io::duplex(1024);
        let mut near = WriteDeadline::new(near, within);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0; 1024];
            loop {
                tokio::time::sleep(within - Duration::from_secs(1)).await;
                let n = far.read(&mut buf).await.unwrap();
                if n == 0 {
                    break got;
                }
                got.extend_from_slice(&buf[..n]);
            }
        });
        let began = tokio::time::Instant::now();
        near.write_all(&[7; 8192]).await.unwrap();
        near.shutdown().await.unwrap();
        assert!(
            began.elapsed() > 5 * within,
            "far longer than the deadline in all"
        );
        drop(near);
        assert_eq!(reader.await.unwrap(), vec![7; 8192]);
    }

    /// Serves one HTTP/1 connection on `io`, answering each request with 4 MiB that hold a
    /// place of `admission` until sent ([`hold`]).
    fn serve_large_answers<T>(
        io: T,
        admission: &Arc<Admission>,
    ) -> tokio::task::JoinHandle<Result<(), hyper::Error>>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let admission = Arc::clone(admission);
        let service =
            hyper::service::service_fn(move |_request: hyper::Request<hyper::body::Incoming>| {
                let admitted = admission.admit(Vec::new());
                async move {
                    let answer = crate::http_answer(
                        hyper::StatusCode::OK,
                        "application/json",
                        "x".repeat(ANSWER),
                    );
                    Ok::<_, std::convert::Infallible>(hold(answer, admitted.unwrap()))
                }
            });
        tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(hyper_util::rt::TokioIo::new(io), service),
        )
    }

    /// The answer [`serve_large_answers`] gives.
    const ANSWER: usize = 4 << 20;

    /// A POST as a client sends it.
    const POST: &[u8] = b"POST /mcp HTTP/1.1\r\nhost: localhost\r\ncontent-length: 0\r\n\r\n";

    /// Through hyper: a client that asks for a large answer and reads none of it holds
    /// its connection and its POST's place until the write deadline (without it, for as
    /// long as it keeps the connection open); one that reads slowly gets it whole.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_gives_back_its_place_at_the_write_deadline() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let admission = Admission::with_limits(4, 4);
        let within = WRITE_WITHIN;

        let (server, mut client) = tokio::io::duplex(16 * 1024);
        client.write_all(POST).await.unwrap();
        let connection = serve_large_answers(server, &admission);
        tokio::time::sleep(100 * within).await;
        assert!(!connection.is_finished(), "without a deadline it waits");
        assert_eq!(admission.total(), 1, "and holds its place");
        connection.abort();
        let _ = connection.await;
        assert_eq!(admission.total(), 0);

        let (server, mut client) = tokio::io::duplex(16 * 1024);
        client.write_all(POST).await.unwrap();
        let connection = serve_large_answers(WriteDeadline::new(server, within), &admission);
        tokio::time::sleep(within - Duration::from_secs(1)).await;
        assert_eq!(admission.total(), 1, "held until the deadline");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(connection.is_finished(), "closed at the deadline");
        assert!(connection.await.unwrap().is_err());
        assert_eq!(admission.total(), 0, "its place given back");
        drop(client);

        let (server, mut client) = tokio::io::duplex(16 * 1024);
        client.write_all(POST).await.unwrap();
        let connection = serve_large_answers(WriteDeadline::new(server, within), &admission);
        let mut got = Vec::new();
        let mut buf = vec![0; 64 * 1024];
        let whole = loop {
            tokio::time::sleep(within - Duration::from_secs(1)).await;
            let n = client.read(&mut buf).await.unwrap();
            assert_ne!(n, 0, "the connection ended early");
            got.extend_from_slice(&buf[..n]);
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n")
                && got.len() - end - 4 >= ANSWER
            {
                break got.len() - end - 4;
            }
        };
        assert_eq!(whole, ANSWER, "the answer whole, read a piece every 29 s");
        assert!(
            !connection.is_finished(),
            "the connection stays for the next request"
        );
        drop(client);
        assert!(connection.await.unwrap().is_ok());
        assert_eq!(admission.total(), 0);
    }

    /// An event stream silent for longer than the deadline is not cut: while it is silent
    /// no write waits, and a write that waited and then proceeded leaves no deadline
    /// behind for the next (each event here is larger than the pipe, so its write waits
    /// for the client to read).
    #[tokio::test(start_paused = true)]
    async fn a_silent_event_stream_is_not_cut() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let service =
            hyper::service::service_fn(|_request: hyper::Request<hyper::body::Incoming>| async {
                let events = futures_util::stream::unfold(0, |n| async move {
                    if n == 3 {
                        return None;
                    }
                    tokio::time::sleep(4 * WRITE_WITHIN).await;
                    let event = format!("data: {n} {}\n\n", "e".repeat(500));
                    let event = hyper::body::Bytes::from(event);
                    Some((Ok::<_, std::convert::Infallible>(Frame::data(event)), n + 1))
                });
                Ok::<_, std::convert::Infallible>(hyper::Response::new(
                    http_body_util::StreamBody::new(events),
                ))
            });
        let (server, mut client) = tokio::io::duplex(64);
        client
            .write_all(b"GET /mcp HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .unwrap();
        let connection = tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(
                    hyper_util::rt::TokioIo::new(WriteDeadline::new(server, WRITE_WITHIN)),
                    service,
                ),
        );
        let began = tokio::time::Instant::now();
        let got = tokio::time::timeout(100 * WRITE_WITHIN, async {
            let mut got = Vec::new();
            let mut buf = [0; 1024];
            while !got.ends_with(b"\r\n0\r\n\r\n") {
                let n = client.read(&mut buf).await.unwrap();
                assert_ne!(n, 0, "the stream was cut");
                got.extend_from_slice(&buf[..n]);
            }
            got
        })
        .await
        .expect("the stream ended");
        let got = String::from_utf8_lossy(&got);
        assert!(
            got.contains("data: 0 ") && got.contains("data: 2 "),
            "{got}"
        );
        assert_eq!(began.elapsed(), 12 * WRITE_WITHIN);
        assert!(!connection.is_finished());
        drop(client);
        assert!(connection.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn a_place_is_held_until_the_answer_is_sent() {
        let admission = Admission::with_limits(1, 1);
        let admitted = admission.admit(Vec::new()).unwrap();
        let answer = hold(too_many(Refused::Session(1)), admitted);
        assert_eq!(answer.status(), hyper::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.headers()[hyper::header::RETRY_AFTER], "1");
        assert!(admission.admit(Vec::new()).is_err());
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body["error"]["message"],
            "too many requests in flight: a session may have 1 at once"
        );
        let identity = too_many(Refused::Identity(64)).into_body();
        let body = identity.collect().await.unwrap().to_bytes();
        assert!(
            String::from_utf8_lossy(&body).contains("an identity may have 64 at once"),
            "{body:?}"
        );
        assert!(admission.admit(Vec::new()).is_ok(), "the place came back");
    }
}
