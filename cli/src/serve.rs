//! `psych serve`: the gateway library ([`psych_gateway`]) under a tokio runtime, on stdio or
//! a loopback HTTP address, shut down cleanly by SIGTERM, SIGINT or SIGHUP
//! ([`crate::signals`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use psych_gateway::{
    GatewaySettings, Listener, Retention, SHUTDOWN_WITHIN, Tokens, disclosure_settings, serve,
};
use psych_mcp::McpConfig;

/// How long the exit waits for what is left in tokio's blocking pool once every task was
/// awaited: only tokio's read of stdin, which never ends while the client keeps its end
/// open (or, after a second signal, whatever was abandoned).
const STRAGGLERS: Duration = Duration::from_millis(100);

/// What `psych serve` was asked for.
pub(crate) struct Options {
    /// The upstream servers.
    pub(crate) config: McpConfig,
    /// Logs under `<dir>/serve/<identity>/`.
    pub(crate) dir: PathBuf,
    /// Streamable HTTP on this address instead of stdio.
    pub(crate) http: Option<SocketAddr>,
    /// The auto budget, in tokens.
    pub(crate) auto_budget: u64,
    /// The most HTTP sessions open at once.
    pub(crate) max_sessions: usize,
    /// The most of them one identity of `tokens` holds (default: half).
    pub(crate) max_sessions_per_identity: Option<usize>,
    /// How long an HTTP session may be idle (no message, no call in flight).
    pub(crate) session_idle: std::time::Duration,
    /// Over HTTP, the tokens a request must present.
    pub(crate) tokens: Option<Tokens>,
    /// What is kept of each identity's results.
    pub(crate) retention: Retention,
    /// The most stored text one call passes by reference, in bytes.
    pub(crate) max_passed_bytes: u64,
    /// The most passed text the process holds at once, in bytes.
    pub(crate) passing_budget: u64,
    /// What results too large for memory may hold on disk at once.
    pub(crate) spill_budget: psych_mcp::SpillBudget,
    /// Start every server at once, none on demand.
    pub(crate) eager: bool,
    /// A `postgres://` URL: records and the catalogue there instead of in files.
    pub(crate) store: Option<String>,
    /// Learned pinning's budget in tokens, when it is on.
    pub(crate) pin_budget: Option<u64>,
}

/// The name of the key, in a store's shared keys, that `psych serve` seals the state of
/// multi-round calls with.
const REQUEST_STATE_KEY: &str = "psych serve requestState";

/// Opens the store at `url` (blocking: before the runtime starts).
pub(crate) fn open_store(url: &str) -> Result<psych_store_postgres::PgBlocking, String> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(format!(
            "--store {url:?}: only a postgres:// URL is supported (records in files are \
             the default, under --dir)"
        ));
    }
    psych_store_postgres::PgBlocking::open(url)
        .map_err(|e| format!("--store: {}", crate::reason::chain(&e)))
}

/// Runs the gateway until its client leaves (stdio) or a SIGTERM or SIGINT stops it
/// (either transport). With `http`, prints `listening on http://ADDR/mcp` on stdout once
/// the gateway has started on the bound address (port 0 picks one); an address beyond
/// loopback is refused without tokens.
///
/// The first signal starts a graceful shutdown (bounded by [`SHUTDOWN_WITHIN`]); a second
/// one exits at once.
pub(crate) fn run(options: Options) -> Result<u8, String> {
    let Options {
        config,
        dir,
        http,
        auto_budget,
        max_sessions,
        max_sessions_per_identity,
        session_idle,
        tokens,
        retention,
        max_passed_bytes,
        passing_budget,
        spill_budget,
        eager,
        store,
        pin_budget,
    } = options;
    let authorized = tokens.is_some();
    let mut settings = GatewaySettings::new(dir)
        .and_then(|s| Ok(s.disclosure(disclosure_settings(auto_budget)?)))
        .map_err(|e| crate::reason::chain(&e))?
        .max_sessions(max_sessions)
        .session_idle(session_idle)
        .retention(retention)
        .max_passed_bytes(max_passed_bytes)
        .passing_budget(passing_budget)
        .spill_budget(spill_budget)
        .eager(eager)
        .report(|line| errln!("psych serve: {line}"));
    if let Some(max) = max_sessions_per_identity {
        settings = settings.max_sessions_per_identity(max);
    }
    if let Some(tokens) = tokens {
        settings = settings.tokens(tokens);
    }
    if let Some(budget) = pin_budget {
        settings =
            settings.learned_pinning(psych_disclosure::pinning::PinSettings::with_budget(budget));
    }
    if let Some(url) = store {
        let store = open_store(&url)?;
        // The replicas on one store share the key sealing multi-round calls' state, so a
        // client's retry may reach any of them.
        let key = store
            .shared_key(REQUEST_STATE_KEY)
            .map_err(|e| format!("--store: {}", crate::reason::chain(&e)))?;
        settings = settings
            .request_state_key(key)
            .catalog_in(std::sync::Arc::new(psych_types::Erased(store.catalog())))
            .records_in(std::sync::Arc::new(store));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let outcome = runtime.block_on(async {
        let mut signals = crate::signals::Signals::new()?;
        let listener = match http {
            None => Listener::Stdio,
            Some(addr) => {
                if !addr.ip().is_loopback() && !authorized {
                    return Err(format!(
                        "--http: {addr} is not a loopback address; beyond loopback, give \
                         --tokens so that every request is authorized"
                    ));
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
                    errln!("psych serve: listening on http://{local}/mcp");
                    outln!("listening on http://{local}/mcp");
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
                stopped = signals.next() => match stop.take() {
                    Some(stop) => {
                        errln!(
                            "psych serve: {}: shutting down (within {} s; a second \
                             signal exits at once)",
                            stopped.name,
                            SHUTDOWN_WITHIN.as_secs()
                        );
                        let _ = stop.send(());
                    }
                    None => return Err(format!("{} again: exiting at once", stopped.name)),
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

/// `psych serve-token NAME`: a fresh token on stdout, and on stderr the tokens file entry
/// that makes it name `name`.
pub(crate) fn token(name: &str) -> Result<u8, crate::Failure> {
    let (token, digest) = psych_gateway::new_token().map_err(|e| crate::reason::chain(&e))?;
    // Checked as the file will check it, so the entry printed loads: a name it refuses is
    // a bad argument.
    let entry = serde_json::json!({"identities": {name: {"tokens": [digest]}}}).to_string();
    Tokens::parse(&entry).map_err(|e| crate::Failure::BadArgument(crate::reason::chain(&e)))?;
    errln!("psych serve-token: give the client the token below; put in the tokens file:");
    errln!("  {entry}");
    outln!("{token}");
    Ok(0)
}
