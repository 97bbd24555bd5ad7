//! Servers started when they are needed ([`McpManager::add_lazy_server`]): a lazy server's
//! supervisor starts nothing until a call or a listing asks for it, serves while it is
//! used, and stops it (its whole process group) once it has been idle for its idle time
//! with no request in flight; the next request starts it again.
//!
//! - **One start for concurrent requests.** A request that finds no session bumps the
//!   `wanted` counter and waits for the next start attempt to finish; the supervisor takes
//!   every request made before its attempt ends as served by that attempt, so concurrent
//!   first calls share one process start, and its failure (with the reason) is each of
//!   theirs.
//! - **Never stopped under a request.** A request takes its session and counts itself in
//!   flight under the slot's read lock; the supervisor stops an idle server only under the
//!   write lock, with nothing in flight and the idle time past since the last request ended.
//!   A request that finds no session asks for a start under the read lock, and the
//!   supervisor publishes each attempt's outcome (and takes the requests it served) under
//!   the write lock, so no request waits for an attempt that will not come.
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
use crate::manager::{Connecting, Slot};
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
    /// Start attempts finished so far, and the last one's failure (`None` if it started).
    attempts: watch::Sender<(u64, Option<String>)>,
    /// Requests holding the session now.
    in_flight: AtomicUsize,
    /// When the last request ended (or the server started).
    last_used: Mutex<Instant>,
}

impl Lazy {
    pub(crate) fn new(idle: Duration) -> Self {
        let (wanted, wanted_rx) = watch::channel(0);
        Self {
            idle,
            wanted,
            wanted_rx: Mutex::new(Some(wanted_rx)),
            attempts: watch::Sender::new((0, None)),
            in_flight: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
        }
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

/// The session of the lazy server in `slot`, started first if need be, held in flight.
///
/// Cancel-safe: dropped while it waits, it leaves only its start request, which the
/// supervisor serves anyway (the server then starts, and stops once idle).
///
/// # Errors
///
/// [`McpError::Unreachable`] with the start's failure; [`McpError::ShutDown`] once the
/// slot is stopped (the server removed or replaced, or the manager shut down; the manager's
/// `acquire` says which).
pub(crate) async fn acquire(
    server: &ServerId,
    slot: &Slot,
    lazy: &Arc<Lazy>,
) -> Result<(Arc<Session>, InFlight), McpError> {
    let mut attempts = lazy.attempts.subscribe();
    let mut stop = slot.stopping();
    loop {
        if *stop.borrow_and_update() {
            return Err(McpError::ShutDown);
        }
        let before = {
            let state = slot.state.read().unwrap_or_else(PoisonError::into_inner);
            // A session known lost is passed over: its supervisor is about to say why and
            // take it away, and then serves this request's start.
            if let Some(session) = state.session.as_ref().filter(|session| !session.is_lost()) {
                // Under the read lock: the supervisor stops an idle server only under the
                // write lock, after seeing nothing in flight.
                lazy.in_flight.fetch_add(1, Ordering::AcqRel);
                let held = InFlight {
                    lazy: Arc::clone(lazy),
                };
                return Ok((Arc::clone(session), held));
            }
            // Asked under the read lock too: the supervisor publishes an attempt's outcome,
            // and takes the requests it served, under the write lock, so this request is
            // either served by the attempt whose outcome it then waits for, or sees its
            // session.
            lazy.wanted.send_modify(|wanted| *wanted += 1);
            attempts.borrow_and_update().0
        };
        loop {
            tokio::select! {
                changed = attempts.changed() => if changed.is_err() {
                    return Err(McpError::ShutDown);
                },
                _ = stop.wait_for(|stop| *stop) => return Err(McpError::ShutDown),
            }
            let (done, failure) = attempts.borrow_and_update().clone();
            if done > before {
                if let Some(reason) = failure {
                    return Err(McpError::Unreachable {
                        server: server.clone(),
                        reason,
                    });
                }
                // Started: take the session (or, gone again already, ask again).
                break;
            }
        }
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
        let attempt = tokio::select! {
            attempt = how.connect(&server, &config, &events) => attempt,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let session = match attempt {
            Ok((session, listing)) => {
                {
                    let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
                    // Every request made until now is served by this attempt.
                    wanted.borrow_and_update();
                    state.malformed = listing.malformed;
                    state.session = Some(Arc::clone(&session));
                    state.reachability = Reachability::Reachable;
                    lazy.touch();
                    lazy.attempts
                        .send_modify(|(done, failure)| (*done, *failure) = (*done + 1, None));
                }
                report(Reachability::Reachable);
                events.push(McpEvent::ToolsChanged {
                    server: server.clone(),
                    cause: ChangeCause::Connected,
                });
                session
            }
            Err(error) => {
                let reason = error.to_string();
                let down = Reachability::Unreachable {
                    reason: reason.clone(),
                };
                {
                    let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
                    wanted.borrow_and_update();
                    state.session = None;
                    state.reachability = down.clone();
                    lazy.attempts.send_modify(|(done, failure)| {
                        (*done, *failure) = (*done + 1, Some(reason));
                    });
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
                    let idle = lazy.in_flight.load(Ordering::Acquire) == 0
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
