//! The requests a peer has in flight, counted so that a peer cannot make a transport hold
//! an answer per request it sends without reading any (each answer waits, with its bytes,
//! for a writer the peer does not empty).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use rmcp::model::{JsonRpcMessage, RequestId};

/// The most requests of one peer in flight at once, by default: 64. A client rarely runs
/// more than a few calls at once, and a server's own requests (`ping`, sampling, roots) are
/// answered as they come.
pub const MAX_PEER_REQUESTS: usize = 64;

/// The ids of a peer's requests whose answers are not written yet, at most a limit.
///
/// A transport [enters](InFlight::enter) each request it passes on, refusing it past the
/// limit, and holds an [`Answering`] from the moment it is given the answer to send
/// until the send ends, however it ends; a cancellation from the peer
/// [leaves](InFlight::leave) at once (rmcp then sends no answer). A request whose id is
/// in flight already (a peer reusing an id) is counted once: rmcp answers only one.
#[derive(Debug)]
pub struct InFlight {
    limit: usize,
    ids: Mutex<HashSet<RequestId>>,
}

impl InFlight {
    /// A count allowing `limit` requests at once.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            ids: Mutex::new(HashSet::new()),
        })
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Counts `id` in; `false` (and nothing counted) if `limit` are in already.
    pub fn enter(&self, id: &RequestId) -> bool {
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        if ids.contains(id) {
            return true;
        }
        if ids.len() >= self.limit {
            return false;
        }
        ids.insert(id.clone());
        true
    }

    /// Counts `id` out (nothing if it is not in).
    pub fn leave(&self, id: &RequestId) {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// How many are in flight.
    pub fn len(&self) -> usize {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A hold on the request `message` answers (if it is an answer with an id), which
    /// counts it out when dropped: made when a send begins, moved into the send.
    pub fn answering<Req, Resp, Not>(
        self: &Arc<Self>,
        message: &JsonRpcMessage<Req, Resp, Not>,
    ) -> Answering {
        let id = match message {
            JsonRpcMessage::Response(response) => Some(response.id.clone()),
            JsonRpcMessage::Error(error) => error.id.clone(),
            _ => None,
        };
        Answering {
            in_flight: Arc::clone(self),
            id,
        }
    }
}

/// Counts an answer's request out of its [`InFlight`] when dropped.
#[derive(Debug)]
pub struct Answering {
    in_flight: Arc<InFlight>,
    id: Option<RequestId>,
}

impl Drop for Answering {
    fn drop(&mut self) {
        if let Some(id) = &self.id {
            self.in_flight.leave(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{ErrorData, ServerJsonRpcMessage, ServerResult};

    use super::*;

    #[test]
    fn requests_are_counted_to_the_limit_and_out_by_their_answers() {
        let in_flight = InFlight::new(2);
        let one = RequestId::Number(1);
        let two = RequestId::String("two".into());
        assert!(in_flight.enter(&one));
        assert!(in_flight.enter(&one), "a reused id is counted once");
        assert!(in_flight.enter(&two));
        assert!(!in_flight.enter(&RequestId::Number(3)));
        assert_eq!(in_flight.len(), 2);
        let answer = ServerJsonRpcMessage::response(ServerResult::empty(()), one.clone());
        let answering = in_flight.answering(&answer);
        assert_eq!(in_flight.len(), 2, "in flight until the send ends");
        drop(answering);
        assert_eq!(in_flight.len(), 1);
        let error = ServerJsonRpcMessage::error(ErrorData::internal_error("x", None), Some(two));
        drop(in_flight.answering(&error));
        assert!(in_flight.is_empty());
        in_flight.leave(&one);
        assert!(in_flight.enter(&RequestId::Number(3)));
    }
}
