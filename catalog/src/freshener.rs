//! The freshener: tokio tasks that keep the catalogue fresh over any
//! [`ToolLister`], by four triggers that are not interchangeable.
//!
//! - **Sync on connect** ([`Freshener::connect`]): lists the server at once.
//! - **TTL sweep**: each server is listed again when its last successful sync is older than
//!   the TTL, plus a per-server jitter so servers connected together do not all list
//!   together. Every list call runs in its own task under a per-server timeout, so a slow or
//!   hanging server never delays another.
//! - **On demand** ([`Freshener::refresh`]): awaitable; the caller learns the new version or
//!   the error.
//! - **`notifications/tools/list_changed`** ([`Freshener::list_changed`]): a plain function
//!   the MCP adapter calls from its notification handler. Notifications are coalesced: a
//!   refresh starts once they stop for `debounce_quiet`, or `debounce_max` after the first,
//!   so a storm gives one or two refreshes.
//!
//! [`Freshener::disconnect`] stops a server's task (a server removed from the configuration
//! is no longer swept); its tools stay in the catalogue.
//!
//! One task per server owns that server's state. It numbers every list call it starts (a
//! generation) and stores a reply only if no later call's reply is already stored, so a
//! `tools/list` reply still in flight can never overwrite a newer one. A failure keeps the
//! current tools, is recorded in the server's health, and is retried with exponential
//! backoff. Redb writes commit with an fsync, so they run under
//! [`tokio::task::spawn_blocking`], as do the reads of a server's health (at a task's
//! start, when a server is followed, at a followed server's sweep). A refresh
//! that changed a server's tools is followed, in the same blocking task, by a read of its
//! live set, so the catalogue's cache of decoded sets holds the new set before the next turn
//! asks for it (that first read is the one that decodes).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use psych_types::{
    CatalogVersion, Lease, LeaseGuard, ServerHealth, ServerId, ToolDefinition, ToolLister,
};
use tokio::runtime::Handle;
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::error::{ConfigError, RefreshError};
use psych_types::Refresh;

use crate::store::Catalog;

/// The freshener's timings, built and checked by [`FreshenerBuilder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreshenerConfig {
    ttl: Duration,
    jitter: Duration,
    list_timeout: Duration,
    backoff_initial: Duration,
    backoff_max: Duration,
    debounce_quiet: Duration,
    debounce_max: Duration,
    seed: u64,
}

/// Builds a [`FreshenerConfig`]; [`build`](Self::build) checks it.
///
/// Defaults: TTL 10 minutes, jitter 1 minute, list timeout 30 s, backoff from 1 s doubling up
/// to 5 minutes, `list_changed` quiet period 200 ms and longest wait 2 s, jitter seed 0.
#[derive(Debug, Clone)]
pub struct FreshenerBuilder {
    config: FreshenerConfig,
}

impl Default for FreshenerBuilder {
    fn default() -> Self {
        Self {
            config: FreshenerConfig {
                ttl: Duration::from_secs(600),
                jitter: Duration::from_secs(60),
                list_timeout: Duration::from_secs(30),
                backoff_initial: Duration::from_secs(1),
                backoff_max: Duration::from_secs(300),
                debounce_quiet: Duration::from_millis(200),
                debounce_max: Duration::from_secs(2),
                seed: 0,
            },
        }
    }
}

impl FreshenerBuilder {
    /// A server is listed again once its last successful sync is this old.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.ttl = ttl;
        self
    }

    /// Each TTL refresh is delayed by a per-server pseudo-random amount below this.
    #[must_use]
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.config.jitter = jitter;
        self
    }

    /// The longest one `tools/list` may take before it counts as a failure.
    #[must_use]
    pub fn list_timeout(mut self, timeout: Duration) -> Self {
        self.config.list_timeout = timeout;
        self
    }

    /// The delay before the first retry after a failure, and the longest delay (each further
    /// failure doubles it).
    #[must_use]
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.config.backoff_initial = initial;
        self.config.backoff_max = max;
        self
    }

    /// `list_changed` coalescing: a refresh starts once notifications stop for `quiet`, or
    /// `max` after the first of them, whichever is first.
    #[must_use]
    pub fn debounce(mut self, quiet: Duration, max: Duration) -> Self {
        self.config.debounce_quiet = quiet;
        self.config.debounce_max = max;
        self
    }

    /// Seeds the jitter, so runs are repeatable.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = seed;
        self
    }

    /// Checks the timings.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] for a zero TTL, list timeout or initial backoff;
    /// [`ConfigError::Backoff`] when the initial backoff exceeds the maximum;
    /// [`ConfigError::Debounce`] when the quiet period exceeds the longest wait.
    pub fn build(self) -> Result<FreshenerConfig, ConfigError> {
        let c = self.config;
        for (name, value) in [
            ("ttl", c.ttl),
            ("list_timeout", c.list_timeout),
            ("backoff_initial", c.backoff_initial),
        ] {
            if value.is_zero() {
                return Err(ConfigError::Zero(name));
            }
        }
        if c.backoff_initial > c.backoff_max {
            return Err(ConfigError::Backoff {
                initial: c.backoff_initial,
                max: c.backoff_max,
            });
        }
        if c.debounce_quiet > c.debounce_max {
            return Err(ConfigError::Debounce {
                quiet: c.debounce_quiet,
                max: c.debounce_max,
            });
        }
        Ok(c)
    }
}

impl FreshenerConfig {
    /// A builder with the defaults.
    pub fn builder() -> FreshenerBuilder {
        FreshenerBuilder::default()
    }

    /// The delay before retry number `failures` (1 for the first).
    fn backoff(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.backoff_initial
            .checked_mul(factor)
            .map_or(self.backoff_max, |d| d.min(self.backoff_max))
    }
}

/// What an on-demand refresh did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefreshOutcome {
    /// The listing was stored.
    Stored(Refresh),
    /// A listing started later was stored first, so this one was dropped; the server's tools
    /// are at least as new as this call's.
    Superseded {
        /// The server's set version now.
        version: CatalogVersion,
    },
    /// The catalogue is shared ([`Catalog::shared`]) and another process sharing it stored
    /// a listing of the server that started after this refresh was asked for, so the server
    /// was not listed again.
    Shared {
        /// The server's set version that listing stored.
        version: CatalogVersion,
    },
}

impl RefreshOutcome {
    /// The server's set version after the refresh.
    pub fn version(&self) -> CatalogVersion {
        match self {
            Self::Stored(refresh) => refresh.version,
            Self::Superseded { version } | Self::Shared { version } => *version,
        }
    }
}

type Waiter = oneshot::Sender<Result<RefreshOutcome, RefreshError>>;

/// Requests from the [`Freshener`] handle to one server's task.
#[derive(Default)]
struct Pending {
    /// Stop this server's task (it was disconnected).
    stop: bool,
    connect: bool,
    changed: bool,
    /// Sweep from the stored sync with the slot's TTL ([`Freshener::follow`]).
    follow: bool,
    demands: Vec<Waiter>,
}

/// How a followed server is swept ([`Freshener::follow`]).
struct Follow {
    /// How old its kept listing may be while it does not run.
    ttl: Duration,
    /// Whether it runs now.
    running: Arc<dyn Fn() -> bool + Send + Sync>,
}

/// Where the handle leaves requests for one server's task.
#[derive(Default)]
struct Slot {
    pending: Mutex<Pending>,
    notify: Notify,
    /// Set for a followed server ([`Freshener::follow`]).
    follow: Mutex<Option<Follow>>,
}

impl Slot {
    /// The followed server's own TTL, and whether it runs now; `None` when not followed.
    fn followed(&self) -> Option<(Duration, bool)> {
        let follow = self.follow.lock().unwrap_or_else(PoisonError::into_inner);
        follow.as_ref().map(|f| (f.ttl, (f.running)()))
    }

    /// The TTL of this server's next sweep: its own while it is followed and does not run,
    /// else the configuration's.
    fn ttl(&self, config: &FreshenerConfig) -> Duration {
        match self.followed() {
            Some((ttl, false)) => ttl,
            _ => config.ttl,
        }
    }
}

impl Slot {
    fn request(&self, f: impl FnOnce(&mut Pending)) {
        f(&mut self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        self.notify.notify_one();
    }
}

/// What every server task shares.
struct Context<L> {
    catalog: Catalog,
    lister: Arc<L>,
    config: FreshenerConfig,
}

/// Keeps a [`Catalog`] fresh from a [`ToolLister`]: sync on connect, a TTL sweep with jitter,
/// refresh on demand, and coalesced `list_changed` notifications.
///
/// A server is registered by the first [`connect`](Self::connect), [`follow`](Self::follow),
/// [`refresh`](Self::refresh) or [`list_changed`](Self::list_changed) that names it, and is
/// swept from then on. Every task it starts is owned: [`shutdown`](Self::shutdown) signals
/// them all and waits for them; dropping the freshener aborts them.
///
/// # Example
///
/// ```
/// use std::sync::Arc;
///
/// use psych_catalog::{Catalog, Freshener, FreshenerConfig};
/// use psych_types::{ServerId, ToolDefinition, ToolLister, ToolName};
///
/// /// A lister that always answers with one tool.
/// struct OneTool;
///
/// impl ToolLister for OneTool {
///     type Error = std::io::Error;
///
///     async fn list_tools(&self, _: &ServerId) -> Result<Vec<ToolDefinition>, Self::Error> {
///         let name = ToolName::new("echo").map_err(std::io::Error::other)?;
///         Ok(vec![ToolDefinition::new(name, "Echo the input", Default::default())])
///     }
/// }
///
/// let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
/// runtime.block_on(async {
///     let catalog = Catalog::in_memory()?;
///     let config = FreshenerConfig::builder().build()?;
///     let freshener = Freshener::start(catalog, Arc::new(OneTool), config)?;
///     let echo = ServerId::new("echo")?;
///     let outcome = freshener.refresh(&echo).await?; // on demand, awaited
///     assert_eq!(outcome.version().0, 1);
///     freshener.list_changed(&echo); // from the MCP adapter's notification handler
///     assert_eq!(freshener.catalog().live(&echo)?.tools.len(), 1);
///     freshener.shutdown().await;
///     Ok::<(), Box<dyn std::error::Error>>(())
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Freshener<L: ToolLister + 'static> {
    context: Arc<Context<L>>,
    runtime: Handle,
    shutdown: watch::Sender<bool>,
    servers: Mutex<BTreeMap<ServerId, Arc<Slot>>>,
    tasks: Mutex<JoinSet<()>>,
}

impl<L: ToolLister + 'static> std::fmt::Debug for Freshener<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Freshener")
            .field("catalog", &self.context.catalog)
            .field("config", &self.context.config)
            .finish_non_exhaustive()
    }
}

impl<L: ToolLister + 'static> Freshener<L> {
    /// Starts a freshener on the current tokio runtime. No server is listed until it is
    /// connected (or refreshed, or notified).
    ///
    /// # Errors
    ///
    /// [`ConfigError::NoRuntime`] when called outside a tokio runtime.
    pub fn start(
        catalog: Catalog,
        lister: Arc<L>,
        config: FreshenerConfig,
    ) -> Result<Self, ConfigError> {
        let runtime = Handle::try_current().map_err(|_| ConfigError::NoRuntime)?;
        Ok(Self {
            context: Arc::new(Context {
                catalog,
                lister,
                config,
            }),
            runtime,
            shutdown: watch::Sender::new(false),
            servers: Mutex::new(BTreeMap::new()),
            tasks: Mutex::new(JoinSet::new()),
        })
    }

    /// The catalogue this freshener writes to.
    pub fn catalog(&self) -> &Catalog {
        &self.context.catalog
    }

    /// Sync on connect: `server` has (re)connected; list it now, and keep it fresh from
    /// then on. Does nothing after shutdown.
    pub fn connect(&self, server: &ServerId) {
        if let Some(slot) = self.slot(server) {
            slot.request(|p| p.connect = true);
        }
    }

    /// Keeps `server` fresh without starting it needlessly, for a server whose listing is
    /// kept and that listing would start (one started only when a call needs it), listing
    /// nothing now. While `running` says it does not run, its sweep lists it only once its
    /// last stored sync is `ttl` old (with the jitter), and a failed listing (a start that
    /// failed) is tried again only `ttl` later, not with the backoff: nothing starts it
    /// meanwhile but a call. While it runs, it is swept with the configuration's TTL like
    /// any server. A server never synced is not swept until something lists it. A
    /// [`connect`](Self::connect), [`refresh`](Self::refresh) or
    /// [`list_changed`](Self::list_changed) still lists it at once. `running` is called on
    /// the freshener's task at each sweep: it must be cheap and must not block. Does nothing
    /// after shutdown.
    pub fn follow(
        &self,
        server: &ServerId,
        ttl: Duration,
        running: impl Fn() -> bool + Send + Sync + 'static,
    ) {
        if let Some(slot) = self.slot(server) {
            *slot.follow.lock().unwrap_or_else(PoisonError::into_inner) = Some(Follow {
                ttl,
                running: Arc::new(running),
            });
            slot.request(|p| p.follow = true);
        }
    }

    /// `server` sent `notifications/tools/list_changed`. Cheap and non-blocking, for the MCP
    /// adapter's notification handler; a storm of calls coalesces into one or two refreshes.
    /// Does nothing after shutdown.
    pub fn list_changed(&self, server: &ServerId) {
        if let Some(slot) = self.slot(server) {
            slot.request(|p| p.changed = true);
        }
    }

    /// `server` is gone (removed from the configuration): stop listing and sweeping it.
    /// Its tools and health stay in the catalogue; a listing in flight is dropped (one
    /// being stored at the moment of the call, a store of a few milliseconds, still
    /// completes), and an on-demand refresh waiting for it returns
    /// [`RefreshError::ShutDown`]. A later [`connect`](Self::connect) starts it afresh.
    pub fn disconnect(&self, server: &ServerId) {
        let slot = self
            .servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(server);
        if let Some(slot) = slot {
            slot.request(|p| p.stop = true);
        }
        // Collect the tasks that have ended, so disconnects do not accumulate.
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        while tasks.try_join_next().is_some() {}
    }

    /// Lists `server` now and stores the result.
    ///
    /// # Errors
    ///
    /// The listing's [`RefreshError`]; the server keeps its tools and the failure is recorded.
    /// [`RefreshError::ShutDown`] when the freshener shuts down first.
    pub async fn refresh(&self, server: &ServerId) -> Result<RefreshOutcome, RefreshError> {
        let shut = || RefreshError::ShutDown {
            server: server.clone(),
        };
        let slot = self.slot(server).ok_or_else(shut)?;
        let (tx, rx) = oneshot::channel();
        slot.request(|p| p.demands.push(tx));
        // Not held while waiting: if the server's task has ended (shutdown, disconnect), the
        // last holder of the slot drops the request and with it `tx`, so this never hangs.
        drop(slot);
        rx.await.map_err(|_| shut())?
    }

    /// Stops every task and waits for them: in-flight listings are dropped (their futures
    /// cancelled), and pending on-demand refreshes return [`RefreshError::ShutDown`]. A write
    /// already handed to the blocking pool finishes first, so none is cut short.
    pub async fn shutdown(&self) {
        self.shutdown.send_replace(true);
        // Drop the handle's slots, so requests left in them after their task ends go with
        // them (their callers see `ShutDown`).
        self.servers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let mut tasks =
            std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        while tasks.join_next().await.is_some() {}
    }

    /// The slot of `server`, starting its task on first use; `None` after shutdown.
    fn slot(&self, server: &ServerId) -> Option<Arc<Slot>> {
        let mut servers = self.servers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = servers.get(server) {
            return (!*self.shutdown.borrow()).then(|| Arc::clone(slot));
        }
        // Checked under the tasks lock, which `shutdown` takes to collect the tasks: a task
        // is either started before shutdown takes the set, or not at all.
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        if *self.shutdown.borrow() {
            return None;
        }
        let slot = Arc::new(Slot::default());
        servers.insert(server.clone(), Arc::clone(&slot));
        tasks.spawn_on(
            run_server(
                Arc::clone(&self.context),
                server.clone(),
                Arc::clone(&slot),
                self.shutdown.subscribe(),
            ),
            &self.runtime,
        );
        Some(slot)
    }
}

/// The instant `after` from now, or about a century from now where that is past what an
/// `Instant` holds (a TTL of years): never a panic.
fn later(after: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// What is left of `ttl` after a sync at `at` (the catalogue's clock, in milliseconds):
/// zero once it has passed.
fn ttl_left(catalog: &Catalog, ttl: Duration, at: u64) -> Duration {
    let age = catalog.now().saturating_sub(at);
    ttl.saturating_sub(Duration::from_millis(age))
}

/// The coalescing window of `list_changed` notifications.
#[derive(Clone, Copy)]
struct Debounce {
    quiet_until: Instant,
    max_until: Instant,
}

/// One server's task: owns its generations, its in-flight listings and its timers.
async fn run_server<L: ToolLister + 'static>(
    context: Arc<Context<L>>,
    server: ServerId,
    slot: Arc<Slot>,
    mut shutdown: watch::Receiver<bool>,
) {
    let config = &context.config;
    let mut jitter = Jitter::new(config.seed, &server);
    let mut inflight = Inflight::default();
    let mut waiters: BTreeMap<u64, Waiter> = BTreeMap::new();
    let mut stored_generation = 0u64;
    let mut stored_version = CatalogVersion(0);
    let mut failures = 0u32;
    // The newest generation that failed: a listing stored after it but started before it
    // (an older one still in flight) may hold the tools from before what the newer one was
    // asked for (a `list_changed`), so its failure still counts and is retried.
    let mut failed_generation = 0u64;
    let mut debounce: Option<Debounce> = None;
    // The sweep: resume from the stored sync, so a reopened catalogue is not listed at once.
    let resume = |jitter: &mut Jitter,
                  stored_version: &mut CatalogVersion,
                  health: Option<ServerHealth>| match health {
        Some(health) => health.last_sync.map(|sync| {
            *stored_version = sync.version;
            let left = ttl_left(&context.catalog, slot.ttl(config), sync.at);
            later(left.saturating_add(jitter.below(config.jitter)))
        }),
        None => None,
    };
    let mut due = resume(
        &mut jitter,
        &mut stored_version,
        health(&context.catalog, &server).await,
    );

    let start = |inflight: &mut Inflight| {
        inflight.start(list(
            Arc::clone(&context.lister),
            context.catalog.clone(),
            server.clone(),
            config.list_timeout,
        ))
    };

    loop {
        let debounce_at = debounce.map(|d| d.quiet_until.min(d.max_until));
        tokio::select! {
            biased;
            () = stopped(&mut shutdown) => break,
            Some((generation, listing)) = inflight.join_next(&server) => {
                // Disconnected while the listing ended: it is dropped, not stored, and the
                // task ends as the stop says (its waiter's channel closes).
                if slot.pending.lock().unwrap_or_else(PoisonError::into_inner).stop {
                    break;
                }
                let outcome = if generation < stored_generation {
                    Ok(RefreshOutcome::Superseded { version: stored_version })
                } else if let Ok(Listed::Shared(version)) = listing {
                    // Another process's listing: should its notification have been missed,
                    // readers still hear of the change.
                    if version != stored_version {
                        context.catalog.changed();
                    }
                    stored_generation = generation;
                    stored_version = version;
                    if generation > failed_generation {
                        failures = 0;
                    }
                    Ok(RefreshOutcome::Shared { version })
                } else {
                    match store(&context.catalog, &server, listing).await {
                        Ok(refresh) => {
                            stored_generation = generation;
                            stored_version = refresh.version;
                            if generation > failed_generation {
                                failures = 0;
                            }
                            Ok(RefreshOutcome::Stored(refresh))
                        }
                        Err(error) => {
                            failures = failures.saturating_add(1);
                            failed_generation = failed_generation.max(generation);
                            Err(error)
                        }
                    }
                };
                if let Some(waiter) = waiters.remove(&generation) {
                    let _ = waiter.send(outcome);
                }
                if inflight.is_empty() {
                    due = Some(later(match (failures, slot.followed()) {
                        (0, _) => slot.ttl(config).saturating_add(jitter.below(config.jitter)),
                        // A followed server that does not run: its listing that failed was a
                        // start that failed, not retried with the backoff (each try would
                        // start it), only by a call or its own TTL. One that runs is retried
                        // like any server.
                        (_, Some((ttl, false))) => ttl,
                        _ => config.backoff(failures),
                    }));
                }
            }
            () = slot.notify.notified() => {
                let pending = std::mem::take(
                    &mut *slot.pending.lock().unwrap_or_else(PoisonError::into_inner),
                );
                if pending.stop {
                    break;
                }
                if pending.follow && inflight.is_empty() {
                    due = resume(
                        &mut jitter,
                        &mut stored_version,
                        health(&context.catalog, &server).await,
                    );
                }
                if pending.connect {
                    start(&mut inflight);
                    due = None;
                }
                for waiter in pending.demands {
                    waiters.insert(start(&mut inflight), waiter);
                    due = None;
                }
                if pending.changed {
                    debounce = Some(Debounce {
                        quiet_until: later(config.debounce_quiet),
                        max_until: debounce.map_or_else(|| later(config.debounce_max), |d| d.max_until),
                    });
                }
            }
            () = sleep_until(debounce_at) => {
                debounce = None;
                start(&mut inflight);
                due = None;
            }
            () = sleep_until(due) => {
                due = None;
                // A followed server that does not run is listed (and so started) only once
                // its kept listing is past its own TTL.
                let kept = match slot.followed() {
                    Some((ttl, false)) => health(&context.catalog, &server)
                        .await
                        .and_then(|health| health.last_sync)
                        .map(|sync| ttl_left(&context.catalog, ttl, sync.at))
                        .filter(|left| !left.is_zero())
                        .map(|left| later(left.saturating_add(jitter.below(config.jitter)))),
                    _ => None,
                };
                match kept {
                    Some(at) => due = Some(at),
                    None => {
                        start(&mut inflight);
                    }
                }
            }
        }
    }
    // Dropping the listings cancels them; the waiters' channels close, so their callers see
    // `RefreshError::ShutDown`, as do demands left in the slot after a disconnect.
    inflight.tasks.shutdown().await;
    drop(std::mem::take(
        &mut *slot.pending.lock().unwrap_or_else(PoisonError::into_inner),
    ));
}

/// One server's listings in flight, each numbered by the generation it was started at.
struct Inflight {
    tasks: JoinSet<Listing>,
    generations: BTreeMap<tokio::task::Id, u64>,
    next: u64,
}

impl Default for Inflight {
    fn default() -> Self {
        Self {
            tasks: JoinSet::new(),
            generations: BTreeMap::new(),
            next: 1,
        }
    }
}

impl Inflight {
    /// Starts `listing` as the next generation and returns that generation.
    fn start(&mut self, listing: impl Future<Output = Listing> + Send + 'static) -> u64 {
        let generation = self.next;
        self.next += 1;
        let handle = self.tasks.spawn(listing);
        self.generations.insert(handle.id(), generation);
        generation
    }

    fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The next listing to finish, with its generation; `None` when none is in flight. A
    /// listing whose task panicked is a [`RefreshError::Task`].
    async fn join_next(&mut self, server: &ServerId) -> Option<(u64, Listing)> {
        loop {
            let (id, listing) = match self.tasks.join_next_with_id().await? {
                Ok((id, listing)) => (id, listing),
                // The listing failed (its lease, if it had one, went with the task):
                // recorded as the server's failure, as the lister's error would be.
                Err(error) => (
                    error.id(),
                    Ok(Listed::Failed(
                        RefreshError::Task {
                            server: server.clone(),
                            reason: error.to_string(),
                        },
                        LeaseGuard::none(),
                    )),
                ),
            };
            if let Some(generation) = self.generations.remove(&id) {
                return Some((generation, listing));
            }
        }
    }
}

type Listing = Result<Listed, RefreshError>;

/// What a listing task brings back.
enum Listed {
    /// The server's tools, listed under the catalogue's lease, held until they are stored.
    Tools(Vec<ToolDefinition>, LeaseGuard),
    /// Another process sharing the catalogue stored a listing that started after this one
    /// was asked for: the server's set version it stored.
    Shared(CatalogVersion),
    /// The server failed to list (an error, no answer in time) under the lease, held until
    /// the failure is recorded: another process's listing, stored after it, is never
    /// overwritten by this older failure.
    Failed(RefreshError, LeaseGuard),
}

/// How often a listing waiting for another process's lease on the server asks again.
const LEASE_POLL: Duration = Duration::from_millis(100);

/// One `tools/list` under the per-server timeout. On a shared catalogue, first the server's
/// refresh lease ([`Catalog::lease`]): one process lists a server at a time, and none lists
/// it when another's listing that started after the request is stored. A lease held by
/// another process is waited for (asked again every [`LEASE_POLL`]) for at most twice the
/// timeout (the holder's listing is bounded by it, its storing usually far less), then
/// [`RefreshError::LeaseBusy`]. An error of this step ([`RefreshError::LeaseBusy`], the
/// store failing, [`RefreshError::Lease`]) is the `Err` and is not recorded as the
/// server's failure: the server was not asked. The server's own failure is
/// [`Listed::Failed`].
async fn list<L: ToolLister>(
    lister: Arc<L>,
    catalog: Catalog,
    server: ServerId,
    timeout: Duration,
) -> Listing {
    let lease = if catalog.is_shared() {
        let since = catalog.now();
        let waited = timeout.saturating_mul(2);
        let give_up = later(waited);
        loop {
            let (asked, owned) = (catalog.clone(), server.clone());
            // Blocks on the store; a guard taken after this future is dropped is dropped
            // with the task's output, which releases it.
            let lease = tokio::task::spawn_blocking(move || asked.lease(&owned, since))
                .await
                .map_err(|error| RefreshError::Task {
                    server: server.clone(),
                    reason: error.to_string(),
                })?
                .map_err(|source| RefreshError::Lease {
                    server: server.clone(),
                    source,
                })?;
            match lease {
                Lease::Proceed(guard) => break guard,
                Lease::Satisfied(version) => return Ok(Listed::Shared(version)),
                _ if Instant::now() >= give_up => {
                    return Err(RefreshError::LeaseBusy {
                        server,
                        after: waited,
                    });
                }
                _ => tokio::time::sleep(LEASE_POLL).await,
            }
        }
    } else {
        LeaseGuard::none()
    };
    let failed = match tokio::time::timeout(timeout, lister.list_tools(&server)).await {
        Ok(Ok(tools)) => return Ok(Listed::Tools(tools, lease)),
        Ok(Err(source)) => RefreshError::Lister {
            server,
            source: Box::new(source),
        },
        Err(_) => RefreshError::TimedOut {
            server,
            after: timeout,
        },
    };
    Ok(Listed::Failed(failed, lease))
}

/// Stores a listing, or records its failure, on the blocking pool (redb commits fsync); after
/// a change, reads the server's live set there too, so the decoding is done off the turn.
async fn store(
    catalog: &Catalog,
    server: &ServerId,
    listing: Listing,
) -> Result<Refresh, RefreshError> {
    let catalog = catalog.clone();
    let owned = server.clone();
    let task = tokio::task::spawn_blocking(move || match listing {
        // Handled by the caller; stores nothing.
        Ok(Listed::Shared(version)) => Ok(Refresh {
            version,
            diff: psych_types::Diff::default(),
        }),
        // The lease is released once the listing is stored (or failed), when `_lease` drops.
        Ok(Listed::Tools(tools, _lease)) => match catalog.refresh(&owned, &tools) {
            Ok(refresh) => {
                if !refresh.diff.is_empty() {
                    // Only warms the cache: a reader that hits the same error reports it.
                    let _ = catalog.live(&owned);
                }
                Ok(refresh)
            }
            Err(source) => {
                // A shared store out of reach cannot record it either, and a lease lost
                // to another process is not the server's failure.
                let unreachable = matches!(
                    &source,
                    crate::CatalogError::Shared(e)
                        if e.kind() == psych_types::CatalogFailure::Unavailable
                );
                let error = RefreshError::Store {
                    server: owned.clone(),
                    source,
                };
                // The store failed; recording that may fail too, and then the first error
                // is the one to report.
                if !unreachable {
                    let _ = catalog.record_failure(&owned, &error.to_string());
                }
                Err(error)
            }
        },
        // Recorded under the lease, released once that is done (when `_lease` drops).
        Ok(Listed::Failed(error, _lease)) => {
            match catalog.record_failure(&owned, &error.to_string()) {
                Ok(()) => Err(error),
                Err(recording) => Err(RefreshError::Unrecorded {
                    failure: Box::new(error),
                    recording,
                }),
            }
        }
        // The lease could not be taken (another process is listing the server, or the
        // shared store failed): the server was not asked, so it is not its failure.
        Err(error) => Err(error),
    });
    task.await.unwrap_or_else(|error| {
        Err(RefreshError::Task {
            server: server.clone(),
            reason: error.to_string(),
        })
    })
}

/// Returns once shutdown is signalled (or the freshener is dropped).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // An error means the sender is gone: the freshener was dropped, which is a stop too.
    let _ = shutdown.wait_for(|stop| *stop).await.map(|_| ());
}

/// The server's health as the catalogue stores it (none when it cannot be read), read on
/// the blocking pool: a database round trip for a shared catalogue, a redb read
/// transaction (file reads) for a local one.
async fn health(catalog: &Catalog, server: &ServerId) -> Option<ServerHealth> {
    let (catalog, owned) = (catalog.clone(), server.clone());
    tokio::task::spawn_blocking(move || catalog.health(&owned).ok())
        .await
        .ok()
        .flatten()
}

/// Sleeps until `at`, or forever when there is no deadline.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A small deterministic generator (SplitMix64) for the jitter, seeded per server so two
/// servers connected together get different delays.
struct Jitter(u64);

impl Jitter {
    fn new(seed: u64, server: &ServerId) -> Self {
        // FNV-1a of the name, mixed with the seed.
        Self(seed ^ psych_types::fnv1a(server.as_str().as_bytes(), 0))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A duration in `[0, bound)`, to the nanosecond (zero when `bound` is zero).
    fn below(&mut self, bound: Duration) -> Duration {
        let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
        if nanos == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.next() % nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_refuses_inconsistent_timings() {
        let b = FreshenerConfig::builder;
        assert_eq!(
            b().ttl(Duration::ZERO).build(),
            Err(ConfigError::Zero("ttl"))
        );
        assert!(matches!(
            b().backoff(Duration::from_secs(10), Duration::from_secs(1))
                .build(),
            Err(ConfigError::Backoff { .. })
        ));
        assert!(matches!(
            b().debounce(Duration::from_secs(3), Duration::from_secs(1))
                .build(),
            Err(ConfigError::Debounce { .. })
        ));
        assert!(b().build().is_ok());
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let config = FreshenerConfig::builder()
            .backoff(Duration::from_secs(1), Duration::from_secs(5))
            .build()
            .unwrap();
        let delays: Vec<u64> = (1..=6).map(|n| config.backoff(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5, 5]);
        assert_eq!(config.backoff(200), Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_change_is_decoded_on_the_blocking_pool_before_the_next_read() {
        let catalog = Catalog::in_memory().unwrap();
        let s = ServerId::new("s").unwrap();
        let tool = |name: &str| {
            ToolDefinition::new(
                psych_types::ToolName::new(name).unwrap(),
                "",
                Default::default(),
            )
        };
        let first = store(
            &catalog,
            &s,
            Ok(Listed::Tools(vec![tool("a")], LeaseGuard::none())),
        )
        .await
        .unwrap();
        assert_eq!(catalog.cached_set_version(&s), Some(first.version.0));
        let same = store(
            &catalog,
            &s,
            Ok(Listed::Tools(vec![tool("a")], LeaseGuard::none())),
        )
        .await
        .unwrap();
        assert_eq!(same.version, first.version);
        let timed_out = RefreshError::TimedOut {
            server: s.clone(),
            after: Duration::from_secs(1),
        };
        assert!(
            store(
                &catalog,
                &s,
                Ok(Listed::Failed(timed_out, LeaseGuard::none()))
            )
            .await
            .is_err()
        );
        assert_eq!(catalog.cached_set_version(&s), Some(first.version.0));
        let second = store(
            &catalog,
            &s,
            Ok(Listed::Tools(
                vec![tool("a"), tool("b")],
                LeaseGuard::none(),
            )),
        )
        .await
        .unwrap();
        assert!(second.version > first.version);
        assert_eq!(catalog.cached_set_version(&s), Some(second.version.0));
    }

    /// The one tool of these tests' servers.
    fn tool_a() -> ToolDefinition {
        ToolDefinition::new(
            psych_types::ToolName::new("a").unwrap(),
            "",
            Default::default(),
        )
    }

    /// A lister of one tool that counts its listings.
    #[derive(Default)]
    struct Counting(std::sync::atomic::AtomicUsize);

    impl ToolLister for Counting {
        type Error = std::io::Error;

        async fn list_tools(&self, _: &ServerId) -> Result<Vec<ToolDefinition>, Self::Error> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let name = psych_types::ToolName::new("a").map_err(std::io::Error::other)?;
            Ok(vec![ToolDefinition::new(name, "", Default::default())])
        }
    }

    /// Issue 30: a server started only when needed is followed with its own TTL, from its
    /// kept listing: not listed when followed, nor at the configuration's TTL.
    #[tokio::test(start_paused = true)]
    async fn a_followed_server_is_listed_only_when_its_own_ttl_runs_out() {
        // The catalogue's clock moves with tokio's paused time.
        let start = Instant::now();
        let catalog = Catalog::builder()
            .clock(move || 1_000_000 + start.elapsed().as_millis() as u64)
            .in_memory()
            .unwrap();
        let s = ServerId::new("s").unwrap();
        let kept = [tool_a()];
        catalog.refresh(&s, &kept).unwrap();
        let lister = Arc::new(Counting::default());
        let config = FreshenerConfig::builder()
            .ttl(Duration::from_secs(1))
            .jitter(Duration::from_millis(1))
            .build()
            .unwrap();
        let freshener = Freshener::start(catalog, Arc::clone(&lister), config).unwrap();
        freshener.follow(&s, Duration::from_secs(3600), || false);
        let listed = || lister.0.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1800)).await;
        assert_eq!(listed(), 0);
        tokio::time::sleep(Duration::from_secs(1801)).await;
        assert_eq!(listed(), 1);
        // Listed, it is due again one of its own TTLs later.
        tokio::time::sleep(Duration::from_secs(1800)).await;
        assert_eq!(listed(), 1);
        // While it runs, it is swept with the configuration's TTL (1 s here).
        let running = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&running);
        freshener.follow(&s, Duration::from_secs(3600), move || {
            flag.load(std::sync::atomic::Ordering::SeqCst)
        });
        running.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1900)).await;
        let swept = listed();
        assert!(swept > 100, "{swept}");
        // Stopped again: no more sweeps until its own TTL passes.
        running.store(false, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let stopped = listed();
        tokio::time::sleep(Duration::from_secs(1800)).await;
        assert_eq!(listed(), stopped);
        // A never-listed server that is followed waits for something to list it.
        let new = ServerId::new("new").unwrap();
        freshener.follow(&new, Duration::from_secs(1), || false);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(listed(), stopped);
        freshener.refresh(&new).await.unwrap();
        assert_eq!(listed(), stopped + 1);
        freshener.shutdown().await;
    }

    /// redb's in-memory backend, whose writes and syncs fail once `failing` is set.
    #[derive(Debug, Default)]
    struct Faulty {
        inner: redb::backends::InMemoryBackend,
        failing: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Faulty {
        fn check(&self) -> std::io::Result<()> {
            if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(std::io::Error::other("the disk is gone"));
            }
            Ok(())
        }
    }

    impl redb::StorageBackend for Faulty {
        fn len(&self) -> std::io::Result<u64> {
            self.inner.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
            self.inner.read(offset, out)
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.check()?;
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.check()?;
            self.inner.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.check()?;
            self.inner.write(offset, data)
        }
    }

    /// A lease that could not be taken (the shared store failing) was recorded as the
    /// server's failure, which every process sharing the catalogue then showed; the server
    /// was never asked. Only the server's own failure, under its lease, is recorded.
    #[tokio::test]
    async fn only_a_listing_that_failed_is_recorded_as_the_servers_failure() {
        let catalog = Catalog::in_memory().unwrap();
        let s = ServerId::new("s").unwrap();
        let not_asked = [
            RefreshError::Lease {
                server: s.clone(),
                source: crate::error::CatalogError::Corrupt {
                    what: "the lease".into(),
                    reason: "no connection".into(),
                },
            },
            RefreshError::LeaseBusy {
                server: s.clone(),
                after: Duration::from_secs(1),
            },
        ];
        for error in not_asked {
            assert!(store(&catalog, &s, Err(error)).await.is_err());
            assert_eq!(catalog.health(&s).unwrap().last_error, None);
        }
        let timed_out = RefreshError::TimedOut {
            server: s.clone(),
            after: Duration::from_secs(1),
        };
        let failed = Ok(Listed::Failed(timed_out, LeaseGuard::none()));
        assert!(store(&catalog, &s, failed).await.is_err());
        let recorded = catalog.health(&s).unwrap().last_error.unwrap();
        assert!(recorded.message.contains("did not answer"), "{recorded:?}");
    }

    /// Before, the caller got the recording's storage error and the lister's was lost.
    #[tokio::test]
    async fn a_failure_that_cannot_be_recorded_is_still_the_listers() {
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let backend = Faulty {
            failing: Arc::clone(&failing),
            ..Faulty::default()
        };
        let catalog = Catalog::builder().over(backend).unwrap();
        let s = ServerId::new("s").unwrap();
        failing.store(true, std::sync::atomic::Ordering::SeqCst);
        let lister = RefreshError::Lister {
            server: s.clone(),
            source: Box::new(std::io::Error::other("tools/list: connection reset")),
        };
        let error = store(&catalog, &s, Ok(Listed::Failed(lister, LeaseGuard::none())))
            .await
            .unwrap_err();
        let RefreshError::Unrecorded { failure, recording } = &error else {
            panic!("not the lister's error: {error}");
        };
        assert!(
            matches!(**failure, RefreshError::Lister { .. }),
            "{failure}"
        );
        assert!(matches!(error.failure(), RefreshError::Lister { .. }));
        assert!(
            matches!(recording, crate::error::CatalogError::Storage(_)),
            "{recording:?}"
        );
        let message = error.to_string();
        assert!(
            message.starts_with("tools/list on s failed: tools/list: connection reset (recording the failure failed too: "),
            "{message}"
        );
        // The chain reaches the lister's own error.
        let source = std::error::Error::source(&error).unwrap();
        assert_eq!(source.to_string(), failure.to_string());
        assert_eq!(
            std::error::Error::source(source).unwrap().to_string(),
            "tools/list: connection reset"
        );
    }

    /// Review: durations past what an `Instant` holds (a TTL of `Duration::MAX` for "never
    /// sweep") once panicked the server's task, and every later `refresh` waited for good.
    #[tokio::test]
    async fn durations_too_long_for_an_instant_never_stop_the_freshener() {
        let catalog = Catalog::in_memory().unwrap();
        let s = ServerId::new("s").unwrap();
        let kept = [tool_a()];
        // A stored sync: the task resumes from it at once, adding the jitter to the TTL.
        catalog.refresh(&s, &kept).unwrap();
        let lister = Arc::new(Counting::default());
        let config = FreshenerConfig::builder()
            .ttl(Duration::MAX)
            .jitter(Duration::MAX)
            .debounce(Duration::MAX, Duration::MAX)
            .build()
            .unwrap();
        let freshener = Freshener::start(catalog, Arc::clone(&lister), config).unwrap();
        freshener.connect(&s);
        for _ in 0..3 {
            freshener.list_changed(&s);
            tokio::time::timeout(Duration::from_secs(10), freshener.refresh(&s))
                .await
                .expect("a refresh is answered")
                .unwrap();
        }
        assert!(lister.0.load(std::sync::atomic::Ordering::SeqCst) >= 3);
    }

    #[test]
    fn jitter_stays_below_its_bound_and_differs_by_server() {
        let a = ServerId::new("a").unwrap();
        let b = ServerId::new("b").unwrap();
        let bound = Duration::from_secs(60);
        let mut ja = Jitter::new(7, &a);
        let mut jb = Jitter::new(7, &b);
        let xs: Vec<Duration> = (0..100).map(|_| ja.below(bound)).collect();
        assert!(xs.iter().all(|x| *x < bound));
        assert_ne!(xs[0], jb.below(bound));
        assert_eq!(Jitter::new(7, &a).below(bound), xs[0], "seeded: repeatable");
        assert_eq!(ja.below(Duration::ZERO), Duration::ZERO);
    }
}
