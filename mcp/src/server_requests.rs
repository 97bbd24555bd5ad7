//! A server's own requests (`ping`, sampling, roots, elicitation) in flight, as psych-mcp's
//! client transports count them: stdio's [`ChildTransport`](crate::stdio) directly, and
//! streamable HTTP through [`Counted`], a wrapper around rmcp's transport.
//!
//! Each request is counted while it is unanswered or its answer is being sent
//! ([`InFlight`], [`MAX_PEER_REQUESTS`]): past the limit, or while one of the same id is
//! unanswered (or its id is a string over
//! [`MAX_REQUEST_ID_BYTES`](crate::MAX_REQUEST_ID_BYTES)), a request is dropped
//! unanswered. So a server that sends requests and never takes their answers (never
//! reads its stdin; over HTTP, accepts the answering POSTs and never responds) makes psych
//! hold at most that many answers, not one per request.
//!
//! While rmcp waits for the answer to `server/discover` or `initialize` it ignores a
//! server's requests (all of them during discover, all but `ping` during initialize: they
//! get no answer): when such an answer comes, the requests still unanswered are forgotten,
//! so none of them holds a place for good. A server's cancellation of its own request
//! frees its place only with a server that completed `initialize` (an earlier revision):
//! rmcp then drops the answer; with one of 2026-07-28 rmcp ignores the cancellation and
//! answers anyway.

use std::future::Future;
use std::sync::Arc;

use rmcp::RoleClient;
use rmcp::model::{ClientRequest, JsonRpcMessage, RequestId, ServerNotification};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

use crate::in_flight::{Answering, InFlight, MAX_PEER_REQUESTS};

/// A server's requests in flight and where psych's handshake stands (see the module
/// docs). Its calls take no lock but the count's, and never await.
#[derive(Debug)]
pub(crate) struct ServerRequests {
    requests: Arc<InFlight>,
    /// The ids of psych's `server/discover` and `initialize` requests not answered yet,
    /// each with whether it is `initialize`.
    handshakes: Vec<(RequestId, bool)>,
    /// Whether the server completed `initialize` (an earlier revision than 2026-07-28).
    legacy: bool,
}

impl Default for ServerRequests {
    fn default() -> Self {
        Self {
            requests: InFlight::new(MAX_PEER_REQUESTS),
            handshakes: Vec::new(),
            legacy: false,
        }
    }
}

impl ServerRequests {
    /// Notes `item`, which psych is about to send: a handshake's request is remembered
    /// until answered; an answer to the server's request is counted until the returned
    /// hold is dropped (move it into the send).
    pub(crate) fn sending(&mut self, item: &TxJsonRpcMessage<RoleClient>) -> Answering {
        if let JsonRpcMessage::Request(request) = item {
            match request.request {
                ClientRequest::InitializeRequest(_) => {
                    self.handshakes.push((request.id.clone(), true));
                }
                ClientRequest::DiscoverRequest(_) => {
                    self.handshakes.push((request.id.clone(), false));
                }
                _ => {}
            }
        }
        self.requests.answering(item)
    }

    /// Whether `message`, which the server wrote, goes on to rmcp: `false` for a request
    /// past the bound (dropped unanswered); a cancellation of the server's request, or the
    /// answer to a handshake step, frees places as the module docs say.
    pub(crate) fn received(&mut self, message: &RxJsonRpcMessage<RoleClient>) -> bool {
        let answered = match message {
            JsonRpcMessage::Request(request) => return self.requests.enter(&request.id).is_ok(),
            JsonRpcMessage::Response(response) => Some((&response.id, true)),
            JsonRpcMessage::Error(error) => error.id.as_ref().map(|id| (id, false)),
            JsonRpcMessage::Notification(notification) => {
                if self.legacy
                    && let ServerNotification::CancelledNotification(cancelled) =
                        &notification.notification
                    && let Some(id) = &cancelled.params.request_id
                {
                    // rmcp drops the answer of a request its server cancelled.
                    self.requests.forget(id);
                }
                None
            }
        };
        if let Some((id, ok)) = answered
            && let Some(at) = self.handshakes.iter().position(|(h, _)| same_id(h, id))
        {
            // rmcp ignored what the server asked while it waited (it ignores requests
            // while any step is awaited). Its handshake goes one step at a time, so the
            // steps before this one were given up; a later one (an `initialize` sent
            // after a `server/discover` timed out, this being its late answer) is still to
            // come and says the revision when it does.
            let initialize = self.handshakes[at].1;
            self.handshakes.drain(..=at);
            self.requests.forget_unanswered();
            if self.handshakes.is_empty() {
                self.legacy = initialize && ok;
            }
        }
        true
    }

    /// How many of the server's requests are in flight.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.requests.len()
    }

    /// How many handshake steps await their answers.
    #[cfg(test)]
    pub(crate) fn handshakes(&self) -> usize {
        self.handshakes.len()
    }

    /// Whether the server completed `initialize`.
    #[cfg(test)]
    pub(crate) fn is_legacy(&self) -> bool {
        self.legacy
    }
}

/// Whether an answer's id `answer` is the request id `request`, as rmcp matches them: a
/// number also matches its decimal string (a server that echoes ids as strings).
pub(crate) fn same_id(request: &RequestId, answer: &RequestId) -> bool {
    match (request, answer) {
        (RequestId::Number(n), RequestId::String(s)) => s.parse::<i64>().ok() == Some(*n),
        _ => request == answer,
    }
}

/// A client transport `T` with its server's requests counted ([`ServerRequests`]): the
/// streamable HTTP transport's, whose answers to them are POSTs that a server may accept
/// and never respond to.
///
/// Cancel-safe as `T` is: `receive` takes a message from `T` and decides on it with no
/// await after, and `send` counts its answer in a hold moved into the send's future.
pub(crate) struct Counted<T> {
    inner: T,
    requests: ServerRequests,
}

impl<T> Counted<T> {
    /// `inner`, counting its server's requests.
    pub(crate) fn new(inner: T) -> Self {
        Self {
            inner,
            requests: ServerRequests::default(),
        }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Counted<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let answering = self.requests.sending(&item);
        answering.during(self.inner.send(item))
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = self.inner.receive().await?;
            // No await from here on: a dropped `receive` loses nothing it took.
            if self.requests.received(&message) {
                return Some(message);
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use rmcp::model::{ClientJsonRpcMessage, ClientResult, ServerJsonRpcMessage};
    use tokio::sync::{Semaphore, mpsc};

    use super::*;

    /// A transport whose server's messages come from a channel and whose sends each wait
    /// for a permit: the server never takes an answer until the test gives one.
    struct Stalled {
        from_server: mpsc::UnboundedReceiver<ServerJsonRpcMessage>,
        taken: Arc<Semaphore>,
    }

    impl Transport<RoleClient> for Stalled {
        type Error = std::io::Error;

        fn send(
            &mut self,
            _item: TxJsonRpcMessage<RoleClient>,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            let taken = Arc::clone(&self.taken);
            async move {
                taken.acquire().await.unwrap().forget();
                Ok(())
            }
        }

        async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
            self.from_server.recv().await
        }

        async fn close(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    fn ping(id: i64) -> ServerJsonRpcMessage {
        serde_json::from_value(serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "ping"}))
            .unwrap()
    }

    fn answer(id: i64) -> ClientJsonRpcMessage {
        ClientJsonRpcMessage::response(ClientResult::empty(()), RequestId::Number(id))
    }

    /// A server (over HTTP, say) sending more requests than [`MAX_PEER_REQUESTS`] while
    /// it takes none of their answers has the first passed and the rest dropped, so at
    /// most that many answers wait; an answer taken lets the next request in.
    #[tokio::test]
    async fn a_server_that_takes_no_answers_has_its_requests_bounded() {
        let (to_client, from_server) = mpsc::unbounded_channel();
        let taken = Arc::new(Semaphore::new(0));
        let mut transport = Counted::new(Stalled {
            from_server,
            taken: Arc::clone(&taken),
        });
        let sent = 100;
        for id in 1..=sent {
            to_client.send(ping(id)).unwrap();
        }
        let last = serde_json::from_value(serde_json::json!({
            "jsonrpc": "2.0", "method": "notifications/tools/list_changed",
        }))
        .unwrap();
        to_client.send(last).unwrap();
        let mut sends = tokio::task::JoinSet::new();
        let mut passed = Vec::new();
        loop {
            match transport.receive().await.unwrap() {
                JsonRpcMessage::Request(request) => {
                    passed.push(request.id.clone());
                    // Answered at once, as rmcp does: the send waits on the server.
                    sends.spawn(transport.send(answer(passed.len() as i64)));
                }
                JsonRpcMessage::Notification(_) => break,
                other => panic!("{other:?}"),
            }
        }
        let expected: Vec<_> = (1..=MAX_PEER_REQUESTS as i64)
            .map(RequestId::Number)
            .collect();
        assert_eq!(passed, expected, "the first pass, the rest are dropped");
        assert_eq!(transport.requests.len(), MAX_PEER_REQUESTS);
        // The server takes one answer: one more request passes.
        taken.add_permits(1);
        sends.join_next().await.unwrap().unwrap().unwrap();
        assert_eq!(transport.requests.len(), MAX_PEER_REQUESTS - 1);
        to_client.send(ping(sent + 1)).unwrap();
        match transport.receive().await.unwrap() {
            JsonRpcMessage::Request(request) => assert_eq!(request.id, RequestId::Number(sent + 1)),
            other => panic!("{other:?}"),
        }
        sends.abort_all();
    }

    #[test]
    fn an_answer_id_matches_as_rmcp_matches_it() {
        let n = RequestId::Number(7);
        assert!(same_id(&n, &RequestId::Number(7)));
        assert!(same_id(&n, &RequestId::String("7".into())));
        assert!(!same_id(&n, &RequestId::String("07x".into())));
        assert!(!same_id(&RequestId::String("7".into()), &n));
    }
}
