//! The redb store: the versioned, soft-delete tool table, per-server sync metadata, and the
//! reads disclosure resolves a turn from. The layout is documented in `docs/format.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use psych_types::{
    CatalogFailure, CatalogStore, CatalogVersion, Diff, DynCatalogStore, Lease, LeaseGuard,
    Reachability, Refresh, ServerCatalog, ServerHealth, ServerId, SyncFailure, SyncStamp,
    ToolDefinition, ToolName, UnixMillis,
};
use redb::backends::InMemoryBackend;
use redb::{
    Database, DatabaseError, ReadTransaction, ReadableDatabase, ReadableTable,
    ReadableTableMetadata, TableDefinition, WriteTransaction,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::clock::{Clock, SystemClock};
use crate::error::{CatalogError, OpenError, storage};

/// The layout this build reads and writes (the `layout` key of the `meta` table).
pub const LAYOUT: u64 = 1;

/// `(server, tool, since)` → `removed_at` (8 bytes, little-endian; 0 = live) + the tool's
/// canonical JSON.
const TOOLS: TableDefinition<'_, (&str, &str, u64), &[u8]> = TableDefinition::new("tools");
/// `server` → the server's sync metadata, as JSON ([`ServerRow`]).
const SERVERS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("servers");
/// `layout` → [`LAYOUT`]; `version` → the catalogue's current version.
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");

const LAYOUT_KEY: &str = "layout";
const VERSION_KEY: &str = "version";
/// The `removed_at` of a row that is live (versions start at 1).
const LIVE: u64 = 0;
/// Bytes before the JSON in a tool row.
const HEADER: usize = 8;

/// What the catalogue stores of one server besides its tools.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct ServerRow {
    /// The version at which the server's live set last changed (0: never had tools).
    set_version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_sync: Option<SyncStamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_error: Option<SyncFailure>,
}

/// The redb catalogue behind the store seam, so that one conformance suite (and, later,
/// any caller) takes it or the PostgreSQL store alike. Each method is the inherent one of
/// the same name.
impl CatalogStore for Catalog {
    type Error = CatalogError;

    fn failure(&self, error: &CatalogError) -> CatalogFailure {
        match error {
            CatalogError::DuplicateTool { .. } => CatalogFailure::DuplicateTool,
            CatalogError::VersionAhead { .. } => CatalogFailure::VersionAhead,
            CatalogError::Shared(error) => error.kind(),
            _ => CatalogFailure::Store,
        }
    }

    fn now(&self) -> UnixMillis {
        Catalog::now(self)
    }

    fn refresh(
        &self,
        server: &ServerId,
        tools: &[ToolDefinition],
    ) -> Result<Refresh, CatalogError> {
        Catalog::refresh(self, server, tools)
    }

    fn record_failure(&self, server: &ServerId, message: &str) -> Result<(), CatalogError> {
        Catalog::record_failure(self, server, message)
    }

    fn version(&self) -> Result<CatalogVersion, CatalogError> {
        Catalog::version(self)
    }

    fn live(&self, server: &ServerId) -> Result<ServerCatalog, CatalogError> {
        Catalog::live(self, server)
    }

    fn servers(&self) -> Result<Vec<ServerId>, CatalogError> {
        Catalog::servers(self)
    }

    fn health(&self, server: &ServerId) -> Result<ServerHealth, CatalogError> {
        Catalog::health(self, server)
    }

    fn tools_at(
        &self,
        server: &ServerId,
        version: CatalogVersion,
    ) -> Result<Vec<ToolDefinition>, CatalogError> {
        Catalog::tools_at(self, server, version)
    }

    fn diff(
        &self,
        server: &ServerId,
        from: CatalogVersion,
        to: CatalogVersion,
    ) -> Result<Diff, CatalogError> {
        Catalog::diff(self, server, from, to)
    }

    fn is_shared(&self) -> bool {
        Catalog::is_shared(self)
    }

    fn lease(&self, server: &ServerId, since: UnixMillis) -> Result<Lease, CatalogError> {
        Catalog::lease(self, server, since)
    }
}

/// Row counts, for tests and monitoring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Every tool row ever written (rows are never deleted, so this only grows).
    pub rows: u64,
    /// Rows that are live now.
    pub live_rows: u64,
    /// Servers with sync metadata (refreshed or failed at least once).
    pub servers: u64,
    /// The catalogue's current version.
    pub version: CatalogVersion,
}

/// Opens a [`Catalog`] with a chosen clock.
pub struct CatalogBuilder {
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for CatalogBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogBuilder").finish_non_exhaustive()
    }
}

impl Default for CatalogBuilder {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
        }
    }
}

impl CatalogBuilder {
    /// Stamps syncs and failures with `clock` instead of the system clock.
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Opens the catalogue file at `path`, creating it when absent.
    ///
    /// # Errors
    ///
    /// [`OpenError::Locked`] when another process has it open, [`OpenError::NewerLayout`]
    /// for a file of a later layout, [`OpenError::Storage`] for a file redb cannot open.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Catalog, OpenError> {
        let path = path.as_ref().to_path_buf();
        let db = match Database::builder().create(&path) {
            Ok(db) => db,
            Err(DatabaseError::DatabaseAlreadyOpen | DatabaseError::LockProtocolMismatch) => {
                return Err(OpenError::Locked { path });
            }
            Err(e) => {
                return Err(OpenError::Storage {
                    path,
                    source: e.into(),
                });
            }
        };
        Catalog::init(db, path, self.clock)
    }

    /// Opens an empty catalogue held in memory (redb's `InMemoryBackend`), for tests.
    ///
    /// # Errors
    ///
    /// [`OpenError::Storage`] if redb cannot initialise it.
    pub fn in_memory(self) -> Result<Catalog, OpenError> {
        self.over(InMemoryBackend::new())
    }

    /// Opens an empty catalogue over `backend` (named `<memory>`): the in-memory one, or in
    /// tests one that fails chosen operations.
    pub(crate) fn over(self, backend: impl redb::StorageBackend) -> Result<Catalog, OpenError> {
        let path = PathBuf::from("<memory>");
        let db = Database::builder()
            .create_with_backend(backend)
            .map_err(|e| OpenError::Storage {
                path: path.clone(),
                source: e.into(),
            })?;
        Catalog::init(db, path, self.clock)
    }
}

/// Where a catalogue's tools are kept.
enum Backend {
    /// A redb file (or memory) of this process's.
    Redb(Database),
    /// A store several processes share ([`Catalog::shared`]).
    Shared(Arc<DynCatalogStore>),
}

struct Inner {
    backend: Backend,
    path: PathBuf,
    clock: Arc<dyn Clock>,
    /// Each server's decoded live set, keyed by the set version it was decoded at (see
    /// [`LiveSets`]).
    live_sets: LiveSets,
    /// Held in memory, not stored: it is what this process's connections report now, and a
    /// stored "reachable" would be stale after a restart.
    reachability: Mutex<BTreeMap<ServerId, Reachability>>,
    /// The change counter ([`Catalog::changes`]).
    changes: watch::Sender<u64>,
}

/// The catalogue of MCP tools: every server's tools, versioned and never hard-deleted.
///
/// Cheap to clone (the clones share one database and one cache of decoded live sets). Reads
/// run in redb read transactions, so they never wait for a refresh and never see half of
/// one; refreshes take one write transaction each and wait for each other.
///
/// Or, made with [`Catalog::shared`], the same catalogue over a store that several
/// processes share (the PostgreSQL store, for gateway replicas): its tools, versions and
/// sync health are the store's, reachability and the change counter this process's.
#[derive(Clone)]
pub struct Catalog {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

impl Catalog {
    /// A builder, to choose the clock.
    pub fn builder() -> CatalogBuilder {
        CatalogBuilder::default()
    }

    /// Opens the catalogue file at `path` with the system clock, creating it when absent.
    ///
    /// # Errors
    ///
    /// As [`CatalogBuilder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, OpenError> {
        Self::builder().open(path)
    }

    /// An empty catalogue in memory with the system clock.
    ///
    /// # Errors
    ///
    /// As [`CatalogBuilder::in_memory`].
    pub fn in_memory() -> Result<Self, OpenError> {
        Self::builder().in_memory()
    }

    /// The catalogue kept in `store`, which other processes may share (the PostgreSQL
    /// store: `Arc::new(Erased(PgCatalog))`, psych-types' `Erased`). Tools, versions and
    /// sync health are read from and written to the store (every method then blocks on it:
    /// call them off the async workers, as for redb); reachability is this process's, held
    /// in memory; the clock is the store's. When another process changes the store, the
    /// change counter ([`changes`](Self::changes)) moves on as for a change made here (the
    /// store's [`watch`](CatalogStore::watch)), so sessions resolved from it are woken: a
    /// change is new tools, an error recorded or cleared (the PostgreSQL store sends none
    /// for a refresh that only moves the sync stamp).
    pub fn shared(store: Arc<DynCatalogStore>) -> Self {
        struct StoreClock(Arc<DynCatalogStore>);
        impl Clock for StoreClock {
            fn now(&self) -> UnixMillis {
                self.0.now()
            }
        }
        let inner = Arc::new(Inner {
            backend: Backend::Shared(Arc::clone(&store)),
            path: PathBuf::from("<shared>"),
            clock: Arc::new(StoreClock(Arc::clone(&store))),
            live_sets: LiveSets::default(),
            reachability: Mutex::new(BTreeMap::new()),
            changes: watch::Sender::new(0),
        });
        let weak = Arc::downgrade(&inner);
        store.watch(Arc::new(move || {
            if let Some(inner) = weak.upgrade() {
                inner.changes.send_modify(|n| *n = n.wrapping_add(1));
            }
        }));
        Self { inner }
    }

    /// Whether the catalogue is kept in a store other processes share ([`Catalog::shared`]).
    pub fn is_shared(&self) -> bool {
        matches!(self.inner.backend, Backend::Shared(_))
    }

    /// The store of a shared catalogue.
    fn store(&self) -> Option<&Arc<DynCatalogStore>> {
        match &self.inner.backend {
            Backend::Shared(store) => Some(store),
            Backend::Redb(_) => None,
        }
    }

    /// Asked before listing `server` for a trigger raised at `since` (by
    /// [`now`](Self::now)); see psych-types' [`CatalogStore::lease`]. A catalogue of this
    /// process's always answers `Proceed`; a shared one lets one process list a server at
    /// a time, and tells when another's listing that started after `since` is stored.
    /// Blocks on a shared store.
    ///
    /// # Errors
    ///
    /// [`CatalogError::Shared`] when the shared store fails.
    pub fn lease(&self, server: &ServerId, since: UnixMillis) -> Result<Lease, CatalogError> {
        match self.store() {
            Some(store) => store.lease(server, since).map_err(CatalogError::Shared),
            None => Ok(Lease::Proceed(LeaseGuard::none())),
        }
    }

    fn init(db: Database, path: PathBuf, clock: Arc<dyn Clock>) -> Result<Self, OpenError> {
        let fail = |source: redb::Error| OpenError::Storage {
            path: path.clone(),
            source,
        };
        let txn = db.begin_write().map_err(|e| fail(e.into()))?;
        let has_tables = txn
            .list_tables()
            .map_err(|e| fail(e.into()))?
            .next()
            .is_some();
        {
            let mut meta = txn.open_table(META).map_err(|e| fail(e.into()))?;
            let layout = meta
                .get(LAYOUT_KEY)
                .map_err(|e| fail(e.into()))?
                .map(|g| g.value());
            match layout {
                Some(LAYOUT) => {}
                Some(found) if found > LAYOUT => {
                    return Err(OpenError::NewerLayout {
                        path,
                        found,
                        supported: LAYOUT,
                    });
                }
                Some(found) => {
                    return Err(OpenError::Corrupt {
                        path,
                        source: corrupt("meta.layout", format!("unknown layout {found}")),
                    });
                }
                None if has_tables => {
                    return Err(OpenError::Corrupt {
                        path,
                        source: corrupt("meta.layout", "a redb file that is not a catalogue"),
                    });
                }
                None => {
                    meta.insert(LAYOUT_KEY, LAYOUT)
                        .map_err(|e| fail(e.into()))?;
                    meta.insert(VERSION_KEY, 0).map_err(|e| fail(e.into()))?;
                }
            }
            txn.open_table(TOOLS).map_err(|e| fail(e.into()))?;
            txn.open_table(SERVERS).map_err(|e| fail(e.into()))?;
        }
        txn.commit().map_err(|e| fail(e.into()))?;
        Ok(Self {
            inner: Arc::new(Inner {
                backend: Backend::Redb(db),
                path,
                clock,
                live_sets: LiveSets::default(),
                reachability: Mutex::new(BTreeMap::new()),
                changes: watch::Sender::new(0),
            }),
        })
    }

    /// The file this catalogue lives in (`<memory>` for the in-memory backend).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The time now by this catalogue's clock.
    pub fn now(&self) -> UnixMillis {
        self.inner.clock.now()
    }

    /// Makes `tools` exactly the live set of `server`, in one write transaction.
    ///
    /// A tool whose canonical JSON is unchanged is not written again; a new or changed tool
    /// gets a row at a new catalogue version; a tool no longer listed has its row marked
    /// removed at that version. When nothing changed no version is taken, and only the sync
    /// stamp moves. Either way the server's last error is cleared.
    ///
    /// # Errors
    ///
    /// [`CatalogError::DuplicateTool`] for a listing that names a tool twice;
    /// [`CatalogError::Storage`] when redb fails. Nothing is committed on error.
    pub fn refresh(
        &self,
        server: &ServerId,
        tools: &[ToolDefinition],
    ) -> Result<Refresh, CatalogError> {
        if let Some(store) = self.store() {
            // The same refusal as redb's, by names alone: the store encodes the tools.
            let mut names: Vec<&ToolName> = tools.iter().map(|tool| &tool.name).collect();
            names.sort_unstable();
            if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
                return Err(CatalogError::DuplicateTool {
                    server: server.clone(),
                    name: pair[0].clone(),
                });
            }
            let refresh = store.refresh(server, tools).map_err(CatalogError::Shared)?;
            self.changed();
            return Ok(refresh);
        }
        let mut incoming = tools
            .iter()
            .map(|tool| Ok((&tool.name, encode_tool(tool)?)))
            .collect::<Result<Vec<_>, CatalogError>>()?;
        incoming.sort_unstable_by(|a, b| a.0.cmp(b.0));
        if let Some(pair) = incoming.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(CatalogError::DuplicateTool {
                server: server.clone(),
                name: pair[0].0.clone(),
            });
        }
        let at = self.now();
        let txn = self.write()?;
        let refresh = write_refresh(&txn, server, &incoming, at)?;
        txn.commit().map_err(storage)?;
        // The stored set version moved on, so a cached set older than it can never be
        // returned again: drop it now rather than at the server's next read.
        self.inner.live_sets.forget_older(server, refresh.version.0);
        self.changed();
        Ok(refresh)
    }

    /// Records that listing `server` failed: its tools stay as they are, and its health
    /// shows `message` until the next successful refresh (a NUL in it as U+FFFD, as
    /// [`failure_message`](psych_types::failure_message) keeps it in every store).
    ///
    /// # Errors
    ///
    /// [`CatalogError::Storage`] when redb fails.
    pub fn record_failure(&self, server: &ServerId, message: &str) -> Result<(), CatalogError> {
        let message = &*psych_types::failure_message(message);
        if let Some(store) = self.store() {
            store
                .record_failure(server, message)
                .map_err(CatalogError::Shared)?;
            self.changed();
            return Ok(());
        }
        let at = self.now();
        let txn = self.write()?;
        {
            let mut servers = txn.open_table(SERVERS).map_err(storage)?;
            let mut row = read_server_row(&servers, server)?.unwrap_or_default();
            row.last_error = Some(SyncFailure {
                at,
                message: message.to_owned(),
            });
            let bytes = encode_server_row(&row)?;
            servers
                .insert(server.as_str(), bytes.as_slice())
                .map_err(storage)?;
        }
        txn.commit().map_err(storage)?;
        self.changed();
        Ok(())
    }

    /// Records whether `server` is reachable now, as its connection reports. Held in memory
    /// only (see `docs/format.md`): it describes this process's connection, not the catalogue.
    pub fn set_reachability(&self, server: &ServerId, reachability: Reachability) {
        let before = self
            .inner
            .reachability
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(server.clone(), reachability.clone());
        if before.as_ref() != Some(&reachability) {
            self.changed();
        }
    }

    /// A counter of the changes a reader of this catalogue can see: it moves on after
    /// every committed [`refresh`](Self::refresh) (a new live set, or only a new sync
    /// stamp), every [`record_failure`](Self::record_failure), and every
    /// [`set_reachability`](Self::set_reachability) that changes a server's reachability.
    ///
    /// For a reader that keeps something derived from the catalogue (a resolved Surface):
    /// wait for [`changed`](watch::Receiver::changed) instead of polling, and read the
    /// counter *before* reading the catalogue, so what was read is at least as new as the
    /// counter says. Every clone of the catalogue shares the counter; it starts at 0.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Moves the change counter on.
    pub(crate) fn changed(&self) {
        self.inner.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn reachability(&self, server: &ServerId) -> Reachability {
        self.inner
            .reachability
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(server)
            .cloned()
            .unwrap_or_default()
    }

    fn read(&self) -> Result<ReadTransaction, CatalogError> {
        match &self.inner.backend {
            Backend::Redb(db) => db.begin_read().map_err(storage),
            Backend::Shared(_) => Err(CatalogError::NotLocal("a redb transaction")),
        }
    }

    fn write(&self) -> Result<WriteTransaction, CatalogError> {
        match &self.inner.backend {
            Backend::Redb(db) => db.begin_write().map_err(storage),
            Backend::Shared(_) => Err(CatalogError::NotLocal("a redb transaction")),
        }
    }

    /// `catalog` as read from the shared store, with this process's reachability.
    fn with_reachability(&self, mut catalog: ServerCatalog) -> ServerCatalog {
        catalog.health.reachability = self.reachability(&catalog.server);
        catalog
    }

    /// The catalogue's current version (0 before the first change).
    ///
    /// # Errors
    ///
    /// [`CatalogError::Storage`] when redb fails.
    pub fn version(&self) -> Result<CatalogVersion, CatalogError> {
        if let Some(store) = self.store() {
            return store.version().map_err(CatalogError::Shared);
        }
        current_version(&self.read()?)
    }

    /// The live tools of `server`, ordered by name, with its set version and health. A server
    /// the catalogue has never listed reads as version 0 with no tools.
    ///
    /// The catalogue keeps each server's decoded live set in memory, keyed by its set
    /// version: a read opens a read transaction, reads the server's row, and when the set
    /// version is the cached one returns the cached tools (the same `Arc` as the last read:
    /// nothing is decoded or copied). The first read after a change decodes the rows and
    /// caches them. Each `Catalog` opened has its own cache (its clones share it), holding
    /// at most one set per server.
    ///
    /// # Errors
    ///
    /// [`CatalogError::Storage`] when redb fails, [`CatalogError::Corrupt`] for a row that
    /// does not decode.
    pub fn live(&self, server: &ServerId) -> Result<ServerCatalog, CatalogError> {
        if let Some(store) = self.store() {
            let catalog = store.live(server).map_err(CatalogError::Shared)?;
            return Ok(self.with_reachability(catalog));
        }
        let txn = self.read()?;
        self.live_in(&txn, server)
    }

    /// The live tools of every server the catalogue knows (refreshed, failed, or reported
    /// reachable or not), ordered by server, all read from one consistent snapshot.
    ///
    /// # Errors
    ///
    /// As [`Catalog::live`].
    pub fn live_all(&self) -> Result<Vec<ServerCatalog>, CatalogError> {
        if self.store().is_some() {
            // Server by server: a shared store has no snapshot across calls.
            return self
                .servers()?
                .iter()
                .map(|server| self.live(server))
                .collect();
        }
        let txn = self.read()?;
        let servers = self.servers_in(&txn)?;
        servers
            .iter()
            .map(|server| self.live_in(&txn, server))
            .collect()
    }

    /// Every server the catalogue knows, ordered.
    ///
    /// # Errors
    ///
    /// As [`Catalog::live`].
    pub fn servers(&self) -> Result<Vec<ServerId>, CatalogError> {
        let stored = match self.store() {
            Some(store) => store.servers().map_err(CatalogError::Shared)?,
            None => return self.servers_in(&self.read()?),
        };
        Ok(self.with_reachable(stored.into_iter().collect()))
    }

    /// The health of `server`: last successful sync, last error, reachability.
    ///
    /// # Errors
    ///
    /// As [`Catalog::live`].
    pub fn health(&self, server: &ServerId) -> Result<ServerHealth, CatalogError> {
        if let Some(store) = self.store() {
            let mut health = store.health(server).map_err(CatalogError::Shared)?;
            health.reachability = self.reachability(server);
            return Ok(health);
        }
        let txn = self.read()?;
        let servers = txn.open_table(SERVERS).map_err(storage)?;
        let row = read_server_row(&servers, server)?.unwrap_or_default();
        Ok(self.health_of(server, row))
    }

    /// The tools of `server` that were live at catalogue version `version`, ordered by name.
    ///
    /// # Errors
    ///
    /// [`CatalogError::VersionAhead`] for a version the catalogue has not reached; otherwise
    /// as [`Catalog::live`].
    pub fn tools_at(
        &self,
        server: &ServerId,
        version: CatalogVersion,
    ) -> Result<Vec<ToolDefinition>, CatalogError> {
        if let Some(store) = self.store() {
            return store
                .tools_at(server, version)
                .map_err(CatalogError::Shared);
        }
        let txn = self.read()?;
        check_reached(&txn, version)?;
        let tools = txn.open_table(TOOLS).map_err(storage)?;
        let mut out = Vec::new();
        scan_server(&tools, server, |_, since, removed_at, json| {
            if live_at(since, removed_at, version.0) {
                out.push(decode_tool(server, json)?);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// What changed in `server`'s tools from version `from` to version `to` (either order;
    /// `to` earlier than `from` describes undoing).
    ///
    /// # Errors
    ///
    /// As [`Catalog::tools_at`], for either version.
    pub fn diff(
        &self,
        server: &ServerId,
        from: CatalogVersion,
        to: CatalogVersion,
    ) -> Result<Diff, CatalogError> {
        if let Some(store) = self.store() {
            return store.diff(server, from, to).map_err(CatalogError::Shared);
        }
        let txn = self.read()?;
        check_reached(&txn, from.max(to))?;
        let tools = txn.open_table(TOOLS).map_err(storage)?;
        // name → (since, json) of the row live at each end.
        let mut before: BTreeMap<String, (u64, Vec<u8>)> = BTreeMap::new();
        let mut after: BTreeMap<String, (u64, Vec<u8>)> = BTreeMap::new();
        scan_server(&tools, server, |name, since, removed_at, json| {
            if live_at(since, removed_at, from.0) {
                before.insert(name.to_owned(), (since, json.to_vec()));
            }
            if live_at(since, removed_at, to.0) {
                after.insert(name.to_owned(), (since, json.to_vec()));
            }
            Ok(())
        })?;
        Diff::between(&before, &after, |name| tool_name(server, name))
    }

    /// Row counts and the current version.
    ///
    /// # Errors
    ///
    /// As [`Catalog::live`]; [`CatalogError::NotLocal`] for a shared catalogue.
    pub fn stats(&self) -> Result<Stats, CatalogError> {
        let txn = self.read()?;
        let tools = txn.open_table(TOOLS).map_err(storage)?;
        let servers = txn.open_table(SERVERS).map_err(storage)?;
        let mut live_rows = 0;
        for entry in tools.iter().map_err(storage)? {
            let (key, value) = entry.map_err(storage)?;
            let (server, name, _) = key.value();
            if removed_at(server, name, value.value())? == LIVE {
                live_rows += 1;
            }
        }
        Ok(Stats {
            rows: tools.len().map_err(storage)?,
            live_rows,
            servers: servers.len().map_err(storage)?,
            version: current_version(&txn)?,
        })
    }

    fn servers_in(&self, txn: &ReadTransaction) -> Result<Vec<ServerId>, CatalogError> {
        let servers = txn.open_table(SERVERS).map_err(storage)?;
        let mut out = std::collections::BTreeSet::new();
        for entry in servers.iter().map_err(storage)? {
            let (key, _) = entry.map_err(storage)?;
            out.insert(
                ServerId::new(key.value())
                    .map_err(|e| corrupt(format!("servers[{:?}]", key.value()), e))?,
            );
        }
        Ok(self.with_reachable(out))
    }

    /// `stored` with every server this process reported reachable or not, ordered.
    fn with_reachable(&self, mut stored: std::collections::BTreeSet<ServerId>) -> Vec<ServerId> {
        stored.extend(
            self.inner
                .reachability
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .keys()
                .cloned(),
        );
        stored.into_iter().collect()
    }

    fn live_in(
        &self,
        txn: &ReadTransaction,
        server: &ServerId,
    ) -> Result<ServerCatalog, CatalogError> {
        let servers = txn.open_table(SERVERS).map_err(storage)?;
        let row = read_server_row(&servers, server)?.unwrap_or_default();
        let tools = match self.inner.live_sets.get(server, row.set_version) {
            Some(tools) => tools,
            // Never had a tool: nothing to decode, and nothing cached for a name that may
            // not be a server at all.
            None if row.set_version == 0 => Arc::from([]),
            None => {
                let decoded = decode_live(txn, server)?;
                self.inner.live_sets.offer(server, row.set_version, decoded)
            }
        };
        Ok(ServerCatalog {
            server: server.clone(),
            version: CatalogVersion(row.set_version),
            tools,
            health: self.health_of(server, row),
        })
    }

    fn health_of(&self, server: &ServerId, row: ServerRow) -> ServerHealth {
        ServerHealth {
            last_sync: row.last_sync,
            last_error: row.last_error,
            reachability: self.reachability(server),
        }
    }
}

/// Every server's live set as last decoded, keyed by the set version it was decoded at: the
/// version at which the server's live set last changed (`ServerRow::set_version`).
///
/// Why a version is a sound key: a change to a server's live set always stores a catalogue
/// version that no commit ever stored before (versions only grow, and an aborted refresh
/// stores nothing), so within one catalogue file a (server, set version) pair names exactly
/// one live set. Only readers fill the cache, from committed snapshots, so an entry is
/// always a set some snapshot really held.
///
/// Holds at most one set per server. The mutex is held only to look up, clone an `Arc`,
/// insert or remove (no I/O and no decoding under it), and a refresh takes it only after
/// its commit, so a reader never waits on a writer's transaction.
#[derive(Default)]
struct LiveSets(Mutex<BTreeMap<ServerId, LiveSet>>);

struct LiveSet {
    version: u64,
    tools: Arc<[ToolDefinition]>,
}

impl LiveSets {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<ServerId, LiveSet>> {
        // The map is always whole between statements, so a panic elsewhere cannot have
        // left it half updated.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The set of `server` at set version `version`, if it is the one cached.
    fn get(&self, server: &ServerId, version: u64) -> Option<Arc<[ToolDefinition]>> {
        self.lock()
            .get(server)
            .filter(|set| set.version == version)
            .map(|set| Arc::clone(&set.tools))
    }

    /// Caches `decoded`, the set of `server` at set version `version`, unless a set at that
    /// version or a later one is cached already (a reader of an older snapshot, or a second
    /// reader decoding the same version); returns the cached set of that version, so readers
    /// of one version share one allocation.
    fn offer(
        &self,
        server: &ServerId,
        version: u64,
        decoded: Vec<ToolDefinition>,
    ) -> Arc<[ToolDefinition]> {
        let mut sets = self.lock();
        match sets.get(server) {
            Some(set) if set.version == version => Arc::clone(&set.tools),
            Some(set) if set.version > version => decoded.into(),
            _ => {
                let tools: Arc<[ToolDefinition]> = decoded.into();
                sets.insert(
                    server.clone(),
                    LiveSet {
                        version,
                        tools: Arc::clone(&tools),
                    },
                );
                tools
            }
        }
    }

    /// Drops the cached set of `server` if it is older than set version `version`.
    fn forget_older(&self, server: &ServerId, version: u64) {
        let mut sets = self.lock();
        if sets.get(server).is_some_and(|set| set.version < version) {
            sets.remove(server);
        }
    }
}

/// Decodes the live rows of `server` in `txn`, ordered by name.
fn decode_live(
    txn: &ReadTransaction,
    server: &ServerId,
) -> Result<Vec<ToolDefinition>, CatalogError> {
    let table = txn.open_table(TOOLS).map_err(storage)?;
    let mut tools = Vec::new();
    scan_server(&table, server, |_, _, removed_at, json| {
        if removed_at == LIVE {
            tools.push(decode_tool(server, json)?);
        }
        Ok(())
    })?;
    Ok(tools)
}

/// The body of [`Catalog::refresh`], inside its write transaction.
fn write_refresh(
    txn: &WriteTransaction,
    server: &ServerId,
    incoming: &[(&ToolName, Vec<u8>)],
    at: UnixMillis,
) -> Result<Refresh, CatalogError> {
    let mut tools = txn.open_table(TOOLS).map_err(storage)?;
    let mut servers = txn.open_table(SERVERS).map_err(storage)?;
    let mut meta = txn.open_table(META).map_err(storage)?;
    let mut row = read_server_row(&servers, server)?.unwrap_or_default();

    let mut listed = vec![false; incoming.len()];
    let mut unchanged = Vec::new();
    let mut changed = Vec::new();
    // Old live rows to mark removed: (name, since, whole stored value).
    let mut retire: Vec<(String, u64, Vec<u8>)> = Vec::new();
    let mut gone = Vec::new();
    scan_server(&tools, server, |name, since, removed_at, json| {
        if removed_at != LIVE {
            return Ok(());
        }
        match incoming.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            Ok(i) => {
                listed[i] = true;
                if &incoming[i].1[HEADER..] == json {
                    unchanged.push(i);
                } else {
                    changed.push(i);
                    retire.push((name.to_owned(), since, stored(LIVE, json)));
                }
            }
            Err(_) => {
                gone.push(tool_name(server, name)?);
                retire.push((name.to_owned(), since, stored(LIVE, json)));
            }
        }
        Ok(())
    })?;
    let added: Vec<usize> = (0..incoming.len()).filter(|&i| !listed[i]).collect();

    if !(added.is_empty() && changed.is_empty() && retire.is_empty()) {
        let version = meta
            .get(VERSION_KEY)
            .map_err(storage)?
            .map_or(0, |g| g.value())
            .checked_add(1)
            .ok_or_else(|| corrupt("meta.version", "no version after u64::MAX"))?;
        for (name, since, mut value) in retire {
            value[..HEADER].copy_from_slice(&version.to_le_bytes());
            tools
                .insert((server.as_str(), name.as_str(), since), value.as_slice())
                .map_err(storage)?;
        }
        for &i in added.iter().chain(&changed) {
            let (name, value) = &incoming[i];
            tools
                .insert((server.as_str(), name.as_str(), version), value.as_slice())
                .map_err(storage)?;
        }
        meta.insert(VERSION_KEY, version).map_err(storage)?;
        row.set_version = version;
    }
    row.last_sync = Some(SyncStamp {
        version: CatalogVersion(row.set_version),
        at,
    });
    row.last_error = None;
    let bytes = encode_server_row(&row)?;
    servers
        .insert(server.as_str(), bytes.as_slice())
        .map_err(storage)?;

    let names = |indices: &[usize]| -> Vec<ToolName> {
        let mut names: Vec<ToolName> = indices.iter().map(|&i| incoming[i].0.clone()).collect();
        names.sort_unstable();
        names
    };
    Ok(Refresh {
        version: CatalogVersion(row.set_version),
        diff: Diff {
            added: names(&added),
            changed: names(&changed),
            removed: gone,
            unchanged: names(&unchanged),
        },
    })
}

/// Calls `visit(name, since, removed_at, json)` for every row of `server`, in key order
/// (by tool name, then by the version the row was written at).
fn scan_server(
    tools: &impl ReadableTable<(&'static str, &'static str, u64), &'static [u8]>,
    server: &ServerId,
    mut visit: impl FnMut(&str, u64, u64, &[u8]) -> Result<(), CatalogError>,
) -> Result<(), CatalogError> {
    let start = (server.as_str(), "", 0u64);
    for entry in tools.range(start..).map_err(storage)? {
        let (key, value) = entry.map_err(storage)?;
        let (row_server, name, since) = key.value();
        if row_server != server.as_str() {
            break;
        }
        let value = value.value();
        let removed_at = removed_at(row_server, name, value)?;
        visit(name, since, removed_at, &value[HEADER..])?;
    }
    Ok(())
}

fn removed_at(server: &str, name: &str, value: &[u8]) -> Result<u64, CatalogError> {
    value
        .first_chunk::<HEADER>()
        .map(|b| u64::from_le_bytes(*b))
        .ok_or_else(|| corrupt(format!("tools[{server}/{name}]"), "shorter than its header"))
}

/// Whether a row written at `since` and removed at `removed_at` was live at `version`.
fn live_at(since: u64, removed_at: u64, version: u64) -> bool {
    since <= version && (removed_at == LIVE || removed_at > version)
}

fn stored(removed_at: u64, json: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(HEADER + json.len());
    value.extend_from_slice(&removed_at.to_le_bytes());
    value.extend_from_slice(json);
    value
}

/// A live row's value: the header then the canonical JSON (serde_json without
/// `preserve_order`, so object keys are sorted and equal definitions give equal bytes).
fn encode_tool(tool: &ToolDefinition) -> Result<Vec<u8>, CatalogError> {
    let mut value = LIVE.to_le_bytes().to_vec();
    serde_json::to_writer(&mut value, tool).map_err(|source| CatalogError::Serialize {
        name: tool.name.clone(),
        source,
    })?;
    Ok(value)
}

fn decode_tool(server: &ServerId, json: &[u8]) -> Result<ToolDefinition, CatalogError> {
    serde_json::from_slice(json).map_err(|e| corrupt(format!("a tool row of {server}"), e))
}

fn tool_name(server: &ServerId, name: &str) -> Result<ToolName, CatalogError> {
    ToolName::new(name).map_err(|e| corrupt(format!("tools[{server}/{name:?}]"), e))
}

fn read_server_row(
    servers: &impl ReadableTable<&'static str, &'static [u8]>,
    server: &ServerId,
) -> Result<Option<ServerRow>, CatalogError> {
    let Some(guard) = servers.get(server.as_str()).map_err(storage)? else {
        return Ok(None);
    };
    serde_json::from_slice(guard.value())
        .map(Some)
        .map_err(|e| corrupt(format!("servers[{server}]"), e))
}

fn encode_server_row(row: &ServerRow) -> Result<Vec<u8>, CatalogError> {
    serde_json::to_vec(row).map_err(|e| corrupt("a server row", e))
}

fn current_version(txn: &ReadTransaction) -> Result<CatalogVersion, CatalogError> {
    let meta = txn.open_table(META).map_err(storage)?;
    let version = meta.get(VERSION_KEY).map_err(storage)?;
    Ok(CatalogVersion(version.map_or(0, |g| g.value())))
}

fn check_reached(txn: &ReadTransaction, asked: CatalogVersion) -> Result<(), CatalogError> {
    let current = current_version(txn)?;
    if asked > current {
        return Err(CatalogError::VersionAhead { asked, current });
    }
    Ok(())
}

fn corrupt(what: impl Into<String>, reason: impl std::fmt::Display) -> CatalogError {
    CatalogError::Corrupt {
        what: what.into(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
impl Catalog {
    /// The set version cached for `server`, if one is.
    pub(crate) fn cached_set_version(&self, server: &ServerId) -> Option<u64> {
        self.inner
            .live_sets
            .lock()
            .get(server)
            .map(|set| set.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> Vec<ToolDefinition> {
        names
            .iter()
            .map(|name| ToolDefinition::new(ToolName::new(*name).unwrap(), "", Default::default()))
            .collect()
    }

    /// Every change a reader can see moves the counter on, once; a reachability reported
    /// again unchanged does not.
    #[test]
    fn the_change_counter_moves_on_every_visible_change() {
        let catalog = Catalog::in_memory().unwrap();
        let changes = catalog.changes();
        let server = ServerId::new("s").unwrap();
        let mut seen = *changes.borrow();
        assert_eq!(seen, 0);
        let mut expect_moved = |what: &str, moved: bool| {
            let now = *changes.borrow();
            assert_eq!(now != seen, moved, "{what}: {seen} -> {now}");
            assert!(now <= seen + 1, "{what}: once");
            seen = now;
        };
        catalog.refresh(&server, &set(&["a"])).unwrap();
        expect_moved("a new set", true);
        catalog.refresh(&server, &set(&["a"])).unwrap();
        expect_moved("an unchanged set: a new sync stamp", true);
        catalog.record_failure(&server, "down").unwrap();
        expect_moved("a failure", true);
        catalog.set_reachability(&server, Reachability::Reachable);
        expect_moved("reachable", true);
        catalog.set_reachability(&server, Reachability::Reachable);
        expect_moved("reachable again", false);
        let unreachable = Reachability::Unreachable {
            reason: "gone".into(),
        };
        catalog.set_reachability(&server, unreachable);
        expect_moved("unreachable", true);
        let clone = catalog.clone();
        clone.refresh(&server, &set(&["a", "b"])).unwrap();
        expect_moved("through a clone", true);
        assert!(
            catalog.refresh(&server, &set(&["x", "x"])).is_err(),
            "a duplicate"
        );
        expect_moved("a refused refresh", false);
    }

    #[test]
    fn an_older_snapshot_never_replaces_a_newer_set() {
        let sets = LiveSets::default();
        let s = ServerId::new("s").unwrap();
        let v2 = sets.offer(&s, 2, set(&["b"]));
        assert!(Arc::ptr_eq(&sets.get(&s, 2).unwrap(), &v2));
        // A reader of version 1 decoded late: it gets its own set, the cache keeps v2.
        let v1 = sets.offer(&s, 1, set(&["a"]));
        assert_eq!(v1.len(), 1);
        assert!(sets.get(&s, 1).is_none());
        assert!(Arc::ptr_eq(&sets.get(&s, 2).unwrap(), &v2));
        // A second reader of version 2 shares the cached allocation.
        assert!(Arc::ptr_eq(&sets.offer(&s, 2, set(&["b"])), &v2));
        // A later version replaces it: one set per server.
        let v3 = sets.offer(&s, 3, set(&["c"]));
        assert!(sets.get(&s, 2).is_none());
        assert!(Arc::ptr_eq(&sets.get(&s, 3).unwrap(), &v3));
        assert_eq!(sets.lock().len(), 1);
    }

    #[test]
    fn a_refresh_that_changes_a_server_drops_its_older_set_only() {
        let sets = LiveSets::default();
        let (s, t) = (ServerId::new("s").unwrap(), ServerId::new("t").unwrap());
        sets.offer(&s, 2, set(&["a"]));
        sets.offer(&t, 1, set(&["b"]));
        sets.forget_older(&s, 2);
        assert!(sets.get(&s, 2).is_some(), "not older: kept");
        sets.forget_older(&s, 4);
        assert!(sets.get(&s, 2).is_none());
        assert!(sets.get(&t, 1).is_some(), "other servers are untouched");
    }

    #[test]
    fn reads_cache_one_set_per_listed_server_and_none_for_unknown_names() {
        let catalog = Catalog::in_memory().unwrap();
        let s = ServerId::new("s").unwrap();
        for name in ["x", "y", "z"] {
            catalog.live(&ServerId::new(name).unwrap()).unwrap();
        }
        catalog.refresh(&s, &set(&["a", "b"])).unwrap();
        catalog.live(&s).unwrap();
        catalog.refresh(&s, &set(&["a"])).unwrap();
        assert!(
            catalog.inner.live_sets.lock().is_empty(),
            "the change dropped the older set"
        );
        catalog.live(&s).unwrap();
        assert_eq!(catalog.cached_set_version(&s), Some(2));
        assert_eq!(catalog.inner.live_sets.lock().len(), 1);
    }
}
