//! The catalogue on PostgreSQL: psych-types' [`CatalogStore`] over the tables of migration 1,
//! the same guarantees as the redb catalogue, proved by the same conformance suite
//! (psych-store-conformance).
//!
//! A refresh is one transaction: the server's row locked (`for update`), its live rows read
//! and compared in Rust with the listing (tools as canonical JSON, the bytes the redb
//! catalogue stores), and, only when something changed, the catalogue's version counter
//! moved on (its row lock orders concurrent writers, as redb's single writer does), the
//! changed and removed rows marked removed at it and the new rows inserted. Rows are never
//! deleted (the database refuses it).
//!
//! The seam is blocking: [`PgCatalog`] runs its queries on a small runtime of its own and
//! blocks the calling thread on each, so call it off the async workers (as the redb
//! catalogue).

use std::collections::BTreeMap;
use std::sync::Arc;

use deadpool_postgres::GenericClient;
use psych_types::{
    CatalogFailure, CatalogStore, CatalogVersion, Diff, Lease, LeaseGuard, Refresh, ServerCatalog,
    ServerHealth, ServerId, SyncFailure, SyncStamp, ToolDefinition, ToolName, UnixMillis,
};

use crate::shared::{CHANNEL, Held, Shared, refresh_lock};
use crate::{DbError, OpenError, PgBlocking, PgStore};

/// Why a catalogue request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// A listing named a tool twice; nothing was stored.
    #[error("server {server} listed the tool {name} twice; nothing was stored")]
    DuplicateTool {
        /// The server.
        server: ServerId,
        /// The tool named twice.
        name: ToolName,
    },
    /// A read asked for a catalogue version not reached yet.
    #[error("catalogue version {} is not reached yet (the catalogue is at {})", asked.0, current.0)]
    VersionAhead {
        /// The version asked for.
        asked: CatalogVersion,
        /// The catalogue's version now.
        current: CatalogVersion,
    },
    /// A tool could not be encoded as JSON.
    #[error("cannot encode the tool {name} of {server}")]
    Encode {
        /// The server.
        server: ServerId,
        /// The tool.
        name: ToolName,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// A stored row did not decode (written by another program, or damaged).
    #[error("damaged catalogue row: {what}")]
    Corrupt {
        /// Which row.
        what: String,
        /// The decoder's error: why it did not decode.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The database failed the request (nothing of it was committed).
    #[error("the catalogue's database failed the request")]
    Db(#[source] DbError),
    /// The store's runtime has shut down (its last handle was dropped while this call
    /// was made).
    #[error("the PostgreSQL store's runtime has shut down")]
    ShutDown,
    /// This catalogue held the server's refresh lease, but another process took it over
    /// (this one's lease connection was lost while it listed): the listing was not stored,
    /// lest it replace a newer one.
    #[error("the refresh lease of {server} was lost to another process; nothing was stored")]
    LeaseLost {
        /// The server.
        server: ServerId,
    },
}

/// Whether PostgreSQL's `error` says it cannot be reached now: [`unreachable`], or a lock
/// or idle timeout (55P03, 25P03).
pub(crate) fn unavailable(error: &tokio_postgres::Error) -> bool {
    unreachable(error)
        || error
            .code()
            .is_some_and(|code| matches!(code.code(), "55P03" | "25P03"))
}

/// Whether PostgreSQL's `error` says the database itself cannot be reached: a closed
/// connection, a connection failure (SQLSTATE class 08), the server shutting down or
/// starting (57P01 to 57P03).
pub(crate) fn unreachable(error: &tokio_postgres::Error) -> bool {
    error.is_closed()
        || error.code().is_some_and(|code| {
            let code = code.code();
            code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
        })
}

pub(crate) fn db(source: tokio_postgres::Error) -> CatalogError {
    CatalogError::Db(DbError::Query(source))
}

/// A catalogue in a PostgreSQL schema, behind psych-types' `CatalogStore` seam. Cheap to
/// clone.
///
/// Every call blocks the calling thread until the database answers: its queries run on the
/// runtime of its [`PgBlocking`] store. Call it off the async workers. Called on a
/// multi-threaded tokio runtime's worker anyway, it blocks in place
/// (`tokio::task::block_in_place`) rather than panicking (see [`PgBlocking`]).
#[derive(Debug, Clone)]
pub struct PgCatalog {
    blocking: PgBlocking,
    /// Each server's decoded live set at its set version (shared by clones): a read at the
    /// same version hands out the same allocation and decodes nothing, as the redb
    /// catalogue's does. A set version names one set for good, so a hit is never stale.
    live_sets: Arc<std::sync::Mutex<BTreeMap<ServerId, LiveSet>>>,
    /// Refresh leases and the change feed (see [`CatalogStore::lease`] and
    /// [`CatalogStore::watch`]), shared by clones.
    shared: Arc<Shared>,
}

/// A server's live set as last decoded, and the set version it was read at.
type LiveSet = (CatalogVersion, Arc<[ToolDefinition]>);

impl PgCatalog {
    /// Opens the store at `url` ([`PgBlocking::open`]: a runtime of its own, two workers)
    /// and blocks until it is open. Call it off the async workers.
    ///
    /// # Errors
    ///
    /// [`OpenError`], and [`OpenError::Runtime`] when the runtime cannot start.
    pub fn open(url: &str) -> Result<Self, OpenError> {
        Ok(Self::on(PgBlocking::open(url)?))
    }

    /// The catalogue of an open store (sharing its pool and runtime).
    pub fn on(blocking: PgBlocking) -> Self {
        Self {
            blocking,
            live_sets: Arc::default(),
            shared: Arc::default(),
        }
    }

    /// The store it works in.
    pub fn store(&self) -> &PgStore {
        self.blocking.store()
    }

    fn block<T: Send>(
        &self,
        work: impl Future<Output = Result<T, CatalogError>> + Send,
    ) -> Result<T, CatalogError> {
        self.blocking
            .block(work)
            .unwrap_or(Err(CatalogError::ShutDown))
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, CatalogError> {
        self.blocking
            .client()
            .await
            .map_err(|e| CatalogError::Db(DbError::Connect(e)))
    }
}

/// The system clock in milliseconds since the Unix epoch.
fn system_now() -> UnixMillis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn millis(at: UnixMillis) -> i64 {
    i64::try_from(at).unwrap_or(i64::MAX)
}

fn version(value: i64) -> CatalogVersion {
    CatalogVersion(u64::try_from(value).unwrap_or(0))
}

fn stored(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn decode(server: &ServerId, json: &[u8]) -> Result<ToolDefinition, CatalogError> {
    serde_json::from_slice(json).map_err(|e| CatalogError::Corrupt {
        what: format!("a tool row of {server}"),
        source: Box::new(e),
    })
}

fn tool_name(server: &ServerId, name: &str) -> Result<ToolName, CatalogError> {
    ToolName::new(name).map_err(|e| CatalogError::Corrupt {
        what: format!("tools[{server}/{name:?}]"),
        source: Box::new(e),
    })
}

/// The catalogue's version now.
async fn current(client: &impl GenericClient) -> Result<CatalogVersion, CatalogError> {
    let row = client
        .query_one(
            "select value from psych_meta where key = 'catalog_version'",
            &[],
        )
        .await
        .map_err(db)?;
    Ok(version(row.get(0)))
}

/// The server's row: set version and health (defaults for a server never seen).
async fn server_row(
    client: &impl GenericClient,
    server: &ServerId,
) -> Result<(CatalogVersion, ServerHealth), CatalogError> {
    let row = client
        .query_opt(
            "select set_version, sync_version, sync_at, error_at, error_message
             from servers where server = $1",
            &[&server.as_str()],
        )
        .await
        .map_err(db)?;
    let Some(row) = row else {
        return Ok((CatalogVersion(0), ServerHealth::default()));
    };
    let sync_version: Option<i64> = row.get(1);
    let sync_at: Option<i64> = row.get(2);
    let error_at: Option<i64> = row.get(3);
    let error_message: Option<String> = row.get(4);
    let health = ServerHealth {
        last_sync: sync_version.zip(sync_at).map(|(v, at)| SyncStamp {
            version: version(v),
            at: u64::try_from(at).unwrap_or(0),
        }),
        last_error: error_at
            .zip(error_message)
            .map(|(at, message)| SyncFailure {
                at: u64::try_from(at).unwrap_or(0),
                message,
            }),
        reachability: psych_types::Reachability::default(),
    };
    Ok((version(row.get(0)), health))
}

/// The server's rows live at `at` (`None`: live now), by name: (since, canonical JSON).
async fn rows_at(
    client: &impl GenericClient,
    server: &ServerId,
    at: Option<CatalogVersion>,
) -> Result<BTreeMap<String, (i64, Vec<u8>)>, CatalogError> {
    let rows = match at {
        None => {
            client
                .query(
                    "select name, since, def from tools
                     where server = $1 and removed_at = 0 order by name",
                    &[&server.as_str()],
                )
                .await
        }
        Some(at) => {
            client
                .query(
                    "select name, since, def from tools
                     where server = $1 and since <= $2 and (removed_at = 0 or removed_at > $2)
                     order by name",
                    &[&server.as_str(), &stored(at.0)],
                )
                .await
        }
    }
    .map_err(db)?;
    Ok(rows
        .iter()
        .map(|row| (row.get(0), (row.get(1), row.get(2))))
        .collect())
}

/// A read-only transaction seeing one snapshot of the catalogue (repeatable read): what a
/// read of several rows runs in, so they agree.
async fn snapshot(
    client: &mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'_>, CatalogError> {
    client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(db)
}

/// Refuses a version the catalogue has not reached.
async fn reached(client: &impl GenericClient, asked: CatalogVersion) -> Result<(), CatalogError> {
    let current = current(client).await?;
    if asked > current {
        return Err(CatalogError::VersionAhead { asked, current });
    }
    Ok(())
}

impl CatalogStore for PgCatalog {
    type Error = CatalogError;

    fn failure(&self, error: &CatalogError) -> CatalogFailure {
        match error {
            CatalogError::DuplicateTool { .. } => CatalogFailure::DuplicateTool,
            CatalogError::VersionAhead { .. } => CatalogFailure::VersionAhead,
            CatalogError::Db(DbError::Connect(_) | DbError::Open(_))
            | CatalogError::ShutDown
            | CatalogError::LeaseLost { .. } => CatalogFailure::Unavailable,
            CatalogError::Db(DbError::Query(error)) if unavailable(error) => {
                CatalogFailure::Unavailable
            }
            _ => CatalogFailure::Store,
        }
    }

    fn now(&self) -> UnixMillis {
        system_now()
    }

    fn refresh(
        &self,
        server: &ServerId,
        tools: &[ToolDefinition],
    ) -> Result<Refresh, CatalogError> {
        let mut incoming = tools
            .iter()
            .map(|tool| {
                let json = serde_json::to_vec(tool).map_err(|source| CatalogError::Encode {
                    server: server.clone(),
                    name: tool.name.clone(),
                    source,
                })?;
                Ok((tool.name.as_str().to_owned(), json))
            })
            .collect::<Result<Vec<_>, CatalogError>>()?;
        incoming.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if let Some(pair) = incoming.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(CatalogError::DuplicateTool {
                server: server.clone(),
                name: tool_name(server, &pair[0].0)?,
            });
        }
        self.block(async {
            let mut client = self.client().await?;
            let txn = client.transaction().await.map_err(db)?;
            txn.execute(
                "insert into servers (server) values ($1) on conflict do nothing",
                &[&server.as_str()],
            )
            .await
            .map_err(db)?;
            let row = txn
                .query_one(
                    "select set_version, error_at is not null, sync_started_at from servers
                     where server = $1 for update",
                    &[&server.as_str()],
                )
                .await
                .map_err(db)?;
            let mut set_version = version(row.get(0));
            let had_error: bool = row.get(1);
            // Holding the server's lease: stored only if no other process took it over
            // (this one's lease connection lost), lest an older listing replace a newer.
            let token = self.shared.token(server);
            if let Some(token) = token
                && row.get::<_, Option<i64>>(2) != Some(token)
            {
                return Err(CatalogError::LeaseLost {
                    server: server.clone(),
                });
            }
            // Stamped no earlier than the lease's start (which may run ahead of this
            // clock: another process's, or bumped past the one before), so the listing
            // reads as done once stored (`lease`'s `Satisfied`).
            // Stamped once the server's row is ours: replicas' stamps follow commit order.
            let now = millis(system_now());
            let at = token.map_or(now, |token| now.max(token));
            let live = rows_at(&txn, server, None).await?;
            let mut diff = Diff::default();
            let mut gone: Vec<&str> = Vec::new();
            let (mut names, mut defs): (Vec<&str>, Vec<&[u8]>) = (Vec::new(), Vec::new());
            for (name, json) in &incoming {
                match live.get(name) {
                    None => diff.added.push(tool_name(server, name)?),
                    Some((_, old)) if old == json => diff.unchanged.push(tool_name(server, name)?),
                    Some(_) => {
                        diff.changed.push(tool_name(server, name)?);
                        gone.push(name);
                    }
                }
                if live.get(name).is_none_or(|(_, old)| old != json) {
                    names.push(name);
                    defs.push(json);
                }
            }
            for name in live.keys() {
                if incoming
                    .binary_search_by(|(n, _)| n.as_str().cmp(name))
                    .is_err()
                {
                    diff.removed.push(tool_name(server, name)?);
                    gone.push(name);
                }
            }
            if !diff.is_empty() {
                let row = txn
                    .query_one(
                        "update psych_meta set value = value + 1 where key = 'catalog_version'
                         returning value",
                        &[],
                    )
                    .await
                    .map_err(db)?;
                let new: i64 = row.get(0);
                txn.execute(
                    "update tools set removed_at = $2
                     where server = $1 and removed_at = 0 and name = any($3)",
                    &[&server.as_str(), &new, &gone],
                )
                .await
                .map_err(db)?;
                txn.execute(
                    "insert into tools (server, name, since, def)
                     select $1, n, $2, d from unnest($3::text[], $4::bytea[]) as t(n, d)",
                    &[&server.as_str(), &new, &names, &defs],
                )
                .await
                .map_err(db)?;
                set_version = version(new);
            }
            // Other processes sharing the catalogue hear of a change (new tools, or an error
            // cleared) once committed; a sync stamp alone wakes no one.
            let payload = self.shared.payload(self.store().schema(), server);
            let notify = !diff.is_empty() || had_error;
            txn.query(
                "with synced as (
                     update servers set set_version = $2, sync_version = $2, sync_at = $3,
                         error_at = null, error_message = null
                     where server = $1 returning server)
                 select pg_notify($4, $5) from synced where $6",
                &[
                    &server.as_str(),
                    &stored(set_version.0),
                    &at,
                    &CHANNEL,
                    &payload,
                    &notify,
                ],
            )
            .await
            .map_err(db)?;
            txn.commit().await.map_err(db)?;
            Ok(Refresh {
                version: set_version,
                diff,
            })
        })
    }

    fn record_failure(&self, server: &ServerId, message: &str) -> Result<(), CatalogError> {
        let at = millis(self.now());
        // PostgreSQL's text holds no NUL, and a server's error may carry one: kept as
        // U+FFFD, as every catalogue store keeps it.
        let message = psych_types::failure_message(message);
        self.block(async {
            let client = self.client().await?;
            let payload = self.shared.payload(self.store().schema(), server);
            client
                .query_one(
                    "with failed as (
                         insert into servers (server, error_at, error_message)
                         values ($1, $2, $3)
                         on conflict (server) do update
                         set error_at = excluded.error_at, error_message = excluded.error_message
                         returning server)
                     select pg_notify($4, $5) from failed",
                    &[&server.as_str(), &at, &&*message, &CHANNEL, &payload],
                )
                .await
                .map_err(db)?;
            Ok(())
        })
    }

    fn version(&self) -> Result<CatalogVersion, CatalogError> {
        self.block(async { current(&self.client().await?).await })
    }

    fn live(&self, server: &ServerId) -> Result<ServerCatalog, CatalogError> {
        self.block(async {
            let mut client = self.client().await?;
            // One snapshot for the row and the tools.
            let txn = snapshot(&mut client).await?;
            let (set_version, health) = server_row(&txn, server).await?;
            let cached = self
                .live_sets
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(server)
                .filter(|(at, _)| *at == set_version)
                .map(|(_, tools)| Arc::clone(tools));
            let tools = match cached {
                Some(tools) => tools,
                None => {
                    let tools: Arc<[ToolDefinition]> = rows_at(&txn, server, None)
                        .await?
                        .values()
                        .map(|(_, json)| decode(server, json))
                        .collect::<Result<Vec<_>, _>>()?
                        .into();
                    self.live_sets
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(server.clone(), (set_version, Arc::clone(&tools)));
                    tools
                }
            };
            txn.commit().await.map_err(db)?;
            Ok(ServerCatalog {
                server: server.clone(),
                version: set_version,
                tools,
                health,
            })
        })
    }

    fn servers(&self) -> Result<Vec<ServerId>, CatalogError> {
        self.block(async {
            let client = self.client().await?;
            let rows = client
                // A row only a lease made (a first listing under way) is not a server
                // the catalogue knows yet.
                .query(
                    "select server from servers
                     where set_version > 0 or sync_at is not null or error_at is not null
                     order by server",
                    &[],
                )
                .await
                .map_err(db)?;
            rows.iter()
                .map(|row| {
                    let name: &str = row.get(0);
                    ServerId::new(name).map_err(|e| CatalogError::Corrupt {
                        what: format!("servers[{name:?}]"),
                        source: Box::new(e),
                    })
                })
                .collect()
        })
    }

    fn health(&self, server: &ServerId) -> Result<ServerHealth, CatalogError> {
        self.block(async { Ok(server_row(&self.client().await?, server).await?.1) })
    }

    fn tools_at(
        &self,
        server: &ServerId,
        version: CatalogVersion,
    ) -> Result<Vec<ToolDefinition>, CatalogError> {
        self.block(async {
            let mut client = self.client().await?;
            let txn = snapshot(&mut client).await?;
            reached(&txn, version).await?;
            let tools = rows_at(&txn, server, Some(version))
                .await?
                .values()
                .map(|(_, json)| decode(server, json))
                .collect::<Result<Vec<_>, _>>()?;
            txn.commit().await.map_err(db)?;
            Ok(tools)
        })
    }

    fn diff(
        &self,
        server: &ServerId,
        from: CatalogVersion,
        to: CatalogVersion,
    ) -> Result<Diff, CatalogError> {
        self.block(async {
            let mut client = self.client().await?;
            let txn = snapshot(&mut client).await?;
            reached(&txn, from.max(to)).await?;
            let before = rows_at(&txn, server, Some(from)).await?;
            let after = rows_at(&txn, server, Some(to)).await?;
            txn.commit().await.map_err(db)?;
            Diff::between(&before, &after, |name| tool_name(server, name))
        })
    }

    /// True: every process on the same schema shares the catalogue.
    fn is_shared(&self) -> bool {
        true
    }

    /// One process lists a server at a time: a session advisory lock per (schema, server)
    /// on a connection of this catalogue's own (see the crate's `shared` module). Taken,
    /// the lock is kept (`Proceed`, the start stamped on the server's row) unless a listing
    /// that started after `since` was stored since (`Satisfied`); not taken, `Busy`.
    ///
    /// The stamps are each process's clock, in milliseconds: processes on machines whose
    /// clocks differ by more than a listing takes may list once too often (behind) or take
    /// a listing that started just before the trigger for one after it (ahead; the next
    /// change or TTL sweep lists the server again).
    fn lease(&self, server: &ServerId, since: UnixMillis) -> Result<Lease, CatalogError> {
        let key = refresh_lock(self.store().schema(), server);
        // This catalogue lists the server already, or is taking its lease (a session's
        // advisory locks are taken again by the same session: claimed here, in one step, so
        // one process's listings of a server take the lease in turn too, and each refresh
        // is fenced by its own token). Given up on every way out but `Proceed`.
        let Some(_claim) = self.shared.claim(server) else {
            return Ok(Lease::Busy);
        };
        self.block(async {
            let client = self.shared.lease_client(self.store()).await?;
            let taken: bool = client
                .query_one("select pg_try_advisory_lock($1)", &[&key])
                .await
                .map_err(db)?
                .get(0);
            if !taken {
                return Ok(Lease::Busy);
            }
            // Unlocks when dropped, on every way out below but `Proceed`.
            let mut held = Held {
                client: Arc::clone(&client),
                key,
                blocking: self.blocking.clone(),
                shared: Arc::clone(&self.shared),
                token: None,
            };
            let row = client
                .query_opt(
                    "select set_version, sync_started_at, sync_at from servers where server = $1",
                    &[&server.as_str()],
                )
                .await
                .map_err(db)?;
            if let Some(row) = row {
                let (started, synced): (Option<i64>, Option<i64>) = (row.get(1), row.get(2));
                if let (Some(started), Some(synced)) = (started, synced)
                    && started > millis(since)
                    && synced >= started
                {
                    return Ok(Lease::Satisfied(version(row.get(0))));
                }
            }
            // The stamp is the lease's token: the refresh storing this listing checks that
            // the row still holds it (no other process took the lease over meanwhile).
            // Never the stamp already there, so a token names one lease.
            let token: i64 = client
                .query_one(
                    "insert into servers (server, sync_started_at) values ($1, $2)
                     on conflict (server) do update set sync_started_at =
                         greatest(excluded.sync_started_at, servers.sync_started_at + 1)
                     returning sync_started_at",
                    &[&server.as_str(), &millis(system_now())],
                )
                .await
                .map_err(db)?
                .get(0);
            self.shared.hold_token(server, token);
            held.token = Some((server.clone(), token));
            Ok(Lease::Proceed(LeaseGuard::holding(held)))
        })
    }

    /// Wakes `wake` at each change another process (another opening of the schema) commits,
    /// through `LISTEN` on a connection of this catalogue's own, started at the first watcher.
    fn watch(&self, wake: Arc<dyn Fn() + Send + Sync>) {
        self.shared.watch(&self.blocking, wake);
    }
}
