//! Progress from the client forwarded to the upstream call, and back.
//!
//! A client asks for progress by putting a `progressToken` in a call's `_meta`. The session
//! hands the executor a [`ProgressSink`] with the call ([`Executor::execute_with_progress`]
//! carries it to the forwarded call, if the call is forwarded); psych-mcp's manager makes
//! that call with its own progress token ([`ToolHost::call_tool_with_progress`]) and hands
//! each upstream `notifications/progress` to the sink, whose [`Relay`] sends it to the
//! client under the client's token. The sink belongs to one call, so two identical calls in
//! flight never exchange their progress.
//!
//! The sink is dropped when its call leaves the host (the executor's contract), which
//! closes the relay's channel: the relay has sent every report before the call's result is
//! returned, and [`SinkWatch::left_host`] tells the session whether the call is still
//! upstream.
//!
//! [`Executor::execute_with_progress`]: psych_runtime::Executor::execute_with_progress
//! [`ToolHost::call_tool_with_progress`]: psych_types::ToolHost::call_tool_with_progress

use psych_types::{ProgressSink, ToolProgress};
use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::Peer;
use tokio::sync::mpsc::{self, UnboundedReceiver, WeakUnboundedSender};

/// Where one client call's progress goes: its session's peer and the client's token.
#[derive(Clone)]
pub(super) struct ClientProgress {
    /// The client.
    pub(super) peer: Peer<RoleServer>,
    /// The token the client sent with the call.
    pub(super) token: ProgressToken,
}

/// The receiving end of one call's [`ProgressSink`]: sends its reports to the client.
pub(super) struct Relay {
    notes: UnboundedReceiver<ToolProgress>,
    client: Option<ClientProgress>,
}

/// Tells whether one call's [`ProgressSink`] still exists.
pub(super) struct SinkWatch(WeakUnboundedSender<ToolProgress>);

impl SinkWatch {
    /// Whether the call's sink is gone: the executor dropped it, so the call is not
    /// upstream (any more), and what remains of its execution is logging its result.
    pub(super) fn left_host(&self) -> bool {
        self.0.upgrade().is_none()
    }
}

/// A sink for one call, its relay to `client` (with no client the reports are dropped) and
/// a watch on the sink.
pub(super) fn sink(client: Option<ClientProgress>) -> (ProgressSink, Relay, SinkWatch) {
    let (tx, notes) = mpsc::unbounded_channel();
    let watch = SinkWatch(tx.downgrade());
    let sink = ProgressSink::new(move |progress| {
        // The relay is gone only when the call was abandoned: nothing left to tell.
        let _ = tx.send(progress);
    });
    (sink, Relay { notes, client }, watch)
}

impl Relay {
    /// Sends each report to the client under its token until the sink is dropped.
    pub(super) async fn run(mut self) {
        while let Some(progress) = self.notes.recv().await {
            let Some(client) = &self.client else {
                continue;
            };
            let mut note = ProgressNotificationParam::new(client.token.clone(), progress.progress);
            note.total = progress.total;
            note.message = progress.message;
            if client.peer.notify_progress(note).await.is_err() {
                // The client is gone: keep draining, so the call is not held up.
                self.client = None;
            }
        }
    }
}
