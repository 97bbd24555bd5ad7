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

/// How long a command's runtime gets to shut down: to drop every task (a dropped server's
/// process is killed and its group swept, up to a second each, on the runtime's threads)
/// and finish its blocking tasks (a catalogue write under way). Work that ended by itself
/// leaves nothing to wait for.
const STRAGGLERS: Duration = Duration::from_secs(10);

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
    /// None when the process was started with SIGHUP ignored (`nohup`): it stays ignored.
    hup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Installs the handlers (from then on none of the three ends the process by itself;
    /// SIGHUP is left ignored when it was, as under `nohup`). Must be called within a
    /// tokio runtime.
    pub(crate) fn new() -> Result<Self, String> {
        let install = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| format!("cannot handle {name}: {e}"))
        };
        Ok(Self {
            term: install(SignalKind::terminate(), "SIGTERM")?,
            int: install(SignalKind::interrupt(), "SIGINT")?,
            hup: if hangup_ignored() {
                None
            } else {
                Some(install(SignalKind::hangup(), "SIGHUP")?)
            },
        })
    }

    /// The next signal. Cancel-safe (each `recv` is).
    pub(crate) async fn next(&mut self) -> Stopped {
        let hup = async {
            match &mut self.hup {
                Some(hup) => hup.recv().await,
                None => std::future::pending().await,
            }
        };
        let (name, number) = tokio::select! {
            _ = self.term.recv() => ("SIGTERM", 15),
            _ = self.int.recv() => ("SIGINT", 2),
            _ = hup => ("SIGHUP", 1),
        };
        Stopped { name, number }
    }
}

/// Whether this process was started with SIGHUP ignored (`nohup`, a service manager's
/// choice): bit 0 of the `SigIgn` mask in `/proc/self/status`. False where that cannot be
/// read.
fn hangup_ignored() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let mask = status
                .lines()
                .find_map(|line| line.strip_prefix("SigIgn:"))?
                .trim();
            u64::from_str_radix(mask, 16).ok()
        })
        .is_some_and(|mask| mask & 1 == 1)
}

/// Runs `work` on a new multi-threaded runtime until it ends, or until SIGTERM, SIGINT or
/// SIGHUP: then `work` is dropped (with the servers' manager it holds) and the runtime shut
/// down, which drops every task it spawned and so kills each server's process group, and
/// the signal is returned. Once the runtime is shut down (its servers stopped, whether
/// `work` ended by itself or not), the three signals end the process as they would have
/// without handlers (a handler, once installed, stays): a thread waits for one, says so
/// and exits with 128 + its number. A signal that comes during the shutdown is kept, not
/// lost, and acted on then: the same handlers go on to the thread.
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
    let (outcome, signals) = runtime.block_on(async {
        let mut signals = match Signals::new() {
            Ok(signals) => signals,
            Err(e) => return (Ok(Err(e)), None),
        };
        let outcome = tokio::select! {
            // Work that ended is reported as ended, whatever signal is ready with it.
            biased;
            done = work() => Ok(done),
            stopped = signals.next() => Err(stopped),
        };
        (outcome, Some(signals))
    });
    // The servers are killed first, whatever signal comes meanwhile (a second Ctrl-C
    // included, which would otherwise leave some running): the handlers stay installed and
    // keep it, and act once the runtime is down.
    runtime.shutdown_timeout(STRAGGLERS);
    if let Some(signals) = signals {
        exit_on_signal(signals);
    }
    outcome
}

/// From now on, a signal of `signals` ends the process with 128 + its number, saying so:
/// what the rest of a command does (writing its report, a store's queries, or killing its
/// servers after a first signal) stops as it would have with no handler installed. Waits
/// on a thread of its own, with a runtime of its own to read the signals.
fn exit_on_signal(mut signals: Signals) {
    let waiter = std::thread::Builder::new()
        .name("psych-signals".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                let stopped = signals.next().await;
                crate::err_line(format_args!("psych: {}: stopped", stopped.name));
                std::process::exit(i32::from(stopped.status()));
            });
        });
    // Without the thread the signals stay handled and do nothing: said, not fatal.
    if let Err(error) = waiter {
        crate::err_line(format_args!(
            "psych: cannot wait for signals ({error}): SIGINT, SIGTERM and SIGHUP no longer \
             stop this command"
        ));
    }
}
