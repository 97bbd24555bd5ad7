//! Raw JSON answers over streamable HTTP.
//!
//! rmcp's HTTP server serves only a [`ServerHandler`](rmcp::ServerHandler), whose
//! `tools/list` and `tools/call` answers are rmcp's typed results: a block type rmcp does
//! not model would be refused and an unknown field dropped, where stdio passes the
//! upstream's JSON through as it was sent. So over HTTP the handler answers with a typed
//! placeholder whose `_meta` carries a key into [`RawAnswers`], and the session's transport
//! ([`RawSessions`] wraps rmcp's session manager, [`RawTransport`] its transport) puts the
//! raw JSON in its place on the way out.
//!
//! This covers every client of an HTTP session (the initialize lifecycle: protocol
//! versions up to 2025-11-25). rmcp 3.11 answers a request that negotiates per request
//! (2026-07-28's discover lifecycle) through a one-shot transport of its own, with no
//! session manager and no hook between the handler's typed result and the bytes sent
//! (its event store sees each message only by reference): such a client would get the
//! typed placeholder itself. So the gateway does not serve that lifecycle: the session
//! handler supports the revisions with `initialize` only and answers `server/discover` as
//! not found, and a 2026-07-28 client falls back to `initialize`, getting a session whose
//! transport is wrapped here.

use std::collections::BTreeMap;
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
#[derive(Debug, Default)]
pub(super) struct RawAnswers {
    next: AtomicU64,
    waiting: Mutex<BTreeMap<u64, Value>>,
}

impl RawAnswers {
    /// Keeps `raw` and marks `meta` (a placeholder's `_meta`) with its key.
    pub(super) fn stash(&self, raw: Value, meta: &mut Option<MetaObject>) {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        while waiting.len() >= MAX_WAITING {
            waiting.pop_first();
        }
        waiting.insert(key, raw);
        meta.get_or_insert_default()
            .0
            .insert(RAW_KEY.to_owned(), Value::from(key));
    }

    /// Puts the raw answer in place of `message`'s result when it is a marked placeholder.
    fn swap(&self, message: &mut ServerJsonRpcMessage) {
        let JsonRpcMessage::Response(response) = message else {
            return;
        };
        let meta = match &response.result {
            ServerResult::CallToolResult(result) => result.meta.as_ref(),
            ServerResult::ListToolsResult(result) => result.meta.as_ref(),
            _ => None,
        };
        let Some(key) = meta.and_then(|m| m.0.get(RAW_KEY)).and_then(Value::as_u64) else {
            return;
        };
        let raw = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
        if let Some(raw) = raw {
            response.result = ServerResult::CustomResult(CustomResult(raw));
        }
    }
}

/// rmcp's [`LocalSessionManager`] with each session's transport wrapped in a
/// [`RawTransport`].
#[derive(Debug, Default)]
pub(super) struct RawSessions {
    inner: LocalSessionManager,
    raw: Arc<RawAnswers>,
}

impl RawSessions {
    /// Sessions whose placeholders are answered from `raw`, each closed after `idle`
    /// without a message (rmcp's keep-alive).
    pub(super) fn new(raw: Arc<RawAnswers>, idle: std::time::Duration) -> Self {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = Some(idle);
        Self { inner, raw }
    }
}

/// A session transport that swaps placeholders for their raw answers as they are sent.
pub(super) struct RawTransport<T> {
    inner: T,
    raw: Arc<RawAnswers>,
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
    type Transport = RawTransport<<Local as SessionManager>::Transport>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, inner) = self.inner.create_session().await?;
        let raw = Arc::clone(&self.raw);
        Ok((id, RawTransport { inner, raw }))
    }

    fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<ServerJsonRpcMessage, Self::Error>> + Send {
        self.inner.initialize_session(id, message)
    }

    fn has_session(
        &self,
        id: &SessionId,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        self.inner.has_session(id)
    }

    fn close_session(
        &self,
        id: &SessionId,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
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

    #[test]
    fn a_marked_placeholder_is_sent_as_its_raw_answer_once() {
        let raw = RawAnswers::default();
        let answer = json!({"content": [{"type": "widget", "x": 1}], "extra": true});
        let mut placeholder = CallToolResult::success(vec![ContentBlock::text("typed")]);
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
}
