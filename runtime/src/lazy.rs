//! Servers started when they are needed, with psych-mcp (feature `mcp`): which servers may
//! wait ([`start_at`], from the kept catalogue and the [`ListingSources`] beside it), and the
//! executor's [`OnDemand`] over psych-mcp's lazy servers ([`LazyStarts`]).
//!
//! A program (psych-gateway's `serve`, a Run's owner) decides with [`start_at`] which
//! servers of its file to make lazy ([`McpManagerBuilder::lazy`]), connects them with
//! [`CatalogSync`](crate::CatalogSync) (which follows the lazy ones instead of listing
//! them), and gives the executor a [`LazyStarts`]. It records each listing's connection
//! in its [`ListingSources`] once the listing is stored, so a kept listing serves a server
//! only while the server is configured as it was when it was listed.
//!
//! [`McpManagerBuilder::lazy`]: psych_mcp::McpManagerBuilder::lazy

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use psych_catalog::{Catalog, Freshener};
use psych_mcp::{McpConfig, McpManager, ServerConfig, Transport};
use psych_types::{Reachability, ServerCatalog, ServerHealth, ServerId};

use crate::executor::{OnDemand, StartFuture};

/// psych-mcp's lazy servers as the [`Executor`](crate::Executor)'s [`OnDemand`]: a call to
/// a lazy server that is not running starts it through the freshener's on-demand refresh
/// (the listing starts it, and is stored in the catalogue, whose change reaches every reader
/// of it), and the call is then guarded against that listing. Give it to the executor with
/// [`Executor::on_demand`](crate::Executor::on_demand), or to a Run with
/// [`RunBuilder::on_demand`](crate::RunBuilder::on_demand).
#[derive(Debug, Clone)]
pub struct LazyStarts {
    manager: McpManager,
    freshener: Arc<Freshener<McpManager>>,
}

impl LazyStarts {
    /// The lazy servers of `manager`, listed into the catalogue by `freshener` (as
    /// [`CatalogSync::start_connecting`](crate::CatalogSync::start_connecting) made them).
    pub fn new(manager: McpManager, freshener: Arc<Freshener<McpManager>>) -> Self {
        Self { manager, freshener }
    }
}

impl OnDemand for LazyStarts {
    fn needs_start(&self, server: &ServerId) -> bool {
        self.manager.is_lazy(server) == Some(true) && self.manager.is_running(server) == Some(false)
    }

    fn start<'a>(&'a self, server: &'a ServerId) -> StartFuture<'a> {
        Box::pin(async move {
            self.freshener.refresh(server).await?;
            // Listed, so started: reachable now, whenever the manager's event of it is
            // applied (a start that failed before would otherwise still read unreachable).
            let catalog = self.freshener.catalog().clone();
            if let Some(reachability @ Reachability::Reachable) = self.manager.reachability(server)
            {
                catalog.set_reachability(server, reachability);
            }
            let server = server.clone();
            // A redb read: off the async workers.
            let live: ServerCatalog =
                tokio::task::spawn_blocking(move || catalog.live(&server)).await??;
            Ok(live)
        })
    }

    fn state(&self, server: &ServerId, health: Option<&ServerHealth>) -> Option<String> {
        if self.manager.is_lazy(server) != Some(true) {
            return None;
        }
        if self.manager.is_running(server) == Some(true) {
            return Some(STARTED_ON_DEMAND.to_owned());
        }
        let listed_ago = health
            .and_then(|h| h.last_sync.as_ref())
            .map(|sync| self.freshener.catalog().now().saturating_sub(sync.at));
        Some(lazy_state(listed_ago))
    }
}

/// A lazy server's state while it runs, as [`LazyStarts`] tells the orientation payload.
pub const STARTED_ON_DEMAND: &str = "started (on demand)";

/// A lazy server's state while it does not run, as [`LazyStarts`] tells the orientation
/// payload: `known (listed 3 h ago), not started: starts at its first call`, given how many
/// milliseconds ago its kept listing was made (`configured, not started: …` without one).
pub fn lazy_state(listed_ago: Option<u64>) -> String {
    match listed_ago {
        Some(millis) => format!(
            "known (listed {} ago), not started: starts at its first call",
            age(millis)
        ),
        None => "configured, not started: starts at its first call".to_owned(),
    }
}

/// An age in milliseconds as a person reads it: `12 s`, `5 min`, `3 h`, `2 d`.
fn age(millis: u64) -> String {
    let secs = millis / 1000;
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        3600..86_400 => format!("{} h", secs / 3600),
        _ => format!("{} d", secs / 86_400),
    }
}

/// How one server of a file is to be started, as [`start_at`] decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartAt {
    /// Known from its kept listing and started only when a call needs it.
    OnDemand {
        /// How old its kept listing is.
        listed_ago: Duration,
        /// How long it runs without a call once started.
        idle: Duration,
    },
    /// Started at once, and why.
    AtOnce(AtOnce),
}

/// Why a server starts at once ([`StartAt::AtOnce`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AtOnce {
    /// Its entry says `"lazy": false`.
    NotLazy,
    /// No listing of it is kept.
    NeverListed,
    /// Its kept listing was made over another connection (its entry's command, arguments,
    /// environment, URL or headers changed since), or it is not known over which.
    Reconfigured,
    /// Its kept listing is at least its listing TTL old.
    Stale {
        /// How old its kept listing is.
        listed_ago: Duration,
        /// Its listing TTL.
        ttl: Duration,
    },
}

impl StartAt {
    /// How old the kept listing is (`None` when it starts at once).
    pub fn listed_ago(&self) -> Option<Duration> {
        match self {
            Self::OnDemand { listed_ago, .. } => Some(*listed_ago),
            Self::AtOnce(_) => None,
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl std::fmt::Display for StartAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OnDemand { listed_ago, .. } => {
                write!(f, "on demand (listed {} ago)", age(millis(*listed_ago)))
            }
            Self::AtOnce(AtOnce::NotLazy) => f.write_str("at once (\"lazy\": false)"),
            Self::AtOnce(AtOnce::NeverListed) => f.write_str("at once (no kept listing)"),
            Self::AtOnce(AtOnce::Reconfigured) => {
                f.write_str("at once (configured otherwise than when it was listed)")
            }
            Self::AtOnce(AtOnce::Stale { listed_ago, ttl }) => write!(
                f,
                "at once (listed {} ago, past its {} TTL)",
                age(millis(*listed_ago)),
                age(millis(*ttl))
            ),
        }
    }
}

/// How each server of `config` is to be started given the kept `catalog` and the
/// connections its listings were made over (`sources`): on demand when its
/// [`StartPolicy`](psych_mcp::StartPolicy) allows it, its kept listing is younger than its
/// listing TTL, and it is configured as it was when listed; at once otherwise. Blocks (redb
/// reads): run off the async workers.
pub fn start_at(
    config: &McpConfig,
    catalog: &Catalog,
    sources: &ListingSources,
) -> BTreeMap<ServerId, StartAt> {
    let now = catalog.now();
    config
        .servers
        .iter()
        .map(|(server, entry)| {
            let policy = entry.start_policy().unwrap_or_default();
            let synced = catalog.health(server).ok().and_then(|h| h.last_sync);
            let start = match synced {
                _ if !policy.lazy => StartAt::AtOnce(AtOnce::NotLazy),
                None => StartAt::AtOnce(AtOnce::NeverListed),
                Some(_) if !sources.matches(server, entry) => StartAt::AtOnce(AtOnce::Reconfigured),
                Some(synced) => {
                    let listed_ago = Duration::from_millis(now.saturating_sub(synced.at));
                    if listed_ago < policy.listing_ttl {
                        StartAt::OnDemand {
                            listed_ago,
                            idle: policy.idle,
                        }
                    } else {
                        StartAt::AtOnce(AtOnce::Stale {
                            listed_ago,
                            ttl: policy.listing_ttl,
                        })
                    }
                }
            };
            (server.clone(), start)
        })
        .collect()
}

/// Over which connection each kept listing was made: a fingerprint of each server's entry
/// (its transport: command, arguments, environment, working directory, or URL and
/// headers), kept as a small JSON file beside the catalogue. A kept listing serves a server
/// lazily only while the server's fingerprint is the one recorded with the listing
/// ([`start_at`]). The fingerprint is a 64-bit FNV-1a hash in hex: nothing of the entry
/// (no secret in its environment or headers) is written in clear.
///
/// Reading and writing the file block: call them off the async workers.
#[derive(Debug, Clone, Default)]
pub struct ListingSources {
    path: PathBuf,
    servers: BTreeMap<String, String>,
}

impl ListingSources {
    /// Where the sources of the kept catalogue at `catalog` are: beside it, its extension
    /// replaced by `sources.json` (`catalog.redb` → `catalog.sources.json`).
    pub fn beside(catalog: &Path) -> PathBuf {
        catalog.with_extension("sources.json")
    }

    /// Opens the kept catalogue at `catalog` and [loads](Self::load) its sources
    /// ([`beside`](Self::beside) it). Held by another process (`psych serve` on the same
    /// folder), an in-memory catalogue serves instead, with no sources (every server then
    /// starts at once), and `held` is told the path. Blocks: redb opens the file.
    ///
    /// # Errors
    ///
    /// The catalogue's `OpenError` other than its being held.
    pub fn open_kept(
        catalog: &Path,
        held: impl FnOnce(&Path),
    ) -> Result<(Catalog, Option<Self>), psych_catalog::OpenError> {
        match Catalog::open(catalog) {
            Err(psych_catalog::OpenError::Locked { path }) => {
                held(&path);
                Catalog::in_memory().map(|catalog| (catalog, None))
            }
            opened => opened.map(|kept| (kept, Some(Self::load(Self::beside(catalog))))),
        }
    }

    /// The sources kept at `path`; none when the file is missing or unreadable (every
    /// server with a kept listing then starts at once, and its listing is recorded anew).
    pub fn load(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let servers = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        Self { path, servers }
    }

    /// The file these sources are kept in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `server`'s kept listing was made over the connection `entry` describes.
    pub fn matches(&self, server: &ServerId, entry: &ServerConfig) -> bool {
        self.servers.get(server.as_str()) == Some(&fingerprint(&entry.transport))
    }

    /// Records that `server`'s listing now kept was made over `entry`'s connection; true
    /// when that changed what is recorded.
    pub fn record(&mut self, server: &ServerId, entry: &ServerConfig) -> bool {
        let print = fingerprint(&entry.transport);
        self.servers
            .insert(server.as_str().to_owned(), print.clone())
            != Some(print)
    }

    /// Writes the sources to their file (a temporary file synced and renamed over it, so a
    /// reader never sees half a file).
    ///
    /// # Errors
    ///
    /// The I/O error of writing or renaming.
    pub fn save(&self) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(&self.servers).map_err(std::io::Error::other)?;
        crate::files::replace_file(&self.path, &text)
    }
}

/// The transport's fingerprint: FNV-1a (64 bits) over its fields, each length-prefixed so
/// that no two different transports share an input.
fn fingerprint(transport: &Transport) -> String {
    let mut hash = 0;
    let mut feed = |field: &str| {
        hash = psych_types::fnv1a(&(field.len() as u64).to_le_bytes(), hash);
        hash = psych_types::fnv1a(field.as_bytes(), hash);
    };
    match transport {
        Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            feed("stdio");
            feed(command);
            for arg in args {
                feed(arg);
            }
            feed("env");
            for (key, value) in env {
                feed(key);
                feed(value);
            }
            feed(
                &cwd.as_ref()
                    .map(|c| c.display().to_string())
                    .unwrap_or_default(),
            );
        }
        Transport::Http { url, headers } => {
            feed("http");
            feed(url);
            for (key, value) in headers {
                feed(key);
                feed(value);
            }
        }
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> McpConfig {
        McpConfig::parse(text, |_| None).unwrap_or_else(|e| panic!("{e}"))
    }

    fn id(name: &str) -> ServerId {
        ServerId::new(name).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_kept_listing_serves_only_while_fresh_lazy_and_configured_the_same() {
        let catalog = Catalog::in_memory().unwrap_or_else(|e| panic!("{e}"));
        let listed = config(
            r#"{"mcpServers": {
                "fresh": {"command": "a"},
                "pinned": {"command": "b", "lazy": false},
                "moved": {"command": "c", "args": ["--old"]},
                "never": {"command": "d"},
                "stale": {"command": "e", "listingTtlSecs": 1, "idleSecs": 7}
            }}"#,
        );
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut sources = ListingSources::load(dir.path().join("sources.json"));
        // Before the listings are stored: their age is counted from then.
        let listed_at = std::time::Instant::now();
        for (server, entry) in &listed.servers {
            if server.as_str() != "never" {
                catalog
                    .refresh(server, &[])
                    .unwrap_or_else(|e| panic!("{e}"));
                assert!(sources.record(server, entry));
            }
        }
        sources.save().unwrap_or_else(|e| panic!("{e}"));
        std::thread::sleep(Duration::from_millis(1100));
        // The same file, but `moved` now runs with other arguments.
        let now = config(
            r#"{"mcpServers": {
                "fresh": {"command": "a"},
                "pinned": {"command": "b", "lazy": false},
                "moved": {"command": "c", "args": ["--new"]},
                "never": {"command": "d"},
                "stale": {"command": "e", "listingTtlSecs": 1, "idleSecs": 7}
            }}"#,
        );
        let sources = ListingSources::load(sources.path());
        let starts = start_at(&now, &catalog, &sources);
        assert!(
            matches!(starts[&id("fresh")], StartAt::OnDemand { idle, .. } if idle == Duration::from_secs(300)),
            "{:?}",
            starts[&id("fresh")]
        );
        assert_eq!(starts[&id("pinned")], StartAt::AtOnce(AtOnce::NotLazy));
        assert_eq!(starts[&id("moved")], StartAt::AtOnce(AtOnce::Reconfigured));
        assert_eq!(starts[&id("never")], StartAt::AtOnce(AtOnce::NeverListed));
        assert!(
            matches!(starts[&id("stale")], StartAt::AtOnce(AtOnce::Stale { ttl, .. }) if ttl == Duration::from_secs(1)),
            "{:?}",
            starts[&id("stale")]
        );
        assert_eq!(
            starts[&id("pinned")].to_string(),
            "at once (\"lazy\": false)"
        );
        // Listed at least a second ago, and no longer ago than has passed since (a loaded
        // machine may stretch the pause).
        let shown = starts[&id("fresh")].to_string();
        let secs: Option<u64> = shown
            .strip_prefix("on demand (listed ")
            .and_then(|rest| rest.split_once(" s ago"))
            .and_then(|(secs, _)| secs.parse().ok());
        assert!(
            secs.is_some_and(|secs| (1..=listed_at.elapsed().as_secs()).contains(&secs)),
            "{shown}"
        );
        // A missing or damaged file knows no source: nothing kept serves lazily.
        std::fs::write(sources.path(), b"{not json").unwrap_or_else(|e| panic!("{e}"));
        let starts = start_at(&now, &catalog, &ListingSources::load(sources.path()));
        assert_eq!(starts[&id("fresh")], StartAt::AtOnce(AtOnce::Reconfigured));
    }

    #[test]
    fn ages_read_as_a_person_says_them() {
        assert_eq!(age(999), "0 s");
        assert_eq!(age(59_999), "59 s");
        assert_eq!(age(60_000), "1 min");
        assert_eq!(age(3_600_000), "1 h");
        assert_eq!(age(2 * 86_400_000), "2 d");
        assert_eq!(
            lazy_state(Some(7_200_000)),
            "known (listed 2 h ago), not started: starts at its first call"
        );
    }
}
