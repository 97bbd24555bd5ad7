//! Streamable HTTP with the raw results kept: rmcp's streamable HTTP client transport over
//! a [`TappedClient`], which is rmcp's own reqwest client with the [`Tap`] looking at each
//! request it posts and each message the server writes back.
//!
//! rmcp parses the events of a POST's (or the GET stream's) `text/event-stream` answer
//! after the client hands them over, so the tap sees the JSON exactly as the server wrote
//! it, as over stdio. A server may instead answer a POST with one `application/json` body,
//! which rmcp's reqwest client would parse itself (dropping the unknown fields of known
//! blocks); so the requests whose answers the tap keeps (`tools/list`, `tools/call`) are
//! posted by [`post`](crate::post), rmcp's POST with the JSON body offered to the tap
//! first, and every other message by rmcp's client. Progress notifications go to their
//! call's channel as the tap reads them, before rmcp sees the call's response, and a
//! `notifications/tools/list_changed` is counted as it is read (a listing walks its pages
//! again for one read during the walk).
//!
//! # What a request whose answer never comes reads
//!
//! rmcp reports an answer's event stream that ends early, breaks, or holds an event over
//! its limit as "Transport closed" (or, for some of them, tries to resume the stream and
//! leaves the call to its deadline). So the event stream of each request's POST ends, when
//! it ends without an error, with one more event: a JSON-RPC error answering that request
//! with what happened ([`Fault`]: the stream ended before the answer or in the middle of
//! an event, it broke, an event was over [`MAX_SSE_EVENT_BYTES`]), marked as psych-mcp's
//! own (never the server's words). rmcp stops reading a POST's stream at its answer, so
//! the extra event reaches the call only when the answer did not. A JSON body over
//! [`MAX_JSON_BODY_BYTES`] is answered the same way, unless it answers a call awaiting
//! its result: that one is kept in files (see [`post`](crate::post)). A stream whose events carry ids is
//! left to rmcp when it ends or breaks, since the server can resume it. The connection
//! reads such an error back with [`fault_of`] as a failed request on a connection that
//! stays up: one stream cut (by a proxy's idle timeout, say) does not end the session and every call in flight
//! on it; a server that is gone fails the next request to reach it. A POST answered with a
//! 429 fails that request alone too (saying its `Retry-After`), as rmcp's worker does: the
//! session stays. Any other refusal of a POST (a 5xx, a proxy's page, a 400) fails that
//! request alone if the server still answers a `ping` on the session (a proxy's 413 for a
//! large argument, a 504 on one long call), and ends the session, so that a new one is
//! made, if it does not (a server restarted without the session, one gone behind its
//! proxy).
//!
//! # Memory
//!
//! One event is held whole while it is read, at most [`MAX_SSE_EVENT_BYTES`] (the bytes of
//! its lines as rmcp counts them); a JSON body at most [`MAX_JSON_BODY_BYTES`]. Past either,
//! a call's answer goes to a file in 1 MiB chunks, at most 4 GiB, and what of it stays in
//! memory is at most 64 MiB ([`sse`](crate::sse), [`post`](crate::post)); an error body is
//! quoted from its first 64 KiB. Each is counted as it arrives, so a larger one that answers
//! nothing awaited is refused at the first byte over, never buffered. The server's own
//! requests (`ping`, sampling) are counted until their answering POSTs end, as a stdio
//! server's are (`server_requests`): past 64, one is dropped unanswered.
//!
//! # Cancel safety
//!
//! rmcp drives these futures from its worker's `select!` loop. A POST's future lives in
//! rmcp's set of posts until it finishes, and is dropped only when its request is
//! cancelled (the caller gave up), when losing the partly read body is what is meant. An
//! event stream is polled through `next()`, which holds no data: the partly read event is
//! in the stream ([`sse`](crate::sse)'s parser, its pending chunk read or file write, the
//! answer wrapper's state), so a `next()` dropped at any point loses nothing
//! (`tests::events_survive_next_dropped_at_random_points`,
//! `sse::tests::a_spilled_event_survives_next_dropped_at_random_points`).

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use psych_types::ServerId;
use rmcp::model::{ClientJsonRpcMessage, ErrorCode, ErrorData, JsonRpcMessage, RequestId};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use serde_json::Value;

use crate::McpError;
use crate::budget::OverBudget;
use crate::tap::{AnswerFailure, Tap};

/// How many same-origin redirects a request follows.
pub(crate) const MAX_REDIRECTS: usize = 5;

/// The most bytes of one server-sent event from a streamable HTTP server held in memory
/// (rmcp's default, named here): a larger event answering a request whose answer psych-mcp
/// reads itself (`tools/call`, `tools/list`) has its data written to a file as it arrives
/// and is read back as a JSON body over [`MAX_JSON_BODY_BYTES`] is (another message over
/// the limit on that request's stream, a notification say, is kept the same way while it
/// arrives, and skipped if it cannot be read back; one that passes the spill budget or
/// [`MAX_SPILLED_ANSWER`](crate::MAX_SPILLED_ANSWER) while it arrives still ends the stream
/// and fails the request); one on any other stream is refused at its first byte over, never buffered,
/// and its request fails at once saying so. The connection stays up either way.
pub const MAX_SSE_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// The most bytes of one `application/json` answer from a streamable HTTP server held in
/// memory (rmcp's default, named here): a larger body answering a request whose answer
/// psych-mcp reads itself (`tools/call`, `tools/list`) is written to a file as it arrives
/// (up to [`MAX_SPILLED_ANSWER`](crate::MAX_SPILLED_ANSWER)), a call's long texts are kept
/// in files and the rest (a listing whole) parsed in memory up to 64 MiB; any other body is
/// refused at its first byte over, or before reading when its `Content-Length` says so,
/// and its request fails at once saying so. A spilled body that cannot be read back fails
/// its request alone; the session stays. The answers rmcp reads itself (`initialize`,
/// `server/discover`, `ping`: a few KiB) are held to
/// [`MAX_JSON_STRUCTURAL_BYTES`](crate::MAX_JSON_STRUCTURAL_BYTES) bytes instead (2 MiB),
/// since rmcp parses them unchecked: no body that short can pass that bound.
pub const MAX_JSON_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The key of the `data` of a JSON-RPC error that psych-mcp wrote itself (see the module
/// docs); its value is this process's [`nonce`](crate::tap::nonce), so that a server's
/// error with the same key is not taken for ours.
const FAULT_KEY: &str = "psych-mcp/transport";

/// Why the answer to a request sent over HTTP did not come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The answer's event stream ended cleanly before the answer.
    EndedBeforeAnswer,
    /// The answer's event stream ended inside an event, `bytes` of it read.
    EndedMidEvent {
        /// The bytes of the cut event that had arrived.
        bytes: usize,
    },
    /// Reading the event stream failed (a connection reset, a body that is not SSE).
    Broke(String),
    /// One event was over the limit.
    EventTooLarge {
        /// The limit.
        max: usize,
    },
    /// A JSON body was over the limit.
    BodyTooLarge {
        /// The limit.
        max: usize,
    },
    /// A JSON body's parse on a blocking thread did not finish (a panic, the runtime's
    /// end): why.
    Unparsed(String),
    /// A JSON body over the memory limit, kept in a file, could not be read back (not a
    /// valid answer, or the file failed): why.
    SpilledUnreadable(String),
    /// The answer holds more structural bytes than psych-mcp parses
    /// ([`MAX_JSON_STRUCTURAL_BYTES`](crate::MAX_JSON_STRUCTURAL_BYTES)): it was not parsed.
    /// Answered as the typed [`AnswerFailure::TooComplex`] (the call fails with
    /// [`McpError::AnswerTooComplex`]).
    TooComplex {
        /// The whole answer's size.
        bytes: u64,
    },
    /// An answer over the memory limit was not kept: its files would have passed the spill
    /// budget. Answered as the typed [`AnswerFailure::OverBudget`] (the call fails with
    /// [`McpError::SpillBudget`]).
    OverBudget {
        /// The answer's bytes read when the budget refused more.
        bytes: u64,
        /// The refusal.
        refused: OverBudget,
    },
}

impl Fault {
    pub(crate) fn reason(&self) -> String {
        match self {
            Self::EndedBeforeAnswer => "the server's event stream ended before the answer".into(),
            Self::EndedMidEvent { bytes } => format!(
                "the server's event stream ended in the middle of an event ({bytes} bytes of \
                 it read), before the answer"
            ),
            Self::Broke(why) => format!("the server's event stream broke: {why}"),
            Self::EventTooLarge { max } => format!(
                "the answer is a server-sent event over the {} limit ({max} bytes); it was \
                 not read",
                size(*max)
            ),
            Self::BodyTooLarge { max } => format!(
                "the answer is a JSON body over the {} limit ({max} bytes); it was not read",
                size(*max)
            ),
            Self::Unparsed(why) => format!("parsing the answer did not finish: {why}"),
            Self::SpilledUnreadable(why) => {
                format!("the answer, kept in a file for its size, is unreadable: {why}")
            }
            Self::OverBudget { bytes, refused } => {
                format!("the answer (at least {bytes} bytes) was not kept: {refused}")
            }
            &Self::TooComplex { bytes } => {
                crate::error::too_complex(bytes, crate::MAX_JSON_STRUCTURAL_BYTES)
            }
        }
    }

    /// This fault as the JSON-RPC error answering request `id`.
    pub(crate) fn answer(&self, id: &RequestId) -> Value {
        let typed = match self {
            Self::OverBudget { bytes, refused } => {
                Some(AnswerFailure::over_budget(*bytes, *refused))
            }
            &Self::TooComplex { bytes } => Some(AnswerFailure::too_complex(bytes)),
            _ => None,
        };
        if let Some(typed) = typed {
            let id = serde_json::to_value(id).unwrap_or(Value::Null);
            return typed.to_message(id);
        }
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": ErrorCode::INTERNAL_ERROR.0,
                "message": self.reason(),
                "data": {FAULT_KEY: crate::tap::nonce()},
            },
        })
    }
}

/// `bytes` in MiB when it is a whole number of them, else in bytes.
fn size(bytes: usize) -> String {
    const MIB: usize = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes}-byte")
    }
}

/// The reason of a JSON-RPC error written by [`Fault::answer`] in this process (it carries
/// the nonce); `None` for an error the server sent, one in the same shape included.
pub(crate) fn fault_of(error: &ErrorData) -> Option<String> {
    let ours = error.data.as_ref()?.get(FAULT_KEY)?.as_str()? == crate::tap::nonce();
    ours.then(|| error.message.to_string())
}

/// rmcp's reqwest client, with the tap.
#[derive(Clone)]
pub(crate) struct TappedClient {
    inner: reqwest::Client,
    tap: Arc<Tap>,
}

/// rmcp's streamable HTTP client transport to `url` with the configured headers, over a
/// [`TappedClient`] feeding `tap`, sending with `inner` ([`shared_client`]).
pub(crate) fn transport(
    server: &ServerId,
    url: &str,
    headers: &std::collections::BTreeMap<String, String>,
    inner: reqwest::Client,
    tap: Arc<Tap>,
) -> Result<StreamableHttpClientTransport<TappedClient>, McpError> {
    let mut map = HashMap::new();
    for (name, value) in headers {
        let bad = |what: String| McpError::Protocol {
            server: server.clone(),
            call: "connect".into(),
            message: format!("header {name:?} cannot be sent: {what}"),
        };
        let header_name = HeaderName::try_from(name.as_str()).map_err(|e| bad(e.to_string()))?;
        let header_value = HeaderValue::try_from(value.as_str()).map_err(|e| bad(e.to_string()))?;
        map.insert(header_name, header_value);
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url)
        .custom_headers(map)
        .max_sse_event_size(MAX_SSE_EVENT_BYTES)
        .max_json_response_size(MAX_JSON_BODY_BYTES);
    Ok(StreamableHttpClientTransport::with_client(
        TappedClient { inner, tap },
        config,
    ))
}

/// The HTTP client every remote server's transport sends with, made once per process.
/// Making one reads and parses the system's certificate store (reqwest's platform
/// verifier: file I/O, milliseconds), so it is made on a blocking thread, not at every
/// connect and reconnect. Its clones share its settings and pool, which keeps no idle
/// connection: as rmcp's default client, no idle connections are kept (a reused connection
/// whose last answer was not read to the end stalls ~40 ms on delayed ACKs), and only
/// same-origin 307/308 redirects are followed. Headers are each transport's own. The
/// system's certificates and proxy settings are read once, when it is made: a change to
/// them reaches remote servers after a restart.
pub(crate) async fn shared_client(server: &ServerId) -> Result<reqwest::Client, McpError> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    if let Some(client) = CLIENT.get() {
        return Ok(client.clone());
    }
    let made = tokio::task::spawn_blocking(|| {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .redirect(same_origin_redirects())
            .build()
    })
    .await
    .map_err(|source| McpError::Task {
        server: server.clone(),
        call: "connect".into(),
        source,
    })?
    .map_err(|e| McpError::Protocol {
        server: server.clone(),
        call: "connect".into(),
        message: format!("the HTTP client cannot be set up: {e}"),
    })?;
    // Two first connects at once may both make one; the first stored is kept.
    Ok(CLIENT.get_or_init(|| made).clone())
}

/// rmcp's redirect policy for its default client, with its refusals said: a 301, 302 or
/// 303 would turn the POST into a bodyless GET and lose the message, and a cross-origin
/// redirect would replay the session id and the configured headers (credentials) to
/// another host, so only same-origin 307 and 308 are followed (method, body and headers
/// kept), at most [`MAX_REDIRECTS`] in a row. Anything else is an error naming the status
/// and the target.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let status = attempt.status();
        let keeps_body = matches!(
            status,
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        let target = attempt.url().to_string();
        if !keeps_body {
            let error = format!(
                "a {status} redirect to {target}: only 307 and 308 are followed (a {} would \
                 send the request again without its body)",
                status.as_u16()
            );
            attempt.error(error)
        } else if !same_origin {
            let error = format!(
                "a {} redirect to another origin ({target}): not followed, since it would \
                 send the session and the configured headers there; configure that URL \
                 instead",
                status.as_u16()
            );
            attempt.error(error)
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!(
                "more than {MAX_REDIRECTS} redirects (the last to {target})"
            ))
        } else {
            attempt.follow()
        }
    })
}

type Events = BoxStream<'static, Result<sse_stream::Sse, SseError>>;

/// The events of request `id`'s POST, then, if the stream ends or fails, the [`Fault`]
/// as that request's answer (see the module docs); an error ends the stream. A stream
/// whose events carry ids can be resumed (the server keeps its events), so its end or
/// break is left to rmcp, which resumes it; an event over the limit never is (it would be
/// sent again). The state lives in the stream, so dropping a pending `next()` loses
/// nothing.
fn answered(events: Events, id: RequestId) -> Events {
    Box::pin(futures_util::stream::unfold(
        Some((events, false)),
        move |state| {
            let id = id.clone();
            async move {
                let (mut events, resumable) = state?;
                let fault = match events.next().await {
                    Some(Ok(event)) => {
                        let resumable = resumable || event.id.is_some();
                        return Some((Ok(event), Some((events, resumable))));
                    }
                    Some(Err(error)) => match crate::sse::fault_of_stream(&error) {
                        // Sent again on resumption, it would fail again (or, past the
                        // spill budget, take its bytes from the calls that hold them).
                        fault @ (Fault::EventTooLarge { .. }
                        | Fault::SpilledUnreadable(_)
                        | Fault::OverBudget { .. }) => fault,
                        _ if resumable => return Some((Err(error), None)),
                        fault => fault,
                    },
                    None if resumable => return None,
                    None => Fault::EndedBeforeAnswer,
                };
                let event = sse_stream::Sse {
                    event: None,
                    data: Some(fault.answer(&id).to_string()),
                    id: None,
                    retry: None,
                };
                Some((Ok(event), None))
            }
        },
    ))
}

impl TappedClient {
    /// The events, each offered to the tap: an answer it waits for is kept raw (and a
    /// stand-in goes to rmcp), progress goes to its call's channel.
    ///
    /// An event over [`JSON_ON_WORKER`](crate::wire::JSON_ON_WORKER) (up to the 16 MiB
    /// event limit) is offered on a blocking thread, as a line over stdio is parsed: the
    /// stream holds that work between polls, so a `next` that rmcp drops loses nothing.
    fn tapped(&self, events: Events) -> Events {
        let tap = Arc::clone(&self.tap);
        Box::pin(events.then(move |event| {
            let tap = Arc::clone(&tap);
            async move {
                let mut event = event?;
                let Some(mut data) = event.data.take() else {
                    return Ok(event);
                };
                // Only a panic or the runtime's end fails a blocking parse: the stream then
                // fails with it (resumed if the server can, else the call is answered why),
                // rather than pass the event on without its answer.
                let kept = crate::wire::parse_by_size(data.len(), move || {
                    if crate::wire::too_complex(data.as_bytes()) {
                        return unparsed(data.as_bytes());
                    }
                    keep(&tap, &mut data);
                    Some(data)
                })
                .await
                .map_err(|e| SseError::Body(Box::new(e)))?;
                event.data = kept;
                Ok(event)
            }
        }))
    }
}

/// What goes to rmcp in place of an event's data holding more structural bytes than
/// psych-mcp parses: the error answering the request it answers ([`Fault::TooComplex`]),
/// or nothing (rmcp skips an event without data) when it answers none.
fn unparsed(data: &[u8]) -> Option<String> {
    let id: RequestId = serde_json::from_str(&crate::stdio::scan::answer_id(data)?).ok()?;
    let bytes = data.len() as u64;
    Some(Fault::TooComplex { bytes }.answer(&id).to_string())
}

/// Offers one event's data to the tap, rewriting it with the stand-in if it was kept.
fn keep(tap: &Tap, data: &mut String) {
    if !tap.wants(data.as_bytes()) {
        return;
    }
    // Lone surrogate escapes are repaired (U+FFFD, the fact in the result's `_meta`), as
    // over stdio, and rmcp gets the repaired message either way: it could not read it.
    let Ok((mut message, repaired)) = crate::stdio::repair::parse_or_repair(data.as_bytes()) else {
        return;
    };
    if (tap.offer(&mut message) || repaired)
        && let Ok(rewritten) = serde_json::to_string(&message)
    {
        *data = rewritten;
    }
}

impl StreamableHttpClient for TappedClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let request = match &message {
            JsonRpcMessage::Request(request) => Some(request.id.clone()),
            _ => None,
        };
        let response = if self.tap.want_request(&message) {
            let message = Arc::new(message);
            let body = crate::post::body(&message).await?;
            crate::post::post_request(
                &self.inner,
                &self.tap,
                &uri,
                &message,
                body,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await?
        } else {
            // rmcp parses this JSON body itself, whole, unchecked: a body of at most
            // `MAX_JSON_STRUCTURAL_BYTES` bytes cannot hold more structural bytes than that
            // (answers to `initialize` or `ping` are a few KiB). A longer one is refused as
            // too large.
            let mut limits = limits;
            let cap = usize::try_from(crate::MAX_JSON_STRUCTURAL_BYTES).unwrap_or(usize::MAX);
            limits.max_json_response_size = limits.max_json_response_size.min(cap);
            self.inner
                .post_message_with_response_limits(
                    uri,
                    message,
                    session_id,
                    auth_header,
                    custom_headers,
                    limits,
                )
                .await?
        };
        Ok(match response {
            StreamableHttpPostResponse::Sse(events, session_id) => {
                let events = match request {
                    Some(id) => answered(events, id),
                    None => events,
                };
                StreamableHttpPostResponse::Sse(self.tapped(events), session_id)
            }
            other => other,
        })
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Events, StreamableHttpError<Self::Error>> {
        let events = self
            .inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await?;
        Ok(self.tapped(events))
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Events, StreamableHttpError<Self::Error>> {
        let events = self
            .inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await?;
        Ok(self.tapped(events))
    }
}

/// `reason` followed by why reqwest failed, in parentheses: reqwest's own message says only
/// "error sending request for url (…)", and neither rmcp's transport error nor its
/// `StreamableHttpError::Client` links reqwest's error as a source, so the causes
/// (connection refused, a TLS handshake that failed, a certificate not trusted) would be
/// lost. Causes already in `reason` are not repeated.
pub(crate) fn with_causes(reason: String, error: &(dyn std::error::Error + 'static)) -> String {
    match http_error(error) {
        Some(StreamableHttpError::Client(client)) => with_causes_of(reason, client),
        _ => reason,
    }
}

/// The streamable HTTP client's error in `error`'s chain (a request's transport error), if
/// any.
fn http_error<'e>(
    error: &'e (dyn std::error::Error + 'static),
) -> Option<&'e StreamableHttpError<reqwest::Error>> {
    let mut node = Some(error);
    while let Some(current) = node {
        if let Some(error) = current.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            return Some(error);
        }
        node = current.source();
    }
    None
}

/// How the server (or its proxy) refused a request's POST: rmcp fails that request alone
/// and its session goes on ([`refusal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// A 429: a rate limit, which says nothing of the session.
    pub(crate) rate_limited: bool,
    /// What to add to the reason: a 429's `Retry-After`, when it has one.
    pub(crate) retry_after: String,
}

/// When `error` (a request's transport error) is the HTTP answer refusing that request's
/// POST, how: a status rmcp reports (429 and 5xx), a body that is not an answer (a 400, a
/// proxy's page), an unexpected content type, an over-long body. A connection that could
/// not be made or broke, an expired session or an authorization challenge (a 401 or 403
/// with `WWW-Authenticate`) is not this. A refusal other than a 429 may also mean a server
/// that no longer has the session (one restarted, one gone behind its proxy): the
/// connection asks a `ping` to tell which.
pub(crate) fn refusal(error: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    match http_error(error)? {
        StreamableHttpError::HttpStatus(status) => {
            let rate_limited = status.status == 429;
            Some(Refusal {
                rate_limited,
                retry_after: match &status.retry_after {
                    Some(after) if rate_limited => format!(" (Retry-After: {after})"),
                    _ => String::new(),
                },
            })
        }
        StreamableHttpError::UnexpectedServerResponse(_)
        | StreamableHttpError::UnexpectedContentType(_)
        | StreamableHttpError::ResponseBodyTooLarge { .. } => Some(Refusal {
            rate_limited: false,
            retry_after: String::new(),
        }),
        _ => None,
    }
}

/// `reason` followed by the causes of reqwest's `error`, as [`with_causes`].
pub(crate) fn with_causes_of(mut reason: String, error: &reqwest::Error) -> String {
    let mut causes: Vec<String> = Vec::new();
    let mut cause = std::error::Error::source(error);
    while let Some(next) = cause {
        let message = next.to_string();
        if !reason.contains(&message) && !causes.iter().any(|c| c.contains(&message)) {
            causes.push(message);
        }
        cause = next.source();
    }
    if !causes.is_empty() {
        reason.push_str(" (");
        reason.push_str(&causes.join(": "));
        reason.push(')');
    }
    reason
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on bad data")]

    use std::task::Poll;

    use super::*;

    use crate::sse::tests::{Rng, response_of};

    /// The POST's events of a response whose body is `wire`, read as a call's are.
    fn events_of(wire: Vec<u8>, seed: u64) -> Events {
        let events = crate::sse::events(response_of(wire, seed), MAX_SSE_EVENT_BYTES, None);
        answered(events, RequestId::Number(7))
    }

    /// Reads every event, dropping a `next()` after one poll at random points (as rmcp's
    /// `select!` does when another branch is ready first).
    async fn read_dropping_at_random(mut events: Events, seed: u64) -> (Vec<String>, usize) {
        let mut rng = Rng(seed);
        let mut read = Vec::new();
        let mut dropped = 0;
        loop {
            let item = if rng.below(8) != 0 {
                match futures_util::poll!(events.next()) {
                    Poll::Ready(item) => item,
                    Poll::Pending => {
                        dropped += 1;
                        tokio::task::yield_now().await;
                        continue;
                    }
                }
            } else {
                events.next().await
            };
            match item {
                Some(Ok(event)) => read.push(event.data.unwrap_or_default()),
                Some(Err(error)) => read.push(format!("error: {error}")),
                None => break,
            }
        }
        (read, dropped)
    }

    // One thread: the reader and the writer take turns, so reads are often pending.
    #[tokio::test]
    async fn events_survive_next_dropped_at_random_points() {
        let mut rng = Rng(0x5eed);
        let mut wire = Vec::new();
        let mut sent = Vec::new();
        for i in 0..40 {
            // 1 B to 8 MiB, most of them small.
            let len = match rng.below(4) {
                0 => 1 + rng.below(8 * 1024 * 1024),
                1 => 1 + rng.below(64 * 1024),
                _ => 1 + rng.below(100),
            };
            let data = format!("{i}:{}", "x".repeat(len));
            wire.extend_from_slice(b"data: ");
            wire.extend_from_slice(data.as_bytes());
            wire.extend_from_slice(if i % 2 == 0 { b"\n\n" } else { b"\r\n\r\n" });
            sent.push(data);
        }
        let (read, dropped) = read_dropping_at_random(events_of(wire, 1), 2).await;
        assert!(dropped > 50, "only {dropped} futures dropped");
        let (fault, events) = read.split_last().unwrap();
        assert_eq!(events.len(), sent.len());
        for (i, (read, sent)) in events.iter().zip(&sent).enumerate() {
            assert!(
                read == sent,
                "event {i}: {} bytes, sent {}",
                read.len(),
                sent.len()
            );
        }
        // No answer came: the stream's end is the request's answer, saying so.
        let fault: Value = serde_json::from_str(fault).unwrap();
        assert_eq!(fault["id"], 7);
        assert_eq!(
            fault["error"]["message"],
            "the server's event stream ended before the answer"
        );
        assert_eq!(fault["error"]["data"][FAULT_KEY], crate::tap::nonce());
        let error: ErrorData = serde_json::from_value(fault["error"].clone()).unwrap();
        assert_eq!(
            fault_of(&error).as_deref(),
            Some("the server's event stream ended before the answer")
        );
    }

    /// Review item 3: a server's own error in the shape of ours (the key without our
    /// nonce) is the server's error.
    #[test]
    fn a_servers_error_in_our_shape_is_not_taken_for_ours() {
        for data in [
            serde_json::json!({FAULT_KEY: true}),
            serde_json::json!({FAULT_KEY: "0123456789abcdef0123456789abcdef"}),
        ] {
            let forged = ErrorData::internal_error("forged", Some(data.clone()));
            assert_eq!(fault_of(&forged), None, "{data}");
        }
    }

    #[tokio::test]
    async fn a_resumable_stream_is_left_to_rmcp_to_resume() {
        // Events with ids: the server keeps them, and rmcp resumes a stream cut short.
        let wire = b"id: 1\ndata: progress\n\nid: 2\ndata: {\"cut".to_vec();
        let (read, _) = read_dropping_at_random(events_of(wire, 7), 8).await;
        assert_eq!(
            read,
            [
                "progress",
                "error: body error: the stream ended in the middle of an event (17 bytes of it read)"
            ]
        );
        // Ended between events: simply the end.
        let wire = b"id: 1\ndata: progress\n\n".to_vec();
        let (read, _) = read_dropping_at_random(events_of(wire, 9), 10).await;
        assert_eq!(read, ["progress"]);
    }

    #[tokio::test]
    async fn a_cut_event_and_an_event_over_the_limit_are_said() {
        let mut cut = b"data: whole\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"res".to_vec();
        cut.extend(std::iter::repeat_n(b'x', 300_000));
        let (read, _) = read_dropping_at_random(events_of(cut, 3), 4).await;
        assert_eq!(read[0], "whole");
        let fault: Value = serde_json::from_str(&read[1]).unwrap();
        assert_eq!(
            fault["error"]["message"],
            "the server's event stream ended in the middle of an event (300034 bytes of it \
             read), before the answer"
        );
        assert_eq!(read.len(), 2);

        // 20 MiB in one event: refused at the first byte over, never held whole.
        let mut huge = b"data: ".to_vec();
        huge.extend(std::iter::repeat_n(b'x', 20 * 1024 * 1024));
        huge.extend_from_slice(b"\n\n");
        let (read, _) = read_dropping_at_random(events_of(huge, 5), 6).await;
        assert_eq!(read.len(), 1);
        let fault: Value = serde_json::from_str(&read[0]).unwrap();
        assert_eq!(
            fault["error"]["message"],
            "the answer is a server-sent event over the 16 MiB limit (16777216 bytes); it was \
             not read"
        );
    }
}
