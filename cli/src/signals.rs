//! The signals that stop a command: SIGTERM, SIGINT (a terminal's Ctrl-C) and SIGHUP (its
//! terminal or SSH session closed).
//!
//! Upstream servers run in process groups of their own (psych-mcp starts them so), so a
//! terminal's signal reaches only `psych`: were it to die of it, no destructor would run
//! and the servers it started (and their children) would be left running. Each command
//! that starts servers handles the three instead: `psych serve` shuts down cleanly
//! ([`crate::serve`]); the reporting commands and the demo stop what they were doing with
//! [`until_signal`], their servers' process groups killed as the runtime drops their tasks,
//! and exit with 128 + the signal's number, as a shell reports a command a signal ended.

use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

/// How long a command stopped by a signal waits for its runtime's blocking tasks (a
/// catalogue write under way) once every async task is dropped.
const STRAGGLERS: Duration = Duration::from_millis(500);

/// A signal that stopped a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stopped {
    /// Its name (`SIGINT`).
    pub(crate) name: &'static str,
    /// Its number (2 for SIGINT).
    pub(crate) number: u8,
}

impl Stopped {
    /// The exit status of a command it stopped: 128 + its number.
    pub(crate) fn status(self) -> u8 {
        128 + self.number
    }
}

/// SIGTERM, SIGINT and SIGHUP, as one stream of signals.
pub(crate) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (from then on none of the three ends the process by itself).
    /// Must be called within a tokio runtime.
    pub(crate) fn new() -> Result<Self, String> {
        let install = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| format!("cannot handle {name}: {e}"))
        };
        Ok(Self {
            term: install(SignalKind::terminate(), "SIGTERM")?,
            int: install(SignalKind::interrupt(), "SIGINT")?,
            hup: install(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    /// The next signal. Cancel-safe (each `recv` is).
    pub(crate) async fn next(&mut self) -> Stopped {
        let (name, number) = tokio::select! {
            _ = self.term.recv() => ("SIGTERM", 15),
            _ = self.int.recv() => ("SIGINT", 2),
            _ = self.hup.recv() => ("SIGHUP", 1),
        };
        Stopped { name, number }
    }
}

/// Runs `work` on a new multi-threaded runtime until it ends, or until SIGTERM, SIGINT or
/// SIGHUP: then `work` is dropped (with the servers' manager it holds) and the runtime shut
/// down, which drops every task it spawned and so kills each server's process group, and
/// the signal is returned.
pub(crate) fn until_signal<T>(
    work: impl AsyncFnOnce() -> Result<T, String>,
) -> Result<Result<T, String>, Stopped> {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return Ok(Err(format!("cannot start the async runtime: {e}"))),
    };
    let outcome = runtime.block_on(async {
        let mut signals = match Signals::new() {
            Ok(signals) => signals,
            Err(e) => return Ok(Err(e)),
        };
        tokio::select! {
            done = work() => Ok(done),
            stopped = signals.next() => Err(stopped),
        }
    });
    runtime.shutdown_timeout(STRAGGLERS);
    outcome
}
