//! Progress of a forwarded `tools/call`. rmcp gives every request a `progressToken` of its
//! own (unique per connection, replacing any the caller set); with
//! [`McpManager::call_tool_with_progress`](crate::McpManager::call_tool_with_progress) each
//! `notifications/progress` the server sends with that call's token reaches the caller's
//! channel as a [`Progress`] until the call ends, so progress of another call (or of a call
//! already abandoned: servers that ignore cancellation keep sending it) never reaches the
//! wrong channel. The route is made as soon as rmcp has sent the request and named its
//! token, before the server can have read it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use tokio::sync::mpsc::UnboundedSender;

/// One `notifications/progress` of a call, as the server sent it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Progress {
    /// The progress so far; it increases with each notification.
    pub progress: f64,
    /// The total, when the server knows it.
    pub total: Option<f64>,
    /// What the server says it is doing.
    pub message: Option<String>,
}

/// The channels of the calls in flight on one connection, by progress token.
#[derive(Debug, Default)]
pub(crate) struct ProgressRoutes {
    routes: Mutex<HashMap<ProgressToken, UnboundedSender<Progress>>>,
}

/// A call's route, removed (closing the channel) when dropped.
pub(crate) struct Route {
    token: ProgressToken,
    routes: Arc<ProgressRoutes>,
}

impl Drop for Route {
    fn drop(&mut self) {
        self.routes
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.token);
    }
}

impl ProgressRoutes {
    /// Routes the progress of the call whose token is `token` to `sink`.
    pub(crate) fn route(
        self: &Arc<Self>,
        token: ProgressToken,
        sink: UnboundedSender<Progress>,
    ) -> Route {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(token.clone(), sink);
        Route {
            token,
            routes: Arc::clone(self),
        }
    }

    /// Sends `param` to its call's channel; a token with no call in flight is dropped.
    pub(crate) fn deliver(&self, param: ProgressNotificationParam) {
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sink) = routes.get(&param.progress_token) {
            let _ = sink.send(Progress {
                progress: param.progress,
                total: param.total,
                message: param.message,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::NumberOrString;

    fn token(n: i64) -> ProgressToken {
        ProgressToken(NumberOrString::Number(n))
    }

    #[test]
    fn progress_reaches_only_its_calls_channel_while_the_call_lasts() {
        let routes = Arc::new(ProgressRoutes::default());
        let (a_sink, mut a) = tokio::sync::mpsc::unbounded_channel();
        let (b_sink, mut b) = tokio::sync::mpsc::unbounded_channel();
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
}
