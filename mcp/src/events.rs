//! What the manager tells its owner: a server's tools may have changed, a server's
//! reachability changed. The catalogue's freshener consumes these.
//!
//! The queue coalesces: a `ToolsChanged` already waiting for a server is not queued twice,
//! and a newer reachability replaces a waiting one, so the queue stays bounded by twice the
//! number of servers however fast a server sends `notifications/tools/list_changed`.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use psych_types::{Reachability, ServerId};
use tokio::sync::Notify;

/// Why a server's tools may have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChangeCause {
    /// The server (re)connected and was listed: any earlier listing may be stale, and a
    /// `list_changed` it sent before its initialize response was dropped by rmcp.
    Connected,
    /// The server sent `notifications/tools/list_changed`.
    Notified,
}

/// One thing the owner of an [`McpManager`](crate::McpManager) may want to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum McpEvent {
    /// List the server again: its tools may have changed.
    ToolsChanged {
        /// The server.
        server: ServerId,
        /// Why.
        cause: ChangeCause,
    },
    /// The server's reachability changed.
    Reachability {
        /// The server.
        server: ServerId,
        /// Its reachability now.
        reachability: Reachability,
    },
}

/// The coalescing queue behind [`McpEvents`].
#[derive(Default)]
pub(crate) struct EventQueue {
    queue: Mutex<VecDeque<McpEvent>>,
    ready: Notify,
}

impl EventQueue {
    pub(crate) fn push(&self, event: McpEvent) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        match &event {
            McpEvent::ToolsChanged { server, .. } => {
                let waiting = queue
                    .iter()
                    .any(|e| matches!(e, McpEvent::ToolsChanged { server: s, .. } if s == server));
                if waiting {
                    return;
                }
            }
            McpEvent::Reachability { server, .. } => {
                queue.retain(
                    |e| !matches!(e, McpEvent::Reachability { server: s, .. } if s == server),
                );
            }
        }
        queue.push_back(event);
        drop(queue);
        self.ready.notify_one();
    }

    fn pop(&self) -> Option<McpEvent> {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
    }
}

/// The receiving end of a manager's events, from
/// [`McpManager::events`](crate::McpManager::events).
pub struct McpEvents {
    pub(crate) queue: std::sync::Arc<EventQueue>,
}

impl McpEvents {
    /// The next event, waiting for one.
    pub async fn next(&self) -> McpEvent {
        loop {
            let notified = self.queue.ready.notified();
            if let Some(event) = self.queue.pop() {
                return event;
            }
            notified.await;
        }
    }

    /// The next event if one is waiting.
    pub fn try_next(&self) -> Option<McpEvent> {
        self.queue.pop()
    }
}

impl std::fmt::Debug for McpEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpEvents").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_coalesces_per_server() {
        let queue = EventQueue::default();
        let a = ServerId::new("a").unwrap();
        let b = ServerId::new("b").unwrap();
        let changed = |server: &ServerId| McpEvent::ToolsChanged {
            server: server.clone(),
            cause: ChangeCause::Notified,
        };
        for _ in 0..100 {
            queue.push(changed(&a));
        }
        queue.push(changed(&b));
        queue.push(McpEvent::Reachability {
            server: a.clone(),
            reachability: Reachability::Reachable,
        });
        queue.push(McpEvent::Reachability {
            server: a.clone(),
            reachability: Reachability::Unreachable { reason: "x".into() },
        });
        let events: Vec<_> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(
            events,
            [
                changed(&a),
                changed(&b),
                McpEvent::Reachability {
                    server: a,
                    reachability: Reachability::Unreachable { reason: "x".into() },
                }
            ]
        );
    }
}
