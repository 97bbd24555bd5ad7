//! Raw JSON answers, over stdio and streamable HTTP, in every revision.
//!
//! rmcp serves only a [`ServerHandler`](rmcp::ServerHandler), whose `tools/list` and
//! `tools/call` answers are rmcp's typed results: a block type rmcp does not model would be
//! refused and an unknown field dropped. So the handler answers with a typed placeholder
//! whose `_meta` carries a key into [`RawAnswers`], rmcp does its protocol work on the
//! placeholder (MCP 2026-07-28's `resultType`, `ttlMs` and `cacheScope`, or none of them
//! for an earlier revision), and on the way out the raw JSON takes the placeholder's place
//! with those protocol fields copied onto it ([`merged`]):
//!
//! - over stdio and in an HTTP session (the `initialize` lifecycle), by the transport:
//!   [`RawTransport`] around psych's stdio transport, and around each session's transport
//!   ([`RawSessions`] wraps rmcp's session manager);
//! - for a request of MCP 2026-07-28 over HTTP, which rmcp answers without a session
//!   through a one-shot transport of its own (no hook between the handler's typed result
//!   and the bytes sent), by [`raw_http`] on the HTTP response rmcp made: the one missing
//!   piece of rmcp 3.11 for a gateway that must pass results through untouched.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rmcp::RoleServer;
use rmcp::model::{
    ClientJsonRpcMessage, CustomResult, JsonRpcMessage, MetaObject, ServerJsonRpcMessage,
    ServerResult,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use serde_json::Value;

/// The `_meta` key of a typed placeholder: the number of its raw answer.
pub(super) const RAW_KEY: &str = "psych.gateway/raw";

/// How many raw answers may wait for their transport at once. One waits only between the
/// handler's return and the transport's send; the bound is for answers whose send never
/// comes (a session ended between the two): the oldest is forgotten first.
///
/// Memory: a raw answer is a listing (under 40 KB, asserted in the serve tests) or a
/// result elision let through whole, so under its per-result threshold (10,000 estimated
/// tokens by default, some 40 KB of text; a larger image or blob is replaced by its
/// placeholder line). So the answers waiting hold some tens of MB at the very worst, and
/// in practice nothing: each is taken by its send.
///
/// Cancel safety: nothing here is held across an await. The swap happens before
/// [`RawTransport::send`] returns its future, and `receive` and `close` are the inner
/// transport's own.
const MAX_WAITING: usize = 1024;

/// Raw answers waiting for the transport to put them in place of their placeholders.
///
/// A placeholder's key is `<secret>-<n>`: the secret is drawn once per gateway and never
/// sent (the key is not in what goes out), so an upstream result whose own `_meta` holds
/// [`RAW_KEY`] can name no answer waiting, another client's least of all; and a raw
/// answer's own [`RAW_KEY`] is dropped when it is kept.
#[derive(Debug)]
pub(super) struct RawAnswers {
    secret: String,
    next: AtomicU64,
    waiting: Mutex<BTreeMap<u64, Value>>,
}

impl Default for RawAnswers {
    fn default() -> Self {
        Self {
            secret: secret(),
            next: AtomicU64::new(0),
            waiting: Mutex::default(),
        }
    }
}

/// 128 random bits in hex, from the system's random source (as a segment's run id is), or
/// if it fails from the standard library's randomly keyed hasher.
fn secret() -> String {
    let bits = crate::tenant::random_u128().unwrap_or_else(|_| {
        use std::hash::BuildHasher;
        let keyed = std::collections::hash_map::RandomState::new();
        (u128::from(keyed.hash_one(1u8)) << 64) | u128::from(keyed.hash_one(2u8))
    });
    format!("{bits:032x}")
}

impl RawAnswers {
    /// Keeps `raw` (without a [`RAW_KEY`] of its own in its `_meta`) and marks `meta` (a
    /// placeholder's `_meta`) with its key.
    pub(super) fn stash(&self, mut raw: Value, meta: &mut Option<MetaObject>) {
        if let Some(Value::Object(own)) = raw.get_mut("_meta") {
            own.remove(RAW_KEY);
        }
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        while waiting.len() >= MAX_WAITING {
            waiting.pop_first();
        }
        waiting.insert(key, raw);
        meta.get_or_insert_default().0.insert(
            RAW_KEY.to_owned(),
            Value::from(format!("{}-{key}", self.secret)),
        );
    }

    /// The number of the answer a placeholder's key names, when it is one of ours.
    fn key_of(&self, key: &Value) -> Option<u64> {
        key.as_str()?
            .strip_prefix(self.secret.as_str())?
            .strip_prefix('-')?
            .parse()
            .ok()
    }

    /// Puts the raw answer in place of `message`'s result when it is a marked placeholder,
    /// with the protocol fields rmcp gave the placeholder ([`merged`]).
    pub(super) fn swap(&self, message: &mut ServerJsonRpcMessage) {
        let JsonRpcMessage::Response(response) = message else {
            return;
        };
        let meta = match &mut response.result {
            ServerResult::CallToolResult(result) => result.meta.as_mut(),
            ServerResult::ListToolsResult(result) => result.meta.as_mut(),
            // MCP 2026-07-28's round: the upstream's `inputRequests` as it sent them.
            ServerResult::InputRequiredResult(result) => result.meta.as_mut(),
            _ => None,
        };
        let Some(meta) = meta else {
            return;
        };
        let Some(key) = meta.0.get(RAW_KEY).and_then(|key| self.key_of(key)) else {
            return;
        };
        let Some(raw) = self.take(key) else {
            // Its answer was forgotten (past MAX_WAITING): the placeholder goes, without
            // the key, which would tell the secret.
            meta.0.remove(RAW_KEY);
            return;
        };
        let placeholder = serde_json::to_value(&response.result).unwrap_or(Value::Null);
        response.result = ServerResult::CustomResult(CustomResult(merged(&placeholder, raw)));
    }

    /// Puts the raw answer in place of the `result` of `message` (a JSON-RPC response as
    /// JSON, as rmcp encoded it) when it is a marked placeholder (or, when its answer was
    /// forgotten, removes the key); says whether it changed the message.
    pub(super) fn swap_json(&self, message: &mut Value) -> bool {
        let Some(result) = message.get_mut("result") else {
            return false;
        };
        let Some(key) = result
            .get("_meta")
            .and_then(|meta| meta.get(RAW_KEY))
            .and_then(|key| self.key_of(key))
        else {
            return false;
        };
        let Some(raw) = self.take(key) else {
            if let Some(Value::Object(meta)) = result.get_mut("_meta") {
                meta.remove(RAW_KEY);
            }
            return true;
        };
        *result = merged(result, raw);
        true
    }

    fn take(&self, key: u64) -> Option<Value> {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key)
    }
}

/// The protocol fields a placeholder result carries and the raw answer must too: what rmcp
/// adds for the revision the client speaks (2026-07-28's `resultType`, and `ttlMs` and
/// `cacheScope` on a listing; none for earlier revisions, whose results rmcp strips of
/// them).
const PROTOCOL_FIELDS: [&str; 3] = ["resultType", "ttlMs", "cacheScope"];

/// `raw` with `placeholder`'s protocol fields ([`PROTOCOL_FIELDS`]) it does not have itself,
/// and the placeholder's `_meta` keys (the server's identity rmcp adds, say) but the raw
/// key; the raw answer's own fields and `_meta` keys are kept otherwise. For a client of a
/// revision before 2026-07-28 (the placeholder has no `resultType`: rmcp stripped it), the
/// raw answer is shaped as rmcp shaped the placeholder ([`for_legacy_peer`]).
fn merged(placeholder: &Value, mut raw: Value) -> Value {
    let Some(object) = raw.as_object_mut() else {
        return raw;
    };
    if placeholder.get("resultType").is_none() {
        for_legacy_peer(placeholder, object);
    }
    for field in PROTOCOL_FIELDS {
        // The raw answer's own value wins (an upstream's `input_required`, say).
        if let Some(value) = placeholder.get(field)
            && !object.contains_key(field)
        {
            object.insert(field.to_owned(), value.clone());
        }
    }
    if let Some(Value::Object(meta)) = placeholder.get("_meta") {
        let extra: Vec<(&String, &Value)> = meta.iter().filter(|(k, _)| *k != RAW_KEY).collect();
        if !extra.is_empty() {
            let target = object
                .entry("_meta")
                .or_insert_with(|| Value::Object(serde_json::Map::new()));
            if let Value::Object(target) = target {
                for (key, value) in extra {
                    target.insert(key.clone(), value.clone());
                }
            }
        }
    }
    raw
}

/// What rmcp's `strip_non_object_output_for_legacy_peer` does to a typed result for a
/// client of a revision before 2026-07-28 (whose schemas take only an object there), done
/// to the raw answer that takes the placeholder's place: in a listing (the placeholder has
/// `tools`), a tool's `outputSchema` whose root `type` is not `"object"` is dropped; in a
/// call's result (it has `content`), a `structuredContent` that is not an object is dropped
/// and, unless the first block is a text holding the same JSON value (or it is `null`),
/// given as a first text block. (MCP 2026-07-28, which psych-mcp speaks to upstreams first, takes both.)
fn for_legacy_peer(placeholder: &Value, raw: &mut serde_json::Map<String, Value>) {
    if placeholder.get("tools").is_some() {
        let Some(Value::Array(tools)) = raw.get_mut("tools") else {
            return;
        };
        for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
            let object_schema = tool
                .get("outputSchema")
                .is_none_or(|schema| schema.get("type").and_then(Value::as_str) == Some("object"));
            if !object_schema {
                tool.remove("outputSchema");
            }
        }
    } else if placeholder.get("content").is_some() {
        if raw.get("structuredContent").is_none_or(Value::is_object) {
            return;
        }
        // `null` is no structured content (rmcp reads it as none): dropped, nothing said.
        let Some(value) = raw.remove("structuredContent").filter(|v| !v.is_null()) else {
            return;
        };
        let content = raw
            .entry("content")
            .or_insert_with(|| Value::Array(Vec::new()));
        let Value::Array(blocks) = content else {
            return;
        };
        let in_content = blocks.first().is_some_and(|block| {
            block.get("type").and_then(Value::as_str) == Some("text")
                && block
                    .get("text")
                    .and_then(Value::as_str)
                    .and_then(|text| serde_json::from_str::<Value>(text).ok())
                    .is_some_and(|text| text == value)
        });
        if !in_content {
            blocks.insert(
                0,
                serde_json::json!({"type": "text", "text": value.to_string()}),
            );
        }
    }
}

/// rmcp's [`LocalSessionManager`] with each session's transport wrapped in a
/// [`RawTransport`], telling [`Owners`](crate::Owners) which sessions are open, and
/// keeping each one's [`Activity`](crate::admit::Activity) for [`RawSessions::idle`].
#[derive(Debug)]
pub(super) struct RawSessions {
    inner: LocalSessionManager,
    raw: Arc<RawAnswers>,
    owners: Arc<crate::Owners>,
    /// The open sessions' activity: one entry a session, removed as it closes.
    activity: Mutex<std::collections::HashMap<SessionId, Arc<crate::admit::Activity>>>,
    idle: std::time::Duration,
}

impl RawSessions {
    /// Sessions whose placeholders are answered from `raw`, idle after `idle` without a
    /// message or an HTTP request for them and with no request in flight
    /// ([`RawSessions::idle`]: rmcp's own keep-alive, which counts messages only and so cut
    /// calls longer than it, is off), their opening and closing told to `owners`.
    pub(super) fn new(
        raw: Arc<RawAnswers>,
        idle: std::time::Duration,
        owners: Arc<crate::Owners>,
    ) -> Self {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = None;
        Self {
            inner,
            raw,
            owners,
            activity: Mutex::default(),
            idle,
        }
    }

    /// The sessions idle longer than their limit at `now`, to close.
    pub(super) fn idle(&self, now: std::time::Instant) -> Vec<SessionId> {
        self.activity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, activity)| self.past_limit(activity, now))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Takes session `id` to be closed if it is still idle past its limit at `now` (a
    /// request may have come since [`RawSessions::idle`]): from then on it is unknown to
    /// a request ([`SessionManager::has_session`] says no, and rmcp answers 404), and the
    /// caller closes it. The look and the taking are under the lock a request's
    /// `has_session` marks the session active under, so a request either comes first and
    /// keeps its session, or finds it gone: none is cut with a session closed under it,
    /// provided the session's worker takes it (and counts it in flight) within the idle
    /// limit of its arrival.
    pub(super) fn reap(&self, id: &SessionId, now: std::time::Instant) -> bool {
        let mut activity = self.activity.lock().unwrap_or_else(PoisonError::into_inner);
        let idle = activity
            .get(id)
            .is_some_and(|activity| self.past_limit(activity, now));
        if idle {
            activity.remove(id);
        }
        idle
    }

    /// Whether a session of `activity` is idle past the limit at `now`.
    fn past_limit(&self, activity: &crate::admit::Activity, now: std::time::Instant) -> bool {
        activity.idle_for(now).is_some_and(|idle| idle > self.idle)
    }

    /// How often to look for idle sessions: a tenth of the limit, between 50 ms and 10 s.
    pub(super) fn sweep_every(&self) -> std::time::Duration {
        (self.idle / 10).clamp(
            std::time::Duration::from_millis(50),
            std::time::Duration::from_secs(10),
        )
    }
}

/// A session transport that swaps placeholders for their raw answers as they are sent.
pub(super) struct RawTransport<T> {
    inner: T,
    raw: Arc<RawAnswers>,
}

impl<T> RawTransport<T> {
    /// `inner` with its placeholders answered from `raw`.
    pub(super) fn new(inner: T, raw: Arc<RawAnswers>) -> Self {
        Self { inner, raw }
    }
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for RawTransport<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        mut item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.raw.swap(&mut item);
        self.inner.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        self.inner.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

type Local = LocalSessionManager;

impl SessionManager for RawSessions {
    type Error = <Local as SessionManager>::Error;
    type Transport = RawTransport<crate::admit::Bounded<<Local as SessionManager>::Transport>>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, inner) = self.inner.create_session().await?;
        self.owners.opened(&id);
        let inner = crate::admit::Bounded::new(inner);
        self.activity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.clone(), inner.activity());
        Ok((id, RawTransport::new(inner, Arc::clone(&self.raw))))
    }

    fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<ServerJsonRpcMessage, Self::Error>> + Send {
        self.inner.initialize_session(id, message)
    }

    /// Asked by rmcp for every request in a session before it takes it: the session is
    /// active from now (so not idle for [`RawSessions::reap`]), unless it has been taken
    /// to be closed, when it is gone (404).
    fn has_session(
        &self,
        id: &SessionId,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        let open = match self
            .activity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
        {
            Some(activity) => {
                activity.touch();
                true
            }
            None => false,
        };
        let inner = self.inner.has_session(id);
        async move { Ok(open && inner.await?) }
    }

    /// Called by rmcp when the client deletes the session and when its worker ends
    /// (cancelled), and by the gateway for an idle one: the session is nobody's from then
    /// on.
    fn close_session(
        &self,
        id: &SessionId,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.owners.closed(id);
        self.activity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        self.inner.close_session(id)
    }

    fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<
        Output = Result<
            impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
            Self::Error,
        >,
    > + Send {
        SessionManager::create_stream(&self.inner, id, message)
    }

    fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.accept_message(id, message)
    }

    fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> impl Future<
        Output = Result<
            impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
            Self::Error,
        >,
    > + Send {
        SessionManager::create_standalone_stream(&self.inner, id)
    }

    fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> impl Future<
        Output = Result<
            impl futures_core::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
            Self::Error,
        >,
    > + Send {
        SessionManager::resume(&self.inner, id, last_event_id)
    }
}

/// An HTTP body as rmcp's streamable HTTP service answers.
pub(super) type HttpBody = http_body_util::combinators::BoxBody<hyper::body::Bytes, Infallible>;

/// Puts raw answers in place of their placeholders in an HTTP response of rmcp's
/// per-request path (MCP 2026-07-28: no session, so no session transport to wrap), whose
/// answer rmcp encodes itself: a JSON body is read whole, patched and encoded again; an
/// event stream is patched event by event as it flows (a call's progress first, then its
/// result), its other events passed on as they were.
///
/// Memory: the JSON body is the gateway's own answer to one request (a listing, a result
/// elision let through, under its threshold, see [`MAX_WAITING`]; or a `resources/read`
/// page, at most `Limits::max_passed_bytes` of text, up to 6x that once JSON-escaped),
/// never a peer's.
pub(super) async fn raw_http(
    raw: Arc<RawAnswers>,
    response: hyper::Response<HttpBody>,
) -> hyper::Response<HttpBody> {
    use futures_util::StreamExt;
    use http_body_util::BodyExt;

    let kind = response
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let (mut parts, body) = response.into_parts();
    if kind.starts_with("application/json") {
        let Ok(collected) = body.collect().await;
        let bytes = collected.to_bytes();
        // The scan, and the parse and patch of an answer that holds a placeholder (or whose
        // text merely names the key), cost about the answer's size: a large one (a result
        // page of up to 16 MiB) is looked at on a blocking thread.
        let large = bytes.len() > psych_mcp::wire::JSON_ON_WORKER;
        let patch = move || -> (hyper::body::Bytes, bool) {
            // Most answers (initialize, discover, errors) carry no placeholder: not parsed.
            if memchr::memmem::find(&bytes, RAW_KEY.as_bytes()).is_none() {
                return (bytes, false);
            }
            let mut message = serde_json::from_slice::<Value>(&bytes).ok();
            let swapped = message.as_mut().is_some_and(|m| raw.swap_json(m));
            match message {
                Some(message) if swapped => (hyper::body::Bytes::from(message.to_string()), true),
                _ => (bytes, false),
            }
        };
        let (body, rewritten) = match psych_mcp::wire::off_worker_if(large, patch).await {
            Ok(patched) => patched,
            // The blocking task did not finish (the runtime is ending): nothing to send.
            Err(_) => (hyper::body::Bytes::new(), true),
        };
        if rewritten {
            parts.headers.remove(hyper::header::CONTENT_LENGTH);
        }
        return hyper::Response::from_parts(parts, http_body_util::Full::new(body).boxed());
    }
    if kind.starts_with("text/event-stream") {
        // Patched event by event at the byte level: every other line of the stream (ids,
        // retry hints, rmcp's keep-alive comments) passes as it was written, when written.
        // The stream is rmcp's own, so its events end with `\n\n` (sse-stream's framing),
        // never `\r\n`.
        // `scanned`: how much of `pending` is known to hold no event end, so that an event
        // arriving in many chunks is searched once, not once per chunk.
        let chunks = futures_util::stream::unfold(
            (body.into_data_stream(), Vec::new(), false, 0usize),
            move |(mut data, mut pending, mut ended, mut scanned)| {
                let raw = Arc::clone(&raw);
                async move {
                    loop {
                        let from = scanned.saturating_sub(1);
                        if let Some(at) = memchr::memmem::find(&pending[from..], b"\n\n") {
                            let rest = pending.split_off(from + at + 2);
                            let event = std::mem::replace(&mut pending, rest);
                            let out = patch_event(&raw, event).await;
                            return Some((
                                Ok(hyper::body::Frame::data(out)),
                                (data, pending, ended, 0),
                            ));
                        }
                        scanned = pending.len();
                        if ended {
                            if pending.is_empty() {
                                return None;
                            }
                            // A last event without its blank line, patched all the same.
                            let out = patch_event(&raw, std::mem::take(&mut pending)).await;
                            return Some((
                                Ok(hyper::body::Frame::data(out)),
                                (data, pending, ended, 0),
                            ));
                        }
                        match data.next().await {
                            Some(Ok(chunk)) => pending.extend_from_slice(&chunk),
                            Some(Err(never)) => match never {},
                            None => ended = true,
                        }
                    }
                }
            },
        );
        return hyper::Response::from_parts(
            parts,
            BodyExt::boxed(http_body_util::StreamBody::new(chunks)),
        );
    }
    hyper::Response::from_parts(parts, body)
}

/// [`patched_event`], on a blocking thread for an event over
/// [`JSON_ON_WORKER`](psych_mcp::wire::JSON_ON_WORKER) bytes (a result page of up to
/// 16 MiB): its scan, parse and patch cost about its size. An event whose blocking task
/// does not finish (the runtime ending) is sent as nothing.
async fn patch_event(raw: &Arc<RawAnswers>, event: Vec<u8>) -> hyper::body::Bytes {
    if event.len() <= psych_mcp::wire::JSON_ON_WORKER {
        return patched_event(raw, event);
    }
    let raw = Arc::clone(raw);
    tokio::task::spawn_blocking(move || patched_event(&raw, event))
        .await
        .unwrap_or_default()
}

/// One server-sent event (its lines and the blank line ending it), with the raw answer in
/// place of its placeholder when its data is one.
fn patched_event(raw: &RawAnswers, event: Vec<u8>) -> hyper::body::Bytes {
    // Most events (progress, notifications, keep-alives) carry no placeholder: not parsed.
    if memchr::memmem::find(&event, RAW_KEY.as_bytes()).is_none() {
        return event.into();
    }
    let Ok(text) = std::str::from_utf8(&event) else {
        return event.into();
    };
    let data: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|value| value.strip_prefix(' ').unwrap_or(value))
        .collect();
    if data.is_empty() {
        return event.into();
    }
    let Ok(mut message) = serde_json::from_str::<Value>(&data.join("\n")) else {
        return event.into();
    };
    if !raw.swap_json(&mut message) {
        return event.into();
    }
    let mut out = String::with_capacity(text.len());
    let mut written = false;
    for line in text.lines() {
        if line.starts_with("data:") {
            if !written {
                out.push_str("data: ");
                out.push_str(&message.to_string());
                out.push('\n');
                written = true;
            }
        } else if !line.is_empty() {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push('\n');
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolResult, ContentBlock, JsonRpcResponse, NumberOrString};
    use serde_json::json;

    fn response(result: ServerResult) -> ServerJsonRpcMessage {
        JsonRpcMessage::Response(JsonRpcResponse {
            jsonrpc: Default::default(),
            id: NumberOrString::Number(7),
            result,
        })
    }

    /// A request's `has_session` and the reaper's last look are each one step under one
    /// lock: a request that comes first keeps its idle session (the reaper then finds it
    /// active), and a session the reaper has taken is gone to the next request (404),
    /// never closed under one that was let in.
    #[tokio::test]
    async fn a_request_and_the_reaper_never_both_win() {
        let sessions = RawSessions::new(
            Arc::default(),
            std::time::Duration::from_millis(20),
            Arc::default(),
        );
        let (first, _first) = sessions.create_session().await.unwrap();
        let (second, _second) = sessions.create_session().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let now = std::time::Instant::now();
        assert_eq!(sessions.idle(now).len(), 2, "both idle past the limit");
        // A request for the first arrives before the reaper's last look: kept.
        assert!(sessions.has_session(&first).await.unwrap());
        assert!(!sessions.reap(&first, now));
        assert!(sessions.has_session(&first).await.unwrap());
        // The second is taken first: the request finds it gone.
        assert!(sessions.reap(&second, now));
        assert!(!sessions.has_session(&second).await.unwrap());
        assert!(!sessions.reap(&second, now), "taken once");
    }

    #[test]
    fn a_marked_placeholder_is_sent_as_its_raw_answer_once() {
        let raw = RawAnswers::default();
        let answer = json!({"content": [{"type": "widget", "x": 1}], "extra": true});
        let mut placeholder = CallToolResult::success(vec![ContentBlock::text("typed")]);
        // As rmcp sends it to a client of a revision before 2026-07-28: no resultType.
        placeholder.result_type = None;
        raw.stash(answer.clone(), &mut placeholder.meta);
        let mut message = response(ServerResult::CallToolResult(placeholder.clone()));
        raw.swap(&mut message);
        assert_eq!(
            serde_json::to_value(&message).unwrap()["result"],
            answer,
            "the raw answer, byte for byte"
        );
        // Taken once: the same placeholder again goes out typed.
        let mut again = response(ServerResult::CallToolResult(placeholder));
        raw.swap(&mut again);
        assert!(matches!(
            again,
            JsonRpcMessage::Response(JsonRpcResponse {
                result: ServerResult::CallToolResult(_),
                ..
            })
        ));
        // An unmarked result is left alone.
        let plain = CallToolResult::success(vec![ContentBlock::text("plain")]);
        let mut message = response(ServerResult::CallToolResult(plain.clone()));
        raw.swap(&mut message);
        assert_eq!(
            serde_json::to_value(&message).unwrap(),
            serde_json::to_value(response(ServerResult::CallToolResult(plain))).unwrap()
        );
    }

    #[test]
    fn the_raw_answer_takes_the_protocol_fields_it_lacks() {
        let raw = RawAnswers::default();
        let placeholder = |raw: &RawAnswers, answer: Value| {
            let mut typed = CallToolResult::success(vec![ContentBlock::text("typed")]);
            raw.stash(answer, &mut typed.meta);
            let mut message = response(ServerResult::CallToolResult(typed));
            raw.swap(&mut message);
            serde_json::to_value(&message).unwrap()["result"].clone()
        };
        let got = placeholder(&raw, json!({"content": [], "extra": 1}));
        assert_eq!(
            got,
            json!({"content": [], "extra": 1, "resultType": "complete"})
        );
        let got = placeholder(&raw, json!({"resultType": "input_required"}));
        assert_eq!(
            got,
            json!({"resultType": "input_required"}),
            "the raw answer's own wins"
        );
    }

    /// A client of a revision before 2026-07-28 takes only objects as a tool's output
    /// schema and a result's structured content: the raw answer is shaped as rmcp shapes
    /// the placeholder for it (before, the swap put both back, and the TypeScript SDK
    /// refused the whole listing); a client of 2026-07-28 gets them as they are.
    #[test]
    fn a_legacy_client_gets_the_raw_answer_in_its_revisions_shape() {
        let raw = RawAnswers::default();
        let sent = |raw: &RawAnswers, answer: Value, legacy: bool, listing: bool| {
            let mut message = if listing {
                let mut typed = rmcp::model::ListToolsResult {
                    result_type: (!legacy).then_some(rmcp::model::ResultType::COMPLETE),
                    ..Default::default()
                };
                raw.stash(answer, &mut typed.meta);
                response(ServerResult::ListToolsResult(typed))
            } else {
                let mut typed = CallToolResult::success(vec![ContentBlock::text("typed")]);
                if legacy {
                    typed.result_type = None;
                }
                raw.stash(answer, &mut typed.meta);
                response(ServerResult::CallToolResult(typed))
            };
            raw.swap(&mut message);
            serde_json::to_value(&message).unwrap()["result"].clone()
        };
        let listing = json!({"tools": [
            {"name": "rows", "inputSchema": {"type": "object"},
             "outputSchema": {"type": "array", "items": {"type": "string"}}},
            {"name": "one", "inputSchema": {"type": "object"},
             "outputSchema": {"type": "object"}},
        ]});
        let got = sent(&raw, listing.clone(), true, true);
        assert_eq!(got["tools"][0].get("outputSchema"), None);
        assert_eq!(got["tools"][1]["outputSchema"], json!({"type": "object"}));
        let got = sent(&raw, listing.clone(), false, true);
        assert_eq!(got["tools"], listing["tools"]);

        let result = json!({"content": [{"type": "text", "text": "two rows"}],
                            "structuredContent": [1, 2]});
        let got = sent(&raw, result.clone(), true, false);
        assert_eq!(got.get("structuredContent"), None);
        assert_eq!(
            got["content"],
            json!([{"type": "text", "text": "[1,2]"}, {"type": "text", "text": "two rows"}])
        );
        // Already the first block's text: not given twice.
        let said = json!({"content": [{"type": "text", "text": "[1, 2]"}],
                          "structuredContent": [1, 2]});
        let got = sent(&raw, said, true, false);
        assert_eq!(got["content"], json!([{"type": "text", "text": "[1, 2]"}]));
        let got = sent(&raw, result.clone(), false, false);
        assert_eq!(got["structuredContent"], json!([1, 2]));
        // An object is every revision's.
        let object = json!({"content": [], "structuredContent": {"n": 2}});
        assert_eq!(sent(&raw, object.clone(), true, false), object);
        // `null` is none: dropped, not said as a text.
        let null = json!({"content": [], "structuredContent": null});
        assert_eq!(sent(&raw, null, true, false), json!({"content": []}));
    }

    #[test]
    fn an_input_required_placeholder_is_sent_as_the_upstreams_answer() {
        let raw = RawAnswers::default();
        // The upstream's inputRequests as it sent them (a field rmcp does not model too),
        // with the gateway's state.
        let answer = json!({
            "resultType": "input_required",
            "inputRequests": {"confirm": {"method": "elicitation/create", "params": {
                "mode": "form", "message": "Sure?", "requestedSchema": {"type": "object"},
                "x-vendor": 1}}},
            "requestState": "psy1.00.11",
        });
        let mut typed = rmcp::model::InputRequiredResult::from_request_state("psy1.00.11");
        raw.stash(answer.clone(), &mut typed.meta);
        let mut message = response(ServerResult::InputRequiredResult(typed));
        raw.swap(&mut message);
        assert_eq!(serde_json::to_value(&message).unwrap()["result"], answer);
    }

    #[test]
    fn an_event_stream_is_patched_event_by_event_and_the_rest_kept() {
        let raw = RawAnswers::default();
        let mut meta = None;
        raw.stash(json!({"content": [{"type": "widget"}]}), &mut meta);
        let key = meta.unwrap().0[RAW_KEY].clone();
        let placeholder =
            json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [], "_meta": {RAW_KEY: key}}});
        let event = format!("id: 0\nevent: message\ndata: {placeholder}\n\n");
        let out = patched_event(&raw, event.into_bytes());
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "id: 0\nevent: message\ndata: {\"id\":1,\"jsonrpc\":\"2.0\",\"result\":{\"content\":[{\"type\":\"widget\"}]}}\n\n"
        );
        for other in [
            ":\n\n",
            "data: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n\n",
            "retry: 5\n\n",
        ] {
            assert_eq!(
                &patched_event(&raw, other.as_bytes().to_vec())[..],
                other.as_bytes()
            );
        }
    }

    #[test]
    fn waiting_answers_are_bounded_oldest_first() {
        let raw = RawAnswers::default();
        let mut first = None;
        raw.stash(json!(0), &mut first);
        for n in 1..=MAX_WAITING {
            raw.stash(json!(n), &mut None);
        }
        let waiting = raw.waiting.lock().unwrap();
        assert_eq!(waiting.len(), MAX_WAITING);
        assert!(!waiting.contains_key(&0), "the oldest was forgotten");
    }

    #[test]
    fn an_upstream_meta_naming_a_raw_key_takes_no_answer_and_is_not_sent() {
        // Another client's answer waits under key 0 (and its secret).
        let raw = RawAnswers::default();
        let mut theirs = None;
        raw.stash(
            json!({"content": [{"type": "text", "text": "secret"}]}),
            &mut theirs,
        );
        let their_key = theirs.unwrap().0[RAW_KEY].clone();
        // An upstream's result naming keys of its own: every guess of the old numbering,
        // and the key itself under another gateway's secret.
        for guess in [json!(0), json!("0"), json!(format!("{}-0", "0".repeat(32)))] {
            let mut ours = None;
            raw.stash(
                json!({"content": [], "_meta": {RAW_KEY: guess, "x": 1}}),
                &mut ours,
            );
            let placeholder = json!({"jsonrpc": "2.0", "id": 2, "result": {
                "content": [], "_meta": ours.unwrap().0}});
            let event = format!("data: {placeholder}\n\n");
            let out = String::from_utf8(patched_event(&raw, event.into_bytes()).to_vec()).unwrap();
            assert_eq!(
                out,
                "data: {\"id\":2,\"jsonrpc\":\"2.0\",\"result\":{\"_meta\":{\"x\":1},\"content\":[]}}\n\n",
                "{guess}"
            );
            // What goes out names no key; sent again, it takes nothing.
            assert_eq!(
                &patched_event(&raw, out.clone().into_bytes())[..],
                out.as_bytes()
            );
        }
        let waiting = raw.waiting.lock().unwrap();
        assert_eq!(waiting.len(), 1, "the other client's answer still waits");
        drop(waiting);
        let mut message = json!({"jsonrpc": "2.0", "id": 1, "result": {
            "content": [], "_meta": {RAW_KEY: their_key}}});
        assert!(raw.swap_json(&mut message));
        assert_eq!(message["result"]["content"][0]["text"], "secret");
    }
}
