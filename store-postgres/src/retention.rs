//! Retention of Runs in the store: whole Runs deleted past an age since their last write, or
//! past a size per identity (the oldest first), never a Run a live process holds open for
//! writing. Catalogue rows are never deleted (the spec's catalogue history).
//!
//! - **Writer leases.** Opening a Run for writing ([`PgBlocking::records`]) sets its
//!   `lease_until` [`RUN_LEASE`] ahead of the database's clock, and every append moves it
//!   on; while any handle of the process holds the Run open, the process renews it every
//!   [`RENEW_EVERY`] (one statement for all its Runs). A process killed leaves its Runs
//!   deletable once their leases lapse. A renewal that fails (no connection, the statement
//!   refused) is not reported: the crate reports through the results of its calls and
//!   has no log, and the renewal is no caller's call. It is tried again at the next tick,
//!   and a lease outlasts four failed renewals; a process whose renewals fail for longer
//!   may have its Run swept, and its next append is then told so (below).
//!   A process that stalls past its lease (or was killed) may lose a Run it still holds:
//!   its next append is refused as [`RecordError::Expired`], never written under the
//!   deleted Run's handles.
//! - **The sweep** ([`PgBlocking::sweep`]) runs in one process at a time per schema (an
//!   advisory lock; another finding it taken does nothing). Per identity, as for files: a
//!   Run whose lease lapsed goes once its last write is older than the age, and, oldest
//!   first, while the identity's Runs (held ones included) hold more than the size. The
//!   doomed Runs are computed by the database (a running total per identity) and read
//!   through a cursor 256 at a time, so the sweep's memory does not grow with the Runs;
//!   each is deleted in a transaction of its own (a 1 GiB Run makes no huge transaction),
//!   its lease re-checked under the Run's lock. A Run that cannot be deleted (a name the
//!   store refuses, its rows locked past the lock timeout, a statement refused) is skipped
//!   and the sweep goes on: the doomed Runs come in the same order every time, so one that
//!   stopped it would stop every sweep. The sweep then ends as [`RecordError::Skipped`]
//!   (what it deleted, and the first [`SKIPPED_KEPT`] Runs skipped, each with its error),
//!   and the next tries them again. Only the database itself failing (the connection lost,
//!   the server down) ends it early. The sweep reads every identity's Runs' sizes and
//!   times (never their records): with learned pinning's read of the newest Runs
//!   (`RecordStores::recent_targets`, which may ask for every identity but some), the only
//!   statements on these tables that do not name an identity, administration that answers
//!   no peer.
//! - **Expired Runs are remembered** in `expired_runs` (the newest [`EXPIRED_KEPT`] per
//!   identity): their handles answer that they expired
//!   ([`RecordStores::expired`](psych_types::RecordStores::expired)), a read of such a
//!   Run (one under way when it went, another replica's, included) fails as
//!   [`RecordError::Expired`] rather than end short, and such a Run is not opened again
//!   under its name, whose handles would then name other records. A name forgotten past
//!   that may be opened again: choose Run names that are not reused (the gateway's are 128
//!   random bits).
//!
//! Every time here is the database's clock (`clock_timestamp()`), so processes whose clocks
//! differ agree on ages and leases. Every process writing to a schema must run a build
//! that knows this retention before any of them sweeps: an older build's Runs carry no
//! lease (migration 3 gives each Run a lease and a last write at its creation, so it is
//! kept for the age at least).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use psych_types::{RunId, SweptRuns};

use crate::records::{RecordError, SkippedRun, damaged, db};
use crate::{DbError, PgBlocking, PgStore};

/// How long a writer's lease on a Run lasts without renewal.
pub const RUN_LEASE: Duration = Duration::from_secs(300);

/// How often a process renews the leases of the Runs it holds open for writing.
pub const RENEW_EVERY: Duration = Duration::from_secs(60);

/// The most expired Runs remembered per identity: handles of older ones answer as unknown.
pub const EXPIRED_KEPT: i64 = 37_000;

/// The most Runs a sweep could not delete that its error
/// ([`RecordError::Skipped`]) holds with their errors; it counts them all.
pub const SKIPPED_KEPT: usize = 16;

/// The database's clock in milliseconds since the Unix epoch, as SQL.
pub(crate) const DB_NOW: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// [`RUN_LEASE`] in milliseconds.
pub(crate) fn lease_millis() -> i64 {
    i64::try_from(RUN_LEASE.as_millis()).unwrap_or(i64::MAX)
}

/// The advisory lock of one Run, taken by opening it for writing and by deleting it, so
/// neither sees the other half done: FNV-1a (64 bits) of a name that says what it locks.
pub(crate) fn run_lock(schema: &str, identity: &str, run: &RunId) -> i64 {
    let name = format!("psych-store-postgres run {schema} {identity} {run}");
    i64::from_le_bytes(psych_types::fnv1a(name.as_bytes(), 0).to_le_bytes())
}

/// The advisory lock of the schema's sweep.
fn sweep_lock(schema: &str) -> i64 {
    let name = format!("psych-store-postgres retention {schema}");
    i64::from_le_bytes(psych_types::fnv1a(name.as_bytes(), 0).to_le_bytes())
}

/// The Runs this process holds open for writing, with how many handles hold each.
#[derive(Debug, Default)]
pub(crate) struct Writers {
    open: Mutex<BTreeMap<(Arc<str>, RunId), usize>>,
    renewing: AtomicBool,
    /// The renewal's interval in milliseconds, 0 for [`RENEW_EVERY`] (tests shorten it).
    every_millis: AtomicU64,
}

/// One handle's hold on a Run's lease (shared by a store's clones); the last one dropped
/// stops its renewal.
#[derive(Debug)]
pub(crate) struct Hold {
    writers: Arc<Writers>,
    key: (Arc<str>, RunId),
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut open = self
            .writers
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

impl Writers {
    /// Renews every `every` (at most [`RENEW_EVERY`], at least a millisecond) rather than
    /// every [`RENEW_EVERY`], from the renewal the first hold starts: for tests. Whether it
    /// takes effect: `false` once a renewal runs (started by an earlier hold, it keeps its
    /// interval until the store goes).
    pub(crate) fn renew_every(&self, every: Duration) -> bool {
        let every = every.min(RENEW_EVERY);
        let millis = u64::try_from(every.as_millis()).unwrap_or(u64::MAX).max(1);
        // SeqCst, here and in `hold`: each side writes one flag and reads the other's (a
        // store-buffering pattern), which Release/Acquire lets both miss, so a renewal could
        // start at the old interval while this answered that the new one took effect.
        self.every_millis.store(millis, Ordering::SeqCst);
        !self.renewing.load(Ordering::SeqCst)
    }

    /// Holds `run` of `identity` open (its lease renewed) until the hold drops; starts the
    /// renewal on the store's runtime at the first hold.
    pub(crate) fn hold(
        self: &Arc<Self>,
        blocking: &PgBlocking,
        identity: Arc<str>,
        run: RunId,
    ) -> Hold {
        let key = (identity, run);
        *self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.clone())
            .or_insert(0) += 1;
        if !self.renewing.swap(true, Ordering::SeqCst) {
            let every = match self.every_millis.load(Ordering::SeqCst) {
                0 => RENEW_EVERY,
                millis => Duration::from_millis(millis),
            };
            blocking.spawn(renew(Arc::downgrade(self), blocking.store().clone(), every));
        }
        Hold {
            writers: Arc::clone(self),
            key,
        }
    }
}

/// Renews the leases of the Runs held open, `every` ([`RENEW_EVERY`] but in tests), until
/// the store goes. A failed renewal is tried again at the next tick (a lease outlasts four
/// of them); it is not reported (see the module's doc).
async fn renew(writers: Weak<Writers>, store: PgStore, every: Duration) {
    let mut every = tokio::time::interval(every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: opening the Runs set their leases.
    every.tick().await;
    loop {
        every.tick().await;
        let Some(held) = writers.upgrade() else {
            return;
        };
        let (identities, runs): (Vec<String>, Vec<String>) = held
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .map(|(identity, run)| (identity.to_string(), run.as_str().to_owned()))
            .unzip();
        drop(held);
        if identities.is_empty() {
            continue;
        }
        // Failures are not reported (no caller waits on the renewal, and the crate has no
        // log): the next tick tries again.
        let Ok(client) = store.pool.get().await else {
            continue;
        };
        // A Run whose row is locked is being appended to, which moves its lease anyway:
        // skipped rather than waited for, so one busy Run never delays the others' renewal
        // (nor two processes renewing the same Runs deadlock).
        let _ = client
            .execute(
                &format!(
                    "with held as (
                         select runs.identity, runs.run from runs
                         join unnest($1::text[], $2::text[]) as mine(identity, run)
                             on runs.identity = mine.identity and runs.run = mine.run
                         order by runs.identity, runs.run
                         for update of runs skip locked)
                     update runs set lease_until = {DB_NOW} + $3
                     from held where runs.identity = held.identity and runs.run = held.run"
                ),
                &[&identities, &runs, &lease_millis()],
            )
            .await;
    }
}

/// One Run the sweep deletes.
struct Doomed {
    identity: String,
    run: String,
    bytes: i64,
    why: String,
}

/// How many doomed Runs the sweep reads at a time.
const PAGE: i64 = 256;

/// Deletes the Runs past `max_age` since their last write, or past `max_bytes` of their
/// identity's (the oldest first), whose leases have lapsed; see the module's doc.
pub(crate) async fn sweep(
    store: &PgStore,
    max_age: Duration,
    max_bytes: u64,
) -> Result<SweptRuns, RecordError> {
    // The lock and the cursor on a connection of the sweep's own, not the pool's: the sweep
    // may take a while, and the pool is the requests'. Dropping it (on every way out)
    // ends its session, which frees the lock.
    let mut reader = store.own_connection().await.map_err(RecordError::Db)?;
    let lock = sweep_lock(&store.schema);
    let taken: bool = reader
        .query_one("select pg_try_advisory_lock($1)", &[&lock])
        .await
        .map_err(db)?
        .try_get(0)
        .map_err(db)?;
    if !taken {
        // Another process sweeps the schema now.
        return Ok(SweptRuns::default());
    }
    sweep_locked(store, &mut reader, max_age, max_bytes).await
}

/// The sweep under its lock: the doomed Runs read through a cursor on `reader` (one
/// snapshot), each deleted through a pooled connection taken for it.
async fn sweep_locked(
    store: &PgStore,
    reader: &mut tokio_postgres::Client,
    max_age: Duration,
    max_bytes: u64,
) -> Result<SweptRuns, RecordError> {
    let age = i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX);
    let most = i64::try_from(max_bytes).unwrap_or(i64::MAX);
    let cursor = reader.transaction().await.map_err(db)?;
    // The cursor's transaction waits while Runs are deleted: not cut off as idle.
    cursor
        .batch_execute("set local idle_in_transaction_session_timeout = 0")
        .await
        .map_err(db)?;
    // Per identity: its total (held Runs included), and each lapsed Run's running total
    // oldest first; a lapsed Run goes when older than the age, or while what is left
    // (the total less the older lapsed Runs) is over the size.
    cursor
        .execute(
            &format!(
                "declare doomed no scroll cursor for
                 with now as (select {DB_NOW} as at),
                 totals as (select identity, sum(bytes) as total from runs group by identity),
                 lapsed as (
                     select identity, run, bytes, last_write_at,
                            sum(bytes) over (partition by identity
                                             order by last_write_at, run) as upto
                     from runs, now where lease_until < now.at)
                 select lapsed.identity, lapsed.run, lapsed.bytes,
                        case when lapsed.last_write_at < now.at - $1::bigint then 'age'
                             else 'size' end
                 from lapsed join totals using (identity), now
                 where lapsed.last_write_at < now.at - $1::bigint
                    or totals.total - (lapsed.upto - lapsed.bytes) > $2::bigint
                 order by lapsed.identity, lapsed.last_write_at, lapsed.run"
            ),
            &[&age, &most],
        )
        .await
        .map_err(db)?;
    let mut swept = SweptRuns::default();
    let mut skipped: Vec<SkippedRun> = Vec::new();
    let mut count = 0u64;
    loop {
        let rows = cursor
            .query(&format!("fetch {PAGE} from doomed"), &[])
            .await
            .map_err(db)?;
        if rows.is_empty() {
            break;
        }
        for row in &rows {
            let doomed = Doomed {
                identity: row.try_get(0).map_err(db)?,
                run: row.try_get(1).map_err(db)?,
                bytes: row.try_get(2).map_err(db)?,
                why: row.try_get(3).map_err(db)?,
            };
            let mut deleter = store
                .pool
                .get()
                .await
                .map_err(|e| RecordError::Db(DbError::Connect(e)))?;
            match delete_run(&mut deleter, &store.schema, &doomed).await {
                Ok(true) => {
                    swept.runs += 1;
                    swept.bytes += u64::try_from(doomed.bytes).unwrap_or(0);
                }
                Ok(false) => {}
                // The database itself failed: the next Run would fail as well.
                Err(error) if unreachable(&error) => return Err(error),
                // This Run's failure (its name refused, its rows locked past the lock
                // timeout, a statement refused): skipped, or it would stop every sweep
                // (the doomed Runs come in the same order each time).
                Err(error) => {
                    count += 1;
                    if skipped.len() < SKIPPED_KEPT {
                        skipped.push(SkippedRun {
                            identity: doomed.identity,
                            run: doomed.run,
                            error,
                        });
                    }
                }
            }
        }
    }
    cursor.commit().await.map_err(db)?;
    // Only the newest are remembered; failing to forget the rest loses nothing.
    let _ = reader
        .execute(
            "delete from expired_runs where (identity, run) in (
                 select identity, run from (
                     select identity, run, row_number() over (
                         partition by identity order by expired_at desc, run desc) as n
                     from expired_runs) as ranked
                 where n > $1)",
            &[&EXPIRED_KEPT],
        )
        .await;
    let mut skipped = skipped.into_iter();
    match skipped.next() {
        None => Ok(swept),
        Some(first) => Err(RecordError::Skipped {
            swept,
            skipped: count,
            first: Box::new(first),
            more: skipped.collect(),
        }),
    }
}

/// Whether `error` says the database itself cannot be reached (no connection, the
/// connection lost, the server shutting down or starting): what ends a sweep. A lock
/// timeout is one Run's (its rows held by another transaction): that Run is skipped.
fn unreachable(error: &RecordError) -> bool {
    match error {
        RecordError::Db(DbError::Connect(_) | DbError::Open(_)) => true,
        RecordError::Db(DbError::Query(e)) => crate::catalog::unreachable(e),
        _ => false,
    }
}

/// Deletes one doomed Run and remembers it, in one transaction under the Run's lock,
/// unless its lease was renewed meanwhile or its row is locked (an append under way):
/// whether it was deleted.
async fn delete_run(
    client: &mut deadpool_postgres::Object,
    schema: &str,
    doomed: &Doomed,
) -> Result<bool, RecordError> {
    let run = RunId::new(&doomed.run)
        .map_err(|e| damaged(format!("runs[{:?}] is not a Run name", doomed.run), e))?;
    let (identity, name) = (doomed.identity.as_str(), doomed.run.as_str());
    let transaction = client.transaction().await.map_err(db)?;
    transaction
        .execute(
            "select pg_advisory_xact_lock($1)",
            &[&run_lock(schema, identity, &run)],
        )
        .await
        .map_err(db)?;
    let lapsed = transaction
        .query_opt(
            &format!(
                "select 1 from runs where identity = $1 and run = $2 and lease_until < {DB_NOW}
                 for update skip locked"
            ),
            &[&identity, &name],
        )
        .await
        .map_err(db)?;
    if lapsed.is_none() {
        return Ok(false);
    }
    for table in ["chunks", "records", "runs"] {
        transaction
            .execute(
                &format!("delete from {table} where identity = $1 and run = $2"),
                &[&identity, &name],
            )
            .await
            .map_err(db)?;
    }
    transaction
        .execute(
            &format!(
                "insert into expired_runs (identity, run, expired_at, why)
                 values ($1, $2, {DB_NOW}, $3) on conflict do nothing"
            ),
            &[&identity, &name, &doomed.why.as_str()],
        )
        .await
        .map_err(db)?;
    transaction.commit().await.map_err(db)?;
    Ok(true)
}

/// Why `identity`'s Run `run` was deleted by a sweep (`age` or `size`), if it was and is
/// still remembered.
pub(crate) async fn expired(
    client: &impl deadpool_postgres::GenericClient,
    identity: &str,
    run: &RunId,
) -> Result<Option<String>, RecordError> {
    let row = client
        .query_opt(
            "select why from expired_runs where identity = $1 and run = $2",
            &[&identity, &run.as_str()],
        )
        .await
        .map_err(db)?;
    Ok(row.map(|row| row.get(0)))
}
