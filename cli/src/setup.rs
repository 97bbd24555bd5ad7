//! The MCP setup a command works on: the `mcpServers` file (or the embedded default),
//! connected, listed and synced into the redb catalogue, then resolved into a Surface the
//! way a turn would be.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use psych_catalog::Catalog;
use psych_disclosure::{Budget, CostBasis, Inputs, Settings, Surface, resolve};
use psych_elision::Estimator;
use psych_mcp::{Listing, McpConfig, McpManager, ServerConfig};
use psych_types::{PermissionGrant, Reachability, ServerCatalog, ServerId};
use tokio::task::JoinSet;

/// The embedded servers: name (also the [`psych_mcp::SyntheticKind`] whose vocabulary and
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

/// One server after connecting and listing.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) server: ServerId,
    /// `None` when it connected and listed; the reason otherwise.
    pub(crate) error: Option<String>,
    /// Tools the server declared that were refused, with the reason.
    pub(crate) malformed: Vec<String>,
}

/// A synced setup, resolved.
pub(crate) struct Setup {
    pub(crate) config: McpConfig,
    pub(crate) outcomes: Vec<Outcome>,
    pub(crate) catalogs: Vec<ServerCatalog>,
    pub(crate) grant: PermissionGrant,
    pub(crate) surface: Surface,
    pub(crate) settings: Settings,
    pub(crate) store: PathBuf,
}

/// Loads the configuration (or the embedded default), connects every server, lists and
/// syncs each into the catalogue at `store`, and resolves the Surface with an auto budget
/// of 5% of `window` tokens (disclosure's documented default share).
pub(crate) fn load(config: Option<&Path>, store: &Path, window: u64) -> Result<Setup, String> {
    let config = match config {
        Some(path) => McpConfig::load(path).map_err(|e| e.to_string())?,
        None => embedded_config()?,
    };
    if let Some(dir) = store.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let catalog =
        Catalog::open(store).map_err(|e| format!("the catalogue {}: {e}", store.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let outcomes = runtime.block_on(connect_and_sync(&config, &catalog))?;

    let mut connections = Vec::new();
    let mut grant = PermissionGrant::none();
    for (server, entry) in &config.servers {
        connections.push(entry.connection.clone());
        grant = grant.allow_server(server.clone());
    }
    let catalogs: Vec<ServerCatalog> = catalog
        .live_all()
        .map_err(|e| format!("reading the catalogue: {e}"))?
        .into_iter()
        .filter(|c| config.servers.contains_key(&c.server))
        .collect();
    let settings = settings(window)?;
    let inputs = Inputs {
        connections: &connections,
        catalogs: &catalogs,
        grant: &grant,
    };
    let surface = resolve(&inputs, &settings, &Estimator::new())
        .map_err(|e| format!("resolving the tool surface: {e}"))?;
    Ok(Setup {
        config,
        outcomes,
        catalogs,

        grant,
        surface,
        settings,
        store: store.to_owned(),
    })
}

/// The context window, in tokens, the auto budget is a share of unless one is given
/// (`psych budget --context-window`'s default).
pub(crate) const WINDOW: u64 = 200_000;

/// Disclosure's settings with an auto budget of 5% of `window` tokens (disclosure's
/// documented default share): what every command resolves with.
pub(crate) fn settings(window: u64) -> Result<Settings, String> {
    Settings::builder()
        .auto_budget(Budget::WindowShare {
            window_tokens: window,
            percent: 5,
        })
        .build()
        .map_err(|e| format!("settings: {e}"))
}

/// `psych serve`'s auto budget unless `--auto-budget` says otherwise: 1,000 tokens for the
/// direct, facade and search tools of every `Auto` server together.
///
/// The runtime and `psych budget` give the Auto servers 5% of the model's window, since
/// they know the window and the rest of the prompt. A gateway knows neither: its listing
/// rides on every request of a client whose window and other tools it cannot see, so it
/// keeps the listing small whatever is configured. Psych's own tools in that listing (the
/// meta tools, orientation, the reader) cost about 850 tokens; with 1,000 for the servers
/// kept out of deferral the listing stays near 2,000 tokens however many servers there
/// are, and a server small enough to fit stays direct (no extra round trip).
pub(crate) const SERVE_AUTO_BUDGET: u64 = 1_000;

/// Disclosure's settings for `psych serve`: an auto budget of `tokens` (the Auto servers'
/// share, [`SERVE_AUTO_BUDGET`] by default) counted on whole tool definitions
/// ([`CostBasis::Definition`]: the client receives every field of a direct tool, output
/// schema and annotations included, so the listing's size is what the budget bounds), the
/// other knobs at their defaults.
pub(crate) fn serve_settings(tokens: u64) -> Result<Settings, String> {
    Settings::builder()
        .auto_budget(Budget::Tokens(tokens))
        .cost_basis(CostBasis::Definition)
        .build()
        .map_err(|e| format!("settings: {e}"))
}

/// Connects and lists every server concurrently; one progress line per server on a
/// terminal's stderr as each finishes. Every listing is synced; every failure recorded.
async fn connect_and_sync(config: &McpConfig, catalog: &Catalog) -> Result<Vec<Outcome>, String> {
    let manager = McpManager::builder(McpConfig {
        servers: Default::default(),
        extra: config.extra.clone(),
    })
    .build()
    .map_err(|e| e.to_string())?;
    let outcomes = sync_all(config, catalog, |server, entry| {
        let manager = manager.clone();
        async move { attempt(&manager, server, entry).await }
    })
    .await;
    manager.shutdown().await;
    outcomes
}

/// One server connected and listed, or why not.
async fn attempt(
    manager: &McpManager,
    server: ServerId,
    entry: ServerConfig,
) -> Result<Listing, String> {
    match manager.add_server(server.clone(), entry).await {
        Ok(Reachability::Reachable) => manager.list(&server).await.map_err(|e| e.to_string()),
        Ok(Reachability::Unreachable { reason }) => Err(reason),
        Ok(_) => Err("no connection was made".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs `connect` for every server of `config` in a task of its own and syncs each answer
/// into `catalog` as it comes. Every server has an outcome, in name order: a task that
/// panicked is a failure that says so.
async fn sync_all<F, A>(
    config: &McpConfig,
    catalog: &Catalog,
    connect: F,
) -> Result<Vec<Outcome>, String>
where
    F: Fn(ServerId, ServerConfig) -> A,
    A: Future<Output = Result<Listing, String>> + Send + 'static,
{
    let progress = std::io::stderr().is_terminal();
    if progress {
        eprintln!("connecting {} MCP servers…", config.servers.len());
    }
    let mut tasks = JoinSet::new();
    let mut servers = BTreeMap::new();
    for (server, entry) in &config.servers {
        let task = tasks.spawn(connect(server.clone(), entry.clone()));
        servers.insert(task.id(), server.clone());
    }
    let mut outcomes = Vec::new();
    while let Some(joined) = tasks.join_next_with_id().await {
        let (task, result) = match joined {
            Ok((task, result)) => (task, result),
            Err(error) => (
                error.id(),
                Err(format!(
                    "connecting and listing it failed inside psych: {error}"
                )),
            ),
        };
        let Some(server) = servers.remove(&task) else {
            continue;
        };
        let outcome = match result {
            Ok(listing) => {
                if progress {
                    eprintln!("  {server}: {} tools listed", listing.tools.len());
                }
                catalog
                    .refresh(&server, &listing.tools)
                    .map_err(|e| format!("syncing {server}: {e}"))?;
                catalog.set_reachability(&server, Reachability::Reachable);
                Outcome {
                    server,
                    error: None,
                    malformed: listing
                        .malformed
                        .iter()
                        .map(|m| format!("{}: {}", m.name, m.reason))
                        .collect(),
                }
            }
            Err(reason) => {
                // The catalogue's health feeds the deferred line the model reads: one
                // line, the stderr tail's telling line kept. The report keeps it all.
                let line = crate::reason::one_line(server.as_str(), &reason);
                if progress {
                    eprintln!("  {server}: failed: {line}");
                }
                catalog
                    .record_failure(&server, &line)
                    .map_err(|e| format!("recording {server}'s failure: {e}"))?;
                catalog.set_reachability(&server, Reachability::Unreachable { reason: line });
                Outcome {
                    server,
                    error: Some(reason),
                    malformed: Vec::new(),
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

    /// Before, a connect task that panicked was skipped: its server was missing from the
    /// report and `psych budget` could exit 0.
    #[test]
    fn a_connect_task_that_panics_is_a_failed_server() {
        let config = McpConfig::parse(
            r#"{"mcpServers": {"fine": {"command": "x"}, "buggy": {"command": "y"}}}"#,
            |_| None,
        )
        .unwrap();
        let catalog = Catalog::in_memory().unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let outcomes = runtime
            .block_on(sync_all(&config, &catalog, |server, _| async move {
                assert_ne!(server.as_str(), "buggy", "a bug in the connect task");
                Ok(Listing::default())
            }))
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
            reason.starts_with("connecting and listing it failed inside psych: task ")
                && reason.contains("panicked with message \"assertion `left != right` failed: a bug in the connect task"),
            "{reason}"
        );
        assert!(
            catalog
                .health(&ServerId::new("buggy").unwrap())
                .unwrap()
                .last_error
                .is_some()
        );
    }
}
