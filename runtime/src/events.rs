//! Catalogue freshness from live connections: psych-mcp's events drive the catalogue's
//! freshener.

use std::sync::Arc;

use psych_catalog::Freshener;
use psych_mcp::{ChangeCause, McpEvent, McpEvents};
use psych_types::ToolLister;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The task that feeds an [`McpManager`](psych_mcp::McpManager)'s events to a
/// [`Freshener`]: a (re)connection is a sync on connect, `notifications/tools/list_changed`
/// a coalesced refresh, a reachability change goes to the catalogue's health (so the guard
/// answers `unreachable: reason` for a server that is down). A `list_changed` that adds a
/// tool is thus on the next turn's Surface, with no restart.
///
/// The task is owned: [`stop`](Self::stop) ends it and waits; dropping it aborts it.
#[derive(Debug)]
pub struct CatalogSync {
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl CatalogSync {
    /// Starts following `events`; call it inside the tokio runtime the freshener runs on.
    pub fn start<L: ToolLister + 'static>(events: McpEvents, freshener: Arc<Freshener<L>>) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    event = events.next() => apply(&freshener, event),
                    _ = stopped.wait_for(|stop| *stop) => break,
                }
            }
        });
        Self {
            stop,
            task: Some(task),
        }
    }

    /// Stops following and waits for the task to end.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for CatalogSync {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// One event, handed to the freshener or the catalogue's health.
fn apply<L: ToolLister + 'static>(freshener: &Freshener<L>, event: McpEvent) {
    match event {
        McpEvent::ToolsChanged {
            server,
            cause: ChangeCause::Connected,
        } => freshener.connect(&server),
        McpEvent::ToolsChanged { server, .. } => freshener.list_changed(&server),
        McpEvent::Reachability {
            server,
            reachability,
        } => freshener.catalog().set_reachability(&server, reachability),
        // An event kind this runtime does not know yet changes nothing.
        _ => {}
    }
}
