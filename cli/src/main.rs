//! The `psych` command: the prompt budget of any MCP setup (`psych budget`), the search
//! tier's ranking over every catalogue (`psych search`), the orientation payload
//! (`psych orient`), the reader over a record log (`psych read`), and a scripted Run
//! against the embedded servers (`psych demo`).
//!
//! With no `--config`, the commands run against the embedded default: five MCP servers
//! bundled with Psych, each this executable started as a real server process
//! (`psych serve-embedded`, hidden) serving a generated catalogue of 9 to 480 tools.
//!
//! Exit codes: 0 success; 1 the report was printed but at least one server failed (budget,
//! search, orient), or `read` answered a validation error; 2 bad arguments; 3 nothing could
//! be reported (an unreadable configuration, a catalogue that cannot be opened, a log that
//! cannot be read, or a foreign or unknown handle; for `demo`, an embedded server that did
//! not start or a step of the Run that failed); 128 + N stopped by signal N (SIGHUP,
//! SIGINT or SIGTERM: the servers it started are stopped too; `serve` shuts down cleanly on
//! one instead, and exits 0).
//!
//! Output never panics: a closed standard output (`psych search … | head -1`) ends what is
//! printed quietly, and any other failure to write it is said on stderr, exit status 3.

#![forbid(unsafe_code)]

/// `println!` that never panics: a closed stdout (`psych … | head`) ends the output
/// quietly, and another failure is reported at exit ([`out_line`]).
macro_rules! outln {
    () => {
        $crate::out_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out_line(format_args!($($arg)*))
    };
}

/// `print!` that never panics ([`out_text`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out_text(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics: a closed stderr loses the line, nothing else.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::err_line(format_args!($($arg)*))
    };
}

mod budget;
mod demo;
mod reason;
mod serve;
mod setup;
mod signals;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Args, Parser, Subcommand};
use psych_disclosure::SearchIndex;
use serde::Serialize;

const EXIT_CODES: &str = "Exit codes: 0 success; 1 printed, but a server failed (or `read` \
answered a validation error); 2 bad arguments; 3 nothing to report (configuration, \
catalogue or log unreadable; a foreign or unknown handle; a demo server or step failed); \
128 + N stopped by signal N (SIGHUP, SIGINT, SIGTERM; the servers it started stopped too; \
`serve` shuts down cleanly instead and exits 0).";

/// The prompt budget of any MCP setup, and Psych's view of it.
#[derive(Debug, Parser)]
#[command(name = "psych", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Connect every MCP server, sync their catalogues and report what their tools cost in
    /// the prompt, with every schema injected and with Psych.
    ///
    /// Example: `psych budget --config ~/.cursor/mcp.json --context-window 128000`
    #[command(after_help = EXIT_CODES)]
    Budget {
        #[command(flatten)]
        setup: SetupArgs,
        /// The model's context window in tokens; the auto budget is 5% of it.
        #[arg(long, value_name = "TOKENS", default_value_t = setup::WINDOW, conflicts_with = "serve",
              value_parser = clap::value_parser!(u64).range(1..))]
        context_window: u64,
        /// Decide as `psych serve` does for this file: its auto budget (`--auto-budget`),
        /// counted on whole tool definitions. The table then shows what `psych serve`
        /// lists, `read_tool_output` aside.
        #[arg(long)]
        serve: bool,
        /// With `--serve`: the tokens the `auto` servers share, as `psych serve
        /// --auto-budget`.
        #[arg(long, value_name = "TOKENS", requires = "serve", default_value_t = psych_gateway::DEFAULT_AUTO_BUDGET)]
        auto_budget: u64,
        /// With `--serve`: also show what `psych serve --pin-budget TOKENS` would pin from
        /// the sessions logged under `--dir`, or kept in the store when `--store` is a
        /// `postgres://` URL (each used tool of a deferred server: its sessions, calls,
        /// tokens, and why it is pinned or not).
        #[arg(long, value_name = "TOKENS", requires = "serve")]
        pin_budget: Option<u64>,
        /// With `--pin-budget`: the `--dir` of the `psych serve` whose logs to learn from
        /// (not read when `--store` is a `postgres://` URL: the sessions are there).
        #[arg(
            long,
            value_name = "DIR",
            default_value = ".psych",
            requires = "pin_budget"
        )]
        dir: PathBuf,
        /// Print the report as JSON (stable field names) instead of a table.
        #[arg(long)]
        json: bool,
        /// Also report what starting servers on demand saves for this file, measured in
        /// this run: the servers `psych serve` would know from their kept listings (in
        /// `--store`) and not start, their processes' resident memory, and the time to a
        /// complete first listing started lazily vs with every server started.
        #[arg(long)]
        lazy: bool,
    },
    /// Rank every server's tools for a query with the search tier's BM25F index (the tools
    /// the file permits: a server's `allowTools` narrows them, as in `psych serve`).
    ///
    /// Example: `psych search "open a pull request" --limit 5`
    #[command(after_help = EXIT_CODES)]
    Search {
        /// What the tool should do, in words.
        query: String,
        #[command(flatten)]
        setup: SetupArgs,
        /// How many hits to show.
        #[arg(long, default_value_t = 10)]
        limit: usize,
        /// Print the hits as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the orientation payload exactly as the model gets it from `psych_orientation`.
    ///
    /// Example: `psych orient --verbose`
    #[command(after_help = EXIT_CODES)]
    Orient {
        #[command(flatten)]
        setup: SetupArgs,
        /// The verbose payload: uncut context and the full tool map.
        #[arg(long)]
        verbose: bool,
        /// Print the payload as pretty JSON instead of the model's exact text.
        #[arg(long)]
        json: bool,
    },
    /// Read a stored tool result back from a record log, as `read_tool_output` does for
    /// the model.
    ///
    /// Example: `psych read .psych/serve/stdio/run-7.plog run-7:3 --grep ERROR`
    #[command(after_help = EXIT_CODES)]
    Read {
        /// The record log file (`<dir>/<run>.plog`).
        log: PathBuf,
        /// The handle (`<run>:<seq>`).
        handle: String,
        /// Lines to skip (0-based).
        #[arg(long)]
        offset: Option<u64>,
        /// Bytes of the line at `--offset` to skip: reads on in a cut line (its end names
        /// the value).
        #[arg(long)]
        byte: Option<u64>,
        /// Lines to return at most.
        #[arg(long)]
        limit: Option<u64>,
        /// Only lines containing this literal text.
        #[arg(long)]
        grep: Option<String>,
    },
    /// Play a scripted multi-turn Run against the embedded servers and print, step by step,
    /// each request's size, the bytes it reuses, what was elided and what the reader read.
    ///
    /// Offline and deterministic: the model is a script, the clock fixed. Example:
    /// `psych demo --dump demo-requests`
    #[command(after_help = EXIT_CODES)]
    Demo {
        /// Write every rendered request body into this folder: Anthropic Messages, OpenAI
        /// Chat Completions and OpenAI Responses JSON (`NN-turnT-stepS.anthropic.json`,
        /// `….openai.json`, `….responses.json`).
        #[arg(long, value_name = "DIR")]
        dump: Option<PathBuf>,
    },
    /// Serve every MCP server of the file to one MCP client, as one MCP server with Psych's
    /// disclosure: direct tools, facades or search pairs, the meta tools for deferred
    /// servers, `read_tool_output` and the orientation tool; large results elided and
    /// logged whole under `<dir>/serve/<identity>/`, their handles readable by the same
    /// identity on any later connection and after a restart.
    ///
    /// Example, in a client's config: `"psych": {"command": "psych", "args": ["serve",
    /// "--config", "/home/me/.psych/mcp.json", "--dir", "/home/me/.psych"]}` (an absolute
    /// `--dir`: a client may start `psych` in any directory, `/` included).
    #[command(after_help = EXIT_CODES)]
    Serve {
        /// An `mcpServers` file; the embedded default servers when absent. A server entry
        /// may narrow its grant with `"allowTools": ["tool", ...]`.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Serve streamable HTTP on this address instead of stdio: a loopback address, or
        /// any with `--tokens`.
        #[arg(long, value_name = "ADDR")]
        http: Option<std::net::SocketAddr>,
        /// With `--http`: every request must present `Authorization: Bearer TOKEN` with a
        /// token of this file, which names its identity: {"identities": {"alice":
        /// {"tokens": ["sha256:HEX"], "allowTools": {"server": ["tool"], "other": "*"}}}}
        /// (`psych serve-token NAME` makes a token; `allowTools`, optional, narrows the
        /// identity's grant to the servers and tools it names). Without it,
        /// every HTTP client is the one identity `loopback`; over stdio the client is
        /// `stdio`.
        #[arg(long, value_name = "FILE", requires = "http")]
        tokens: Option<PathBuf>,
        /// Where the record logs go (`<dir>/serve/<identity>/<run>.plog`).
        #[arg(long, value_name = "DIR", default_value = ".psych")]
        dir: PathBuf,
        /// Days an identity's results are kept (whole log segments; a handle of a deleted
        /// one answers that it expired).
        #[arg(long, value_name = "DAYS", default_value_t = 7, value_parser = clap::value_parser!(u64).range(1..))]
        retain_days: u64,
        /// MiB of results kept per identity (the segments' checkpoints counted with them), the
        /// oldest segments deleted first.
        #[arg(long, value_name = "MIB", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
        retain_mib: u64,
        /// MiB of logged results one call may pass by reference (`{"$psych_result":
        /// HANDLE}` in its arguments) and one `resources/read` answer may hold; 0 refuses
        /// every reference, and an elided result then carries no `resource_link`.
        #[arg(long, value_name = "MIB", default_value_t = psych_reader_tool::DEFAULT_MAX_PASSED_BYTES >> 20)]
        max_passed_mib: u64,
        /// MiB of passed result text every call and `resources/read` answer of this process
        /// hold at once, every identity together: a call passing results reserves its
        /// `--max-passed-mib` first, waiting while the budget cannot give it, and gives back
        /// what it did not read. At least `--max-passed-mib`. With `--tokens` naming several
        /// identities, one identity holds at most half of it (at least `--max-passed-mib`).
        #[arg(long, value_name = "MIB", default_value_t = psych_gateway::DEFAULT_PASSING_BUDGET >> 20)]
        passing_budget_mib: u64,
        /// MiB that results too large for memory (over 16 MiB) may hold at once in
        /// `<dir>/spill/` while they arrive and until they are logged, across every upstream,
        /// call and identity of this process; a result that would pass it is not kept, and
        /// its call answers a tool error saying so. A result needs about twice its size
        /// while it is split up, so the largest kept is about half the budget; 0 keeps none.
        #[arg(long, value_name = "MIB", default_value_t = psych_mcp::DEFAULT_SPILL_BUDGET >> 20)]
        spill_budget_mib: u64,
        /// Estimated tokens the tool definitions of the servers with preload `auto` (the
        /// default) share in the listing; the servers that do not fit are deferred.
        ///
        /// Smallest server first, each is kept (direct tools, or a facade or search pair by
        /// size) while the kept ones' whole definitions fit; the rest are deferred behind
        /// the meta tools. 0 defers every `auto` server. Small by default because the
        /// listing rides on every request of a client whose window and other tools Psych
        /// cannot see: with Psych's own tools (about 850 tokens) it stays near 2,000 tokens
        /// however many servers are configured. `"preload": true` or `false` on a server
        /// pins it and takes no share.
        #[arg(long, value_name = "TOKENS", default_value_t = psych_gateway::DEFAULT_AUTO_BUDGET)]
        auto_budget: u64,
        /// Learned pinning: at start, list as direct tools the tools of deferred servers
        /// that the 20 most recent sessions logged under `--dir` (with `--store`: kept in
        /// the store, by every replica) used most (in at least 2 of them and a quarter),
        /// their definitions within TOKENS; kept until the process ends, so the listing
        /// does not change under a client. What it would pin: `psych budget --serve
        /// --pin-budget TOKENS` (with the same `--store`). Off by default.
        #[arg(long, value_name = "TOKENS")]
        pin_budget: Option<u64>,
        /// With `--http`: the most sessions open at once; a client opening one more is
        /// refused (HTTP 503, `Retry-After: 1`) with an error saying so. A session ends when
        /// its client deletes it, or after `--session-idle-secs` without a message or request
        /// for it and with no call in flight; a request of MCP 2026-07-28 holds one while it
        /// runs.
        #[arg(
            long,
            value_name = "N",
            default_value_t = psych_gateway::MAX_SESSIONS,
            value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
        )]
        max_sessions: usize,
        /// With `--http --tokens`: the most of those sessions one identity holds at once
        /// (all its tokens together; a request of 2026-07-28 holds one while it runs); one
        /// more is refused the same way. Default: half of `--max-sessions`, so that one
        /// identity's clients leave the others room (all of them for a file of one
        /// identity). While another identity is refused for want of room, one at its fair
        /// share (`--max-sessions` over the identities active now) takes no more.
        #[arg(
            long,
            value_name = "N",
            requires = "tokens",
            value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
        )]
        max_sessions_per_identity: Option<usize>,
        /// With `--http`: a session (of a client of a revision before 2026-07-28) is closed,
        /// its slot freed, after this many seconds without a message either way or an HTTP
        /// request for it and with no call in flight; a call running longer keeps its
        /// session.
        #[arg(
            long,
            value_name = "SECS",
            default_value_t = psych_gateway::SESSION_IDLE.as_secs(),
            value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..)
        )]
        session_idle_secs: u64,
        /// Start every server at once. By default a server whose listing is kept in
        /// `<dir>/catalog.redb` and younger than its `listingTtlSecs` (default 7 days) is
        /// known from it and started only when a call needs it, then stopped after
        /// `idleSecs` (default 300) without a call; `"lazy": false` in a server's entry
        /// starts that one at once. A server never listed starts at once (its listing, kept,
        /// makes it lazy from the next start).
        #[arg(long)]
        eager: bool,
        /// Keep the records and the catalogue in PostgreSQL instead of files under
        /// `<dir>/serve/` and `<dir>/catalog.redb`:
        /// `postgres://USER@HOST:PORT/DATABASE?schema=NAME` (`schema` default `psych`,
        /// `pool_size` default 16; tables created and migrated by the gateway). Every
        /// `psych serve` on the same database and schema (replicas behind one address)
        /// reads the handles the others minted for the same identity and lists the same
        /// tools: one replica lists an upstream server at a time, and a change one stores
        /// reaches every replica's clients as `list_changed`. Give replicas the same
        /// servers. `--retain-days` and `--retain-mib` apply to the store's Runs as to
        /// files (in one replica at a time; never a Run a live replica holds open).
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
    /// Make a bearer token for `psych serve --tokens`: prints the token on stdout (give it to
    /// the client) and, on stderr, the digest to put in the tokens file under NAME.
    ServeToken {
        /// The identity the token names.
        name: String,
    },
    /// Serve one embedded catalogue over stdio (started by the other commands).
    #[command(hide = true)]
    ServeEmbedded {
        /// The test server's flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Debug, Args)]
struct SetupArgs {
    /// An `mcpServers` file (Claude Desktop, Cursor, Claude Code); the embedded default
    /// servers when absent.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The redb catalogue the listings are synced into, or a `postgres://` URL: the
    /// catalogue `psych serve --store` replicas share.
    #[arg(long, value_name = "FILE|URL", default_value = ".psych/catalog.redb")]
    store: PathBuf,
}

/// A failure that leaves nothing to report: exit status 3.
const FATAL: u8 = 3;
/// Bad arguments: exit status 2 (as clap's own refusals).
const BAD_ARGUMENTS: u8 = 2;

/// Why a command ended without its report.
#[derive(Debug)]
enum Failure {
    /// Nothing could be reported: exit status 3.
    Fatal(String),
    /// An argument clap let through is not usable (a malformed handle, a bad name): 2.
    BadArgument(String),
    /// A signal stopped the command: 128 + its number.
    Stopped(signals::Stopped),
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self::Fatal(message)
    }
}

/// Set once writing stdout failed: nothing more is written to it.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
/// The first failure writing stdout that was not a closed pipe, said at exit.
static STDOUT_FAILED: Mutex<Option<String>> = Mutex::new(None);

/// Writes `text` to stdout unless it failed before. A closed pipe (the reader gone:
/// `psych demo | head`) stops the output quietly; another failure (a full disk) is kept
/// for [`main`] to report. Never panics, unlike `print!`.
fn out_text(text: std::fmt::Arguments<'_>) {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
        if error.kind() != std::io::ErrorKind::BrokenPipe {
            let mut failed = STDOUT_FAILED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            failed.get_or_insert_with(|| error.to_string());
        }
    }
}

/// [`out_text`] with a newline.
fn out_line(text: std::fmt::Arguments<'_>) {
    out_text(format_args!("{text}\n"));
}

/// Writes a line to stderr; a failure loses the line (there is nowhere left to say it).
fn err_line(text: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match run(cli.command) {
        Ok(code) => code,
        Err(Failure::Fatal(message)) => {
            errln!("psych: {message}");
            FATAL
        }
        Err(Failure::BadArgument(message)) => {
            errln!("psych: {message}");
            BAD_ARGUMENTS
        }
        Err(Failure::Stopped(stopped)) => {
            errln!(
                "psych: {}: stopped; the servers it started were stopped",
                stopped.name
            );
            stopped.status()
        }
    };
    let failed = STDOUT_FAILED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(error) = failed {
        errln!("psych: cannot write the output: {error}");
        return ExitCode::from(code.max(FATAL));
    }
    ExitCode::from(code)
}

fn print_json<T: Serialize>(value: &T) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    outln!("{text}");
    Ok(())
}

fn run(command: Command) -> Result<u8, Failure> {
    match command {
        Command::Budget {
            setup,
            context_window,
            serve,
            auto_budget,
            pin_budget,
            dir,
            json,
            lazy,
        } => {
            let (settings, basis) = if serve {
                let settings = psych_gateway::disclosure_settings(auto_budget)
                    .and_then(|settings| psych_gateway::listing_settings(&settings))
                    .map_err(|e| format!("settings: {e}"))?;
                (settings, budget::Basis::Serve)
            } else {
                (
                    setup::settings(context_window)?,
                    budget::Basis::Window(context_window),
                )
            };
            let loaded = setup::load(setup.config.as_deref(), &setup.store, settings, lazy)?;
            let mut report = budget::report(
                &loaded,
                setup::config_label(setup.config.as_deref()),
                basis,
                lazy,
            );
            if let Some(tokens) = pin_budget {
                let pinning = psych_disclosure::pinning::PinSettings::with_budget(tokens);
                let estimator = psych_elision::Estimator::new();
                report.pins = Some(if let Some(stores) = &loaded.records {
                    // The sessions every replica kept in the store.
                    let usage = psych_gateway::store_usage(
                        stores,
                        &psych_types::Identities::AllBut(Vec::new()),
                    )
                    .map_err(|e| format!("--store: {}", reason::chain(&e)))?;
                    psych_disclosure::pinning::choose(
                        &usage,
                        &loaded.surface,
                        &loaded.catalogs,
                        &estimator,
                        &pinning,
                    )
                } else {
                    let logs = psych_gateway::GatewaySettings::new(&dir)
                        .map_err(|e| format!("settings: {e}"))?
                        .logs();
                    psych_gateway::learned_pins(
                        &logs,
                        &loaded.surface,
                        &loaded.catalogs,
                        &estimator,
                        &pinning,
                    )
                });
            }
            if json {
                print_json(&report)?;
            } else {
                out!("{}", budget::table(&report));
            }
            Ok(status(&loaded))
        }
        Command::Search {
            query,
            setup,
            limit,
            json,
        } => {
            let loaded = setup::load(
                setup.config.as_deref(),
                &setup.store,
                setup::settings(setup::WINDOW)?,
                false,
            )?;
            // The Surface's permitted set, as `psych serve`'s search tier indexes it: a
            // server's `allowTools` narrows what is searched (and so the words' weights).
            let permitted = loaded.surface.permitted();
            let index = SearchIndex::new(loaded.catalogs.iter().flat_map(|c| {
                let tools = permitted.tools(&c.server);
                c.tools
                    .iter()
                    .filter(move |t| tools.is_some_and(|tools| tools.contains(&t.name)))
                    .map(move |t| (&c.server, t))
            }));
            let ranking = index.rank(&query, limit);
            let note = ranking.note(&query);
            let hits: Vec<Hit> = ranking
                .hits
                .into_iter()
                .map(|(target, score)| {
                    let description = loaded
                        .catalogs
                        .iter()
                        .find(|c| c.server == target.server)
                        .and_then(|c| c.tools.iter().find(|t| t.name == target.tool))
                        .and_then(|t| t.description.as_deref())
                        .and_then(|d| d.lines().next())
                        .map(str::to_owned)
                        .unwrap_or_default();
                    Hit {
                        tool: format!("{}/{}", target.server, target.tool),
                        score: (score * 1000.0).round() / 1000.0,
                        description,
                    }
                })
                .collect();
            if json {
                print_json(&SearchReport {
                    query,
                    indexed: index.len(),
                    hits,
                    note,
                })?;
            } else {
                outln!(
                    "{} hits for {query:?} among {} tools",
                    hits.len(),
                    index.len()
                );
                for hit in &hits {
                    let line = format!("{:>7.3}  {}  {}", hit.score, hit.tool, hit.description);
                    outln!("{}", truncate(&line, 80));
                }
                if let Some(note) = &note {
                    outln!("{note}");
                }
            }
            Ok(status(&loaded))
        }
        Command::Orient {
            setup,
            verbose,
            json,
        } => {
            let loaded = setup::load(
                setup.config.as_deref(),
                &setup.store,
                setup::settings(setup::WINDOW)?,
                false,
            )?;
            let text = budget::orientation_text(&loaded, verbose, true);
            if json {
                let value: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| e.to_string())?;
                print_json(&value)?;
            } else {
                outln!("{text}");
            }
            Ok(status(&loaded))
        }
        Command::Read {
            log,
            handle,
            offset,
            byte,
            limit,
            grep,
        } => read(
            &log,
            // What is not given is null, which `read_tool_output` takes for absent.
            &serde_json::json!({
                "handle": handle, "offset": offset, "byte": byte, "limit": limit, "grep": grep
            }),
        ),
        Command::Demo { dump } => demo::run(dump.as_deref()),
        Command::ServeEmbedded { args } => Ok(serve_embedded(args)?),
        Command::Serve {
            config,
            http,
            dir,
            auto_budget,
            max_sessions,
            max_sessions_per_identity,
            session_idle_secs,
            tokens,
            retain_days,
            retain_mib,
            max_passed_mib,
            passing_budget_mib,
            spill_budget_mib,
            eager,
            store,
            pin_budget,
        } => {
            let config = match config {
                Some(path) => psych_mcp::McpConfig::load(&path).map_err(|e| e.to_string())?,
                None => setup::embedded_config()?,
            };
            // Flags that cannot go together, refused as bad arguments (exit 2) before
            // anything starts: the gateway would refuse each later, as a failure.
            if let Some(addr) = http
                && !addr.ip().is_loopback()
                && tokens.is_none()
            {
                return Err(Failure::BadArgument(format!(
                    "--http: {addr} is not a loopback address; beyond loopback, give --tokens \
                     so that every request is authorized"
                )));
            }
            if passing_budget_mib < max_passed_mib {
                return Err(Failure::BadArgument(format!(
                    "the passing budget (--passing-budget-mib {passing_budget_mib}) is less \
                     than --max-passed-mib {max_passed_mib}: it must hold one call's passed \
                     results"
                )));
            }
            if let Some(url) = store.as_deref().filter(|url| !setup::is_store_url(url)) {
                return Err(Failure::BadArgument(format!(
                    "--store {url:?}: only a postgres:// URL is supported (records in files \
                     are the default, under --dir)"
                )));
            }
            if !config.disabled.is_empty() {
                errln!(
                    "psych serve: left out (\"disabled\": true in the config): {}",
                    config.disabled.join(", ")
                );
            }
            let tokens = tokens
                .map(|path| psych_gateway::Tokens::load(&path))
                .transpose()
                .map_err(|e| reason::chain(&e))?;
            let retention = psych_gateway::Retention {
                max_age: std::time::Duration::from_secs(retain_days.saturating_mul(86_400)),
                max_bytes: retain_mib.saturating_mul(1 << 20),
            };
            Ok(serve::run(serve::Options {
                config,
                dir,
                http,
                auto_budget,
                max_sessions,
                max_sessions_per_identity,
                session_idle: std::time::Duration::from_secs(session_idle_secs),
                tokens,
                retention,
                max_passed_bytes: max_passed_mib.saturating_mul(1 << 20),
                passing_budget: passing_budget_mib.saturating_mul(1 << 20),
                spill_budget: psych_mcp::SpillBudget::new(spill_budget_mib.saturating_mul(1 << 20)),
                eager,
                store,
                pin_budget,
            })?)
        }
        Command::ServeToken { name } => serve::token(&name),
    }
}

/// One hit of `psych search --json`.
#[derive(Debug, Serialize)]
struct Hit {
    /// `server/tool`.
    tool: String,
    /// The ranking's score, rounded to 3 decimals; comparable within one query only.
    score: f64,
    /// The first line of the tool's description.
    description: String,
}

/// What `psych search --json` prints.
#[derive(Debug, Serialize)]
struct SearchReport {
    /// The query as given.
    query: String,
    /// Tools indexed across every server.
    indexed: usize,
    /// Best first.
    hits: Vec<Hit>,
    /// When nothing matched or only weakly: says so and names the closest servers.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

fn truncate(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_owned();
    }
    let mut cut: String = line.chars().take(width - 1).collect();
    cut.push('…');
    cut
}

/// 1 when a server failed, else 0.
fn status(setup: &setup::Setup) -> u8 {
    u8::from(setup.outcomes.iter().any(|o| o.error.is_some()))
}

fn read(log: &std::path::Path, arguments: &serde_json::Value) -> Result<u8, Failure> {
    use psych_reader_tool::{CallError, HandleProblem, InvalidHandle, Reader};
    use psych_record_log::RecordLog;
    use psych_types::RunId;

    // The log is opened by its Run's name in its folder: a file of another extension would
    // have `<run>.plog` beside it read instead.
    let run = log
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|_| log.extension().is_some_and(|e| e == "plog"))
        .ok_or_else(|| {
            Failure::BadArgument(format!(
                "{}: not a record log's file name (`<run>.plog`)",
                log.display()
            ))
        })?;
    if !log.is_file() {
        return Err(Failure::Fatal(format!(
            "{}: no such record log",
            log.display()
        )));
    }
    let run =
        RunId::new(run).map_err(|e| Failure::BadArgument(format!("{}: {e}", log.display())))?;
    let dir = log.parent().unwrap_or_else(|| std::path::Path::new("."));
    // Read-only: a log another process is appending to is read as it is, not locked,
    // cut or synced.
    let (log, _) = RecordLog::open_read_only(dir, &run)
        .map_err(|e| format!("{}: {e}", RecordLog::path_for(dir, &run).display()))?;
    match Reader::new(&log).call(arguments) {
        Ok(answer) => {
            outln!("{}", answer.render());
            Ok(u8::from(answer.is_error()))
        }
        // The error's text starts with its code (`invalid_deferred_handle: …`); a handle
        // that does not parse is a bad argument.
        Err(error) => {
            let malformed = matches!(
                &error,
                CallError::InvalidDeferredHandle(InvalidHandle {
                    problem: HandleProblem::Malformed(_),
                    ..
                })
            );
            let message = error.to_string();
            Err(if malformed {
                Failure::BadArgument(message)
            } else {
                Failure::Fatal(message)
            })
        }
    }
}

fn serve_embedded(args: Vec<String>) -> Result<u8, String> {
    let (scenario, mode) = psych_test_server::Scenario::from_args(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime
        .block_on(scenario.serve(mode))
        .map_err(|e| format!("serve-embedded: {e}"))?;
    Ok(0)
}
