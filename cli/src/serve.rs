//! `psych serve`: the gateway library ([`psych_gateway`]) under a tokio runtime, on stdio or
//! a loopback HTTP address, stopped by SIGTERM or SIGINT.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use psych_gateway::{GatewaySettings, Listener, SHUTDOWN_WITHIN, disclosure_settings, serve};
use psych_mcp::McpConfig;

/// How long the exit waits for what is left in tokio's blocking pool once every task was
/// awaited: only tokio's read of stdin, which never ends while the client keeps its end
/// open (or, after a second signal, whatever was abandoned).
const STRAGGLERS: Duration = Duration::from_millis(100);

/// Runs the gateway for `config` until its client leaves (stdio) or a SIGTERM or SIGINT
/// stops it (either transport), with an auto budget of `auto_budget` tokens and at most
/// `max_sessions` HTTP sessions at once, logs under `<dir>/serve/`. With `http`, prints
/// `listening on http://ADDR/mcp` on stdout once the gateway has started on the bound
/// address (port 0 picks one).
///
/// The first signal starts a graceful shutdown (bounded by [`SHUTDOWN_WITHIN`]); a second
/// one exits at once.
pub(crate) fn run(
    config: McpConfig,
    dir: &Path,
    http: Option<SocketAddr>,
    auto_budget: u64,
    max_sessions: usize,
) -> Result<u8, String> {
    let mut settings = GatewaySettings::new(dir)
        .and_then(|s| Ok(s.disclosure(disclosure_settings(auto_budget)?)))
        .map_err(|e| crate::reason::chain(&e))?
        .max_sessions(max_sessions)
        .report(|line| eprintln!("psych serve: {line}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let outcome = runtime.block_on(async {
        let mut signals = Signals::new()?;
        let listener = match http {
            None => Listener::Stdio,
            Some(addr) => {
                if !addr.ip().is_loopback() {
                    return Err(format!("--http: {addr} is not a loopback address"));
                }
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| format!("--http {addr}: {e}"))?;
                let local = listener
                    .local_addr()
                    .map_err(|e| format!("--http {addr}: {e}"))?;
                // Said once the gateway has started, not when the address is bound: a
                // script taking the line as ready finds a gateway that answers.
                settings = settings.on_ready(move || {
                    eprintln!("psych serve: listening on http://{local}/mcp");
                    println!("listening on http://{local}/mcp");
                });
                Listener::Http(listener)
            }
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async {
            let _ = stopped.await;
        };
        let serving = serve(config, listener, settings, shutdown);
        let mut serving = std::pin::pin!(serving);
        let mut stop = Some(stop);
        loop {
            tokio::select! {
                served = &mut serving => {
                    return served.map(|()| 0).map_err(|e| crate::reason::chain(&e));
                }
                name = signals.next() => match stop.take() {
                    Some(stop) => {
                        eprintln!(
                            "psych serve: {name}: shutting down (within {} s; a second \
                             signal exits at once)",
                            SHUTDOWN_WITHIN.as_secs()
                        );
                        let _ = stop.send(());
                    }
                    None => return Err(format!("{name} again: exiting at once")),
                },
            }
        }
    });
    // Every task was awaited (or, after a second signal, is abandoned: dropping the
    // manager's tasks kills the upstream groups). What may remain is tokio's blocking read
    // of stdin, which must not hold the exit.
    runtime.shutdown_timeout(STRAGGLERS);
    outcome
}

/// SIGTERM and SIGINT, as one stream of signals.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (from then on neither signal ends the process by itself).
    fn new() -> Result<Self, String> {
        use tokio::signal::unix::{SignalKind, signal};
        let install = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| format!("cannot handle {name}: {e}"))
        };
        Ok(Self {
            term: install(SignalKind::terminate(), "SIGTERM")?,
            int: install(SignalKind::interrupt(), "SIGINT")?,
        })
    }

    /// The next signal's name. Cancel-safe (each `recv` is).
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
