//! The connection manager: one supervised connection per configured server.
//!
//! Each server gets a supervisor task that connects it, lists it once, reports it
//! reachable, waits until the connection is lost (process exit, transport closed, a request
//! that found it gone), reports it unreachable with the reason, and reconnects after a
//! backoff. Every task is owned by its server's slot and awaited on shutdown; shutdown
//! closes every session and stops every stdio server's whole process group.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use psych_types::{
    HostAnswer, InputRound, JsonObject, ProgressSink, Reachability, ServerId, SpilledBlock,
    ToolDefinition, ToolHost, ToolLister, ToolOutput, ToolRef,
};
use rmcp::model::CallToolResult;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle, JoinSet};

use crate::budget::SpillBudget;
use crate::connection::Session;
use crate::events::{ChangeCause, EventQueue, McpEvent, McpEvents};
use crate::lazy::{InFlight, Lazy};
use crate::listing::{Listing, MalformedTool};
use crate::{Backoff, McpConfig, McpError, ServerConfig, Timeouts};

/// Why a manager could not be built from its settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A deadline was zero.
    #[error("the {0} deadline must be longer than zero")]
    ZeroDeadline(&'static str),
    /// The page deadline was longer than the whole-listing deadline.
    #[error(
        "the tools/list page deadline ({page:?}) is longer than the whole listing's ({listing:?})"
    )]
    PageOverListing {
        /// The page deadline.
        page: std::time::Duration,
        /// The whole-listing deadline.
        listing: std::time::Duration,
    },
    /// The backoff's first delay was zero or longer than its longest.
    #[error("the reconnect backoff must start above zero and at most at its maximum")]
    Backoff,
}

/// Why [`McpManager::connect_all`] has no reachability to report for a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The manager refused the server ([`McpError::ShutDown`] after shutdown).
    #[error(transparent)]
    Manager(#[from] McpError),
    /// The task making the server's first attempt panicked or was cancelled: a bug,
    /// reported rather than lost. The server may stay configured.
    #[error("the first connection attempt of MCP server \"{server}\" did not finish: {source}")]
    Task {
        /// The server.
        server: ServerId,
        /// What tokio said.
        #[source]
        source: JoinError,
    },
}

/// Settings of an [`McpManager`], validated by [`McpManagerBuilder::build`].
#[derive(Debug, Clone)]
pub struct McpManagerBuilder {
    config: McpConfig,
    timeouts: Timeouts,
    backoff: Backoff,
    spill_dir: PathBuf,
    spill_budget: SpillBudget,
    max_listing_bytes: u64,
    lazy: BTreeMap<ServerId, Duration>,
}

impl McpManagerBuilder {
    /// Makes `server` (one of the configuration's) lazy: [`McpManager::connect_all`] adds it
    /// with [`McpManager::add_lazy_server`] and this `idle` time, starting nothing, instead
    /// of connecting it. The caller decides which servers may wait (`psych serve`: those
    /// whose kept listing is fresh, by their [`StartPolicy`](crate::StartPolicy)); a name
    /// the configuration lacks is ignored.
    pub fn lazy(mut self, server: ServerId, idle: Duration) -> Self {
        self.lazy.insert(server, idle);
        self
    }

    /// Sets the folder of the unnamed files that hold an answer too large for memory while
    /// it is read and until its result is logged (default: [`std::env::temp_dir`]). Each
    /// file has no name (`O_TMPFILE`, or unlinked at once) and goes with its last handle;
    /// what they hold at once is bounded by the [spill budget](Self::spill_budget), and
    /// each answer by [`MAX_SPILLED_ANSWER`](crate::MAX_SPILLED_ANSWER). The folder must
    /// exist; if a file
    /// cannot be made there, the call whose answer needed it fails saying so. `psych serve`
    /// puts it beside its record logs, on the disk that will hold the result anyway.
    pub fn spill_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spill_dir = dir.into();
        self
    }

    /// Sets what the files of [`spill_dir`](Self::spill_dir) may hold at once, across every
    /// connection and call (default: [`DEFAULT_SPILL_BUDGET`](crate::DEFAULT_SPILL_BUDGET),
    /// 10 GiB): an answer whose next bytes would pass it is not kept and its call fails
    /// with [`McpError::SpillBudget`](crate::McpError::SpillBudget). An answer needs about
    /// twice its size while its texts are split off (its file and its texts at once), so
    /// the largest kept is about half the budget.
    /// Pass a clone of one [`SpillBudget`] to several managers to share it between them.
    pub fn spill_budget(mut self, budget: SpillBudget) -> Self {
        self.spill_budget = budget;
        self
    }

    /// Sets the most one server's listing may hold, all its pages together, counted as
    /// [`DEFAULT_MAX_LISTING_BYTES`](crate::DEFAULT_MAX_LISTING_BYTES) says (default: that,
    /// 64 MiB). A listing past it fails with
    /// [`McpError::ListingTooLarge`](crate::McpError::ListingTooLarge) at the page that
    /// passed it, and the server is reported unreachable with that reason, as for any
    /// listing that fails. (A listing walked again because the server changed its tools
    /// during the walk holds the walk before too, so twice this at most, and a walk again
    /// past it returns the walk before: [`McpManager::list`].)
    pub fn max_listing_bytes(mut self, bytes: u64) -> Self {
        self.max_listing_bytes = bytes;
        self
    }

    /// Sets the deadlines (default: [`Timeouts::default`]).
    pub fn timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Sets the reconnect backoff (default: [`Backoff::default`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Checks the settings and makes the manager; nothing is started until
    /// [`McpManager::connect_all`] or [`McpManager::add_server`].
    ///
    /// # Errors
    ///
    /// A [`BuildError`] for a zero deadline, a page deadline over the listing deadline, or
    /// a backoff that starts at zero or above its maximum.
    pub fn build(self) -> Result<McpManager, BuildError> {
        let t = self.timeouts;
        for (name, deadline) in [
            ("connect", t.connect),
            ("tools/list page", t.page),
            ("tools/list", t.listing),
            ("tools/call", t.call),
        ] {
            if deadline.is_zero() {
                return Err(BuildError::ZeroDeadline(name));
            }
        }
        if t.page > t.listing {
            return Err(BuildError::PageOverListing {
                page: t.page,
                listing: t.listing,
            });
        }
        if self.backoff.initial.is_zero() || self.backoff.initial > self.backoff.max {
            return Err(BuildError::Backoff);
        }
        Ok(McpManager {
            inner: Arc::new(Inner {
                config: self.config,
                lazy: self.lazy,
                timeouts: self.timeouts,
                backoff: self.backoff,
                spill_dir: Arc::from(self.spill_dir),
                spill_budget: self.spill_budget,
                max_listing_bytes: self.max_listing_bytes,
                servers: RwLock::new(BTreeMap::new()),
                events: Arc::new(EventQueue::default()),
                shut_down: Mutex::new(false),
            }),
        })
    }
}

/// Live connections to the servers of an [`McpConfig`]: lists their tools, calls them,
/// reports `list_changed` and reachability as [`McpEvent`]s, reconnects lost servers with
/// backoff, and stops every server it started on [`McpManager::shutdown`].
///
/// It implements [`ToolLister`] and [`ToolHost`] (calls mapped whole into [`ToolOutput`]);
/// [`McpManager::call_tool_raw`] returns rmcp's typed `CallToolResult` instead.
#[derive(Clone)]
pub struct McpManager {
    inner: Arc<Inner>,
}

struct Inner {
    config: McpConfig,
    /// The servers of `config` that `connect_all` adds lazily, with their idle time.
    lazy: BTreeMap<ServerId, Duration>,
    timeouts: Timeouts,
    backoff: Backoff,
    spill_dir: Arc<Path>,
    spill_budget: SpillBudget,
    max_listing_bytes: u64,
    servers: RwLock<BTreeMap<ServerId, Arc<Slot>>>,
    events: Arc<EventQueue>,
    shut_down: Mutex<bool>,
}

/// One server: its state and its supervisor.
pub(crate) struct Slot {
    pub(crate) state: RwLock<State>,
    stop: watch::Sender<bool>,
    pub(crate) first_attempt: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
    /// A lazy server's start requests and use ([`McpManager::add_lazy_server`]).
    lazy: Option<Arc<Lazy>>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) session: Option<Arc<Session>>,
    pub(crate) reachability: Reachability,
    pub(crate) malformed: Vec<MalformedTool>,
}

impl std::fmt::Debug for McpManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpManager")
            .field("servers", &self.servers())
            .finish_non_exhaustive()
    }
}

impl McpManager {
    /// A builder over `config`, with default deadlines and backoff.
    pub fn builder(config: McpConfig) -> McpManagerBuilder {
        McpManagerBuilder {
            config,
            timeouts: Timeouts::default(),
            spill_dir: std::env::temp_dir(),
            spill_budget: SpillBudget::default(),
            max_listing_bytes: crate::DEFAULT_MAX_LISTING_BYTES,
            backoff: Backoff::default(),
            lazy: BTreeMap::new(),
        }
    }

    /// A new subscriber to this manager's events: it sees every event from now on, each
    /// subscriber its own copy, its queue coalesced per server and so bounded (see
    /// [`McpEvents`]). Subscribe before [`add_server`](Self::add_server) or
    /// [`connect_all`](Self::connect_all) to see a server's first connection.
    pub fn events(&self) -> McpEvents {
        self.inner.events.subscribe()
    }

    /// Connects every server of the configuration, concurrently, and waits for each first
    /// attempt. Servers that failed stay configured, reported unreachable, and are retried
    /// with backoff. Returns, for every server of the configuration, its reachability after
    /// its first attempt, or why there is none: the manager refused it (after shutdown), or
    /// the task making the attempt panicked. A server made lazy by
    /// [`McpManagerBuilder::lazy`] is added lazily instead, started by nothing: its entry
    /// is [`Reachability::Unknown`] (see [`is_lazy`](Self::is_lazy)).
    ///
    /// Dropping the future stops the attempts not yet made; servers already added stay.
    pub async fn connect_all(&self) -> BTreeMap<ServerId, Result<Reachability, ConnectError>> {
        let mut attempts = JoinSet::new();
        let mut servers = BTreeMap::new();
        for (server, config) in &self.inner.config.servers {
            let manager = self.clone();
            let (id, config) = (server.clone(), config.clone());
            let idle = self.inner.lazy.get(server).copied();
            let handle = attempts.spawn(async move {
                match idle {
                    Some(idle) => manager
                        .add_lazy_server(id, config, idle)
                        .await
                        .map(|()| Reachability::Unknown),
                    None => manager.add_server(id, config).await,
                }
            });
            servers.insert(handle.id(), server.clone());
        }
        let mut out = BTreeMap::new();
        while let Some(joined) = attempts.join_next_with_id().await {
            let task = match &joined {
                Ok((task, _)) => *task,
                Err(error) => error.id(),
            };
            let Some(server) = servers.remove(&task) else {
                continue;
            };
            let outcome = match joined {
                Ok((_, reached)) => reached.map_err(ConnectError::from),
                Err(source) => Err(ConnectError::Task {
                    server: server.clone(),
                    source,
                }),
            };
            out.insert(server, outcome);
        }
        out
    }

    /// Adds a server (one connected mid-Run, say) and waits for its first connection
    /// attempt; returns its reachability then. Replaces a server of the same name. When it
    /// returns, the attempt's events (its reachability, and `ToolsChanged` with
    /// [`ChangeCause::Connected`] when it connected) are already queued for every subscriber.
    ///
    /// # Errors
    ///
    /// [`McpError::ShutDown`] after shutdown.
    pub async fn add_server(
        &self,
        server: ServerId,
        config: ServerConfig,
    ) -> Result<Reachability, McpError> {
        if self.is_shut_down() {
            return Err(McpError::ShutDown);
        }
        self.add_slot(server.clone(), config, None).await?;
        Ok(self.reachability(&server).unwrap_or_default())
    }

    /// Adds a server that is started only when it is needed: by the first
    /// [`call_tool`](ToolHost::call_tool) or [`list`](Self::list) that names it, once for
    /// concurrent ones; it is stopped (its whole process group) after `idle` without a
    /// request and with none in flight (an `idle` of zero: as soon as none is), and started
    /// again by the next one. Starts nothing; replaces a server of the same name (stopping
    /// it first). A request dropped while it waits for the start leaves the start under
    /// way (the server then stops once idle). A failed start fails the
    /// requests that waited for it with [`McpError::StartFailed`], the start's own error
    /// (and is reported as [`McpEvent::Reachability`]); the next request tries again. A
    /// request whose start succeeded but whose server was gone before it could take the
    /// session (one that exits right after it starts) fails with [`McpError::Unreachable`]
    /// saying so, rather than starting it again. Removed, replaced or shut down during a
    /// start, the server is stopped with its grace ([`Timeouts::shutdown_grace`]). A start is
    /// reported as a first connection is (reachable, then
    /// [`McpEvent::ToolsChanged`] with [`ChangeCause::Connected`]); an idle stop is not
    /// reported. [`is_running`](Self::is_running) says whether it runs now.
    ///
    /// # Errors
    ///
    /// [`McpError::ShutDown`] after shutdown.
    pub async fn add_lazy_server(
        &self,
        server: ServerId,
        config: ServerConfig,
        idle: std::time::Duration,
    ) -> Result<(), McpError> {
        if self.is_shut_down() {
            return Err(McpError::ShutDown);
        }
        self.add_slot(server, config, Some(Arc::new(Lazy::new(idle))))
            .await
    }

    /// The configuration the manager was built with (servers added later by
    /// [`add_server`](Self::add_server) are not in it).
    pub fn config(&self) -> &McpConfig {
        &self.inner.config
    }

    /// Whether `server` is started only when it is needed (added by
    /// [`add_lazy_server`](Self::add_lazy_server), or made lazy by
    /// [`McpManagerBuilder::lazy`] and added by [`connect_all`](Self::connect_all)), or
    /// `None` for a server the manager does not have.
    pub fn is_lazy(&self, server: &ServerId) -> Option<bool> {
        Some(self.slot(server).ok()?.lazy.is_some())
    }

    /// Whether `server` has a live session now (a lazy server between its start and its
    /// stop; any other while connected), or `None` for a server the manager does not have.
    pub fn is_running(&self, server: &ServerId) -> Option<bool> {
        let slot = self.slot(server).ok()?;
        let state = slot.state.read().unwrap_or_else(PoisonError::into_inner);
        Some(state.session.is_some())
    }

    /// Makes the slot of `server` and its supervisor (lazy with `lazy`), and waits for its
    /// first attempt (none for a lazy one).
    async fn add_slot(
        &self,
        server: ServerId,
        config: ServerConfig,
        lazy: Option<Arc<Lazy>>,
    ) -> Result<(), McpError> {
        let (stop, stop_rx) = watch::channel(false);
        let (first_attempt, mut first_rx) = watch::channel(false);
        let slot = Arc::new(Slot {
            state: RwLock::new(State::default()),
            stop,
            first_attempt,
            task: Mutex::new(None),
            lazy: lazy.clone(),
        });
        let how = Connecting {
            timeouts: self.inner.timeouts,
            backoff: self.inner.backoff,
            spill_dir: Arc::clone(&self.inner.spill_dir),
            spill_budget: self.inner.spill_budget.clone(),
            max_listing_bytes: self.inner.max_listing_bytes,
        };
        let events = Arc::clone(&self.inner.events);
        // A slot this one replaces in the map is stopped by this one's supervisor before it
        // starts its server: never two of one server at once, nothing left to the adder's
        // future, which may be dropped, and the name never missing from the map meanwhile,
        // so a request waiting on the old slot follows to this one.
        let (handover, replaced) = tokio::sync::oneshot::channel::<Arc<Slot>>();
        // Stopped meanwhile (removed, shut down): the supervisor does not start.
        let stopped = stop_rx.clone();
        let retire = async move {
            if let Ok(replaced) = replaced.await {
                replaced.finish().await;
            }
            *stopped.borrow()
        };
        let task = match lazy {
            Some(lazy) => spawn_after(
                &slot,
                retire,
                crate::lazy::supervise(
                    server.clone(),
                    config,
                    Arc::clone(&slot),
                    lazy,
                    events,
                    how,
                    stop_rx,
                ),
            ),
            None => spawn_after(
                &slot,
                retire,
                supervise(
                    server.clone(),
                    config,
                    Arc::clone(&slot),
                    events,
                    how,
                    stop_rx,
                ),
            ),
        };
        let replaced = {
            // The shutdown flag is checked again under the map's lock: `shutdown` sets the
            // flag before it takes the map, so a slot is either in the map it takes (and
            // stopped with the others) or refused here, never left running after it.
            let mut servers = self
                .inner
                .servers
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if self.is_shut_down() {
                drop(servers);
                let _ = slot.stop.send_replace(true);
                // Aborted, the supervisor drops its session, and a stdio child kills its
                // process group when dropped.
                task.abort();
                return Err(McpError::ShutDown);
            }
            *slot.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
            // A slot of the same name added meanwhile is handed to the new supervisor,
            // which stops it first (no handover: nothing to stop).
            servers.insert(server.clone(), slot)
        };
        match replaced {
            // Told to stop now, in this poll, whatever becomes of this future; the new
            // supervisor waits for it to have stopped.
            Some(replaced) => {
                let _ = replaced.stop.send_replace(true);
                let _ = handover.send(replaced);
            }
            // Nothing to wait for: the new supervisor starts at once.
            None => drop(handover),
        }
        // If the server is removed or the manager shut down during the first attempt, its
        // supervisor's task ends and marks the attempt made (`FirstAttemptReleased`): this
        // wait ends.
        let _ = first_rx.wait_for(|done| *done).await;
        Ok(())
    }

    /// Disconnects a server and forgets it; its process group is stopped with its grace
    /// (SIGTERM, then SIGKILL after [`Timeouts::shutdown_grace`]), also while it is still
    /// starting. Does nothing for an unknown server.
    pub async fn remove_server(&self, server: &ServerId) {
        let slot = self
            .inner
            .servers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(server);
        if let Some(slot) = slot {
            slot.finish().await;
        }
    }

    /// The servers, by name.
    pub fn servers(&self) -> Vec<ServerId> {
        self.inner
            .servers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// Whether `server` can be reached now, or `None` for a server the manager does not
    /// have.
    pub fn reachability(&self, server: &ServerId) -> Option<Reachability> {
        let slot = self.slot(server).ok()?;
        let state = slot.state.read().unwrap_or_else(PoisonError::into_inner);
        Some(state.reachability.clone())
    }

    /// The tools the last listing of `server` refused, by name with the reason.
    pub fn malformed_tools(&self, server: &ServerId) -> Vec<MalformedTool> {
        self.slot(server)
            .map(|slot| {
                slot.state
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .malformed
                    .clone()
            })
            .unwrap_or_default()
    }

    /// The process group of a connected stdio server (its pid): for diagnostics, and for
    /// tests that check nothing of it outlives shutdown.
    pub fn process_group(&self, server: &ServerId) -> Option<i32> {
        self.session(server).ok()?.pgid()
    }

    fn slot(&self, server: &ServerId) -> Result<Arc<Slot>, McpError> {
        self.inner
            .servers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(server)
            .cloned()
            .ok_or_else(|| McpError::UnknownServer {
                server: server.clone(),
            })
    }

    fn session(&self, server: &ServerId) -> Result<Arc<Session>, McpError> {
        if self.is_shut_down() {
            return Err(McpError::ShutDown);
        }
        Self::session_of(server, &*self.slot(server)?)
    }

    /// The live session in `slot` (of `server`), or why there is none.
    fn session_of(server: &ServerId, slot: &Slot) -> Result<Arc<Session>, McpError> {
        let state = slot.state.read().unwrap_or_else(PoisonError::into_inner);
        match &state.session {
            Some(session) => Ok(Arc::clone(session)),
            None => Err(McpError::Unreachable {
                server: server.clone(),
                reason: match &state.reachability {
                    Reachability::Unreachable { reason } => reason.clone(),
                    _ => "not connected yet".to_owned(),
                },
            }),
        }
    }

    /// The session of `server` for a request: a lazy server's started first if need be,
    /// and held in flight (not stopped for idleness) while the guard lives; another's first
    /// connection attempt waited for if it is under way. A request whose server is removed
    /// while it waits fails with [`McpError::UnknownServer`]; one whose server is replaced
    /// waits for the new one.
    async fn acquire(
        &self,
        server: &ServerId,
    ) -> Result<(Arc<Session>, Option<InFlight>), McpError> {
        if self.is_shut_down() {
            return Err(McpError::ShutDown);
        }
        let mut slot = self.slot(server)?;
        loop {
            let acquired = match &slot.lazy {
                Some(lazy) => crate::lazy::acquire(server, &slot, lazy)
                    .await
                    .map(|(session, held)| (session, Some(held))),
                None => Self::first_session(server, &slot)
                    .await
                    .map(|session| (session, None)),
            };
            let error = match acquired {
                Ok(acquired) => return Ok(acquired),
                Err(error) => error,
            };
            // Released by a stop during the wait, say what became of the server: shut down,
            // removed (unknown now), or replaced (the new one is waited for).
            if self.is_shut_down() {
                return Err(McpError::ShutDown);
            }
            let now = self.slot(server)?;
            if Arc::ptr_eq(&now, &slot) {
                return Err(error);
            }
            slot = now;
        }
    }

    /// The live session in `slot` (of `server`, not lazy), waiting first for the server's
    /// first connection attempt if it is still under way: a request made while the servers
    /// connect in the background (a gateway answering from a kept listing meanwhile) reaches
    /// the server once it is up, or fails with the attempt's reason, not with "not connected
    /// yet". The wait is bounded by the attempt's own deadlines (the connect deadline, then
    /// the first listing's; after the slot it replaces has stopped, if it replaces one), and
    /// ends when the slot is stopped (the server removed or replaced, the manager shut
    /// down; [`acquire`](Self::acquire) then says which); an attempt is marked made
    /// however the supervisor's task ends ([`FirstAttemptReleased`]). Later, between
    /// reconnection attempts, it fails at once with the last reason. Cancel-safe: it only
    /// waits on watches.
    async fn first_session(server: &ServerId, slot: &Slot) -> Result<Arc<Session>, McpError> {
        let mut first = slot.first_attempt.subscribe();
        let mut stop = slot.stop.subscribe();
        tokio::select! {
            _ = first.wait_for(|done| *done) => {}
            _ = stop.wait_for(|stop| *stop) => {}
        }
        // A stopped slot's session may still be set for a moment (its supervisor has not
        // yet cleared it): taking it would fail the request as the session closes, where
        // `acquire` follows the replacement or says the server was removed.
        if *slot.stop.borrow() {
            return Err(McpError::Unreachable {
                server: server.clone(),
                reason: "its connection is being stopped (the server was removed, replaced \
                         or shut down)"
                    .to_owned(),
            });
        }
        Self::session_of(server, slot)
    }

    /// Whether [`McpManager::shutdown`] has begun.
    fn is_shut_down(&self) -> bool {
        *self
            .inner
            .shut_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Lists every tool of `server` now, page by page to the end (no cache), starting a
    /// lazy server first (or waiting for another's first connection attempt, if under way).
    /// Malformed tools are set aside in [`Listing::malformed`] and the rest kept.
    ///
    /// A listing of several pages during which the server announced a change of its tools
    /// is walked again (at most twice, every walk again ending within half the listing
    /// deadline, and one started only when it can at the pace of the last): its pages may
    /// come from two catalogues, and one whose cursor is an offset skips a tool the server
    /// did not change. Over stdio every change announced before a page's answer is seen;
    /// over HTTP the announcement comes on another stream and may be read after the walk. A
    /// walk again that fails returns the walk before it. The same holds of the listing each
    /// connection makes.
    ///
    /// # Errors
    ///
    /// An [`McpError`] naming the server, the page and the reason.
    pub async fn list(&self, server: &ServerId) -> Result<Listing, McpError> {
        let (session, _held) = self.acquire(server).await?;
        let listing = session.list().await?;
        if let Ok(slot) = self.slot(server) {
            slot.state
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .malformed
                .clone_from(&listing.malformed);
        }
        Ok(listing)
    }

    /// Calls a tool and returns the server's result as rmcp parses it (which drops fields
    /// and block types rmcp does not model; [`ToolHost::call_tool`] keeps everything). The
    /// call has the [`Timeouts::call`] deadline; when it passes, or when the future is
    /// dropped before the answer, `notifications/cancelled` is sent and the connection stays
    /// usable. A tool that ran and failed is `Ok` with `is_error` set.
    ///
    /// # Errors
    ///
    /// An [`McpError`]: unknown or unreachable server, timeout, the server's exit (with
    /// its status and last stderr lines), a closed connection, a protocol error (including
    /// a result rmcp cannot read, or a `resultType` psych does not know), a server asking
    /// for input ([`McpError::InputRequired`]) or a capability
    /// ([`McpError::MissingCapability`]) this call cannot give.
    pub async fn call_tool_raw(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        // A text kept in a file is its placeholder here: rmcp's type cannot name files.
        match self
            .call_as::<CallToolResult>(tool, arguments, &InputRound::default(), None)
            .await?
        {
            Read::Complete(result, _) => Ok(result),
            Read::InputRequired(_) => Err(input_required(tool)),
        }
    }

    /// A `tools/call` carrying `round`, whose `result` JSON (exactly as the server wrote it)
    /// is read by its `resultType`: complete (or none, as before MCP 2026-07-28) as `T`,
    /// with the texts kept in files; `input_required` as the raw result. Any other
    /// `resultType`, or a complete answer that does not read as `T`, is a protocol error:
    /// never an empty result.
    async fn call_as<T: DeserializeOwned + Send + 'static>(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
        round: &InputRound,
        progress: Option<ProgressSink>,
    ) -> Result<Read<T>, McpError> {
        let (session, _held) = self.acquire(&tool.server).await?;
        let kept = session
            .call(
                tool.tool.as_str(),
                arguments,
                round,
                self.inner.timeouts.call,
                progress,
            )
            .await?;
        let protocol = |message: String| McpError::Protocol {
            server: tool.server.clone(),
            call: format!("tools/call {}", tool.tool),
            message,
        };
        let result_type = kept.value.get("resultType").map(|value| value.as_str());
        match result_type {
            None | Some(Some("complete")) => {}
            Some(Some("input_required")) => {
                return match kept.value {
                    serde_json::Value::Object(raw) => Ok(Read::InputRequired(raw)),
                    _ => Err(protocol("the answer is not a JSON object".to_owned())),
                };
            }
            Some(other) => {
                return Err(protocol(format!(
                    "the answer's resultType {} is not one psych knows (complete, \
                     input_required)",
                    other.map_or_else(|| "(not a string)".to_owned(), |t| format!("{t:?}"))
                )));
            }
        }
        // Typing copies every text and decodes every image of the answer: a large one is
        // typed on a blocking thread.
        let value = kept.value;
        let large = crate::wire::value_past_worker_bound(&value);
        let typed = crate::wire::off_worker_if(large, move || serde_json::from_value::<T>(value))
            .await
            .map_err(|source| McpError::Task {
                server: tool.server.clone(),
                call: format!("tools/call {}", tool.tool),
                source,
            })?;
        let read =
            typed.map_err(|e| protocol(format!("the answer is not a tools/call result: {e}")))?;
        Ok(Read::Complete(read, kept.spilled))
    }

    /// [`McpManager::call_as`] into a [`HostAnswer`], its spilled texts named in the
    /// output; a -32021 refusal is an answer too.
    async fn call_round(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
        round: &InputRound,
        progress: Option<ProgressSink>,
    ) -> Result<HostAnswer, McpError> {
        match self
            .call_as::<ToolOutput>(tool, arguments, round, progress)
            .await
        {
            Ok(Read::Complete(mut output, spilled)) => {
                output.spilled = spilled;
                Ok(HostAnswer::Complete(output))
            }
            Ok(Read::InputRequired(raw)) => Ok(HostAnswer::InputRequired(raw)),
            Err(McpError::MissingCapability { message, data, .. }) => {
                Ok(HostAnswer::MissingCapability { message, data })
            }
            Err(error) => Err(error),
        }
    }

    /// A call that cannot answer input requests ([`ToolHost::call_tool`]): an
    /// `input_required` answer is [`McpError::InputRequired`].
    async fn call_output(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
        progress: Option<ProgressSink>,
    ) -> Result<ToolOutput, McpError> {
        match self
            .call_as::<ToolOutput>(tool, arguments, &InputRound::default(), progress)
            .await?
        {
            Read::Complete(mut output, spilled) => {
                output.spilled = spilled;
                Ok(output)
            }
            Read::InputRequired(_) => Err(input_required(tool)),
        }
    }

    /// Stops every supervisor, closes every session and stops every stdio server's process
    /// group, and waits for all of it. Later calls fail with [`McpError::ShutDown`].
    pub async fn shutdown(&self) {
        *self
            .inner
            .shut_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        let slots: Vec<_> = std::mem::take(
            &mut *self
                .inner
                .servers
                .write()
                .unwrap_or_else(PoisonError::into_inner),
        )
        .into_values()
        .collect();
        for slot in &slots {
            let _ = slot.stop.send_replace(true);
        }
        for slot in slots {
            slot.finish().await;
        }
    }
}

/// A `tools/call` answer read by its `resultType`.
enum Read<T> {
    /// Complete: the result, and its texts kept in files.
    Complete(T, Vec<SpilledBlock>),
    /// `input_required`: the result object as sent.
    InputRequired(JsonObject),
}

/// What a call that cannot answer input requests fails with when the server asks for some.
fn input_required(tool: &ToolRef) -> McpError {
    McpError::InputRequired {
        server: tool.server.clone(),
        call: format!("tools/call {}", tool.tool),
    }
}

impl Slot {
    /// A slot with no supervisor, for tests that play the supervisor's part by hand.
    #[cfg(test)]
    pub(crate) fn unsupervised(lazy: Option<Arc<Lazy>>) -> Self {
        Self {
            state: RwLock::new(State::default()),
            stop: watch::Sender::new(false),
            first_attempt: watch::Sender::new(false),
            task: Mutex::new(None),
            lazy,
        }
    }

    /// Says the slot is stopped, as [`finish`](Self::finish) does first.
    #[cfg(test)]
    pub(crate) fn stop(&self) {
        let _ = self.stop.send_replace(true);
    }

    /// A watch of the slot's stop: `true` once the server is removed or the manager shut
    /// down.
    pub(crate) fn stopping(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Stops the supervisor and waits for it (it closes its session on the way out).
    async fn finish(&self) {
        let _ = self.stop.send_replace(true);
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
        let session = self
            .state
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .session
            .take();
        if let Some(session) = session {
            session.close().await;
        }
    }

    pub(crate) fn set(&self, session: Option<Arc<Session>>, reachability: Reachability) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.session = session;
        state.reachability = reachability;
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A manager dropped without `shutdown`: stop the supervisors; each stdio child
        // kills its process group when dropped.
        for slot in self
            .servers
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            let _ = slot.stop.send_replace(true);
            if let Some(task) = slot
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            {
                task.abort();
            }
        }
    }
}

/// How a server is connected: the manager's settings a supervisor needs.
pub(crate) struct Connecting {
    timeouts: Timeouts,
    backoff: Backoff,
    spill_dir: Arc<Path>,
    spill_budget: SpillBudget,
    max_listing_bytes: u64,
}

impl Connecting {
    /// One connection attempt to `server`, with its first listing; ended by `stop` with
    /// [`McpError::ShutDown`], a process started for it stopped with its grace
    /// ([`Session::connect`]).
    pub(crate) async fn connect(
        &self,
        server: &ServerId,
        config: &ServerConfig,
        events: &Arc<EventQueue>,
        stop: &watch::Receiver<bool>,
    ) -> Result<(Arc<Session>, Listing), McpError> {
        Session::connect(
            server,
            &config.transport,
            (self.timeouts, self.max_listing_bytes),
            Arc::clone(events),
            (&self.spill_dir, &self.spill_budget),
            stop.clone(),
        )
        .await
    }
}

/// Spawns `supervise` to run once `retire` has finished the slot it replaces, unless
/// `retire` says the new slot was stopped meanwhile.
fn spawn_after(
    slot: &Arc<Slot>,
    retire: impl Future<Output = bool> + Send + 'static,
    supervise: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let released = FirstAttemptReleased(Arc::clone(slot));
    tokio::spawn(async move {
        let _released = released;
        if !retire.await {
            supervise.await;
        }
    })
}

/// Marks its slot's first connection attempt made when the supervisor's task ends, however
/// it ends (stopped before it started, finished, panicked, aborted), so no request waits
/// for an attempt that will never come ([`McpManager::acquire`]); a lazy server's
/// supervisor is marked ended ([`Lazy::end`]) for the same reason.
struct FirstAttemptReleased(Arc<Slot>);

impl Drop for FirstAttemptReleased {
    fn drop(&mut self) {
        self.0.first_attempt.send_replace(true);
        if let Some(lazy) = &self.0.lazy {
            lazy.end();
        }
    }
}

/// Connects, watches and reconnects one server until told to stop.
async fn supervise(
    server: ServerId,
    config: ServerConfig,
    slot: Arc<Slot>,
    events: Arc<EventQueue>,
    how: Connecting,
    mut stop: watch::Receiver<bool>,
) {
    let mut failures = 0u32;
    let report = |reachability: Reachability| {
        events.push(McpEvent::Reachability {
            server: server.clone(),
            reachability,
        });
    };
    loop {
        // Not raced with `stop` here: the attempt ends itself when stopped, stopping a
        // process it started with its grace (dropped, it would be killed at once, blocking
        // this worker while its tree is looked through).
        let attempt = how.connect(&server, &config, &events, &stop).await;
        if *stop.borrow() {
            if let Ok((session, _)) = attempt {
                session.close().await;
            }
            break;
        }
        match attempt {
            Ok((session, listing)) => {
                let connected = tokio::time::Instant::now();
                {
                    let mut state = slot.state.write().unwrap_or_else(PoisonError::into_inner);
                    state.malformed = listing.malformed;
                }
                slot.set(Some(Arc::clone(&session)), Reachability::Reachable);
                report(Reachability::Reachable);
                events.push(McpEvent::ToolsChanged {
                    server: server.clone(),
                    cause: ChangeCause::Connected,
                });
                // After the events: whoever waited for the first attempt finds them queued.
                let _ = slot.first_attempt.send_replace(true);
                let lost = tokio::select! {
                    reason = session.lost() => Some(reason),
                    _ = stop.wait_for(|stop| *stop) => None,
                };
                let Some(reason) = lost else {
                    slot.set(None, Reachability::Unknown);
                    session.close().await;
                    break;
                };
                // A session lost sooner than the delay it would wait now (a server that
                // crashes as it starts, say) is a failure like any: the delay grows. One
                // that lasted that long steps the backoff back one delay, and one that
                // lasted the longest delay starts it over; so a server that keeps dying is
                // restarted about as often as its sessions last, never at the first delay
                // whatever they last.
                failures = how.backoff.after_session(failures, connected.elapsed());
                let down = Reachability::Unreachable { reason };
                slot.set(None, down.clone());
                report(down);
                session.close().await;
            }
            Err(error) => {
                let down = Reachability::Unreachable {
                    reason: error.to_string(),
                };
                slot.set(None, down.clone());
                report(down);
                let _ = slot.first_attempt.send_replace(true);
            }
        }
        let delay = how.backoff.delay(failures);
        failures = failures.saturating_add(1);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
    }
    // Stopped before a first attempt finished: its task's `FirstAttemptReleased` releases
    // whoever waits for it.
}

impl ToolLister for McpManager {
    type Error = McpError;

    async fn list_tools(&self, server: &ServerId) -> Result<Vec<ToolDefinition>, McpError> {
        Ok(self.list(server).await?.tools)
    }
}

/// `tools/call` with the [`Timeouts::call`] deadline and cancellation, as
/// [`McpManager::call_tool_raw`]; the result is read from its JSON into a [`ToolOutput`]
/// block by block, so nothing the server sent is dropped: unknown block types are kept as
/// [`ContentBlock::Unknown`](psych_types::ContentBlock::Unknown), unknown fields in their
/// block's `extra`. A tool that ran and failed is `Ok` with `is_error` set; `Err` is the
/// connection, the deadline, or an answer that is not a `CallToolResult` at all.
///
/// With [`ToolHost::call_tool_with_progress`] the call carries a progress token of its own,
/// and each `notifications/progress` the server sends for it is reported to the sink, in
/// the order read and before the call returns; the sink is dropped when the call ends.
///
/// A call to a server whose first connection attempt is still under way (one being added,
/// or connecting in the background after [`McpManager::connect_all`] was spawned) waits for
/// that attempt (its connect and first listing deadlines) and then reaches the server, or
/// fails with the attempt's reason; the call's own deadline ([`Timeouts::call`]) starts
/// once it has the session. A call while a lost server waits to be reconnected fails at
/// once with [`McpError::Unreachable`]; one whose server is removed while it waits fails
/// with [`McpError::UnknownServer`], and one whose server is replaced waits for the new one.
///
/// MCP 2026-07-28's rounds: [`ToolHost::call_tool_round`] sends the round's
/// `inputResponses` and `requestState` (byte for byte) and, to a server of 2026-07-28, its
/// client capabilities, and answers an `input_required` result raw
/// ([`HostAnswer::InputRequired`]) and a -32021 refusal as
/// [`HostAnswer::MissingCapability`]. The plain calls declare no capability, so a
/// conforming server never asks them for input; one that does anyway is
/// [`McpError::InputRequired`], never an empty result. A `resultType` psych does not know
/// is a protocol error.
impl ToolHost for McpManager {
    async fn call_tool(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
    ) -> Result<ToolOutput, McpError> {
        self.call_output(tool, arguments, None).await
    }

    async fn call_tool_with_progress(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
        progress: ProgressSink,
    ) -> Result<ToolOutput, McpError> {
        self.call_output(tool, arguments, Some(progress)).await
    }

    async fn call_tool_round(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
        round: InputRound,
        progress: ProgressSink,
    ) -> Result<HostAnswer, McpError> {
        self.call_round(tool, arguments, &round, Some(progress))
            .await
    }
}
