//! Servers started when they are needed ([`McpManager::add_lazy_server`]): a lazy server's
//! supervisor starts nothing until a call or a listing asks for it, serves while it is
//! used, and stops it (its whole process group) once it has been idle for its idle time
//! with no request in flight; the next request starts it again.
//!
//! - **One start for concurrent requests.** A request that finds no session bumps the
//!   `wanted` counter and waits for the next start attempt to finish; the supervisor takes
//!   every request made before its attempt ends as served by that attempt, so concurrent
//!   first calls share one process start, and its failure (the start's own error,
//!   [`McpError::StartFailed`](crate::McpError::StartFailed)) is each of theirs.
//! - **Never stopped under a request.** A request takes its session and counts itself in
//!   flight under the slot's read lock; the supervisor stops an idle server only under the
//!   write lock, with nothing in flight, no request waiting to take the session a start
//!   gave it, and the idle time past since the last request ended. A request that finds no
//!   session asks for a start under the read lock, and the supervisor publishes each
//!   attempt's outcome (and takes the requests it served) under the write lock, so no
//!   request waits for an attempt that will not come; if the supervisor's task ends
//!   however it ends (a panic included), its last outcome says so and every waiting and
//!   later request fails at once.
//! - **One start per request.** A request whose start succeeded but whose session was lost
//!   before it could take it (a server that exits right after it starts) fails with why,
//!   rather than starting the server again and again without an answer.
//! - **Removal and shutdown** end every waiting request at once: with
//!   [`McpError::UnknownServer`](crate::McpError::UnknownServer) for a removal,
//!   [`McpError::ShutDown`](crate::McpError::ShutDown) for a shutdown; a request whose server
//!   is replaced goes on to the new one.
//! - **Events.** A start reports the server reachable and its tools changed
//!   ([`ChangeCause::Connected`]), as a first connection does, so a listener re-lists it; a
//!   failed start reports it unreachable with the reason; an idle stop reports nothing (the
//!   server is as reachable as before, only not running), so nothing a client sees changes
//!   when a server stops. A connection lost while it runs is reported unreachable, and the
//!   next request starts it again (no reconnect loop while nothing needs it).
//!
//! [`McpManager::add_lazy_server`]: crate::McpManager::add_lazy_server

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use psych_types::{Reachability, ServerId};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::connection::Session;
use crate::events::{ChangeCause, EventQueue, McpEvent};
use crate::manager::{Connecting, Slot, State};
use crate::{McpError, ServerConfig};

/// How often an idle server is looked at, at most: a tenth of its idle time, within
/// 10 ms to 1 s.
fn idle_check(idle: Duration) -> Duration {
    (idle / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// A lazy server's start requests, outcomes and use.
#[derive(Debug)]
pub(crate) struct Lazy {
    /// How long the server runs without a request before it is stopped.
    idle: Duration,
    /// Start requests made so far; the supervisor waits for it to move.
    wanted: watch::Sender<u64>,
    /// The supervisor's receiver of `wanted`, made with it (so that no request made before
    /// the supervisor first runs is missed), taken when it starts.
    wanted_rx: Mutex<Option<watch::Receiver<u64>>>,
    /// What the start attempts came to so far.
    attempts: watch::Sender<Attempts>,
    /// Requests holding the session now.
    in_flight: AtomicUsize,
    /// Requests that asked for a start and have not yet taken a session (or given up):
    /// while any is, a server a start gave them is not stopped for idleness.
    waiting: AtomicUsize,
    /// When the last request ended (or the server started).
    last_used: Mutex<Instant>,
}

/// What a lazy server's start attempts came to.
#[derive(Debug, Clone, Default)]
struct Attempts {
    /// Attempts finished so far.
    done: u64,
    /// The last one's failure (`None` if it started).
    failure: Option<Arc<McpError>>,
    /// Whether the supervisor has ended: no attempt will come.
    ended: bool,
}

impl Lazy {
    pub(crate) fn new(idle: Duration) -> Self {
        let (wanted, wanted_rx) = watch::channel(0);
        Self {
            idle,
            wanted,
            wanted_rx: Mutex::new(Some(wanted_rx)),
            attempts: watch::Sender::new(Attempts::default()),
            in_flight: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
        }
    }

    /// Says that the supervisor has ended (called however its task ends): the requests
    /// waiting for an attempt, and every later one, fail at once.
    pub(crate) fn end(&self) {
        self.attempts.send_modify(|attempts| {
            attempts.done += 1;
            attempts.failure = None;
            attempts.ended = true;
        });
    }

    /// Publishes an attempt's outcome.
    fn finished(&self, failure: Option<Arc<McpError>>) {
        self.attempts.send_modify(|attempts| {
            attempts.done += 1;
            attempts.failure = failure;
        });
    }

    fn touch(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }
}

/// A request's hold on a lazy server's session: while it lives, the server is not stopped
/// for idleness; dropped, it starts the idle time again.
#[derive(Debug)]
pub(crate) struct InFlight {
    lazy: Arc<Lazy>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.lazy.touch();
        self.lazy.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request counted in [`Lazy::waiting`] from its ask for a start until it takes a
/// session or gives up (dropped with its future: cancel-safe).
struct Waiting<'a>(&'a Lazy);

impl<'a> Waiting<'a> {
    fn new(lazy: &'a Lazy) -> Self {
        lazy.waiting.fetch_add(1, Ordering::AcqRel);
        Self(lazy)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a request whose start succeeded found no session to take: its process exited or
/// its connection closed at once (`lost`, the session as found, says why; else the
/// reachability the supervisor reported).
async fn lost_at_start(lost: Option<Arc<Session>>, reachability: Reachability) -> String {
    let why = match (lost, reachability) {
        (Some(session), _) => session.lost().await,
        (None, Reachability::Unreachable { reason }) => reason,
        (None, _) => "its connection ended".to_owned(),
    };
    format!("it stopped right after it started: {why}")
}

/// The session of the lazy server in `slot`, started first if need be, held in flight.
///
/// Cancel-safe: dropped while it waits, it leaves only its start request, which the
/// supervisor serves anyway (the server then starts, and stops once idle); it no longer
/// counts as waiting.
///
/// # Errors
///
/// [`McpError::StartFailed`] with the start's own error; [`McpError::Unreachable`] when
/// the start succeeded but the server was gone again before the request could take it, or
/// the supervisor has ended (it cannot be started until it is added again);
/// [`McpError::ShutDown`] once the slot is stopped (the server removed or replaced, or the
/// manager shut down; the manager's `acquire` says which).
pub(crate) async fn acquire(
    server: &ServerId,
    slot: &Slot,
    lazy: &Arc<Lazy>,
) -> Result<(Arc<Session>, InFlight), McpError> {
    let mut attempts = lazy.attempts.subscribe();
    let mut stop = slot.stopping();
    // The session, or a start asked for: under the read lock, as the supervisor publishes
    // an attempt's outcome, and takes the requests it served, under the write lock, so this
    // request is either served by the attempt whose outcome it then waits for, or sees its
    // session. Counted as waiting from the ask until this returns (or is dropped).
    let (before, _waiting) = {
        let state = slot.state.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = take(server, lazy, &state, &mut stop, &mut attempts)? {
            return Ok(held);
        }
        let waiting = Waiting::new(lazy);
        lazy.wanted.send_modify(|wanted| *wanted += 1);
        (attempts.borrow().done, waiting)
    };
    loop {
        tokio::select! {
            changed = attempts.changed() => if changed.is_err() {
                return Err(McpError::ShutDown);
            },
            _ = stop.wait_for(|stop| *stop) => return Err(McpError::ShutDown),
        }
        let now = attempts.borrow_and_update().clone();
        if now.done > before {
            if let Some(failure) = now.failure {
                return Err(McpError::StartFailed {
                    server: server.clone(),
                    source: failure,
                });
            }
            break;
        }
    }
    // Started (or the supervisor ended): the session, or why it is gone. Waiting kept the
    // server from an idle stop, so it is gone only because it was lost: starting it again
    // could go on forever.
    let (session, reachability) = {
        let state = slot.state.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = take(server, lazy, &state, &mut stop, &mut attempts)? {
            return Ok(held);
        }
        (state.session.clone(), state.reachability.clone())
    };
    Err(McpError::Unreachable {
        server: server.clone(),
        reason: lost_at_start(session, reachability).await,
    })
}

/// Under the slot's read lock (`state`): [`McpError::ShutDown`] for a stopped slot (removed,
/// replaced: its session about to close), the supervisor's end, or its live session held
/// in flight; `None` when it has none (a session known lost is passed over: its
/// supervisor is about to say why and take it away).
fn take(
    server: &ServerId,
    lazy: &Arc<Lazy>,
    state: &State,
    stop: &mut watch::Receiver<bool>,
    attempts: &mut watch::Receiver<Attempts>,
) -> Result<Option<(Arc<Session>, InFlight)>, McpError> {
    if *stop.borrow_and_update() {
        return Err(McpError::ShutDown);
    }
    // A session left by a supervisor that ended is nobody's to stop or watch.
    if attempts.borrow_and_update().ended {
        return Err(ended(server));
    }
    let Some(session) = state.session.as_ref().filter(|session| !session.is_lost()) else {
        return Ok(None);
    };
    // Under the read lock: the supervisor stops an idle server only under the write lock,
    // after seeing nothing in flight and no one waiting.
    lazy.in_flight.fetch_add(1, Ordering::AcqRel);
    let held = InFlight {
        lazy: Arc::clone(lazy),
    };
    Ok(Some((Arc::clone(session), held)))
}

/// A request to a lazy server whose supervisor has ended without being stopped.
fn ended(server: &ServerId) -> McpError {
    McpError::Unreachable {
        server: server.clone(),
        reason: "psych-mcp's supervisor of this lazy server ended unexpectedly; it starts \
                 again once the server is added again"
            .to_owned(),
    }
}

/// Starts the lazy server of `slot` whenever a request wants it, serves until it is idle,
/// lost or told to stop, and stops it; until told to stop.
pub(crate) async fn supervise(
    server: ServerId,
    config: ServerConfig,
    slot: Arc<Slot>,
    lazy: Arc<Lazy>,
    events: Arc<EventQueue>,
    how: Connecting,
    mut stop: watch::Receiver<bool>,
) {
    let taken = lazy
        .wanted_rx
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let Some(mut wanted) = taken else {
        return;
    };
    let report = |reachability: Reachability| {
        events.push(McpEvent::Reachability {
            server: server.clone(),
            reachability,
        });
    };
    // Added, not started: nothing to wait for.
    let _ = slot.first_attempt.send_replace(true);
    loop {
        tokio::select! {
            changed = wanted.changed() => if changed.is_err() { break },
            _ = stop.wait_for(|stop| *stop) => break,
        }
        // Both may have been ready: a stopped slot starts nothing.
        if *stop.borrow() {
            break;
        }
        // Not raced with `stop` here: the attempt ends itself when stopped, stopping a
        // process it started with its grace (dropped, it would be killed at once, blocking
        // this worker while its tree is looked through).
        let attempt = how.connect(&server, &config, &events, &stop).await;
        let session = match attempt {
            // Stopped as the attempt succeeded: the session is not published (nor reported
            // reachable) for a server removed or replaced.
            Ok((session, _)) if *stop.borrow() => {
                session.close().await;
                break;
            }
            Ok((session, listing)) => {
                {
                    let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
                    // Every request made until now is served by this attempt.
                    wanted.borrow_and_update();
                    state.malformed = listing.malformed;
                    state.session = Some(Arc::clone(&session));
                    state.reachability = Reachability::Reachable;
                    lazy.touch();
                    lazy.finished(None);
                }
                report(Reachability::Reachable);
                events.push(McpEvent::ToolsChanged {
                    server: server.clone(),
                    cause: ChangeCause::Connected,
                });
                session
            }
            // Stopped during the attempt, which ended itself (its process stopped).
            Err(_) if *stop.borrow() => break,
            Err(error) => {
                let down = Reachability::Unreachable {
                    reason: error.to_string(),
                };
                {
                    let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
                    wanted.borrow_and_update();
                    state.session = None;
                    state.reachability = down.clone();
                    lazy.finished(Some(Arc::new(error)));
                }
                report(down);
                continue;
            }
        };
        // The first look one period after the start, not at once: the requests the start
        // served take the session first (with an idle time of zero, as soon as none is in
        // flight after that).
        let period = idle_check(lazy.idle);
        let mut check = tokio::time::interval_at(Instant::now() + period, period);
        // Made once: `lost` may wait a while for a process's exit status to say why.
        let lost = session.lost();
        tokio::pin!(lost);
        let stopped = loop {
            tokio::select! {
                reason = &mut lost => {
                    let down = Reachability::Unreachable { reason };
                    slot.set(None, down.clone());
                    report(down);
                    break false;
                }
                _ = stop.wait_for(|stop| *stop) => break true,
                _ = check.tick() => {
                    let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
                    // A session lost meanwhile is left to `lost`, which says why: stopped
                    // here, its crash would go unreported.
                    let idle = lazy.in_flight.load(Ordering::Acquire) == 0
                        && lazy.waiting.load(Ordering::Acquire) == 0
                        && !session.is_lost()
                        && lazy.last_used.lock().unwrap_or_else(PoisonError::into_inner).elapsed()
                            >= lazy.idle;
                    if idle {
                        // Stopped, not lost: the reachability stays as it was.
                        state.session = None;
                        break false;
                    }
                }
            }
        };
        if stopped {
            slot.set(None, Reachability::Unknown);
            session.close().await;
            break;
        }
        session.close().await;
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    fn server() -> ServerId {
        ServerId::new("lazy").unwrap()
    }

    type Request<'a> =
        Pin<Box<dyn Future<Output = Result<(Arc<Session>, InFlight), McpError>> + 'a>>;

    /// `request` polled once (no waker needed: the tests poll again by hand).
    fn poll(request: &mut Request<'_>) -> Poll<Result<(Arc<Session>, InFlight), McpError>> {
        request
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
    }

    /// Requests waiting for a start: each asks once and counts as waiting until it ends or
    /// is dropped; a failed start is every one's, the very error shared; a supervisor that
    /// ends without being stopped fails those waiting and every later one at once.
    #[test]
    fn waiting_requests_are_counted_share_a_failure_and_end_with_the_supervisor() {
        let lazy = Arc::new(Lazy::new(Duration::ZERO));
        let slot = Slot::unsupervised(Some(Arc::clone(&lazy)));
        let server = server();
        let mut first: Request<'_> = Box::pin(acquire(&server, &slot, &lazy));
        let mut second: Request<'_> = Box::pin(acquire(&server, &slot, &lazy));
        let mut dropped: Request<'_> = Box::pin(acquire(&server, &slot, &lazy));
        for request in [&mut first, &mut second, &mut dropped] {
            assert!(poll(request).is_pending());
        }
        assert_eq!(*lazy.wanted.borrow(), 3, "each asked for a start");
        assert_eq!(lazy.waiting.load(Ordering::Acquire), 3);
        drop(dropped);
        assert_eq!(
            lazy.waiting.load(Ordering::Acquire),
            2,
            "given up: no longer waiting"
        );

        let failure = Arc::new(McpError::ShutDown);
        lazy.finished(Some(Arc::clone(&failure)));
        for request in [&mut first, &mut second] {
            let Poll::Ready(Err(McpError::StartFailed { source, .. })) = poll(request) else {
                panic!("not the start's failure");
            };
            assert!(Arc::ptr_eq(&source, &failure), "the start's own error");
        }
        drop((first, second));
        assert_eq!(lazy.waiting.load(Ordering::Acquire), 0);

        let mut waiting: Request<'_> = Box::pin(acquire(&server, &slot, &lazy));
        assert!(poll(&mut waiting).is_pending());
        lazy.end();
        let Poll::Ready(Err(McpError::Unreachable { reason, .. })) = poll(&mut waiting) else {
            panic!("a waiting request did not end with the supervisor");
        };
        assert!(reason.contains("supervisor"), "{reason}");
        let mut later: Request<'_> = Box::pin(acquire(&server, &slot, &lazy));
        assert!(
            matches!(
                poll(&mut later),
                Poll::Ready(Err(McpError::Unreachable { .. }))
            ),
            "a later request fails at once"
        );
        assert_eq!(*lazy.wanted.borrow(), 4, "and asks for nothing");
        drop((waiting, later));
        assert_eq!(lazy.waiting.load(Ordering::Acquire), 0);
    }

    /// A stopped slot (the server removed or replaced) is not served from: the request
    /// ends with `ShutDown` (for the manager to say which) and asks for no start.
    #[test]
    fn a_stopped_slot_serves_no_request() {
        let lazy = Arc::new(Lazy::new(Duration::ZERO));
        let slot = Slot::unsupervised(Some(Arc::clone(&lazy)));
        slot.stop();
        let server = server();
        let mut request: Request<'_> = Box::pin(acquire(&server, &slot, &lazy));
        assert!(matches!(
            poll(&mut request),
            Poll::Ready(Err(McpError::ShutDown))
        ));
        assert_eq!(*lazy.wanted.borrow(), 0);
    }
}
