//! Progress from the client forwarded to the upstream call, and back.
//!
//! A client asks for progress by putting a `progressToken` in a call's `_meta`. The session
//! hands the executor a [`ProgressSink`] with the call ([`Executor::execute_with_progress`]
//! carries it to the forwarded call, if the call is forwarded); psych-mcp's manager makes
//! that call with its own progress token ([`ToolHost::call_tool_with_progress`]) and hands
//! each upstream `notifications/progress` to the sink, whose [`Relay`] sends it to the
//! client under the client's token. The sink belongs to one call, so two identical calls in
//! flight never exchange their progress. A call's reports wait for the relay in a queue of at
//! most [`MAX_QUEUED`], the oldest dropped first, each message cut to
//! [`MAX_PROGRESS_MESSAGE_BYTES`](psych_types::MAX_PROGRESS_MESSAGE_BYTES):
//! the relay goes at the client's pace, a server may report at its own.
//!
//! The sink is dropped when its call leaves the host (the executor's contract), which
//! ends the relay's queue: the relay has sent every report before the call's result is
//! returned, and [`SinkWatch::left_host`] tells the session whether the call is still
//! upstream. Once a stdio client's input has ended, rmcp sends no more notifications (a
//! send would wait for its loop to end, past the 5 s it gives the calls in flight to
//! answer): the relay drops the reports left rather than hold the call's answer.
//!
//! [`Executor::execute_with_progress`]: psych_runtime::Executor::execute_with_progress
//! [`ToolHost::call_tool_with_progress`]: psych_types::ToolHost::call_tool_with_progress

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use psych_types::{ProgressSink, ToolProgress};
use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::Peer;
use tokio::sync::Notify;

/// The most reports of one call waiting for its relay. The relay sends at the client's
/// pace (a client that reads slowly holds each send), while a server may report as fast as
/// it writes lines: past this, the oldest waiting report is dropped, since a later one says
/// more (progress only grows), so a call's queue is bounded whatever the server sends.
pub(super) const MAX_QUEUED: usize = 64;

/// Where one client call's progress goes: its session's peer and the client's token.
pub(super) struct ClientProgress {
    /// The client.
    pub(super) peer: Peer<RoleServer>,
    /// The token the client sent with the call.
    pub(super) token: ProgressToken,
    /// Whether the client's input has ended (stdio; never for HTTP): from then on rmcp
    /// sends no notification, and a send waits until its loop ends.
    pub(super) input_ended: tokio::sync::watch::Receiver<bool>,
    /// Resolves when the client cancels the call (its request's cancellation): from then on
    /// nothing more is sent, so a send the client's unread output holds up does not hold
    /// the call's handler, whose place the cancellation has given back.
    pub(super) cancelled: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// One call's reports waiting for the relay, and whether its sink is gone.
#[derive(Default)]
struct Queue {
    notes: VecDeque<ToolProgress>,
    closed: bool,
}

/// What a sink and its relay share.
#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Told of each report and of the sink's end (the relay is the only waiter).
    ready: Notify,
}

impl Shared {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Held by the sink: its drop ends the relay once the queue is sent.
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.queue().closed = true;
        self.0.ready.notify_one();
    }
}

/// The receiving end of one call's [`ProgressSink`]: sends its reports to the client.
pub(super) struct Relay {
    shared: Arc<Shared>,
    client: Option<ClientProgress>,
}

/// Tells whether one call's [`ProgressSink`] still exists.
pub(super) struct SinkWatch(Arc<Shared>);

impl SinkWatch {
    /// Whether the call's sink is gone: the executor dropped it, so the call is not
    /// upstream (any more), and what remains of its execution is logging its result.
    pub(super) fn left_host(&self) -> bool {
        self.0.queue().closed
    }
}

/// A sink for one call, its relay to `client` (with no client the reports are dropped) and
/// a watch on the sink. At most [`MAX_QUEUED`] reports wait for the relay, each message at
/// most [`MAX_PROGRESS_MESSAGE_BYTES`](psych_types::MAX_PROGRESS_MESSAGE_BYTES) (a host's
/// reports are cut already when made with [`ToolProgress::with_message`]; cut again here
/// for any other).
pub(super) fn sink(client: Option<ClientProgress>) -> (ProgressSink, Relay, SinkWatch) {
    let shared = Arc::new(Shared::default());
    let open = Open(Arc::clone(&shared));
    let sink = ProgressSink::new(move |mut progress| {
        let shared = &open.0;
        progress.cut_message();
        let mut queue = shared.queue();
        if queue.notes.len() == MAX_QUEUED {
            queue.notes.pop_front();
        }
        queue.notes.push_back(progress);
        drop(queue);
        shared.ready.notify_one();
    });
    let relay = Relay {
        shared: Arc::clone(&shared),
        client,
    };
    (sink, relay, SinkWatch(shared))
}

impl Relay {
    /// Sends each report to the client under its token until the sink is dropped and its
    /// queue is empty.
    pub(super) async fn run(mut self) {
        loop {
            let next = {
                let mut queue = self.shared.queue();
                match queue.notes.pop_front() {
                    Some(progress) => Some(progress),
                    None if queue.closed => return,
                    None => None,
                }
            };
            let Some(progress) = next else {
                // A report or the sink's end since the queue was looked at left a permit.
                self.shared.ready.notified().await;
                continue;
            };
            let Some(client) = &mut self.client else {
                continue;
            };
            let mut note = ProgressNotificationParam::new(client.token.clone(), progress.progress);
            note.total = progress.total;
            note.message = progress.message;
            let ended = &mut client.input_ended;
            let sent = tokio::select! {
                sent = client.peer.notify_progress(note) => sent.is_ok(),
                // (A closed channel: the gateway is going, and the send decides.)
                Ok(_) = ended.wait_for(|ended| *ended) => false,
                () = &mut client.cancelled => false,
            };
            if !sent {
                // The client is gone, reads no more notifications or cancelled the call:
                // keep draining, so the call's answer (or its logging) is not held up.
                self.client = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server reporting far faster than the client reads: the waiting reports stay at
    /// most [`MAX_QUEUED`], each message at most 4 KiB (its allocation too), the newest kept;
    /// the relay sends what waits, then ends with the sink.
    #[tokio::test]
    async fn a_flood_of_reports_waits_in_bounded_memory_newest_kept() {
        let (sink, relay, watch) = sink(None);
        let long = "é".repeat(40_000);
        for n in 0..1_000u32 {
            // Set directly, not through `with_message`: the relay cuts what a host did not.
            let mut progress = ToolProgress::new(f64::from(n));
            progress.message = Some(long.clone());
            sink.report(progress);
        }
        {
            let queue = relay.shared.queue();
            assert_eq!(queue.notes.len(), MAX_QUEUED);
            assert!(queue.notes.iter().all(|note| {
                note.message.as_ref().is_some_and(|m| {
                    m.capacity() <= psych_types::MAX_PROGRESS_MESSAGE_BYTES && m.ends_with('…')
                })
            }));
            assert_eq!(queue.notes.back().map(|note| note.progress), Some(999.0));
        }
        assert!(!watch.left_host());
        drop(sink);
        assert!(watch.left_host());
        tokio::time::timeout(std::time::Duration::from_secs(10), relay.run())
            .await
            .expect("the relay ends once the sink is gone and its queue is sent");
    }

    /// A report made while the relay waits wakes it, and one made before it waits is not
    /// missed.
    #[tokio::test]
    async fn the_relay_sends_reports_made_before_and_while_it_waits() {
        let (sink, relay, _watch) = sink(None);
        sink.report(ToolProgress::new(1.0));
        let shared = Arc::clone(&relay.shared);
        let running = tokio::spawn(relay.run());
        tokio::task::yield_now().await;
        sink.report(ToolProgress::new(2.0));
        drop(sink);
        tokio::time::timeout(std::time::Duration::from_secs(10), running)
            .await
            .expect("the relay ends with the sink")
            .unwrap();
        assert!(shared.queue().notes.is_empty());
    }
}
