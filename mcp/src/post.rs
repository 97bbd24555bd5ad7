//! rmcp's streamable HTTP POST for the requests whose answers the [`Tap`] keeps
//! (`tools/list` and `tools/call`): the same request and the same reading of every kind of
//! answer as rmcp 3.11's reqwest client (`StreamableHttpClient for reqwest::Client`), with
//! one difference. A single `application/json` body is offered to the tap as the server
//! wrote it before it is parsed into rmcp's message, as the events of an event-stream
//! answer are; rmcp's client parses such a body itself, so the unknown fields of a known
//! block would be gone before the tap could see them.
//!
//! rmcp's public pieces are used as they are: its header names and media types, its
//! error and answer types, the [`StreamableHttpResponseLimits`] the transport passes on
//! every POST, [`HttpStatusError`]. Its helpers for the rest (bounded body reads, media
//! type matching, the per-event size limit of an event stream, reserved headers, the scope
//! of a 403 challenge) are private to rmcp, so they are ported here with the same limits
//! and the same errors, with two more things said: an event stream that ends inside an
//! event is an error (`EndedMidEvent`; the SSE parser would drop the cut event silently;
//! the events are read by [`sse`](crate::sse), which keeps an event over its limit that
//! answers a call in a file), and a JSON body over its limit answers its request with what happened instead of
//! failing the POST (rmcp would then report the session as closed), unless it answers a
//! request whose result the tap awaits: then it is written to an unnamed file as it
//! arrives (up to [`MAX_SPILLED_ANSWER`](crate::MAX_SPILLED_ANSWER)) and its long texts
//! are kept in files, as a stdio line over [`SPILL_AT`](crate::SPILL_AT) is. How the errors of an
//! answer's event stream reach its call is [`remote`](crate::remote)'s answer wrapper.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use http::header::{ACCEPT, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage, RequestId, ServerJsonRpcMessage};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_LAST_EVENT_ID, HEADER_SESSION_ID, JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};

use crate::budget::{OverBudget, Reservation};
use crate::remote::Fault;
use crate::tap::Tap;

type Error = StreamableHttpError<reqwest::Error>;

/// What a body that could not be read reads as (rmcp's words).
const BODY_READ_FAILURE: &str = "<failed to read response body>";
/// How much of a body that is not a JSON-RPC message an error quotes (rmcp's length).
const BODY_PREVIEW: usize = 256;

/// `message`'s JSON, the body [`post_request`] sends: serialized here when short, on a
/// blocking thread when longer than [`JSON_ON_WORKER`](crate::wire::JSON_ON_WORKER) (a call
/// passing results, up to tens of MiB).
pub(crate) async fn body(message: &Arc<ClientJsonRpcMessage>) -> Result<Vec<u8>, Error> {
    match crate::wire::line_on_worker(&**message)? {
        Ok(mut line) => {
            // The line's `\n`: the body is the JSON alone, as reqwest's `json` makes it.
            line.pop();
            Ok(line)
        }
        Err(_) => {
            let whole = Arc::clone(message);
            Ok(tokio::task::spawn_blocking(move || serde_json::to_vec(&*whole)).await??)
        }
    }
}

/// POSTs `message` (a request: it always awaits an answer) as rmcp's reqwest client does,
/// and reads the answer as it does, except that a JSON body is offered to `tap` first.
#[allow(
    clippy::too_many_arguments,
    reason = "rmcp's `post_message_with_response_limits` arguments, plus the client and the tap"
)]
pub(crate) async fn post_request(
    client: &reqwest::Client,
    tap: &Arc<Tap>,
    uri: &str,
    message: &ClientJsonRpcMessage,
    body: Vec<u8>,
    session_id: Option<Arc<str>>,
    auth_token: Option<String>,
    custom_headers: HashMap<HeaderName, HeaderValue>,
    limits: StreamableHttpResponseLimits,
) -> Result<StreamableHttpPostResponse, Error> {
    let mut request = client
        .post(uri)
        .header(ACCEPT, [EVENT_STREAM_MIME_TYPE, JSON_MIME_TYPE].join(", "));
    if let Some(token) = auth_token {
        request = request.bearer_auth(token);
    }
    // As reqwest's `json` does: the JSON type unless the configured headers give one.
    if !custom_headers.contains_key(&CONTENT_TYPE) {
        request = request.header(CONTENT_TYPE, JSON_MIME_TYPE);
    }
    for (name, value) in custom_headers {
        if is_reserved(&name) {
            return Err(StreamableHttpError::ReservedHeaderConflict(
                name.to_string(),
            ));
        }
        request = request.header(name, value);
    }
    let session_was_attached = session_id.is_some();
    if let Some(session_id) = session_id {
        request = request.header(HEADER_SESSION_ID, session_id.as_ref());
    }
    let response = request.body(body).send().await?;
    let status = response.status();
    if let Some(error) = challenge(status, response.headers()) {
        return Err(error);
    }
    if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
        return Ok(StreamableHttpPostResponse::Accepted);
    }
    if status == StatusCode::NOT_FOUND && session_was_attached {
        return Err(StreamableHttpError::SessionExpired);
    }
    let content_type = response.headers().get(CONTENT_TYPE).cloned();
    let is_json = content_type
        .as_ref()
        .is_some_and(|ct| media_type_is(ct.as_bytes(), JSON_MIME_TYPE));
    // Rate limits and failures that are not JSON return without reading the body.
    let status_error = match (http_status_error(status, response.headers()), is_json) {
        (Some(error), is_json) if !is_json || status == StatusCode::TOO_MANY_REQUESTS => {
            return Err(error.into());
        }
        (error, _) => error,
    };
    let session_id = response
        .headers()
        .get(HEADER_SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if !status.is_success() {
        return failure(response, status, status_error, is_json, session_id, limits).await;
    }
    // The request whose result the tap awaits: its answer is kept in a file past the
    // memory limit, as an event or as a JSON body.
    let awaited = match message {
        JsonRpcMessage::Request(request) if tap.awaits(&request.id) => Some(&request.id),
        _ => None,
    };
    match &content_type {
        Some(ct) if media_type_is(ct.as_bytes(), EVENT_STREAM_MIME_TYPE) => {
            // An event answering a call that awaits its result is kept in a file past the
            // limit, as a JSON body is.
            let spill = awaited.map(|id| crate::sse::SpillTo {
                tap: Arc::clone(tap),
                id: id.clone(),
            });
            Ok(StreamableHttpPostResponse::Sse(
                crate::sse::events(response, limits.max_sse_event_size, spill),
                session_id,
            ))
        }
        Some(_) if is_json => {
            let max = limits.max_json_response_size;
            let body = match read_bounded_or_spill(response, max, awaited.map(|id| (&**tap, id)))
                .await
            {
                Ok(Body::Memory(body)) => body,
                Ok(Body::Spilled(file, held)) => {
                    return spilled(tap, message, (file, held), max, session_id).await;
                }
                Ok(Body::OverBudget { bytes, refused }) => {
                    return failed_with(message, &Fault::OverBudget { bytes, refused }, session_id);
                }
                Ok(Body::Unwritable(reason)) => {
                    let fault = Fault::SpilledUnreadable(reason.clone());
                    let refused = StreamableHttpError::UnexpectedServerResponse(Cow::Owned(reason));
                    return answered_with(message, &fault, session_id, refused);
                }
                // Answered with what happened, so the call fails at once and says why.
                Err(StreamableHttpError::ResponseBodyTooLarge { max_size }) => {
                    return too_large(message, max_size, session_id);
                }
                Err(error) => return Err(error),
            };
            // A body over `JSON_ON_WORKER` (up to the 16 MiB limit: tens of milliseconds,
            // and a repair parses again) is parsed on a blocking thread, as over stdio. A
            // post dropped meanwhile loses its answer, as it would mid-body.
            let tap = Arc::clone(tap);
            let bytes = body.len() as u64;
            let parsed =
                match crate::wire::parse_by_size(body.len(), move || parse_answer(&tap, &body))
                    .await
                {
                    Ok(Some(parsed)) => parsed?,
                    // A body too complex to parse, or its parse's panic or the runtime's end:
                    // the call fails saying so, the session stays (a failed post would close
                    // it).
                    Ok(None) => {
                        return failed_with(message, &Fault::TooComplex { bytes }, session_id);
                    }
                    Err(e) => {
                        let fault = Fault::Unparsed(e.to_string());
                        return failed_with(message, &fault, session_id);
                    }
                };
            Ok(StreamableHttpPostResponse::Json(parsed, session_id))
        }
        _ => Err(StreamableHttpError::UnexpectedContentType(
            content_type.map(|ct| String::from_utf8_lossy(ct.as_bytes()).into_owned()),
        )),
    }
}

/// A JSON body read whole, offered to the tap (which keeps an answer it waits for raw and
/// gives rmcp a stand-in): invalid UTF-8 and lone surrogate escapes are repaired (U+FFFD,
/// the fact in the result's `_meta`), as over stdio. `None`, unparsed, when it holds more
/// structural bytes than [`MAX_JSON_STRUCTURAL_BYTES`](crate::MAX_JSON_STRUCTURAL_BYTES).
fn parse_answer(tap: &Tap, body: &[u8]) -> Option<Result<ServerJsonRpcMessage, Error>> {
    (!crate::wire::too_complex(body)).then(|| parse_json(tap, body))
}

/// [`parse_answer`] of a body within the bound.
fn parse_json(tap: &Tap, body: &[u8]) -> Result<ServerJsonRpcMessage, Error> {
    let unreadable = |e: serde_json::Error| {
        StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!(
            "could not parse JSON response as ServerJsonRpcMessage: {e}: {}",
            preview(body)
        )))
    };
    let (mut raw, _) = crate::stdio::repair::parse_or_repair(body).map_err(unreadable)?;
    tap.offer(&mut raw);
    serde_json::from_value(raw).map_err(unreadable)
}

/// The answer to `message` (a request) that says its JSON body was over `max`.
fn too_large(
    message: &ClientJsonRpcMessage,
    max: usize,
    session_id: Option<String>,
) -> Result<StreamableHttpPostResponse, Error> {
    let refused = StreamableHttpError::ResponseBodyTooLarge { max_size: max };
    answered_with(message, &Fault::BodyTooLarge { max }, session_id, refused)
}

/// [`answered_with`] `fault`, refused with its reason when `message` is not a request.
fn failed_with(
    message: &ClientJsonRpcMessage,
    fault: &Fault,
    session_id: Option<String>,
) -> Result<StreamableHttpPostResponse, Error> {
    let refused = StreamableHttpError::UnexpectedServerResponse(Cow::Owned(fault.reason()));
    answered_with(message, fault, session_id, refused)
}

/// `message`'s request answered with `fault` (that request fails, the session stays);
/// `refused` when `message` is not a request.
fn answered_with(
    message: &ClientJsonRpcMessage,
    fault: &Fault,
    session_id: Option<String>,
    refused: Error,
) -> Result<StreamableHttpPostResponse, Error> {
    let JsonRpcMessage::Request(request) = message else {
        return Err(refused);
    };
    let answer = fault.answer(&request.id);
    match serde_json::from_value(answer) {
        Ok(answer) => Ok(StreamableHttpPostResponse::Json(answer, session_id)),
        Err(_) => Err(refused),
    }
}

/// A non-success answer: a JSON-RPC error in a JSON body of at most
/// [`JSON_ON_WORKER`](crate::wire::JSON_ON_WORKER) is the answer; anything else is an error
/// quoting a bounded prefix of the body.
async fn failure(
    response: reqwest::Response,
    status: StatusCode,
    status_error: Option<HttpStatusError>,
    is_json: bool,
    session_id: Option<String>,
    limits: StreamableHttpResponseLimits,
) -> Result<StreamableHttpPostResponse, Error> {
    let content_type = response.headers().get(CONTENT_TYPE).cloned();
    let max_error = limits.max_error_response_size;
    // A 401/403 without a challenge (those with one were answered already) keeps its status.
    let is_auth_failure = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
    let body = if is_json && !is_auth_failure {
        match read_bounded(response, limits.max_json_response_size).await {
            Ok(raw) => {
                let prefix = (raw.len() > max_error).then(|| raw[..max_error].to_vec());
                let full = decode(raw, content_type.clone(), max_error).await;
                // A JSON-RPC error is a few KiB: a body over `JSON_ON_WORKER` is not parsed
                // here on the worker (nor can it hold too many values to parse), only quoted.
                if full.len() <= crate::wire::JSON_ON_WORKER
                    && let Ok(error @ JsonRpcMessage::Error(_)) =
                        serde_json::from_str::<ServerJsonRpcMessage>(&full)
                {
                    return Ok(StreamableHttpPostResponse::Json(error, session_id));
                }
                match prefix {
                    Some(prefix) => decode(prefix, content_type, max_error).await,
                    None => full,
                }
            }
            Err(error @ StreamableHttpError::ResponseBodyTooLarge { .. }) => {
                return Err(status_error.map(StreamableHttpError::from).unwrap_or(error));
            }
            Err(StreamableHttpError::Client(_)) => read_failure(max_error),
            Err(error) => return Err(error),
        }
    } else {
        match read_truncated(response, max_error).await {
            Ok(prefix) => decode(prefix, content_type, max_error).await,
            Err(_) => read_failure(max_error),
        }
    };
    if let Some(error) = status_error {
        return Err(error.into());
    }
    Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
        format!("HTTP {status}: {body}"),
    )))
}

/// Header names rmcp sets itself (`MCP-Protocol-Version` is let through: its worker
/// sends it as a custom header once the version is negotiated).
fn is_reserved(name: &HeaderName) -> bool {
    ["accept", HEADER_SESSION_ID, HEADER_LAST_EVENT_ID]
        .iter()
        .any(|reserved| name.as_str().eq_ignore_ascii_case(reserved))
}

/// A 401 or 403 with a `WWW-Authenticate` challenge, as rmcp's errors.
fn challenge(status: StatusCode, headers: &HeaderMap) -> Option<Error> {
    if !matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
        return None;
    }
    let header = headers.get(WWW_AUTHENTICATE)?;
    let Ok(header) = header.to_str() else {
        return Some(StreamableHttpError::UnexpectedServerResponse(Cow::from(
            "invalid www-authenticate header value",
        )));
    };
    Some(if status == StatusCode::UNAUTHORIZED {
        StreamableHttpError::AuthRequired(AuthRequiredError::new(header.to_owned()))
    } else {
        StreamableHttpError::InsufficientScope(InsufficientScopeError::new(
            header.to_owned(),
            scope(header),
        ))
    })
}

/// The `scope=` parameter of a challenge, quoted or not.
fn scope(header: &str) -> Option<String> {
    let start = header.to_ascii_lowercase().find("scope=")? + "scope=".len();
    let value = header.get(start..)?;
    if let Some(quoted) = value.strip_prefix('"') {
        return quoted.find('"').map(|end| quoted[..end].to_owned());
    }
    let end = value
        .find(|c: char| c == ',' || c == ';' || c.is_whitespace())
        .unwrap_or(value.len());
    (end > 0).then(|| value[..end].to_owned())
}

/// 429 and 5xx, with a `Retry-After` of at most 128 bytes.
fn http_status_error(status: StatusCode, headers: &HeaderMap) -> Option<HttpStatusError> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let retry_after = headers
        .get(RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    Some(HttpStatusError::new(status.as_u16(), retry_after))
}

/// Whether a `Content-Type` value's media type (case-insensitive, parameters ignored) is
/// `expected`.
fn media_type_is(value: &[u8], expected: &str) -> bool {
    value
        .split(|byte| *byte == b';')
        .next()
        .and_then(|essence| std::str::from_utf8(essence).ok())
        .is_some_and(|essence| {
            essence
                .trim_matches([' ', '\t'])
                .eq_ignore_ascii_case(expected)
        })
}

/// A JSON body read whole: in memory, or in a file when it was over the memory limit.
enum Body {
    Memory(Vec<u8>),
    /// In a file, with its bytes of the spill budget.
    Spilled(std::fs::File, Reservation),
    /// Over the memory limit, and its file could not be written: why (the rest of the body
    /// is not read; its request fails, the session stays).
    Unwritable(String),
    /// Over the memory limit, and its file would pass the spill budget: the bytes read by
    /// then (the rest of the body is not read; its request fails, the session stays).
    OverBudget {
        bytes: u64,
        refused: OverBudget,
    },
}

/// The body within `max` bytes in memory; past `max`, with `spill`, written to an unnamed
/// file (in chunks of [`WRITE_BUFFER`](crate::spill::WRITE_BUFFER), each on a blocking
/// thread, each reserved of the tap's budget first) up to
/// [`MAX_SPILLED_ANSWER`](crate::MAX_SPILLED_ANSWER), with `spill`: the
/// connection's tap (its folder) and the request it answers, each chunk noted on the tap's
/// transfer clock while the request still awaits it (its answer is arriving). Dropped
/// midway, the file goes with it (the POST's answer is lost with its future either way),
/// closed on a blocking thread; ended with a refusal or an error, the file is closed and
/// its bytes of the budget given back before this returns.
async fn read_bounded_or_spill(
    response: reqwest::Response,
    max: usize,
    spill: Option<(&Tap, &RequestId)>,
) -> Result<Body, Error> {
    let Some((tap, id)) = spill else {
        return read_bounded(response, max).await.map(Body::Memory);
    };
    let mut spilling = crate::spill::Spilling::default();
    let read = read_spilling(response, max, tap, id, &mut spilling).await;
    // Empty unless the read was refused or failed with a file under way.
    spilling.close().await;
    read
}

/// [`read_bounded_or_spill`]'s work, the file and its bytes of the budget in `spilling`
/// while no write owns them.
async fn read_spilling(
    mut response: reqwest::Response,
    max: usize,
    tap: &Tap,
    id: &RequestId,
    spilling: &mut crate::spill::Spilling,
) -> Result<Body, Error> {
    use crate::spill::WRITE_BUFFER;
    let spill_dir = tap.spill_dir().to_path_buf();
    let cap = crate::MAX_SPILLED_ANSWER;
    if response.content_length().is_some_and(|length| length > cap) {
        return Err(StreamableHttpError::ResponseBodyTooLarge {
            max_size: usize::try_from(cap).unwrap_or(usize::MAX),
        });
    }
    let mut body = Vec::new();
    let mut total = 0u64;
    // A write owns the file and its bytes of the budget until it ends: this future dropped
    // midway, the bytes go back only once the write has closed the file.
    let write = |file: Option<std::fs::File>, held: Reservation, chunk: Vec<u8>| {
        let dir = spill_dir.clone();
        tokio::task::spawn_blocking(move || {
            crate::spill::append(file, &dir, &chunk).map(|file| (file, held))
        })
    };
    // Each chunk's bytes, reserved before it is written.
    // Refused, what was held stays held, to go back once the file is closed.
    let reserve = |held: &mut Option<Reservation>, len: usize| {
        let mut reservation = held.take().unwrap_or_else(|| tap.budget().reserve());
        match reservation.grow(len as u64) {
            Ok(()) => Ok(reservation),
            Err(refused) => {
                *held = Some(reservation);
                Err(refused)
            }
        }
    };
    let failed = |error: std::io::Error| {
        format!(
            "the JSON body, over {} MiB, could not be written to a file in {}: {error}",
            max >> 20,
            spill_dir.display()
        )
    };
    while let Some(chunk) = response.chunk().await? {
        // Not for a request given up on: its answer keeps no other call waiting.
        if tap.awaits(id) {
            tap.transfer().note();
        }
        total += chunk.len() as u64;
        if total > cap {
            return Err(StreamableHttpError::ResponseBodyTooLarge {
                max_size: usize::try_from(cap).unwrap_or(usize::MAX),
            });
        }
        if spilling.file.is_none()
            && body.len() + chunk.len() > body.capacity()
            && body.len() >= max
        {
            // Exact: doubling a body of `max` bytes here would be the peak.
            body.reserve_exact(chunk.len());
        }
        body.extend_from_slice(&chunk);
        if (spilling.file.is_some() || body.len() > max) && body.len() >= WRITE_BUFFER {
            let reservation = match reserve(&mut spilling.held, body.len()) {
                Ok(reservation) => reservation,
                // The file closed (off the worker) before what it held goes back.
                Err(refused) => {
                    return Ok(Body::OverBudget {
                        bytes: total,
                        refused,
                    });
                }
            };
            let chunk = std::mem::replace(&mut body, Vec::with_capacity(WRITE_BUFFER + 64 * 1024));
            let written = write(spilling.file.take(), reservation, chunk)
                .await
                .map_err(std::io::Error::other);
            match written.and_then(|written| written) {
                Ok((written, reservation)) => {
                    (spilling.file, spilling.held) = (Some(written), Some(reservation));
                }
                Err(error) => return Ok(Body::Unwritable(failed(error))),
            }
        }
    }
    let Some(file) = spilling.file.take() else {
        return Ok(Body::Memory(body));
    };
    let reservation = match reserve(&mut spilling.held, body.len()) {
        Ok(reservation) => reservation,
        Err(refused) => {
            spilling.file = Some(file);
            return Ok(Body::OverBudget {
                bytes: total,
                refused,
            });
        }
    };
    let written = write(Some(file), reservation, body)
        .await
        .map_err(std::io::Error::other);
    Ok(match written.and_then(|written| written) {
        Ok((file, held)) => Body::Spilled(file, held),
        Err(error) => Body::Unwritable(failed(error)),
    })
}

/// The answer to `message` whose JSON body is in `file`: read back on a blocking thread
/// ([`crate::spill::read_answer`]), its long texts kept in files with its result in the
/// tap; answered as too large (`max`, the memory limit) if what stays in memory is over
/// the cap.
async fn spilled(
    tap: &Arc<Tap>,
    message: &ClientJsonRpcMessage,
    (file, held): (std::fs::File, Reservation),
    max: usize,
    session_id: Option<String>,
) -> Result<StreamableHttpPostResponse, Error> {
    let bytes = held.bytes();
    let unreadable = |reason: String| {
        StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!(
            "could not parse JSON response as ServerJsonRpcMessage: {reason}"
        )))
    };
    let tap = Arc::clone(tap);
    // Read back and typed there: the message left in memory may be large (the tap keeps a
    // call's result, not an error's nor one its caller gave up on).
    let read = tokio::task::spawn_blocking(move || {
        crate::spill::read_answer(file, held, &tap)
            .map(serde_json::from_value::<ServerJsonRpcMessage>)
    })
    .await
    .map_err(|error| unreadable(error.to_string()))?;
    let faulty = |fault: Fault| {
        let error = unreadable(fault.reason());
        answered_with(message, &fault, session_id.clone(), error)
    };
    match read {
        Ok(parsed) => {
            let parsed = parsed.map_err(|e| unreadable(e.to_string()))?;
            Ok(StreamableHttpPostResponse::Json(parsed, session_id))
        }
        Err(crate::spill::Refused::OverBudget(refused)) => {
            faulty(Fault::OverBudget { bytes, refused })
        }
        Err(crate::spill::Refused::TooComplex) => faulty(Fault::TooComplex { bytes }),
        Err(refused) => match refused.reason() {
            None => too_large(message, crate::spill::MAX_IN_MEMORY.max(max), session_id),
            // The request fails with what happened; the session stays usable.
            Some(reason) => {
                let fault = Fault::SpilledUnreadable(reason.clone());
                answered_with(message, &fault, session_id, unreadable(reason))
            }
        },
    }
}

async fn read_bounded(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, Error> {
    if response
        .content_length()
        .is_some_and(|length| length > max as u64)
    {
        return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if chunk.len() > max - body.len() {
            return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// At most `max` bytes of the body, for a diagnostic.
async fn read_truncated(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, Error> {
    let mut body = Vec::new();
    while body.len() < max {
        let Some(chunk) = response.chunk().await? else {
            break;
        };
        let count = chunk.len().min(max - body.len());
        body.extend_from_slice(&chunk[..count]);
    }
    Ok(body)
}

/// A body as text, decoded as reqwest decodes it.
async fn decode(body: Vec<u8>, content_type: Option<HeaderValue>, max_error: usize) -> String {
    if body.is_empty() {
        return String::new();
    }
    let mut buffered = http::Response::new(body);
    if let Some(content_type) = content_type {
        buffered.headers_mut().insert(CONTENT_TYPE, content_type);
    }
    reqwest::Response::from(buffered)
        .text()
        .await
        .unwrap_or_else(|_| read_failure(max_error))
}

fn read_failure(max_error: usize) -> String {
    BODY_READ_FAILURE[..BODY_READ_FAILURE.len().min(max_error)].to_owned()
}

/// The start of a body that is not a JSON-RPC message, for an error.
pub(crate) fn preview(body: &[u8]) -> Cow<'_, str> {
    if body.is_empty() {
        return Cow::Borrowed("<empty>");
    }
    let lossy = String::from_utf8_lossy(body);
    if lossy.len() <= BODY_PREVIEW {
        return lossy;
    }
    Cow::Owned(lossy[..lossy.floor_char_boundary(BODY_PREVIEW)].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's body is its JSON, short or long; a long one is serialized on a blocking
    /// thread (a current-thread runtime without one to spare would still finish it).
    #[tokio::test]
    async fn a_body_is_the_message_json_short_or_long() {
        use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest};
        for bytes in [10, 2 * crate::wire::JSON_ON_WORKER] {
            let mut arguments = serde_json::Map::new();
            arguments.insert("text".into(), serde_json::json!("x".repeat(bytes)));
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(
                CallToolRequestParams::new("echo").with_arguments(arguments),
            ));
            let message = Arc::new(JsonRpcMessage::request(request, RequestId::Number(1)));
            let sent = body(&message).await.map_err(|e| e.to_string());
            let sent = sent.unwrap_or_default();
            assert_eq!(
                Some(sent.clone()),
                serde_json::to_vec(&*message).ok(),
                "its JSON alone"
            );
            let sent: serde_json::Value = serde_json::from_slice(&sent).unwrap_or_default();
            assert_eq!(
                sent["params"]["arguments"]["text"].as_str().map(str::len),
                Some(bytes)
            );
        }
    }

    #[test]
    fn media_types_and_scopes_read_as_rmcp_reads_them() {
        assert!(media_type_is(
            b"Application/JSON; charset=utf-8",
            JSON_MIME_TYPE
        ));
        assert!(!media_type_is(
            b"application/json-patch+json",
            JSON_MIME_TYPE
        ));
        assert_eq!(
            scope(r#"Bearer error="insufficient_scope", scope="files:read files:write""#),
            Some("files:read files:write".to_owned())
        );
        assert_eq!(
            scope("Bearer scope=read:data, x=1"),
            Some("read:data".to_owned())
        );
        assert_eq!(scope("Bearer realm=x"), None);
        assert!(is_reserved(&HeaderName::from_static("last-event-id")));
        assert!(!is_reserved(&HeaderName::from_static(
            "mcp-protocol-version"
        )));
    }
}
