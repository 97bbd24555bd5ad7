//! Bounds on what HTTP clients hold in the gateway at once: connections, and POSTs being
//! handled (each up to rmcp's 4 MiB body while it is read, then a task and the answer
//! while it is made and sent).
//!
//! - At most [`MAX_CONNECTIONS`] connections are open; past it the gateway accepts no more
//!   until one closes (the rest wait in the listen backlog, as on any busy server).
//! - At most [`MAX_REQUESTS`] POSTs are in flight across every client, and at most
//!   [`MAX_REQUESTS_PER_SESSION`] within one session (by its `Mcp-Session-Id`); past either
//!   a POST is answered at once with `429 Too Many Requests` and a JSON-RPC error saying
//!   which, its body unread. A POST is in flight from its headers until its answer's body
//!   is sent or dropped (an event stream of progress included).
//!
//! Requests without a session (MCP 2026-07-28's, an `initialize`) share the global bound
//! only. Event streams (GET) are bounded per identity by [`MAX_LISTENS`](crate::MAX_LISTENS)
//! and sessions by [`GatewaySettings::max_sessions`](crate::GatewaySettings::max_sessions).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};

use crate::raw::HttpBody;

/// The most HTTP connections open at once. An idle connection holds a task and hyper's
/// buffers (some KB); the requests on them are bounded apart.
pub const MAX_CONNECTIONS: usize = 1024;

/// The most POSTs in flight at once across every HTTP client: what their bodies may hold
/// while read is at most this many times rmcp's 4 MiB.
pub const MAX_REQUESTS: usize = 256;

/// The most POSTs in flight at once within one session, so that one client cannot take
/// every place of [`MAX_REQUESTS`]; as many as a stdio client may have in flight.
pub const MAX_REQUESTS_PER_SESSION: usize = crate::stdio::MAX_IN_FLIGHT;

/// The counts of POSTs in flight, in all and per session.
#[derive(Debug)]
pub(crate) struct Admission {
    total_limit: usize,
    session_limit: usize,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    /// Only sessions with a POST in flight: at most `total` entries.
    sessions: HashMap<String, usize>,
}

/// Which bound refused a POST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// [`MAX_REQUESTS`] across every client.
    Total(usize),
    /// [`MAX_REQUESTS_PER_SESSION`] in the POST's session.
    Session(usize),
}

impl Admission {
    /// Counts with the gateway's bounds.
    pub(crate) fn new() -> Arc<Self> {
        Self::with_limits(MAX_REQUESTS, MAX_REQUESTS_PER_SESSION)
    }

    fn with_limits(total_limit: usize, session_limit: usize) -> Arc<Self> {
        Arc::new(Self {
            total_limit,
            session_limit,
            counts: Mutex::new(Counts::default()),
        })
    }

    /// Counts one POST in (of `session`, if it names one), or says which bound it is past.
    pub(crate) fn admit(self: &Arc<Self>, session: Option<&str>) -> Result<Admitted, Refused> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if counts.total >= self.total_limit {
            return Err(Refused::Total(self.total_limit));
        }
        if let Some(session) = session {
            let count = counts.sessions.get(session).copied().unwrap_or(0);
            if count >= self.session_limit {
                return Err(Refused::Session(self.session_limit));
            }
            counts.sessions.insert(session.to_owned(), count + 1);
        }
        counts.total += 1;
        Ok(Admitted {
            admission: Arc::clone(self),
            session: session.map(str::to_owned),
        })
    }

    #[cfg(test)]
    fn total(&self) -> usize {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

/// A POST's place, given back when dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    session: Option<String>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self
            .admission
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        counts.total = counts.total.saturating_sub(1);
        if let Some(session) = &self.session
            && let Some(count) = counts.sessions.get_mut(session)
        {
            *count -= 1;
            if *count == 0 {
                counts.sessions.remove(session);
            }
        }
    }
}

/// The answer to a POST refused by `refused`: 429, with a JSON-RPC error without an `id`
/// (the body was not read) and `Retry-After: 1`.
pub(crate) fn too_many(refused: Refused) -> hyper::Response<HttpBody> {
    let (message, limit) = match refused {
        Refused::Total(limit) => (
            format!("too many requests in flight: the gateway handles {limit} at once"),
            limit,
        ),
        Refused::Session(limit) => (
            format!("too many requests in flight: a session may have {limit} at once"),
            limit,
        ),
    };
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "error": {"code": -32000, "message": message, "data": {"inFlight": limit}},
    });
    let mut response = crate::http_answer(
        hyper::StatusCode::TOO_MANY_REQUESTS,
        "application/json",
        body.to_string(),
    );
    response.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from_static("1"),
    );
    response
}

/// `response` with `admitted` held until its body has been sent or dropped.
pub(crate) fn hold(
    response: hyper::Response<HttpBody>,
    admitted: Admitted,
) -> hyper::Response<HttpBody> {
    use http_body_util::BodyExt;
    response.map(|body| {
        Held {
            body,
            _admitted: admitted,
        }
        .boxed()
    })
}

/// A body that holds a POST's place while it is sent.
struct Held {
    body: HttpBody,
    _admitted: Admitted,
}

impl Body for Held {
    type Data = hyper::body::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use http_body_util::BodyExt;

    use super::*;

    #[test]
    fn posts_past_either_bound_are_refused_and_places_come_back() {
        let admission = Admission::with_limits(5, 2);
        let a1 = admission.admit(Some("a")).unwrap();
        let a2 = admission.admit(Some("a")).unwrap();
        assert_eq!(admission.admit(Some("a")).unwrap_err(), Refused::Session(2));
        let b = admission.admit(Some("b")).unwrap();
        let none: Vec<_> = (0..2).map(|_| admission.admit(None).unwrap()).collect();
        assert_eq!(admission.admit(None).unwrap_err(), Refused::Total(5));
        assert_eq!(admission.admit(Some("c")).unwrap_err(), Refused::Total(5));
        drop(a1);
        let a3 = admission.admit(Some("a")).unwrap();
        drop((a2, a3, b, none));
        assert_eq!(admission.total(), 0);
        assert!(
            admission.counts.lock().unwrap().sessions.is_empty(),
            "a session with nothing in flight holds no entry"
        );
    }

    #[tokio::test]
    async fn a_place_is_held_until_the_answer_is_sent() {
        let admission = Admission::with_limits(1, 1);
        let admitted = admission.admit(None).unwrap();
        let answer = hold(too_many(Refused::Session(1)), admitted);
        assert_eq!(answer.status(), hyper::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.headers()[hyper::header::RETRY_AFTER], "1");
        assert!(admission.admit(None).is_err());
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body["error"]["message"],
            "too many requests in flight: a session may have 1 at once"
        );
        assert!(admission.admit(None).is_ok(), "the place came back");
    }
}
