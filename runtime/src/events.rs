//! Catalogue freshness from live connections: psych-mcp's events drive the catalogue's
//! freshener.

use std::sync::Arc;

use psych_catalog::{Catalog, ConfigError, Freshener, FreshenerConfig, RefreshError};
use psych_mcp::{ChangeCause, ConnectError, McpEvent, McpEvents, McpManager};
use psych_types::{ServerId, ToolLister};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The task that feeds an [`McpManager`](psych_mcp::McpManager)'s events to a
/// [`Freshener`]: a (re)connection is a sync on connect, `notifications/tools/list_changed`
/// a coalesced refresh, a reachability change goes to the catalogue's health (so the guard
/// answers `unreachable: reason` for a server that is down). A `list_changed` that adds a
/// tool is thus on the next turn's Surface, with no restart.
///
/// The task is owned: [`stop`](Self::stop) ends it and waits; dropping it aborts it.
#[derive(Debug)]
pub struct CatalogSync {
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl CatalogSync {
    /// Starts following `events`; call it inside the tokio runtime the freshener runs on.
    pub fn start<L: ToolLister + 'static>(events: McpEvents, freshener: Arc<Freshener<L>>) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    event = events.next() => apply(&freshener, event),
                    _ = stopped.wait_for(|stop| *stop) => break,
                }
            }
        });
        Self {
            stop,
            task: Some(task),
        }
    }

    /// Connects every server of `manager` and keeps `catalog` fresh from them: a
    /// [`Freshener`] listing through the manager, fed the manager's events by a
    /// `CatalogSync` started before connecting (so no connection is missed), and each server
    /// listed once before this returns, so the catalogue holds every server that answered.
    /// A server the manager starts only when it is needed
    /// ([`McpManagerBuilder::lazy`](psych_mcp::McpManagerBuilder::lazy)) is neither started
    /// nor listed: the catalogue's kept listing serves until a call starts it (see
    /// [`LazyStarts`](crate::LazyStarts)), and the freshener [follows](Freshener::follow) it
    /// with its configuration's listing TTL ([`StartPolicy`](psych_mcp::StartPolicy)),
    /// listing it (and so starting it) when that runs out while it does not run.
    /// Call it inside the tokio runtime the freshener is to run on.
    ///
    /// # Errors
    ///
    /// [`ConfigError::NoRuntime`] outside a tokio runtime. A server whose first listing
    /// fails is not an error: it is in [`Connected::failures`].
    pub async fn connect(
        manager: &McpManager,
        catalog: Catalog,
        config: FreshenerConfig,
    ) -> Result<Connected, ConfigError> {
        let Started {
            sync,
            freshener,
            connecting,
        } = Self::start_connecting(manager, catalog, config)?;
        let failures = connecting.finish().await;
        Ok(Connected {
            sync,
            freshener,
            failures,
        })
    }

    /// [`connect`](Self::connect) without waiting: starts the freshener and the
    /// `CatalogSync`, then connects every server of `manager` in a task of its own and
    /// returns at once. Each server reaches the catalogue as its first listing commits
    /// (the catalogue's [`changes`](Catalog::changes) counter moves on), so a caller that
    /// must answer at once (a gateway's `initialize`) serves what is known and learns of
    /// the rest from the catalogue; one server that never answers delays nothing but
    /// itself. [`Connecting::finish`] waits for every first attempt, as `connect` does.
    /// Call it inside the tokio runtime the freshener is to run on.
    ///
    /// # Errors
    ///
    /// [`ConfigError::NoRuntime`] outside a tokio runtime.
    pub fn start_connecting(
        manager: &McpManager,
        catalog: Catalog,
        config: FreshenerConfig,
    ) -> Result<Started, ConfigError> {
        let freshener = Arc::new(Freshener::start(
            catalog,
            Arc::new(manager.clone()),
            config,
        )?);
        let sync = Self::start(manager.events(), Arc::clone(&freshener));
        let task = tokio::spawn({
            let manager = manager.clone();
            let freshener = Arc::clone(&freshener);
            async move {
                let attempts = manager.connect_all().await;
                let added = manager.servers();
                let mut failures = Vec::new();
                for (server, attempt) in attempts {
                    // A server the manager refused (or whose attempt panicked) and does not
                    // hold has nothing to list: its connect error is the failure.
                    if let Err(error) = attempt
                        && !added.contains(&server)
                    {
                        failures.push((server, FirstSyncError::Connect(error)));
                    }
                }
                for server in added {
                    // A lazy server is listed when it starts, or when its kept listing's
                    // TTL runs out (which starts it); nothing starts it now.
                    if manager.is_lazy(&server) == Some(true) {
                        let ttl = manager
                            .config()
                            .servers
                            .get(&server)
                            .and_then(|config| config.start_policy().ok())
                            .unwrap_or_default()
                            .listing_ttl;
                        let (manager, id) = (manager.clone(), server.clone());
                        freshener
                            .follow(&server, ttl, move || manager.is_running(&id) == Some(true));
                        continue;
                    }
                    if let Err(error) = freshener.refresh(&server).await {
                        failures.push((server, FirstSyncError::Listing(error)));
                    }
                }
                failures.sort_by(|a, b| a.0.cmp(&b.0));
                failures
            }
        });
        Ok(Started {
            sync,
            freshener,
            connecting: Connecting { task: Some(task) },
        })
    }

    /// Stops following and waits for the task to end.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// Why a server has no first listing after [`CatalogSync::connect`] (or
/// [`Connecting::finish`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FirstSyncError {
    /// The manager could not add the server (it had shut down), or the task making its
    /// first attempt panicked: the server is not one of the manager's.
    #[error(transparent)]
    Connect(ConnectError),
    /// The server is the manager's, but its first listing failed (it is down, or it
    /// answered badly); the failure is also in the catalogue's health.
    #[error(transparent)]
    Listing(RefreshError),
}

/// What [`CatalogSync::connect`] set up: the catalogue kept fresh from live connections.
#[derive(Debug)]
#[non_exhaustive]
pub struct Connected {
    /// The task feeding the manager's events to the freshener; stop it before shutting the
    /// freshener down.
    pub sync: CatalogSync,
    /// The freshener over the manager, holding the catalogue ([`Freshener::catalog`]).
    pub freshener: Arc<Freshener<McpManager>>,
    /// The servers whose first connection or listing failed, in name order, with why (a
    /// listing failure is also recorded in the catalogue's health; a server the manager
    /// could not add, [`FirstSyncError::Connect`], is not in the catalogue at all).
    pub failures: Vec<(ServerId, FirstSyncError)>,
}

/// What [`CatalogSync::start_connecting`] set up: the catalogue kept fresh from live
/// connections, with the servers still connecting.
#[derive(Debug)]
#[non_exhaustive]
pub struct Started {
    /// The task feeding the manager's events to the freshener; stop it before shutting the
    /// freshener down.
    pub sync: CatalogSync,
    /// The freshener over the manager, holding the catalogue ([`Freshener::catalog`]).
    pub freshener: Arc<Freshener<McpManager>>,
    /// The first connection attempt of every server, under way.
    pub connecting: Connecting,
}

/// The first connection attempt and listing of every server, running in a task of its
/// own. Owned: [`finish`](Self::finish) waits for it; dropping it aborts the task (a server
/// whose attempt was cut short stays with the manager, which retries it, and is stopped
/// by [`McpManager::shutdown`](psych_mcp::McpManager::shutdown)).
#[derive(Debug)]
pub struct Connecting {
    task: Option<JoinHandle<Vec<(ServerId, FirstSyncError)>>>,
}

impl Connecting {
    /// Waits until every server has connected or failed and been listed once: the servers
    /// whose first connection or listing failed, in name order, with why (as
    /// [`Connected::failures`]). Bounded by the manager's connect and listing deadlines.
    pub async fn finish(mut self) -> Vec<(ServerId, FirstSyncError)> {
        // Awaited in place: dropped mid-way, `self` still aborts the task.
        match self.task.as_mut() {
            Some(task) => match task.await {
                Ok(failures) => failures,
                // A bug in the task, not a server's failure: it is not hidden here.
                Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
                Err(_) => Vec::new(),
            },
            None => Vec::new(),
        }
    }
}

impl Drop for Connecting {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for CatalogSync {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// One event, handed to the freshener or the catalogue's health.
fn apply<L: ToolLister + 'static>(freshener: &Freshener<L>, event: McpEvent) {
    match event {
        McpEvent::ToolsChanged {
            server,
            cause: ChangeCause::Connected,
        } => freshener.connect(&server),
        McpEvent::ToolsChanged { server, .. } => freshener.list_changed(&server),
        McpEvent::Reachability {
            server,
            reachability,
        } => freshener.catalog().set_reachability(&server, reachability),
        // An event kind this runtime does not know yet changes nothing.
        _ => {}
    }
}
