//! What the manager tells its owner: a server's tools may have changed, a server's
//! reachability changed. The catalogue's freshener consumes these.
//!
//! Every [`McpManager::events`](crate::McpManager::events) call is a subscriber of its own
//! with its own coalescing queue; the rules and the bound are on [`McpEvents`]. The manager
//! holds its subscribers weakly and forgets each one when it finds it dropped.

use std::collections::VecDeque;
use std::mem::discriminant;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use psych_types::{Reachability, ServerId};
use tokio::sync::Notify;

/// The most events one subscriber's queue holds for one server: one `ToolsChanged` and two
/// reachabilities (see [`McpEvents`]).
pub const MAX_QUEUED_PER_SERVER: usize = 3;

/// The most reachabilities one subscriber's queue holds for one server.
const MAX_REACHABILITIES_PER_SERVER: usize = 2;

/// Why a server's tools may have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChangeCause {
    /// The server (re)connected and was listed: any earlier listing may be stale, and a
    /// `list_changed` it sent before its initialize response was dropped by rmcp.
    Connected,
    /// The server sent `notifications/tools/list_changed` (for a server of MCP 2026-07-28,
    /// on its `subscriptions/listen` stream).
    Notified,
    /// The `subscriptions/listen` stream of a server of MCP 2026-07-28 ended and was opened
    /// again: a `list_changed` sent while it was down was lost, so list again.
    Resubscribed,
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

impl McpEvent {
    #[cfg(test)]
    fn server(&self) -> &ServerId {
        match self {
            Self::ToolsChanged { server, .. } | Self::Reachability { server, .. } => server,
        }
    }
}

/// The manager's side of its events: hands each pushed event to every live subscriber.
#[derive(Default)]
pub(crate) struct EventQueue {
    subscribers: Mutex<Vec<Weak<Subscriber>>>,
}

impl EventQueue {
    /// Queues `event` for every subscriber alive now, forgetting those dropped.
    pub(crate) fn push(&self, event: McpEvent) {
        let mut subscribers = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        subscribers.retain(|subscriber| match subscriber.upgrade() {
            Some(subscriber) => {
                subscriber.push(event.clone());
                true
            }
            None => false,
        });
    }

    /// A new subscriber, seeing every event pushed from now on.
    pub(crate) fn subscribe(&self) -> McpEvents {
        let subscriber = Arc::new(Subscriber::default());
        let mut subscribers = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Pruned here too, so subscribing again and again with no event in between does
        // not grow the list.
        subscribers.retain(|s| s.strong_count() > 0);
        subscribers.push(Arc::downgrade(&subscriber));
        McpEvents { subscriber }
    }

    #[cfg(test)]
    fn subscribers(&self) -> usize {
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// One subscriber's coalescing queue.
#[derive(Default)]
struct Subscriber {
    queue: Mutex<VecDeque<McpEvent>>,
    ready: Notify,
}

impl Subscriber {
    fn push(&self, event: McpEvent) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        coalesce(&mut queue, event);
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

/// Queues `event` behind the others, coalescing it with those of its server (the rules are
/// on [`McpEvents`]).
fn coalesce(queue: &mut VecDeque<McpEvent>, event: McpEvent) {
    match event {
        McpEvent::ToolsChanged { server, cause } => {
            let waiting = queue.iter().position(
                |e| matches!(e, McpEvent::ToolsChanged { server: s, .. } if *s == server),
            );
            let cause = match waiting.and_then(|at| queue.remove(at)) {
                Some(McpEvent::ToolsChanged {
                    cause: ChangeCause::Connected,
                    ..
                }) => ChangeCause::Connected,
                _ => cause,
            };
            queue.push_back(McpEvent::ToolsChanged { server, cause });
        }
        McpEvent::Reachability {
            server,
            reachability,
        } => {
            let mine = |e: &McpEvent| reachability_of(e, &server).is_some();
            let last = queue.iter().rposition(mine);
            if let Some(at) = last
                && queue
                    .get(at)
                    .and_then(|e| reachability_of(e, &server))
                    .is_some_and(|waiting| discriminant(waiting) == discriminant(&reachability))
            {
                queue.remove(at);
            }
            if queue.iter().filter(|e| mine(e)).count() >= MAX_REACHABILITIES_PER_SERVER
                && let Some(oldest) = queue.iter().position(mine)
            {
                queue.remove(oldest);
            }
            queue.push_back(McpEvent::Reachability {
                server,
                reachability,
            });
        }
    }
}

/// The reachability `event` reports for `server`, if it is one.
fn reachability_of<'a>(event: &'a McpEvent, server: &ServerId) -> Option<&'a Reachability> {
    match event {
        McpEvent::Reachability {
            server: s,
            reachability,
        } if s == server => Some(reachability),
        McpEvent::Reachability { .. } | McpEvent::ToolsChanged { .. } => None,
    }
}

/// One subscriber to a manager's events, from
/// [`McpManager::events`](crate::McpManager::events): it sees every event pushed from its
/// subscription on, whatever other subscribers read (a subscriber that only logs takes
/// nothing from the catalogue's). Dropping it unsubscribes.
///
/// Its queue coalesces per server, so it holds at most [`MAX_QUEUED_PER_SERVER`] events per
/// server however fast a server sends `notifications/tools/list_changed` or flaps, and
/// however late the subscriber reads; coalescing never loses what a subscriber acts on:
///
/// - at most one `ToolsChanged` per server waits: a newer one replaces it at the back of
///   the queue, with the stronger cause (`Connected` over `Notified`), since the listing it
///   asks for happens when it is read, after both;
/// - at most two reachabilities per server wait, of different kinds: a newer one of the
///   same kind as the last waiting replaces it (its reason is the current one), one of
///   another kind is queued behind it and the oldest beyond two is dropped. So "down then
///   up again" reads as down, then up, however late the subscriber looks, and the last
///   reachability of a server in the queue is always its reachability now.
pub struct McpEvents {
    subscriber: Arc<Subscriber>,
}

impl McpEvents {
    /// The next event, waiting for one. Cancel-safe: an event is taken from the queue only
    /// when it is returned.
    pub async fn next(&self) -> McpEvent {
        loop {
            let notified = self.subscriber.ready.notified();
            if let Some(event) = self.subscriber.pop() {
                return event;
            }
            notified.await;
        }
    }

    /// The next event if one is waiting.
    pub fn try_next(&self) -> Option<McpEvent> {
        self.subscriber.pop()
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

    fn server(name: &str) -> ServerId {
        ServerId::new(name).unwrap()
    }

    fn changed(server: &ServerId, cause: ChangeCause) -> McpEvent {
        McpEvent::ToolsChanged {
            server: server.clone(),
            cause,
        }
    }

    fn reach(server: &ServerId, reachability: Reachability) -> McpEvent {
        McpEvent::Reachability {
            server: server.clone(),
            reachability,
        }
    }

    fn down(reason: &str) -> Reachability {
        Reachability::Unreachable {
            reason: reason.into(),
        }
    }

    fn drain(events: &McpEvents) -> Vec<McpEvent> {
        std::iter::from_fn(|| events.try_next()).collect()
    }

    #[test]
    fn a_list_changed_storm_is_one_event_per_server() {
        let hub = EventQueue::default();
        let events = hub.subscribe();
        let (a, b) = (server("a"), server("b"));
        for _ in 0..100 {
            hub.push(changed(&a, ChangeCause::Notified));
        }
        hub.push(changed(&b, ChangeCause::Notified));
        assert_eq!(
            drain(&events),
            [
                changed(&a, ChangeCause::Notified),
                changed(&b, ChangeCause::Notified)
            ]
        );
    }

    /// What the manager pushes for a server that connects, crashes and reconnects, read by
    /// a subscriber only after the reconnect. The queue before this change kept only the
    /// latest reachability and read `[Connected, Reachable]`: the outage was lost.
    #[test]
    fn a_late_reader_still_sees_the_outage() {
        let hub = EventQueue::default();
        let events = hub.subscribe();
        let s = server("s");
        hub.push(reach(&s, Reachability::Reachable));
        hub.push(changed(&s, ChangeCause::Connected));
        hub.push(reach(&s, down("exited with status 70")));
        hub.push(reach(&s, Reachability::Reachable));
        hub.push(changed(&s, ChangeCause::Connected));
        assert_eq!(
            drain(&events),
            [
                reach(&s, down("exited with status 70")),
                reach(&s, Reachability::Reachable),
                changed(&s, ChangeCause::Connected),
            ]
        );
    }

    /// The queue before this change dropped the `Connected` and kept the `Notified`.
    #[test]
    fn connected_upgrades_a_waiting_notified_and_is_never_downgraded() {
        let hub = EventQueue::default();
        let events = hub.subscribe();
        let s = server("s");
        hub.push(changed(&s, ChangeCause::Notified));
        hub.push(changed(&s, ChangeCause::Connected));
        assert_eq!(drain(&events), [changed(&s, ChangeCause::Connected)]);
        hub.push(changed(&s, ChangeCause::Connected));
        hub.push(changed(&s, ChangeCause::Notified));
        assert_eq!(drain(&events), [changed(&s, ChangeCause::Connected)]);
    }

    #[test]
    fn reachabilities_keep_the_last_two_kinds_with_the_latest_reason() {
        let hub = EventQueue::default();
        let events = hub.subscribe();
        let s = server("s");
        hub.push(reach(&s, Reachability::Reachable));
        hub.push(reach(&s, down("first")));
        hub.push(reach(&s, down("second")));
        assert_eq!(
            drain(&events),
            [
                reach(&s, Reachability::Reachable),
                reach(&s, down("second"))
            ]
        );
        // Up, down, up, down: the last two transitions, ending in the state now.
        for reachability in [
            Reachability::Reachable,
            down("a"),
            Reachability::Reachable,
            down("b"),
        ] {
            hub.push(reach(&s, reachability));
        }
        assert_eq!(
            drain(&events),
            [reach(&s, Reachability::Reachable), reach(&s, down("b"))]
        );
    }

    /// A server that flaps and notifies without end, and a subscriber that never reads:
    /// its queue stays at the bound per server.
    #[test]
    fn a_subscriber_that_never_reads_holds_at_most_the_bound_per_server() {
        let hub = EventQueue::default();
        let events = hub.subscribe();
        let servers: Vec<ServerId> = (0..10).map(|i| server(&format!("s{i}"))).collect();
        for round in 0..1_000 {
            for s in &servers {
                hub.push(changed(s, ChangeCause::Notified));
                hub.push(reach(s, down(&format!("round {round}"))));
                hub.push(reach(s, Reachability::Reachable));
                hub.push(changed(s, ChangeCause::Connected));
            }
        }
        let queued = drain(&events);
        assert!(queued.len() <= servers.len() * MAX_QUEUED_PER_SERVER);
        for s in &servers {
            let mine: Vec<_> = queued.iter().filter(|e| e.server() == s).collect();
            assert_eq!(
                mine,
                [
                    &reach(s, down("round 999")),
                    &reach(s, Reachability::Reachable),
                    &changed(s, ChangeCause::Connected),
                ]
            );
        }
    }

    #[test]
    fn every_subscriber_sees_every_event_from_its_subscription_on() {
        let hub = EventQueue::default();
        let s = server("s");
        let early = hub.subscribe();
        hub.push(reach(&s, Reachability::Reachable));
        let late = hub.subscribe();
        hub.push(changed(&s, ChangeCause::Connected));
        assert_eq!(
            drain(&early),
            [
                reach(&s, Reachability::Reachable),
                changed(&s, ChangeCause::Connected)
            ]
        );
        assert_eq!(drain(&late), [changed(&s, ChangeCause::Connected)]);
    }

    #[test]
    fn a_dropped_subscriber_is_forgotten() {
        let hub = EventQueue::default();
        let kept = hub.subscribe();
        for _ in 0..100 {
            drop(hub.subscribe());
        }
        assert_eq!(hub.subscribers(), 2, "pruned at each subscribe");
        let dropped = hub.subscribe();
        drop(dropped);
        hub.push(changed(&server("s"), ChangeCause::Notified));
        assert_eq!(hub.subscribers(), 1, "pruned at each push");
        assert_eq!(drain(&kept).len(), 1);
    }

    #[tokio::test]
    async fn next_waits_for_a_push() {
        let hub = Arc::new(EventQueue::default());
        let events = hub.subscribe();
        let s = server("s");
        let pusher = {
            let hub = Arc::clone(&hub);
            let s = s.clone();
            tokio::spawn(async move { hub.push(changed(&s, ChangeCause::Notified)) })
        };
        assert_eq!(events.next().await, changed(&s, ChangeCause::Notified));
        pusher.await.unwrap();
    }
}
