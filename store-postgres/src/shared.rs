//! What processes sharing one catalogue need besides its tables (gateway replicas on one
//! database): one process lists a server at a time, and every other process hears of a
//! change it did not make.
//!
//! - **Refresh leases.** A session advisory lock per (schema, server), taken with
//!   `pg_try_advisory_lock` on a connection of the catalogue's own, outside the pool (a
//!   lease is held while the server is listed, which may take seconds: taken from the pool,
//!   leases could starve the refreshes that end them). A process killed while it holds one
//!   loses its session, and PostgreSQL frees the lock; a host that vanishes without closing
//!   its connections is found dead by the server's TCP keepalives (asked of this connection:
//!   first probe after 30 s idle, three 10 s apart), freeing it within about a minute.
//!   Another process waiting meanwhile gives up after twice its list timeout, without
//!   recording a failure of the server.
//! - **Change feed.** A refresh that changes the tools or clears an error, and every
//!   recorded failure, sends `pg_notify` on [`CHANNEL`] in its own transaction (so only
//!   once committed; a refresh that only moves the sync stamp sends none), with the payload
//!   `schema instance server`; a listener connection of the catalogue's own (`LISTEN`)
//!   wakes the catalogue's watchers for each notification of its schema sent by another
//!   instance, and once each time its `LISTEN` takes effect (a change may have been
//!   committed before it did). It stops when the catalogue's last clone is dropped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use psych_types::ServerId;
use tokio_postgres::{AsyncMessage, Client, NoTls};

use crate::catalog::CatalogError;
use crate::{DbError, PgBlocking, PgStore};

/// The channel catalogue changes are notified on.
pub const CHANNEL: &str = "psych_catalog";

/// The longest wait between two attempts to reconnect the change feed.
const MOST_BACKOFF: Duration = Duration::from_secs(5);

/// A callback that wakes a watcher.
type Wake = Arc<dyn Fn() + Send + Sync>;

/// One opened catalogue's leases and feed, shared by its clones.
pub(crate) struct Shared {
    /// This catalogue's id in notifications (random per opening), to skip its own.
    instance: String,
    /// The connection leases are taken on, opened at the first lease and again after it
    /// is lost (its locks are lost with it).
    leases: tokio::sync::Mutex<Option<Arc<Client>>>,
    wakes: Mutex<Vec<Wake>>,
    listening: AtomicBool,
    /// The leases this catalogue holds or is taking, by server: the listing start each
    /// stamped (`None` while it is being taken), which the server's row must still hold
    /// when the listing is stored (else another process took the lease over after this
    /// one's connection was lost). Claimed here before the advisory lock is asked for, in
    /// one step, since the lock is the session's and taken again by the same session: one
    /// listing of a server at a time in this process as across processes.
    tokens: Mutex<BTreeMap<ServerId, Option<i64>>>,
    /// Stops the feed's listener when the catalogue goes.
    stop: Arc<tokio::sync::Notify>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // `notify_one` keeps the permit should the listener not be waiting right now.
        self.stop.notify_one();
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("instance", &self.instance)
            .field("listening", &self.listening.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for Shared {
    fn default() -> Self {
        use std::hash::BuildHasher;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        // Not a secret, only distinct: the std hasher's random keys, the process and time.
        let instance =
            std::collections::hash_map::RandomState::new().hash_one((std::process::id(), nanos));
        Self {
            instance: format!("{instance:016x}"),
            leases: tokio::sync::Mutex::new(None),
            wakes: Mutex::new(Vec::new()),
            listening: AtomicBool::new(false),
            tokens: Mutex::new(BTreeMap::new()),
            stop: Arc::new(tokio::sync::Notify::new()),
        }
    }
}

impl Shared {
    /// The payload that notifies a change of `server` in `schema` made by this instance.
    pub(crate) fn payload(&self, schema: &str, server: &ServerId) -> String {
        format!("{schema} {} {server}", self.instance)
    }

    /// The lease connection, opened when there is none or it was lost. Runs on the store's
    /// runtime (its connection task is spawned there).
    pub(crate) async fn lease_client(&self, store: &PgStore) -> Result<Arc<Client>, CatalogError> {
        let mut slot = self.leases.lock().await;
        if let Some(client) = slot.as_ref().filter(|client| !client.is_closed()) {
            return Ok(Arc::clone(client));
        }
        let (client, connection) = keepalive(&store.config)
            .connect(NoTls)
            .await
            .map_err(|e| CatalogError::Db(DbError::Open(e)))?;
        tokio::spawn(async move {
            // Ends when the connection does; its locks go with its session.
            let _ = connection.await;
        });
        let client = Arc::new(client);
        *slot = Some(Arc::clone(&client));
        Ok(client)
    }

    /// Adds `wake` to the watchers, and starts the feed's listener on the store's runtime
    /// at the first.
    pub(crate) fn watch(self: &Arc<Self>, blocking: &PgBlocking, wake: Wake) {
        let stop = Arc::clone(&self.stop);
        self.wakes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(wake);
        if !self.listening.swap(true, Ordering::AcqRel) {
            let store = blocking.store();
            // Dropped when stopped: its client with it, which ends its connection and pump.
            let feed = listen(
                Arc::downgrade(self),
                keepalive(&store.config),
                store.schema().to_owned(),
            );
            blocking.spawn(async move {
                tokio::select! {
                    () = feed => {}
                    () = stop.notified() => {}
                }
            });
        }
    }

    /// Claims the taking of `server`'s lease for this catalogue, unless one of its
    /// listings holds or is taking it already (`None`). Checked and claimed in one step:
    /// two listings of one server starting together in this process are not both let
    /// through to the advisory lock, which the session would grant to both.
    pub(crate) fn claim(self: &Arc<Self>, server: &ServerId) -> Option<Claim> {
        let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        if tokens.contains_key(server) {
            return None;
        }
        tokens.insert(server.clone(), None);
        Some(Claim {
            shared: Arc::clone(self),
            server: server.clone(),
        })
    }

    /// Forgets `server`'s lease if its entry is still `entry` (a claim's `None`, a held
    /// lease's token): a later claim or lease of the server is not undone.
    fn give_up(&self, server: &ServerId, entry: Option<i64>) {
        let mut tokens = self.tokens.lock().unwrap_or_else(PoisonError::into_inner);
        if tokens.get(server) == Some(&entry) {
            tokens.remove(server);
        }
    }

    /// Records that this catalogue holds `server`'s lease, stamped `token`.
    pub(crate) fn hold_token(&self, server: &ServerId, token: i64) {
        self.tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(server.clone(), Some(token));
    }

    /// The stamp of `server`'s lease if this catalogue holds it.
    pub(crate) fn token(&self, server: &ServerId) -> Option<i64> {
        self.tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(server)
            .copied()
            .flatten()
    }

    fn wake_all(&self) {
        let wakes = self
            .wakes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for wake in wakes {
            wake();
        }
    }
}

/// A lease of one server being taken by this catalogue ([`Shared::claim`]): given up when
/// dropped unless the lease was taken meanwhile (then [`Held`] gives it up).
pub(crate) struct Claim {
    shared: Arc<Shared>,
    server: ServerId,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.shared.give_up(&self.server, None);
    }
}

/// A refresh lease held: unlocked when dropped.
pub(crate) struct Held {
    pub(crate) client: Arc<Client>,
    pub(crate) key: i64,
    pub(crate) blocking: PgBlocking,
    pub(crate) shared: Arc<Shared>,
    /// The server and stamp of the lease, once taken (`Proceed`).
    pub(crate) token: Option<(ServerId, i64)>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some((server, token)) = self.token.take() {
            self.shared.give_up(&server, Some(token));
        }
        let (client, key, shared) = (Arc::clone(&self.client), self.key, Arc::clone(&self.shared));
        // The token goes now and the lock a little later: the next lease of the server in
        // this catalogue may take the lock again on this session before the unlock runs,
        // which the session counts (locked twice, unlocked twice), so it stays held by that
        // lease. On the store's runtime. Should the unlock fail or find the lock not held, the
        // session is not what it should be: it is given up (closed once no lease uses it),
        // and its locks go with it. A store already shut down has closed the connection.
        self.blocking.spawn(async move {
            let unlocked = client
                .query_one("select pg_advisory_unlock($1)", &[&key])
                .await
                .is_ok_and(|row| row.get::<_, bool>(0));
            if !unlocked {
                let mut slot = shared.leases.lock().await;
                if slot.as_ref().is_some_and(|held| Arc::ptr_eq(held, &client)) {
                    *slot = None;
                }
            }
        });
    }
}

/// `config` with the server asked to probe the connection when idle (after 30 s, then
/// every 10 s, three times), so a lock or a `LISTEN` of a host that vanished is freed
/// within about a minute.
fn keepalive(config: &tokio_postgres::Config) -> tokio_postgres::Config {
    let mut config = config.clone();
    let options = config.get_options().unwrap_or("").to_owned();
    config.options(format!(
        "{options} -c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 \
         -c tcp_keepalives_count=3"
    ));
    config.keepalives(true);
    config
}

/// The refresh lease's lock key of `server` in `schema`: FNV-1a (64 bits) of a name that
/// says what it locks, as PostgreSQL's signed key.
pub(crate) fn refresh_lock(schema: &str, server: &ServerId) -> i64 {
    let name = format!("psych-store-postgres refresh {schema} {server}");
    i64::from_le_bytes(psych_types::fnv1a(name.as_bytes(), 0).to_le_bytes())
}

/// The change feed: listens on [`CHANNEL`] and wakes the watchers at each notification of
/// `schema` from another instance; reconnects with a backoff when the connection is lost,
/// and wakes them once after (a change may have been missed). Ends when the catalogue is
/// dropped.
async fn listen(shared: Weak<Shared>, config: tokio_postgres::Config, schema: String) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(instance) = shared.upgrade().map(|s| s.instance.clone()) else {
            return;
        };
        let opened = tokio::time::Instant::now();
        let Ok((client, mut connection)) = config.connect(NoTls).await else {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MOST_BACKOFF);
            continue;
        };
        let (feed, schema_of_feed) = (shared.clone(), schema.clone());
        // Polls the connection (which runs the LISTEN below) and wakes for notifications.
        let pump = tokio::spawn(async move {
            while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                let Ok(AsyncMessage::Notification(note)) = message else {
                    if message.is_err() {
                        return;
                    }
                    continue;
                };
                let Some(shared) = feed.upgrade() else {
                    return;
                };
                let mut parts = note.payload().split(' ');
                if parts.next() == Some(schema_of_feed.as_str())
                    && parts.next().is_some_and(|from| from != instance)
                {
                    shared.wake_all();
                }
            }
        });
        if client
            .batch_execute(&format!("listen {CHANNEL}"))
            .await
            .is_ok()
        {
            // A change committed before the LISTEN took effect was not heard.
            if let Some(shared) = shared.upgrade() {
                shared.wake_all();
            }
            // Until the connection ends (the client is kept alive, or it would close it).
            let _ = pump.await;
        } else {
            pump.abort();
        }
        drop(client);
        // A connection that ends soon after it opened (a database refusing it, a session
        // timeout) is not reopened at once, nor is everyone woken over and over.
        if opened.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MOST_BACKOFF);
        } else {
            backoff = Duration::from_millis(100);
        }
    }
}
