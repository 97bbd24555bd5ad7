//! The store for blocking callers: the seams (`CatalogStore`, `RecordStore`) are blocking,
//! so the PostgreSQL store runs its queries on a small runtime of its own and blocks the
//! calling thread on each.

use std::sync::Arc;

use psych_types::RunId;

use crate::{OpenError, PgCatalog, PgRecords, PgStore, RecordError};

/// An open store for blocking callers: the pool, and a runtime of two workers its
/// connections live on. Cheap to clone; the catalogue ([`catalog`](Self::catalog)) and every
/// Run's records ([`records`](Self::records)) share its pool. The runtime shuts down in the
/// background when the last clone (or a catalogue or record store made from it) goes, so
/// dropping one from async code is safe.
///
/// Every call blocks: from async code call it from `spawn_blocking`. On a multi-threaded
/// tokio runtime's worker a call blocks in place (`tokio::task::block_in_place`); within a
/// single-threaded runtime (its `spawn_blocking` threads, or, wrongly, its own thread,
/// which the call then stalls) it runs from a scoped thread of its own.
#[derive(Debug, Clone)]
pub struct PgBlocking {
    store: PgStore,
    runtime: Arc<Runtime>,
    /// The Runs this process holds open for writing (their writer leases renewed).
    writers: Arc<crate::retention::Writers>,
}

/// The runtime the blocking calls run on, shut down in the background when the last clone
/// goes (or when the open it was made for fails): dropped in the ordinary way within a
/// runtime's context, a tokio runtime panics.
#[derive(Debug)]
struct Runtime(Option<tokio::runtime::Runtime>);

impl Runtime {
    /// Runs `work` on the runtime, blocking this thread ([`block_on`]); `None` only once it
    /// has shut down (taken when it drops: a live one always has its runtime).
    fn block<T: Send>(&self, work: impl Future<Output = T> + Send) -> Option<T> {
        Some(block_on(self.0.as_ref()?, work))
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl PgBlocking {
    /// Opens the store at `url` ([`PgStore::open`]) on a runtime of its own (two workers)
    /// and blocks until it is open.
    ///
    /// # Errors
    ///
    /// [`OpenError`], and [`OpenError::Runtime`] when the runtime cannot start.
    pub fn open(url: &str) -> Result<Self, OpenError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("psych-pg")
            .enable_all()
            .build()
            .map_err(OpenError::Runtime)?;
        // Wrapped before the open, so every way out (a refused URL, no connection, a
        // panic) shuts it down in the background, which never panics within a runtime.
        let runtime = Arc::new(Runtime(Some(runtime)));
        let store = runtime.block(PgStore::open(url)).ok_or_else(|| {
            OpenError::Runtime(std::io::Error::other("the store's runtime shut down"))
        })??;
        Ok(Self {
            store,
            runtime,
            writers: Arc::default(),
        })
    }

    /// The store it works in.
    pub fn store(&self) -> &PgStore {
        &self.store
    }

    /// The key named `name` every process using the store shares ([`PgStore::shared_key`]).
    /// Blocks for two round trips.
    ///
    /// # Errors
    ///
    /// [`DbError`](crate::DbError), as [`PgStore::shared_key`].
    pub fn shared_key(&self, name: &str) -> Result<[u8; 32], crate::DbError> {
        // A live store always has its runtime (taken only when the last clone drops).
        self.block(self.store.shared_key(name))
            .unwrap_or(Err(crate::DbError::ShutDown))
    }

    /// The catalogue (see [`PgCatalog`]).
    pub fn catalog(&self) -> PgCatalog {
        PgCatalog::on(self.clone())
    }

    /// Opens (creating it on first use) the record store of Run `run` of `identity` (see
    /// [`PgRecords`]). Blocks for one round trip.
    ///
    /// # Errors
    ///
    /// [`RecordError`]: `identity` is not a valid identity, or the database failed.
    pub fn records(&self, identity: &str, run: &RunId) -> Result<PgRecords, RecordError> {
        PgRecords::open(self.clone(), identity, run)
    }

    /// The record store of Run `run` of `identity` if the database has that Run (written
    /// by any process: a handle another replica minted), without creating it; `None`
    /// otherwise (and for an identity the store would refuse). Blocks for one round trip.
    ///
    /// # Errors
    ///
    /// [`RecordError`] when the database failed.
    pub fn existing_records(
        &self,
        identity: &str,
        run: &RunId,
    ) -> Result<Option<PgRecords>, RecordError> {
        PgRecords::existing(self.clone(), identity, run)
    }

    /// Runs `work` on the store's runtime, blocking this thread ([`block_on`]). The future
    /// itself runs on the calling thread (or a scoped one), never on a worker of the
    /// store's runtime (its workers drive the connections), so blocking work inside it
    /// (reading a spill file) blocks the caller only.
    pub(crate) fn block<T: Send>(&self, work: impl Future<Output = T> + Send) -> Option<T> {
        self.runtime.block(work)
    }

    /// Deletes whole Runs past `max_age` since their last write, or the oldest of an
    /// identity's past `max_bytes`, never a Run whose writer's lease is current (see the crate's
    /// retention): what `psych serve --store` runs at start and hourly. One process sweeps
    /// a schema at a time; another finding it taken deletes nothing.
    ///
    /// A Run that cannot be deleted is skipped, and the sweep goes on.
    ///
    /// # Errors
    ///
    /// [`RecordError::Skipped`] when it could not delete some Runs (the others deleted,
    /// what it deleted and each Run skipped with its error said); [`RecordError`] when the
    /// database fails (what was deleted before stays deleted).
    pub fn sweep(
        &self,
        max_age: std::time::Duration,
        max_bytes: u64,
    ) -> Result<psych_types::SweptRuns, RecordError> {
        self.block(crate::retention::sweep(&self.store, max_age, max_bytes))
            .unwrap_or(Err(RecordError::ShutDown))
    }

    /// Renews the writer leases of the Runs this store holds open every `every` rather than
    /// every [`RENEW_EVERY`](crate::RENEW_EVERY), which it may only shorten (a longer one
    /// is taken as `RENEW_EVERY`: leases would lapse between renewals). Takes effect only
    /// when no Run has been opened for writing through this store (or its clones) yet: the
    /// renewal then started keeps its interval until the store goes. Returns whether it
    /// took effect (`false`: a renewal runs already, unchanged). For tests of renewal; not
    /// part of the API.
    #[doc(hidden)]
    #[must_use]
    pub fn renew_every(&self, every: std::time::Duration) -> bool {
        self.writers.renew_every(every)
    }

    /// Holds `run` of `identity` open for writing: its lease renewed until the hold drops.
    pub(crate) fn hold(&self, identity: Arc<str>, run: RunId) -> crate::retention::Hold {
        self.writers.hold(self, identity, run)
    }

    /// Runs `work` on the store's runtime in the background (nothing when the store has
    /// shut down).
    pub(crate) fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        if let Some(runtime) = self.runtime.0.as_ref() {
            drop(runtime.spawn(work));
        }
    }

    pub(crate) async fn client(
        &self,
    ) -> Result<deadpool_postgres::Object, deadpool_postgres::PoolError> {
        self.store.pool.get().await
    }
}

/// Runs' records for processes that share them (gateway replicas): each Run's store erased
/// behind psych-types' seam.
impl psych_types::RecordStores for PgBlocking {
    fn open(
        &self,
        identity: &str,
        run: &RunId,
        estimator: Arc<dyn psych_types::TokenEstimator + Send + Sync>,
    ) -> Result<Arc<psych_types::DynRecordStore>, psych_types::StoreError> {
        let records = self
            .records(identity, run)
            .map_err(RecordError::into_store_error)?;
        Ok(Arc::new(psych_types::Erased(
            records.with_estimator(estimator),
        )))
    }

    fn find(
        &self,
        identity: &str,
        run: &RunId,
    ) -> Result<Option<Arc<psych_types::DynRecordStore>>, psych_types::StoreError> {
        let found = self
            .existing_records(identity, run)
            .map_err(RecordError::into_store_error)?;
        Ok(found.map(|records| {
            Arc::new(psych_types::Erased(records)) as Arc<psych_types::DynRecordStore>
        }))
    }

    fn sweep(
        &self,
        max_age: std::time::Duration,
        max_bytes: u64,
    ) -> Result<psych_types::SweptRuns, psych_types::StoreError> {
        PgBlocking::sweep(self, max_age, max_bytes).map_err(RecordError::into_store_error)
    }

    fn recent_targets(
        &self,
        whose: &psych_types::Identities,
        recent: usize,
    ) -> Result<Vec<std::collections::BTreeMap<psych_types::ToolRef, u64>>, psych_types::StoreError>
    {
        self.block(async {
            let mut client = self
                .client()
                .await
                .map_err(|e| RecordError::Db(crate::DbError::Connect(e)))?;
            crate::usage::recent_targets(&mut client, whose, recent).await
        })
        .unwrap_or(Err(RecordError::ShutDown))
        .map_err(RecordError::into_store_error)
    }

    fn expired(
        &self,
        identity: &str,
        run: &RunId,
    ) -> Result<Option<String>, psych_types::StoreError> {
        if !crate::records::valid_identity(identity) {
            return Ok(None);
        }
        self.block(async {
            let client = self
                .client()
                .await
                .map_err(|e| RecordError::Db(crate::DbError::Connect(e)))?;
            crate::retention::expired(&client, identity, run).await
        })
        .unwrap_or(Err(RecordError::ShutDown))
        .map_err(RecordError::into_store_error)
    }
}

/// Runs `work` on `runtime`, blocking this thread: at once off any runtime, in place on a
/// multi-threaded runtime's worker (`block_in_place`), and from a scoped thread of its own
/// within a single-threaded runtime's context, this thread waiting for it. (There, tokio
/// tells no public way apart the runtime's own thread, where `block_on` of another runtime
/// panics, from its `spawn_blocking` threads, where it would not: the scoped thread, one OS
/// thread per call, is the price of never panicking.)
fn block_on<T: Send>(runtime: &tokio::runtime::Runtime, work: impl Future<Output = T> + Send) -> T {
    match tokio::runtime::Handle::try_current() {
        Err(_) => runtime.block_on(work),
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| runtime.block_on(work))
        }
        Ok(_) => std::thread::scope(|scope| {
            match scope.spawn(|| runtime.block_on(work)).join() {
                Ok(done) => done,
                // The work panicked: the same panic, on this thread.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }),
    }
}
