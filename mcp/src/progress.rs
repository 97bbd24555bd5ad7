//! Progress of a forwarded `tools/call`. rmcp gives every request a `progressToken` of its
//! own (unique per connection, replacing any the caller set); with
//! [`ToolHost::call_tool_with_progress`](psych_types::ToolHost::call_tool_with_progress)
//! each `notifications/progress` the server sends with that call's token reaches the
//! caller's [`ProgressSink`] as a [`ToolProgress`] until the call ends, so progress of
//! another call (or of a call already abandoned: servers that ignore cancellation keep
//! sending it) never reaches the wrong sink. The route is made as soon as rmcp has queued the request and named its
//! token; the server may already be answering by then (an HTTP answer's first event can be
//! read before the caller runs again), so notifications for a token with no route yet are
//! held, for a few calls (the oldest dropped first), and handed to the route when it is
//! made. A token is never reused on a connection, so what is held for a call that never
//! asks for its progress, or has ended, reaches no one.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use psych_types::{ProgressSink, ToolProgress};
use rmcp::model::{NumberOrString, ProgressNotificationParam, ProgressToken};

/// How many tokens without a route have their progress held.
const EARLY_CALLS: usize = 16;
/// How many notifications are held for one token without a route.
const EARLY_NOTES: usize = 64;
/// The longest string token of a notification held before its call's route, in bytes: a
/// peer's string id, bounded as a request's is.
const MAX_EARLY_TOKEN_BYTES: usize = crate::MAX_REQUEST_ID_BYTES;

/// The sinks of the calls in flight on one connection, by progress token.
#[derive(Debug, Default)]
pub(crate) struct ProgressRoutes {
    inner: Mutex<Routes>,
}

#[derive(Debug, Default)]
struct Routes {
    routes: HashMap<ProgressToken, ProgressSink>,
    /// Progress for tokens with no route yet, oldest token first.
    early: VecDeque<(ProgressToken, Vec<ToolProgress>)>,
}

/// A call's route, removed (dropping the sink) when dropped.
pub(crate) struct Route {
    token: ProgressToken,
    routes: Arc<ProgressRoutes>,
}

impl Drop for Route {
    fn drop(&mut self) {
        self.routes.lock().routes.remove(&self.token);
    }
}

impl ProgressRoutes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Routes the progress of the call whose token is `token` to `sink`, starting with what
    /// arrived for it before the route was made.
    pub(crate) fn route(self: &Arc<Self>, token: ProgressToken, sink: ProgressSink) -> Route {
        let mut inner = self.lock();
        if let Some(at) = inner.early.iter().position(|(early, _)| *early == token)
            && let Some((_, held)) = inner.early.remove(at)
        {
            for progress in held {
                sink.report(progress);
            }
        }
        inner.routes.insert(token.clone(), sink);
        Route {
            token,
            routes: Arc::clone(self),
        }
    }

    /// Reports `param` to its call's sink, or holds it until the call's route is made.
    pub(crate) fn deliver(&self, param: ProgressNotificationParam) {
        let progress = ToolProgress::new(param.progress)
            .with_total(param.total)
            .with_message(param.message);
        let mut inner = self.lock();
        if let Some(sink) = inner.routes.get(&param.progress_token) {
            sink.report(progress);
            return;
        }
        match inner
            .early
            .iter_mut()
            .find(|(early, _)| *early == param.progress_token)
        {
            Some((_, held)) if held.len() < EARLY_NOTES => held.push(progress),
            Some(_) => {}
            // Not a token of a call of ours (rmcp's are numbers; a string one is kept only
            // while short), so it is not held: a long one would be held whole.
            None if matches!(&param.progress_token.0, NumberOrString::String(token)
                if token.len() > MAX_EARLY_TOKEN_BYTES) => {}
            None => {
                if inner.early.len() == EARLY_CALLS {
                    inner.early.pop_front();
                }
                inner
                    .early
                    .push_back((param.progress_token, vec![progress]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::NumberOrString;
    use tokio::sync::mpsc::UnboundedReceiver;

    fn token(n: i64) -> ProgressToken {
        ProgressToken(NumberOrString::Number(n))
    }

    /// A sink and the channel it reports into (closed when the sink is dropped).
    fn channel() -> (ProgressSink, UnboundedReceiver<ToolProgress>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let sink = ProgressSink::new(move |progress| {
            let _ = tx.send(progress);
        });
        (sink, rx)
    }

    #[test]
    fn progress_reaches_only_its_calls_channel_while_the_call_lasts() {
        let routes = Arc::new(ProgressRoutes::default());
        let (a_sink, mut a) = channel();
        let (b_sink, mut b) = channel();
        let route_a = routes.route(token(1), a_sink);
        let route_b = routes.route(token(2), b_sink);
        routes.deliver(ProgressNotificationParam::new(token(1), 1.0));
        routes.deliver(ProgressNotificationParam::new(token(9), 2.0));
        assert_eq!(a.try_recv().map(|p| p.progress), Ok(1.0));
        assert!(a.try_recv().is_err() && b.try_recv().is_err());
        drop(route_a);
        routes.deliver(ProgressNotificationParam::new(token(1), 3.0));
        assert!(
            a.try_recv().is_err(),
            "the channel is closed with its route"
        );
        drop(route_b);
    }

    #[test]
    fn progress_of_a_long_string_token_without_a_route_is_not_held() {
        let routes = Arc::new(ProgressRoutes::default());
        let long = ProgressToken(NumberOrString::String(
            "t".repeat(MAX_EARLY_TOKEN_BYTES + 1).into(),
        ));
        routes.deliver(ProgressNotificationParam::new(long.clone(), 1.0));
        assert!(routes.lock().early.is_empty());
        let short = ProgressToken(NumberOrString::String("t".into()));
        routes.deliver(ProgressNotificationParam::new(short, 1.0));
        assert_eq!(routes.lock().early.len(), 1);
    }

    #[test]
    fn progress_that_arrives_before_its_route_is_handed_over_first() {
        let routes = Arc::new(ProgressRoutes::default());
        routes.deliver(ProgressNotificationParam::new(token(1), 1.0));
        for n in 2..=(EARLY_CALLS as i64 + 1) {
            routes.deliver(ProgressNotificationParam::new(token(n), 1.0));
        }
        routes.deliver(ProgressNotificationParam::new(token(2), 2.0));
        let (sink, mut progress) = channel();
        let _route = routes.route(token(2), sink);
        routes.deliver(ProgressNotificationParam::new(token(2), 3.0));
        let seen: Vec<f64> = std::iter::from_fn(|| progress.try_recv().ok())
            .map(|p| p.progress)
            .collect();
        assert_eq!(seen, [1.0, 2.0, 3.0], "held, then live, in order");
        let (sink, mut oldest) = channel();
        let _route = routes.route(token(1), sink);
        assert!(
            oldest.try_recv().is_err(),
            "the oldest token's progress made room for newer ones"
        );
    }
}
