//! The test server's raw results over streamable HTTP: rmcp's HTTP server takes only a
//! typed `ServerHandler`, whose `tools/call` answer is rmcp's `CallToolResult` (which cannot
//! carry a block type or a field rmcp does not model). So the `exotic` tool answers with a
//! marker, and the session's transport replaces that answer with [`exotic_result`] (or
//! [`exotic_known_result`], or [`exotic_structured_result`]) as raw JSON on its way out;
//! every other message passes untouched. Served statelessly with JSON bodies (`--json-response`), there is no session
//! transport: [`replace_marker_in_body`] does the same in the response body. Over stdio
//! the server's `RawListing` service replaces the handler's answer with
//! [`replace_marker_result`], the same replacement.
//!
//! [`fault`] answers, before rmcp sees the request, what a misbehaving HTTP server or the
//! proxy in front of it would: redirects (paths under `/moved`: a same-origin 307 or 308 to
//! `/mcp`, a loop, a cross-origin 307), event streams cut short (`tools/call` of
//! `cut_stream {bytes}`: part of an event, then the end; of `end_stream`: the end before
//! any answer), an answer too dense to parse (`tools/call` of `many_values {count, json}`:
//! [`many_values_answer`](super::many_values_answer) as an event, or as a JSON body with
//! `json`) and refusals of one request (`tools/call` of `rate_limited`: a 429 with
//! `Retry-After: 7`; of `bad_gateway`: a proxy's 502 page in HTML), or of every request
//! from then on (`forget_sessions`: a 400, as a server restarted without its sessions
//! answers). Those tools are not listed; only a client that calls them by name sees them.
//! With `--dense-initialize N`, [`fault`] answers `initialize` with `N` zeros in the
//! result's `_meta` (and `server/discover` with an error, so a client falls back to it).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::Stream;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Collected, Full};
use hyper::body::Bytes;
use rmcp::RoleServer;
use rmcp::model::ServerResult;
use rmcp::model::{ClientJsonRpcMessage, CustomResult, JsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::streamable_http_server::session::ServerSseMessage;
use rmcp::transport::streamable_http_server::{RestoreOutcome, SessionId, SessionManager};
use serde_json::Value;

use super::{exotic_known_result, exotic_result, exotic_structured_result};

/// A response of the test server's HTTP service.
pub(super) type HttpResponse = http::Response<BoxBody<Bytes, Infallible>>;

/// What [`fault`] decided: answer with this, or hand rmcp the request (its body read).
pub(super) enum Fault {
    /// The misbehaviour's answer.
    Answer(HttpResponse),
    /// An ordinary request, for rmcp.
    Pass(http::Request<Full<Bytes>>),
}

/// An answer of `status` with the text `body`.
fn plain(status: http::StatusCode, body: &'static str) -> HttpResponse {
    let mut response = http::Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed());
    *response.status_mut() = status;
    response
}

/// A 400, as the Python SDK answers a session it does not know (after a restart, say).
fn no_session() -> HttpResponse {
    plain(
        http::StatusCode::BAD_REQUEST,
        "Bad Request: No valid session ID provided",
    )
}

/// A redirect to `location`.
fn redirect(status: http::StatusCode, location: &str) -> HttpResponse {
    let mut response = plain(status, "");
    if let Ok(location) = http::HeaderValue::from_str(location) {
        response
            .headers_mut()
            .insert(http::header::LOCATION, location);
    }
    response
}

/// A JSON body of `body`.
fn json_body(body: Vec<u8>) -> HttpResponse {
    typed(body, "application/json")
}

/// An event stream of `body`, which ends when it does.
fn event_stream(body: Vec<u8>) -> HttpResponse {
    typed(body, "text/event-stream")
}

/// A 200 answer of `body` with the content type `content_type`.
fn typed(body: Vec<u8>, content_type: &'static str) -> HttpResponse {
    let mut response = http::Response::new(Full::new(Bytes::from(body)).boxed());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

/// The misbehaviours of the HTTP mode (see the module docs), or the request for rmcp.
/// `forgot` is the server's: set by `forget_sessions`, after which every POST is refused
/// with a 400.
pub(super) async fn fault<B>(
    request: http::Request<B>,
    forgot: &AtomicBool,
    dense_initialize: Option<u64>,
) -> Fault
where
    B: hyper::body::Body<Data = Bytes>,
{
    use http::StatusCode;
    let path = request.uri().path().to_owned();
    let host = request
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    match path.as_str() {
        "/moved" => return Fault::Answer(redirect(StatusCode::TEMPORARY_REDIRECT, "/mcp")),
        "/moved/permanently" => {
            return Fault::Answer(redirect(StatusCode::PERMANENT_REDIRECT, "/mcp"));
        }
        "/moved/absolute" => {
            let target = format!("http://{host}/mcp");
            return Fault::Answer(redirect(StatusCode::TEMPORARY_REDIRECT, &target));
        }
        "/moved/loop" => {
            return Fault::Answer(redirect(StatusCode::TEMPORARY_REDIRECT, "/moved/loop"));
        }
        "/moved/away" => {
            // Another origin: the same server under another host name.
            let port = host.rsplit_once(':').map(|(_, port)| port).unwrap_or("80");
            let target = format!("http://localhost:{port}/mcp");
            return Fault::Answer(redirect(StatusCode::TEMPORARY_REDIRECT, &target));
        }
        _ => {}
    }
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(Collected::to_bytes)
        .unwrap_or_default();
    if parts.method == http::Method::POST && forgot.load(Ordering::SeqCst) {
        return Fault::Answer(no_session());
    }
    if parts.method == http::Method::POST
        && let Some(count) = dense_initialize
        && let Ok(message) = serde_json::from_slice::<Value>(&body)
    {
        let id = message["id"].to_string();
        let answer = match message["method"].as_str() {
            Some("server/discover") => Some(format!(
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32601,"message":"Method not found"}}}}"#
            ).into_bytes()),
            Some("initialize") => {
                let mut answer = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":{{"protocolVersion":"2025-11-25","capabilities":{{"tools":{{}}}},"serverInfo":{{"name":"dense","version":"1"}},"_meta":{{"values":["#
                )
                .into_bytes();
                let count = usize::try_from(count).unwrap_or(0);
                super::stdio_faults::push_zeros(&mut answer, count);
                answer.extend_from_slice(b"]}}}");
                Some(answer)
            }
            _ => None,
        };
        if let Some(answer) = answer {
            return Fault::Answer(json_body(answer));
        }
    }
    if parts.method == http::Method::POST
        && let Ok(message) = serde_json::from_slice::<Value>(&body)
        && message["method"] == "tools/call"
    {
        let id = message["id"].to_string();
        match message["params"]["name"].as_str() {
            Some("cut_stream") => {
                let bytes = message["params"]["arguments"]["bytes"]
                    .as_u64()
                    .unwrap_or(1_000);
                let mut event = format!(
                    "data: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\""
                )
                .into_bytes();
                event.resize(event.len() + usize::try_from(bytes).unwrap_or(0), b'x');
                return Fault::Answer(event_stream(event));
            }
            Some("end_stream") => return Fault::Answer(event_stream(b": no answer\n\n".to_vec())),
            Some("many_values") => {
                let arguments = &message["params"]["arguments"];
                let count = arguments["count"].as_u64().unwrap_or(0);
                let answer = super::many_values_answer(&id, usize::try_from(count).unwrap_or(0));
                if arguments["json"] == true {
                    return Fault::Answer(json_body(answer));
                }
                let mut event = b"data: ".to_vec();
                event.extend_from_slice(&answer);
                event.extend_from_slice(b"\n\n");
                return Fault::Answer(event_stream(event));
            }
            Some("rate_limited") => {
                let mut response = plain(StatusCode::TOO_MANY_REQUESTS, "slow down");
                response.headers_mut().insert(
                    http::header::RETRY_AFTER,
                    http::HeaderValue::from_static("7"),
                );
                return Fault::Answer(response);
            }
            Some("forget_sessions") => {
                forgot.store(true, Ordering::SeqCst);
                return Fault::Answer(no_session());
            }
            Some("bad_gateway") => {
                let mut response = plain(
                    StatusCode::BAD_GATEWAY,
                    "<html><body><h1>502 Bad Gateway</h1></body></html>",
                );
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/html"),
                );
                return Fault::Answer(response);
            }
            _ => {}
        }
    }
    Fault::Pass(http::Request::from_parts(parts, Full::new(body)))
}

/// One answer of `exotic`: the flag that asks for it, its marker, its raw result.
type Marker = (Option<&'static str>, &'static str, fn() -> Value);

/// What the handler answers `exotic` with, by the flag it was called with (none, the
/// first), each the text of its one block and replaced on the wire by the raw result:
/// [`exotic_result`], [`exotic_known_result`] (`known_only`), [`exotic_structured_result`]
/// (`structured_only`, which goes before `known_only`).
const MARKERS: [Marker; 3] = [
    (
        None,
        "psych-test-server: exotic, replaced on the wire",
        exotic_result,
    ),
    (
        Some("structured_only"),
        "psych-test-server: exotic (structured only), replaced on the wire",
        exotic_structured_result,
    ),
    (
        Some("known_only"),
        "psych-test-server: exotic (known only), replaced on the wire",
        exotic_known_result,
    ),
];

/// The marker the handler answers `exotic` with, by its arguments.
pub(super) fn marker(arguments: &serde_json::Map<String, Value>) -> &'static str {
    let flagged = |flag: Option<&str>| {
        flag.is_some_and(|name| arguments.get(name) == Some(&Value::Bool(true)))
    };
    MARKERS
        .iter()
        .find(|(flag, ..)| flagged(*flag))
        .map_or(MARKERS[0].1, |(_, marker, _)| marker)
}

/// A session manager whose sessions' transports are [`RawResults`].
pub(super) struct RawSessions<M>(pub(super) M);

/// A session transport that puts [`exotic_result`] in place of the marker answer.
pub(super) struct RawResults<T>(T);

/// Puts the raw result in place of a marker answer; any other result is left as it is.
/// (Over stdio the server's `RawListing` service does this to the handler's answers.)
pub(super) fn replace_marker_result(result: &mut ServerResult) {
    if let ServerResult::CallToolResult(call) = result
        && let [block] = call.content.as_slice()
        && let Some(text) = block.as_text()
    {
        let Some((.., raw)) = MARKERS.iter().find(|(_, marker, _)| text.text == *marker) else {
            return;
        };
        *result = ServerResult::CustomResult(CustomResult(raw()));
    }
}

fn replace_marker(mut item: TxJsonRpcMessage<RoleServer>) -> TxJsonRpcMessage<RoleServer> {
    if let JsonRpcMessage::Response(response) = &mut item {
        replace_marker_result(&mut response.result);
    }
    item
}

/// A response of rmcp's HTTP service, with the marker answer replaced if it is a JSON body
/// that carries one; any other response is passed on untouched.
pub(super) async fn replace_marker_in_body(
    response: http::Response<BoxBody<Bytes, Infallible>>,
) -> http::Response<BoxBody<Bytes, Infallible>> {
    let is_json = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/json"));
    if !is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(body) = body.collect().await.map(Collected::to_bytes);
    let marked = MARKERS
        .iter()
        .any(|(_, marker, _)| memchr::memmem::find(&body, marker.as_bytes()).is_some());
    let body = match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
        Ok(message) if marked => match serde_json::to_vec(&replace_marker(message)) {
            Ok(rewritten) => {
                parts.headers.remove(http::header::CONTENT_LENGTH);
                Bytes::from(rewritten)
            }
            Err(_) => body,
        },
        _ => body,
    };
    http::Response::from_parts(parts, Full::new(body).boxed())
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for RawResults<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.0.send(replace_marker(item))
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        self.0.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.0.close()
    }
}

impl<M: SessionManager> SessionManager for RawSessions<M> {
    type Error = M::Error;
    type Transport = RawResults<M::Transport>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, transport) = self.0.create_session().await?;
        Ok((id, RawResults(transport)))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.0.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.0.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.0.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.0.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.0.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.0.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.0.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        Ok(match self.0.restore_session(id).await? {
            RestoreOutcome::Restored(transport) => RestoreOutcome::Restored(RawResults(transport)),
            RestoreOutcome::AlreadyPresent => RestoreOutcome::AlreadyPresent,
            _ => RestoreOutcome::NotSupported,
        })
    }

    fn event_store(
        &self,
    ) -> Option<std::sync::Arc<dyn rmcp::transport::streamable_http_server::session::EventStore>>
    {
        self.0.event_store()
    }
}
