//! The end of a session's serve loop, as a signal a request's wait can take.
//!
//! rmcp answers each request through a one-shot channel it keeps until the answer comes or
//! its serve task ends, and counts on that task's end to drop the ones still waiting, so
//! that their callers hear [`ServiceError::TransportClosed`]. A request sent while the
//! task is ending can slip past that: its message goes into rmcp's queue as the queue's
//! receiver is dropped, after the receiver took what it held, and stays there (with its
//! answer's sender) for as long as a [`Peer`](rmcp::Peer) of the session lives, which is
//! for as long as the request waits. The request then waited for its whole deadline: a
//! call to a server that had just exited timed out after 20 s instead of failing (a test
//! that calls a lazy server as it exits, at 40 rounds a run with two runs of the whole
//! psych-tests binary beside it: 4 runs in 48 failed so; none with this module).
//!
//! rmcp's loop ends at once when the transport's receive says the server's output has
//! ended (the usual end: the server exited or closed the connection), and it reads
//! nothing more; it closes its transport once the loop has ended (and once it has sent
//! the answers to the server's own requests still going out: up to 5 s, so that a close
//! can wait), and answers nothing of psych's after its loop. So the transport is wrapped
//! in [`Ending`], which says so when its receive ends, when it is closed and when it is
//! dropped, whichever comes first, and [`answered`] waits for a request's answer or that
//! signal, an answer given before the end winning (rmcp hands an answer over in the
//! loop's turn that read it, before it asks for the next message).

use std::future::Future;
use std::task::Poll;

use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, ServiceError, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::sync::watch;

/// A transport that says when its receive ends (the server's output ended: rmcp's loop
/// ends with it), when rmcp begins to close it, or drops it (its serve task ended however
/// it ended, a panic included). Its sends and receives are `T`'s, and as cancel-safe.
pub(crate) struct Ending<T> {
    inner: T,
    /// True once the receive has ended or the transport is closed; dropped with the
    /// transport.
    ended: watch::Sender<bool>,
}

/// Whether the serve loop of a transport made by [`Ending::new`] has ended: its receive
/// ended (the loop ends with it), or its close began, or it was dropped. A loop ended by
/// cancellation (psych closing the session) is said only as the close begins, after
/// rmcp's drain of up to 2 s.
#[derive(Debug, Clone)]
pub(crate) struct Ended(watch::Receiver<bool>);

impl<T> Ending<T> {
    /// `inner`, with the receiver of its end.
    pub(crate) fn new(inner: T) -> (Self, Ended) {
        let (ended, receiver) = watch::channel(false);
        (Self { inner, ended }, Ended(receiver))
    }
}

impl Ended {
    /// Whether the end has come now: the receive ended, or the transport is closed or
    /// dropped.
    pub(crate) fn is_ended(&self) -> bool {
        // An error is the sender dropped: the transport is gone.
        *self.0.borrow() || self.0.has_changed().is_err()
    }

    /// Resolves once the receive has ended, or the transport is closed or dropped.
    pub(crate) async fn wait(&mut self) {
        // An error is the sender dropped: the transport is gone.
        let _ = self.0.wait_for(|ended| *ended).await;
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Ending<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        let ended = &self.ended;
        let receive = self.inner.receive();
        async move {
            let message = receive.await;
            // No await after the inner receive: dropped anywhere, this loses nothing.
            if message.is_none() {
                // rmcp leaves its loop now and reads no more: no answer comes after this.
                ended.send_replace(true);
            }
            message
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // Said first: rmcp has left its loop before it closes, so no answer comes now.
        self.ended.send_replace(true);
        self.inner.close().await
    }
}

/// `response` (rmcp's wait for a request's answer), or
/// [`ServiceError::TransportClosed`] once `ended` says the serve loop has ended with the
/// answer not given (see the module docs). Cancel-safe: it holds nothing but the two
/// waits.
pub(crate) async fn answered<R>(
    response: impl Future<Output = Result<R, ServiceError>>,
    mut ended: Ended,
) -> Result<R, ServiceError> {
    let mut response = std::pin::pin!(response);
    tokio::select! {
        biased;
        result = &mut response => result,
        () = ended.wait() => {
            // An answer given before the end is in its channel: one look takes it, a look
            // outside tokio's cooperative budget (which, spent, would make it say pending
            // and lose the answer).
            tokio::task::unconstrained(std::future::poll_fn(|cx| {
                match response.as_mut().poll(cx) {
                    Poll::Ready(result) => Poll::Ready(result),
                    Poll::Pending => Poll::Ready(Err(ServiceError::TransportClosed)),
                }
            }))
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use std::time::Duration;

    use super::*;

    /// A transport whose sends succeed and whose receive gives `messages` in turn, then
    /// says the input ended (`ends`) or waits for good.
    struct Scripted {
        messages: std::collections::VecDeque<RxJsonRpcMessage<RoleClient>>,
        ends: bool,
    }

    /// A transport that never receives and whose sends succeed.
    fn quiet() -> Scripted {
        Scripted {
            messages: std::collections::VecDeque::new(),
            ends: false,
        }
    }

    impl Transport<RoleClient> for Scripted {
        type Error = std::io::Error;

        fn send(
            &mut self,
            _: TxJsonRpcMessage<RoleClient>,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            std::future::ready(Ok(()))
        }

        fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
            let next = self.messages.pop_front();
            let ends = self.ends;
            async move {
                match next {
                    Some(message) => Some(message),
                    None if ends => None,
                    None => std::future::pending().await,
                }
            }
        }

        async fn close(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    /// The end is seen at once, without waiting: false while the transport is open, true
    /// once it is closed, and once it is dropped.
    #[tokio::test]
    async fn the_end_is_seen_when_closed_and_when_dropped() {
        let (mut transport, ended) = Ending::new(quiet());
        assert!(!ended.is_ended());
        transport.close().await.unwrap();
        assert!(ended.is_ended());
        let (transport, ended) = Ending::new(quiet());
        let seen = ended.clone();
        drop(transport);
        assert!(ended.is_ended() && seen.is_ended());
    }

    /// The end of the server's output is the end: a receive that says so sets it at once
    /// (rmcp's close may come much later), a receive that brings a message does not, and
    /// a wait whose answer cannot come ends with it.
    #[tokio::test]
    async fn the_end_of_the_input_is_the_end() {
        let ping: RxJsonRpcMessage<RoleClient> = serde_json::from_value(serde_json::json!(
            {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        ))
        .unwrap();
        let (mut transport, ended) = Ending::new(Scripted {
            messages: [ping].into(),
            ends: true,
        });
        let (_kept, never) = tokio::sync::oneshot::channel::<()>();
        let wait = tokio::spawn(answered(
            async { never.await.map_err(|_| ServiceError::TransportClosed) },
            ended.clone(),
        ));
        assert!(transport.receive().await.is_some());
        assert!(!ended.is_ended(), "a message is not the end");
        assert!(transport.receive().await.is_none());
        assert!(ended.is_ended(), "the input's end is");
        let result = tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .expect("the wait ended with the input")
            .unwrap();
        assert!(
            matches!(result, Err(ServiceError::TransportClosed)),
            "{result:?}"
        );
        drop(transport);
    }

    /// Through rmcp: a server answers a ping and its output ends right after. The end is
    /// said (the waits here look only once it has been) and the answer is still taken:
    /// rmcp hands an answer over in the loop's turn that read it, before the next receive.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_read_just_before_the_end_is_taken() {
        use rmcp::ServiceExt as _;
        use rmcp::model::{ClientRequest, PingRequest};
        use rmcp::service::PeerRequestOptions;
        use serde_json::{Value, json};
        use tokio::sync::mpsc;

        /// Psych's side of an in-memory server.
        struct Piped {
            to_server: mpsc::UnboundedSender<Value>,
            from_server: mpsc::UnboundedReceiver<RxJsonRpcMessage<RoleClient>>,
        }

        impl Transport<RoleClient> for Piped {
            type Error = std::io::Error;

            fn send(
                &mut self,
                item: TxJsonRpcMessage<RoleClient>,
            ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
                let _ = self.to_server.send(serde_json::to_value(&item).unwrap());
                std::future::ready(Ok(()))
            }

            fn receive(
                &mut self,
            ) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
                self.from_server.recv()
            }

            async fn close(&mut self) -> Result<(), Self::Error> {
                Ok(())
            }
        }

        for _ in 0..50 {
            let (to_server, mut requests) = mpsc::unbounded_channel::<Value>();
            let (answers, from_server) = mpsc::unbounded_channel();
            // Answers `initialize` (and refuses `server/discover`, so that a client trying
            // 2026-07-28 first falls back), then answers the ping and ends its output.
            tokio::spawn(async move {
                while let Some(message) = requests.recv().await {
                    let Some(id) = message.get("id").cloned() else {
                        continue;
                    };
                    let method = message["method"].as_str().unwrap_or_default().to_owned();
                    let reply = match method.as_str() {
                        "initialize" => json!({"jsonrpc": "2.0", "id": id, "result": {
                            "protocolVersion": "2025-11-25",
                            "capabilities": {},
                            "serverInfo": {"name": "brief", "version": "1"},
                        }}),
                        "ping" => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
                        _ => json!({"jsonrpc": "2.0", "id": id, "error": {
                            "code": -32601, "message": "Method not found",
                        }}),
                    };
                    answers
                        .send(serde_json::from_value(reply).unwrap())
                        .unwrap();
                    if method == "ping" {
                        return;
                    }
                }
            });
            let (transport, ended) = Ending::new(Piped {
                to_server,
                from_server,
            });
            let client = ().serve(transport).await.unwrap();
            let ping = ClientRequest::PingRequest(PingRequest::default());
            let handle = client
                .peer()
                .send_request_with_option(
                    ping,
                    PeerRequestOptions::with_timeout(Duration::from_secs(10)),
                )
                .await
                .unwrap();
            let mut end = ended.clone();
            tokio::time::timeout(Duration::from_secs(10), end.wait())
                .await
                .expect("the end is said");
            let answer = answered(handle.await_response(), ended).await;
            assert!(answer.is_ok(), "{answer:?}");
        }
    }

    /// A wait whose answer will never come (its sender kept, as rmcp's queue keeps one it
    /// took too late) ends when the transport is closed, and when it is dropped.
    #[tokio::test]
    async fn an_answer_that_cannot_come_fails_once_the_transport_ends() {
        for by_drop in [false, true] {
            let (mut transport, ended) = Ending::new(quiet());
            let (_kept, never) = tokio::sync::oneshot::channel::<()>();
            let wait = tokio::spawn(answered(
                async { never.await.map_err(|_| ServiceError::TransportClosed) },
                ended,
            ));
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(
                !wait.is_finished(),
                "it waited while the transport was open"
            );
            if by_drop {
                drop(transport);
            } else {
                transport.close().await.unwrap();
            }
            let result = tokio::time::timeout(Duration::from_secs(5), wait)
                .await
                .expect("the wait ended with the transport")
                .unwrap();
            assert!(
                matches!(result, Err(ServiceError::TransportClosed)),
                "{result:?}"
            );
        }
    }

    /// An answer that comes as the end is seen is taken, not lost to the end's signal: the
    /// wait's first look finds none, the end is signalled, the second look finds it.
    #[tokio::test]
    async fn an_answer_given_before_the_end_wins() {
        let (mut transport, ended) = Ending::new(quiet());
        transport.close().await.unwrap();
        let mut looks = 0;
        let response = std::future::poll_fn(|cx| {
            looks += 1;
            if looks == 1 {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(Ok::<_, ServiceError>(7))
            }
        });
        assert_eq!(answered(response, ended).await.unwrap(), 7);
        assert_eq!(looks, 2);
    }

    /// An answer that comes as the end is seen is taken whatever is left of the task's
    /// cooperative budget (spent, tokio's channels say pending): from none spent to more
    /// than a task gets.
    #[tokio::test]
    async fn an_answer_is_taken_whatever_budget_is_left() {
        for spent in 0..=130 {
            let taken = tokio::spawn(async move {
                let (mut transport, ended) = Ending::new(quiet());
                transport.close().await.unwrap();
                let (answer, mut rx) = tokio::sync::oneshot::channel();
                let mut answer = Some(answer);
                for _ in 0..spent {
                    tokio::task::coop::consume_budget().await;
                }
                // The first look finds nothing (the answer is given then), the next takes
                // it.
                let response = std::future::poll_fn(move |cx| {
                    if let Some(answer) = answer.take() {
                        answer.send(7).unwrap();
                        return Poll::Pending;
                    }
                    std::pin::Pin::new(&mut rx)
                        .poll(cx)
                        .map(|answer| answer.map_err(|_| ServiceError::TransportClosed))
                });
                answered(response, ended).await
            });
            let taken = taken.await.unwrap();
            assert_eq!(taken.unwrap(), 7, "with {spent} units of budget spent");
        }
    }
}
