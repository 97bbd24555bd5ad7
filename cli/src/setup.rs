//! The MCP setup a command works on: the `mcpServers` file (or the embedded default),
//! connected, listed and synced into the redb catalogue, then resolved into a Surface the
//! way a turn would be.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use psych_catalog::{Catalog, FreshenerConfig};
use psych_disclosure::{Budget, Inputs, Settings, Surface, resolve};
use psych_elision::Estimator;
use psych_mcp::{McpConfig, McpManager};
use psych_runtime::{CatalogSync, FirstSyncError, ListingSources, StartAt, start_at};
use psych_types::{PermissionGrant, Reachability, ServerCatalog, ServerId};

/// The embedded servers: name (also the [`psych_test_server::SyntheticKind`] whose vocabulary and
/// schema style its generated tools have), tool count, and description. Sizes and shapes
/// follow `../shared/fixtures/catalogs/`: server-memory (9 tools), server-filesystem (14),
/// notion (24), github (117), and a suite of several hundred, the size at which a facade's
/// index no longer fits.
pub(crate) const EMBEDDED: [(&str, usize, &str); 5] = [
    (
        "notes",
        9,
        "Notes and reminders (shaped like server-memory).",
    ),
    (
        "files",
        14,
        "Workspace files (shaped like server-filesystem).",
    ),
    (
        "wiki",
        24,
        "Team wiki pages and databases (shaped like notion).",
    ),
    (
        "forge",
        117,
        "Code hosting: issues, pull requests, CI (shaped like github).",
    ),
    (
        "suite",
        480,
        "An all-in-one business suite: CRM, billing, support, docs, HR.",
    ),
];

/// The hidden subcommand that serves one embedded catalogue.
pub(crate) const SERVE: &str = "serve-embedded";

/// The embedded default as an `mcpServers` file: each server is this executable run as
/// `psych serve-embedded --kind NAME --tools N --no-control-tools`, a real MCP server
/// process.
pub(crate) fn embedded_config() -> Result<McpConfig, String> {
    let exe = std::env::current_exe().map_err(|e| {
        format!("cannot find the psych executable to start the embedded servers: {e}")
    })?;
    // A JSON string: a path that is not UTF-8 cannot be written in the file.
    let exe = exe.to_str().ok_or_else(|| {
        format!(
            "the psych executable's path {} is not UTF-8, so the embedded servers cannot \
             be started from it; give --config",
            exe.display()
        )
    })?;
    let mut servers = serde_json::Map::new();
    for (name, tools, description) in EMBEDDED {
        servers.insert(
            name.to_owned(),
            serde_json::json!({
                "command": exe,
                "args": [SERVE, "--kind", name, "--tools", tools.to_string(), "--no-control-tools"],
                "description": description,
            }),
        );
    }
    let text = serde_json::json!({ "mcpServers": servers }).to_string();
    McpConfig::parse(&text, |_| None).map_err(|e| format!("the embedded configuration: {e}"))
}

/// Where the config came from, for reports.
pub(crate) fn config_label(path: Option<&Path>) -> String {
    match path {
        Some(path) => path.display().to_string(),
        None => "embedded default".to_owned(),
    }
}

/// What starting servers on demand saves for a file, measured while a command lists every
/// server (`psych budget --lazy`).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct LazyFigures {
    /// The servers of the file.
    pub(crate) servers: usize,
    /// Of them, those `psych serve` would know from their kept listings and start only at
    /// their first call: processes a lazy start does not start.
    pub(crate) not_started: usize,
    /// The resident memory of those servers' processes (their whole process groups) while
    /// they ran here after their listing, in KiB: what a lazy start does not hold.
    pub(crate) not_started_rss_kib: u64,
    /// Starting every server at once: the time from the start until the last server was
    /// listed (when a complete listing could first be answered), in milliseconds.
    pub(crate) eager_first_answer_ms: u64,
    /// Starting on demand: the kept listings read and resolved, and the servers that start
    /// at once listed (their times from the same run), in milliseconds.
    pub(crate) lazy_first_answer_ms: u64,
}

/// The file's grant, the catalogue's live sets of the file's servers, and the Surface they
/// resolve to with `settings`, as a turn would resolve it. Blocks (redb reads).
fn resolved(
    config: &McpConfig,
    catalog: &Catalog,
    settings: &Settings,
) -> Result<(PermissionGrant, Vec<ServerCatalog>, Surface), String> {
    let connections: Vec<_> = config
        .servers
        .values()
        .map(|entry| entry.connection.clone())
        .collect();
    let grant = config.grant().map_err(|e| e.to_string())?;
    let catalogs: Vec<ServerCatalog> = catalog
        .live_all()
        .map_err(|e| format!("reading the catalogue: {e}"))?
        .into_iter()
        .filter(|c| config.servers.contains_key(&c.server))
        .collect();
    let inputs = Inputs {
        connections: &connections,
        catalogs: &catalogs,
        grant: &grant,
    };
    let surface = resolve(&inputs, settings, &Estimator::new())
        .map_err(|e| format!("resolving the tool surface: {e}"))?;
    Ok((grant, catalogs, surface))
}

/// The lazy start's figures from this run: every server's listing time (its sync stamp,
/// from `started`), the kept Surface's resolution time, and the resident memory of the
/// servers `psych serve` would not start.
fn lazy_figures(
    catalog: &Catalog,
    starts: &BTreeMap<ServerId, StartAt>,
    outcomes: &[Outcome],
    started: u64,
    kept_resolved: std::time::Duration,
) -> LazyFigures {
    let listed_after = |server: &ServerId| {
        catalog
            .health(server)
            .ok()
            .and_then(|h| h.last_sync)
            .map_or(0, |sync| sync.at.saturating_sub(started))
    };
    let on_demand =
        |server: &ServerId| matches!(starts.get(server), Some(StartAt::OnDemand { .. }));
    let eager = outcomes
        .iter()
        .map(|o| listed_after(&o.server))
        .max()
        .unwrap_or(0);
    let at_once = outcomes
        .iter()
        .filter(|o| !on_demand(&o.server))
        .map(|o| listed_after(&o.server))
        .max()
        .unwrap_or(0);
    let resolved = u64::try_from(kept_resolved.as_millis()).unwrap_or(u64::MAX);
    LazyFigures {
        servers: outcomes.len(),
        not_started: outcomes.iter().filter(|o| on_demand(&o.server)).count(),
        not_started_rss_kib: outcomes
            .iter()
            .filter(|o| on_demand(&o.server))
            .filter_map(|o| o.rss_kib)
            .sum(),
        eager_first_answer_ms: eager,
        lazy_first_answer_ms: resolved.max(at_once),
    }
}

/// The resident memory of each server's process group, in KiB, from one pass over `/proc`
/// (empty where there is none). Blocks: run it on the blocking pool.
fn groups_rss_kib(groups: &[(ServerId, i32)]) -> BTreeMap<ServerId, u64> {
    let mut rss = BTreeMap::new();
    if groups.is_empty() {
        return rss;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return rss;
    };
    for entry in entries.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp …: the fields after the command's closing parenthesis.
        let group = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(2))
            .and_then(|g| g.parse::<i32>().ok());
        let Some((server, _)) = groups.iter().find(|(_, pgid)| Some(*pgid) == group) else {
            continue;
        };
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
        *rss.entry(server.clone()).or_insert(0) += kib.unwrap_or(0);
    }
    rss
}

/// One server after connecting and listing.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) server: ServerId,
    /// The resident memory of its process group after its listing, in KiB (stdio servers
    /// that ran; `None` otherwise).
    pub(crate) rss_kib: Option<u64>,
    /// `None` when it connected and listed; the reason otherwise.
    pub(crate) error: Option<String>,
    /// Tools the server declared that were refused, with the reason.
    pub(crate) malformed: Vec<String>,
    /// Tools in its live catalogue (for the progress line).
    pub(crate) tools: usize,
}

/// A synced setup, resolved.
pub(crate) struct Setup {
    pub(crate) config: McpConfig,
    pub(crate) outcomes: Vec<Outcome>,
    pub(crate) catalogs: Vec<ServerCatalog>,
    /// How `psych serve` on the same catalogue would start each server, as decided from
    /// what the catalogue held before this command listed them.
    /// Empty when another process held the catalogue (unknown).
    pub(crate) starts: BTreeMap<ServerId, StartAt>,
    /// What a lazy start saves for this file, measured in this run (`psych budget --lazy`).
    pub(crate) lazy: Option<LazyFigures>,
    pub(crate) grant: PermissionGrant,
    pub(crate) surface: Surface,
    pub(crate) settings: Settings,
    pub(crate) store: PathBuf,
    /// Whether the catalogue is the one `psych serve --store` replicas share (how they
    /// would start each server is then each replica's, from its own folder).
    pub(crate) shared: bool,
    /// That store, opened once (its Runs are what `--pin-budget` learns from).
    pub(crate) records: Option<psych_store_postgres::PgBlocking>,
}

/// Loads the configuration (or the embedded default), connects every server, lists and
/// syncs each into the catalogue at `store`, and resolves the Surface with `settings` and
/// the file's grant ([`McpConfig::grant`], the one `psych serve` uses: a server's
/// `allowTools` narrows it), so the same file gives the same Surface here and there. Records
/// over which connection each listing was made beside the catalogue
/// (`<store>.sources.json`, psych-runtime's [`ListingSources`]), as `psych serve` does. With
/// `measure_lazy`, measures what a lazy start saves ([`LazyFigures`]).
pub(crate) fn load(
    config: Option<&Path>,
    store: &Path,
    settings: Settings,
    measure_lazy: bool,
) -> Result<Setup, crate::Failure> {
    let config = match config {
        Some(path) => McpConfig::load(path).map_err(|e| e.to_string())?,
        None => embedded_config()?,
    };
    if !config.disabled.is_empty() {
        errln!(
            "psych: left out (\"disabled\": true in the config): {}",
            config.disabled.join(", ")
        );
    }
    let mut records = None;
    // Set when another process holds the catalogue's file: the listings go to memory.
    let held = std::cell::Cell::new(false);
    let (catalog, mut sources) = match store.to_str().filter(|s| is_store_url(s)) {
        // The catalogue `psych serve --store` replicas share; the sources of their kept
        // listings are in their folders, so how they would start each server is unknown.
        Some(url) => {
            let store = crate::serve::open_store(url)?;
            let erased = std::sync::Arc::new(psych_types::Erased(store.catalog()));
            records = Some(store);
            (Catalog::shared(erased), None)
        }
        None => {
            if let Some(dir) = store.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            // `psych serve` on the same folder holds it while it runs.
            ListingSources::open_kept(store, |path| {
                held.set(true);
                errln!(
                    "psych: the catalogue {} is held by another process (a psych serve on \
                     the same folder?); listing into memory instead",
                    path.display()
                );
            })
            .map_err(|e| format!("the catalogue {}: {e}", store.display()))?
        }
    };
    // How `psych serve` would start each server, from what the catalogue kept before this
    // command lists them again (unknown when another process holds the catalogue).
    let starts = sources
        .as_ref()
        .map(|sources| start_at(&config, &catalog, sources))
        .unwrap_or_default();
    // What a lazy start answers a first listing from: the kept listings, read and resolved.
    let kept_started = std::time::Instant::now();
    if measure_lazy {
        resolved(&config, &catalog, &settings)?;
    }
    let kept_resolved = kept_started.elapsed();
    let started = catalog.now();
    // A signal stops the listing, and every server with it.
    let outcomes = crate::signals::until_signal(async || {
        connect_and_sync(&config, catalog.clone(), measure_lazy).await
    })
    .map_err(crate::Failure::Stopped)??;
    let lazy =
        measure_lazy.then(|| lazy_figures(&catalog, &starts, &outcomes, started, kept_resolved));
    // Every listing kept now was made over the connection the file gives.
    if let Some(sources) = &mut sources {
        for outcome in outcomes.iter().filter(|o| o.error.is_none()) {
            if let Some(entry) = config.servers.get(&outcome.server) {
                sources.record(&outcome.server, entry);
            }
        }
        if let Err(error) = sources.save() {
            errln!(
                "psych: cannot write {}: {error}; psych serve will start every server at once",
                sources.path().display()
            );
        }
    }

    let (grant, catalogs, surface) = resolved(&config, &catalog, &settings)?;
    Ok(Setup {
        config,
        outcomes,
        catalogs,
        starts,
        lazy,
        grant,
        surface,
        settings,
        shared: catalog.is_shared(),
        records,
        store: match store.to_str().filter(|s| is_store_url(s)) {
            Some(url) => PathBuf::from(store_label(url)),
            // Not the file: the report would say it was synced.
            None if held.get() => PathBuf::from(format!(
                "memory only ({} is held by another process)",
                store.display()
            )),
            None => store.to_owned(),
        },
    })
}

/// Whether `store` names the PostgreSQL store rather than a redb file.
pub(crate) fn is_store_url(store: &str) -> bool {
    store.starts_with("postgres://") || store.starts_with("postgresql://")
}

/// How a store URL is shown: its schema and where, never its user or password.
fn store_label(url: &str) -> String {
    let parsed = psych_store_postgres::StoreUrl::parse(url).ok();
    let schema = parsed
        .as_ref()
        .map_or(psych_store_postgres::DEFAULT_SCHEMA, |u| u.schema.as_str());
    let host = url
        .split_once("://")
        .map(|(_, rest)| rest.rsplit_once('@').map_or(rest, |(_, host)| host))
        .and_then(|rest| rest.split(['/', '?']).next())
        .unwrap_or("");
    format!("the PostgreSQL schema {schema} at {host}")
}

/// The context window, in tokens, the auto budget is a share of unless one is given
/// (`psych budget --context-window`'s default).
pub(crate) const WINDOW: u64 = 200_000;

/// Disclosure's settings for a Run: an auto budget of 5% of `window` tokens (disclosure's
/// documented default share), the other knobs at their defaults. A Run reserves the slot of
/// its own tool in the cap itself (`psych demo` hands these to its Runs).
pub(crate) fn run_settings(window: u64) -> Result<Settings, String> {
    Settings::builder()
        .auto_budget(Budget::WindowShare {
            window_tokens: window,
            percent: 5,
        })
        .build()
        .map_err(|e| format!("settings: {e}"))
}

/// What a Run resolves with for [`run_settings`]`(window)`: the same, with the slot of the
/// Run's own tool (`read_tool_output`, [`EXECUTOR_TOOLS`](psych_runtime::EXECUTOR_TOOLS))
/// reserved in the tool cap as `Run::open` reserves it. What the reporting commands resolve
/// with, so a table shows what a Run decides.
pub(crate) fn settings(window: u64) -> Result<Settings, String> {
    psych_runtime::reserve_executor_tools(&run_settings(window)?)
        .map_err(|e| format!("settings: {e}"))
}

/// The freshener's settings for a command's one listing of every server: its listing
/// deadline is psych-mcp's for a whole listing (every page), as when the command listed
/// through the manager itself.
pub(crate) fn listing_freshener() -> Result<FreshenerConfig, String> {
    FreshenerConfig::builder()
        .list_timeout(psych_mcp::Timeouts::default().listing)
        .build()
        .map_err(|e| format!("the catalogue's freshener: {e}"))
}

/// Connects every server and lists each into `catalog` by the one path the gateway and a
/// Run take (psych-runtime's [`CatalogSync::connect`]: the manager's servers connected
/// concurrently, a freshener listing each through the manager, its events followed), then
/// stops following: a command reports the setup as it was. One progress line per server
/// on a terminal's stderr. A failed server's reason is recorded in the catalogue's health
/// in one line (the telling stderr line kept, as the report shows it), once nothing else
/// writes there.
///
/// With `measure`, each server's process group's resident memory is read (one pass over
/// `/proc`, on the blocking pool) after the listings and before the servers stop.
async fn connect_and_sync(
    config: &McpConfig,
    catalog: Catalog,
    measure: bool,
) -> Result<Vec<Outcome>, String> {
    let manager = McpManager::builder(config.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let progress = std::io::stderr().is_terminal();
    if progress {
        errln!("connecting {} MCP servers…", config.servers.len());
    }
    let fresh = listing_freshener()?;
    let connected = CatalogSync::connect(&manager, catalog.clone(), fresh)
        .await
        .map_err(|e| format!("the catalogue's freshener: {e}"))?;
    connected.sync.stop().await;
    connected.freshener.shutdown().await;
    let mut listed = Vec::new();
    for server in config.servers.keys() {
        let failed = connected.failures.iter().find(|(s, _)| s == server);
        let outcome = match failed {
            Some((_, error)) => Err(failure_reason(&manager, server, error)),
            None => Ok(manager
                .malformed_tools(server)
                .iter()
                .map(|m| format!("{}: {}", m.name, m.reason))
                .collect()),
        };
        listed.push((server.clone(), outcome));
    }
    let groups: Vec<(ServerId, i32)> = config
        .servers
        .keys()
        .filter(|_| measure)
        .filter_map(|server| Some((server.clone(), manager.process_group(server)?)))
        .collect();
    let rss = tokio::task::spawn_blocking(move || groups_rss_kib(&groups))
        .await
        .unwrap_or_default();
    manager.shutdown().await;
    let mut outcomes = tokio::task::spawn_blocking(move || record(&catalog, listed))
        .await
        .map_err(|e| format!("syncing the catalogue: {e}"))??;
    for outcome in &mut outcomes {
        outcome.rss_kib = rss.get(&outcome.server).copied();
    }
    if progress {
        for outcome in &outcomes {
            let server = &outcome.server;
            match &outcome.error {
                None => errln!("  {server}: {} tools listed", outcome.tools),
                Some(reason) => errln!(
                    "  {server}: failed: {}",
                    crate::reason::one_line(server.as_str(), reason)
                ),
            }
        }
    }
    Ok(outcomes)
}

/// Why `server` has no first listing, as the report words it: the reason the manager gave
/// when the server went down or never came up (psych-mcp's, with its last stderr lines),
/// else what the listing answered.
fn failure_reason(manager: &McpManager, server: &ServerId, error: &FirstSyncError) -> String {
    if let Some(Reachability::Unreachable { reason }) = manager.reachability(server) {
        return reason;
    }
    match error {
        FirstSyncError::Listing(error) => {
            std::error::Error::source(error).map_or_else(|| error.to_string(), ToString::to_string)
        }
        other => other.to_string(),
    }
}

/// Each server's outcome from its listing's malformed tools (listed) or its failure's
/// reason, the failure recorded in `catalog`'s health and reachability in one line: the
/// catalogue's health feeds the deferred line the model reads, so it gets the stderr
/// tail's telling line; the report keeps the whole reason. In name order. Blocks (redb
/// commits): run it in the blocking pool.
fn record(
    catalog: &Catalog,
    listed: Vec<(ServerId, Result<Vec<String>, String>)>,
) -> Result<Vec<Outcome>, String> {
    let mut outcomes = Vec::new();
    for (server, listing) in listed {
        let outcome = match listing {
            Ok(malformed) => {
                // Listed: reachable, whatever the followed events had applied when the
                // following stopped.
                catalog.set_reachability(&server, Reachability::Reachable);
                let tools = catalog.live(&server).map_or(0, |c| c.tools.len());
                Outcome {
                    server,
                    rss_kib: None,
                    error: None,
                    malformed,
                    tools,
                }
            }
            Err(reason) => {
                let line = crate::reason::one_line(server.as_str(), &reason);
                catalog
                    .record_failure(&server, &line)
                    .map_err(|e| format!("recording {server}'s failure: {e}"))?;
                catalog.set_reachability(&server, Reachability::Unreachable { reason: line });
                Outcome {
                    server,
                    rss_kib: None,
                    error: Some(reason),
                    malformed: Vec::new(),
                    tools: 0,
                }
            }
        };
        outcomes.push(outcome);
    }
    outcomes.sort_by(|a, b| a.server.cmp(&b.server));
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_mcp::ConnectError;

    /// Before, a connect task that panicked was skipped: its server was missing from the
    /// report and `psych budget` could exit 0. The panic becoming the server's outcome is
    /// psych-mcp's (`McpManager::connect_all`'s [`ConnectError::Task`]); here, that outcome
    /// is a failed server in the report and in the catalogue's health.
    #[test]
    fn a_connect_task_that_panics_is_a_failed_server() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let buggy = ServerId::new("buggy").unwrap();
        let source = runtime
            .block_on(async {
                tokio::spawn(async {
                    panic!("a bug in the connect task");
                })
                .await
            })
            .unwrap_err();
        let manager =
            McpManager::builder(McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap())
                .build()
                .unwrap();
        let error = FirstSyncError::Connect(ConnectError::Task {
            server: buggy.clone(),
            source,
        });
        let catalog = Catalog::in_memory().unwrap();
        let outcomes = record(
            &catalog,
            vec![
                (ServerId::new("fine").unwrap(), Ok(Vec::new())),
                (buggy.clone(), Err(failure_reason(&manager, &buggy, &error))),
            ],
        )
        .unwrap();
        let seen: Vec<_> = outcomes
            .iter()
            .map(|o| (o.server.as_str(), o.error.as_deref()))
            .collect();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[1], ("fine", None));
        assert_eq!(seen[0].0, "buggy");
        let reason = seen[0].1.unwrap();
        assert!(
            reason.starts_with(
                "the first connection attempt of MCP server \"buggy\" did not finish: task "
            ) && reason.contains("panicked with message \"a bug in the connect task"),
            "{reason}"
        );
        assert!(catalog.health(&buggy).unwrap().last_error.is_some());
    }
}
