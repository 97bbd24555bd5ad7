//! Psych's records and MCP tool catalogues on PostgreSQL, for the fleets the local stores
//! cannot serve: workers that come and go while their Runs go on, and `psych serve` replicas
//! behind one address sharing handles and catalogues (issue 31; the design is
//! `docs/design/31-postgres-store.md`).
//!
//! What this version holds:
//!
//! - The store's address ([`StoreUrl`]: a `postgres://` URL with `schema` and `pool_size`),
//!   its connection pool, and its schema, created and migrated by the store when it opens
//!   ([`PgStore::open`]): numbered migrations in one transaction under an advisory lock
//!   (replicas starting together migrate once); a schema a newer build migrated is used as
//!   it is when its migrations let this build open it (`opens_from`), else refused, and
//!   left as it is either way.
//! - The catalogue ([`PgCatalog`]): psych-types' `CatalogStore`, the seam the redb
//!   catalogue implements, passing the same conformance suite (14 properties)
//!   (psych-store-conformance): a refresh is one transaction, an unchanged listing takes
//!   no version, every past version reads as it was, and the database itself refuses to
//!   delete a tool row. Replicas refreshing together take distinct versions and store whole
//!   listings. For processes sharing it: one lists a server at a time (`lease`, a session
//!   advisory lock on a connection of the catalogue's own, freed with the session of a
//!   process that dies), and each hears of the changes the others commit (`watch`:
//!   `pg_notify` on [`CHANNEL`] in the change's transaction, `LISTEN` on a connection of
//!   its own, reconnected with a backoff).
//! - Records ([`PgRecords`], one per Run of an identity): psych-types' `RecordStore`, the
//!   seam the record log implements, passing the same conformance suite (10 properties): a
//!   batch is one transaction and its handles are returned only after its commit; a tool
//!   result of any size is stored once, in chunks of [`CHUNK`] bytes with the line breaks
//!   before each, so a page or a line of it reads about the page (a spilled text is
//!   streamed from its file, checked as UTF-8); every row carries its identity and every
//!   read names it, so a Run of another identity is not read even under the same handle.
//!
//! The seams are blocking: [`PgBlocking`] runs the queries on a small runtime of its own,
//! shared by the catalogue and every Run's records. It is also psych-types' `RecordStores`,
//! which `psych serve --store` (psych-gateway's `GatewaySettings::records_in`) writes each
//! identity's Runs to, so replicas on one schema read each other's handles, and the
//! runtime's `RunBuilder::records_in` opens a Run in, so any worker resumes it. The
//! catalogue, erased (`Erased(PgCatalog)`), is what psych-catalog's `Catalog::shared` and
//! `psych serve --store` (`GatewaySettings::catalog_in`) keep the replicas' catalogue in.
//! Retention ([`PgBlocking::sweep`], psych-types' `RecordStores::sweep`): whole Runs past
//! an age since their last write or, oldest first, past a size per identity, never a Run a
//! process holds open (a writer lease it renews), their handles then answering that they
//! expired (a read under way when its Run goes included: never a short text or history)
//! and their names not opened again while remembered (the newest [`EXPIRED_KEPT`] per
//! identity: a name forgotten past that may be opened again, so choose Run names that are
//! never reused, as the gateway's random ones).
//!
//! Every connection commits durably (`synchronous_commit=on`, whatever the server's
//! default) and finds the store's tables first (`search_path`). TLS is not supported yet: a
//! URL asking for it is refused, saying so.
//!
//! # Example
//!
//! ```no_run
//! use psych_store_postgres::PgBlocking;
//! use psych_types::{CatalogStore, Record, RecordSource, RecordStore, RunId, UserMessage};
//!
//! // Off the async workers (or in `spawn_blocking`): the store's calls block.
//! // Trust authentication, database `test`, the store's tables in schema `fleet`.
//! let store = PgBlocking::open("postgres://postgres@127.0.0.1:5432/test?schema=fleet")?;
//! let records = store.records("team-a", &RunId::new("run-1")?)?;
//! let hello = Record::User(UserMessage { text: "hello".into() });
//! let handle = records.append(&hello)?; // returned once committed
//! assert_eq!(records.record(&handle)?, Some(hello));
//! // Another identity's Run of the same name is another Run.
//! let other = store.records("team-b", &RunId::new("run-1")?)?;
//! assert_eq!(other.record(&handle)?, None);
//! let catalog = store.catalog();
//! println!("catalogue version {}", catalog.version()?.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod blocking;
mod catalog;
mod error;
mod records;
mod retention;
mod schema;
mod shared;
mod url;
mod usage;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

pub use blocking::PgBlocking;
pub use catalog::{CatalogError, PgCatalog};
pub use error::OpenError;
pub use records::{CHUNK, CommitFault, PgRecords, RecordError, SkippedRun, SpillError, Unresolved};
pub use retention::{EXPIRED_KEPT, RENEW_EVERY, RUN_LEASE, SKIPPED_KEPT};
pub use schema::SCHEMA_VERSION;
pub use shared::CHANNEL;
pub use url::{DEFAULT_POOL_SIZE, DEFAULT_SCHEMA, StoreUrl, UrlError};

/// How long a caller waits for a connection of the pool before the request fails.
pub const POOL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// An open store: a pool of connections to one database, the store's tables in one schema.
/// Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    schema: String,
    /// The connection settings, for the connections of its own the catalogue opens (the
    /// refresh leases' and the change feed's).
    config: tokio_postgres::Config,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.schema)
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

/// A failed request to the database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// No connection could be had within [`POOL_WAIT`].
    #[error("no PostgreSQL connection")]
    Connect(#[source] deadpool_postgres::PoolError),
    /// PostgreSQL refused or failed the request.
    #[error("PostgreSQL")]
    Query(#[source] tokio_postgres::Error),
    /// A connection of the store's own, outside the pool (the catalogue's refresh leases),
    /// could not be opened.
    #[error("cannot open a PostgreSQL connection")]
    Open(#[source] tokio_postgres::Error),
    /// A row holds what the schema's own checks should have refused (the table altered by
    /// hand): what it is.
    #[error("the store's {0} is malformed")]
    Malformed(&'static str),
    /// The store's runtime has shut down ([`PgBlocking`]'s last clone dropped).
    #[error("the store has shut down")]
    ShutDown,
}

impl PgStore {
    /// A connection of the store's own, outside the pool, with the pool's settings: for
    /// work that must not hold a pooled connection (a sweep's cursor), or must not trust
    /// one (asking again after a lost answer). Its task runs on the current runtime and
    /// ends when the client drops, which ends its session (and frees its locks).
    pub(crate) async fn own_connection(&self) -> Result<tokio_postgres::Client, DbError> {
        let (client, connection) = self
            .config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(DbError::Open)?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// Opens the store at `url` ([`StoreUrl::parse`]): makes the pool, connects once, and
    /// creates or migrates the schema to [`SCHEMA_VERSION`] in one transaction (a schema
    /// already past it is used as it is, when its `opens_from` lets this build open it). Call it
    /// inside a tokio runtime (with its time driver): the pool's connections run there.
    ///
    /// Another process migrating the schema is waited for (up to 10 minutes, whatever the
    /// URL's `lock_timeout` and `statement_timeout`). A migration whose statement waits more
    /// than half a second for a table lock (an older replica's long append) gives way, lets
    /// the requests queued behind it through for a second and is tried again, for up to two
    /// minutes: a request to a table being migrated waits at most about half a second at a
    /// time behind it, then for the migration's own work once it has the table.
    ///
    /// # Errors
    ///
    /// [`OpenError`]: the URL refused, no connection, the migration failed (nothing of it
    /// committed), or the schema was migrated past what this build may open
    /// ([`OpenError::NewerSchema`]).
    pub async fn open(url: &str) -> Result<Self, OpenError> {
        let url = StoreUrl::parse(url)?;
        let manager = Manager::from_config(
            url.config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(url.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(POOL_WAIT))
            .build()
            .map_err(OpenError::Pool)?;
        let mut client = pool.get().await.map_err(OpenError::Connect)?;
        if !schema::migrate(&mut client, &url.schema).await? {
            // Its session may hold the migration lock still: closed, not pooled.
            drop(deadpool_postgres::Object::take(client));
        }
        Ok(Self {
            pool,
            schema: url.schema,
            config: url.config,
        })
    }

    /// The schema the store's tables live in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The 32-byte key named `name` that every process using this store shares: made once,
    /// by the first process to ask, from PostgreSQL's strong random source
    /// (`gen_random_uuid`, PostgreSQL 13 or later: 244 random bits), and the same for every
    /// process after. Replicas of `psych serve` seal the state of multi-round calls with
    /// one, so that a round sealed by one replica opens on any. Whoever can read the
    /// store's tables can read it.
    ///
    /// # Errors
    ///
    /// [`DbError`] when no connection can be had or a query fails, and
    /// [`DbError::Malformed`] when the row is not 32 bytes (altered by hand).
    pub async fn shared_key(&self, name: &str) -> Result<[u8; 32], DbError> {
        let client = self.pool.get().await.map_err(DbError::Connect)?;
        // Inserted if absent, then read: two processes asking at once both read the one
        // inserted first.
        client
            .execute(
                "insert into shared_keys (name, value)
                 values ($1, uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()))
                 on conflict (name) do nothing",
                &[&name],
            )
            .await
            .map_err(DbError::Query)?;
        let row = client
            .query_one("select value from shared_keys where name = $1", &[&name])
            .await
            .map_err(DbError::Query)?;
        let value: &[u8] = row.get(0);
        <[u8; 32]>::try_from(value).map_err(|_| DbError::Malformed("shared key"))
    }

    /// The schema's version as the database holds it now.
    ///
    /// # Errors
    ///
    /// [`DbError`] when no connection can be had or the query fails.
    pub async fn schema_version(&self) -> Result<i64, DbError> {
        let client = self.pool.get().await.map_err(DbError::Connect)?;
        let row = client
            .query_one(
                "select value from psych_meta where key = 'schema_version'",
                &[],
            )
            .await
            .map_err(DbError::Query)?;
        Ok(row.get(0))
    }
}
