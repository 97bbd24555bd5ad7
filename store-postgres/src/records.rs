//! A Run's records on PostgreSQL: psych-types' [`RecordStore`] over the tables of migration
//! 2, the same guarantees as the record log, proved by the same conformance suite
//! (psych-store-conformance's `records_conformance!`).
//!
//! - A batch is one transaction: the Run's row locked (`update … returning`, which orders
//!   the Run's writers), each record's row and its result's chunks inserted, the Run's
//!   count moved on, then `COMMIT`; handles are returned only after the commit (every
//!   connection commits with `synchronous_commit=on`). A batch that failed before its
//!   COMMIT leaves nothing; one whose COMMIT's answer was lost is resolved by asking the
//!   database for its transaction's status (`txid_status`): stored and acknowledged, or
//!   `NotStored`, or, when even that cannot be asked (on a pooled connection, then on a
//!   new one, each question given [`ASK_WAIT`]), `InDoubt` ([`Unresolved`] says why). A transaction still in
//!   progress is one of two. Its session idle in it (`pg_stat_activity`) for a second
//!   ([`IDLE_BEFORE_END`]): the COMMIT never reached the server (the connection was lost
//!   first, the usual case) and the session would sit there until its
//!   `idle_in_transaction_session_timeout` (60 s), so the store ends it
//!   (`pg_terminate_backend`), which rolls the transaction back: `NotStored`, within
//!   about a second. (A session shows `idle in transaction` until it reads its next
//!   message: idle for less, its COMMIT may be in its socket, not yet read, and is
//!   left to arrive.) Its session still working through the COMMIT the lost
//!   connection sent: waited for, up to [`RESOLVE_WAIT`], before it is `InDoubt`; told
//!   so, a caller would append again a batch that then commits. Ending a session needs
//!   the privileges of its role, as seeing its state does: the store's connections all
//!   use one role, which has them over its own sessions (unless the session is a
//!   superuser's and the store's role is not), and `pg_signal_backend` and
//!   `pg_read_all_stats` grant them over other roles'. Without them, a transaction in
//!   progress is waited for in either case (and is `InDoubt` after [`RESOLVE_WAIT`],
//!   its session still idle).
//! - A tool result's readable text (the bytes a reader pages and greps) is stored once, in
//!   chunks of [`CHUNK`] bytes (`bytea`, stored uncompressed out of line, so a slice of a
//!   chunk reads only the pages it needs), each with the line breaks before it; the record
//!   row holds the result with its texts left empty and each text's span in the readable
//!   text. Reading a page or a line of a result of gigabytes reads about the page. A row
//!   read is checked against itself (each span within the text's length, the length within
//!   what chunks can index) and against its chunks (none missing before the length): a
//!   damaged row is [`RecordError::Corrupt`], never a panic, an allocation of what it
//!   claims or a text read short.
//! - A spilled text ([`ToolOutput::spilled`](psych_types::ToolOutput::spilled)) is read from
//!   its file in 1 MiB reads, checked as UTF-8, and streamed into chunk rows inserted 64 at
//!   a time: about 9 MiB of it in memory at once (the rows waiting and one read), whatever
//!   its size. The Run's row lock is held meanwhile, so a writer of the same Run (another
//!   process resuming it) waits for the whole file, for at most the store's lock timeout
//!   (30 s by default), after which its append or open fails as unavailable
//!   ([`RecordFailure::Unavailable`](psych_types::RecordFailure::Unavailable): nothing of
//!   it stored) and may be tried again.
//! - Every row carries the Run's identity, and every read names it in its `WHERE`: a store
//!   opened for one identity cannot read another identity's Run of the same name.
//! - A read that finds a row missing (a record, a chunk of its text, the next batch of a
//!   history) asks whether the Run is still there: retention deletes a Run's rows in one
//!   transaction, so a Run gone was deleted with them, and the read fails as
//!   [`RecordError::Expired`] rather than answer a short text, a partial history or
//!   nothing as whole (a replica paging another's result while a sweep deletes it is told
//!   the Run expired). Rows never change once committed, so reads of several statements
//!   need no shared snapshot beyond that.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_postgres::GenericClient;
use psych_types::{
    BlockLines, ContentBlock, History, HistoryEntry, HistoryItem, LineMark, OutputInfo, OutputKind,
    Record, RecordFailure, RecordHandle, RecordSource, RecordStore, ResourceContents, RunId,
    SpilledText, StoredResult, TextContent, TokenEstimator, ToolCallId, ToolOutput, ToolRef,
};

use crate::catalog::unavailable;
use crate::{DbError, PgBlocking};

/// Bytes of readable text per chunk row.
pub const CHUNK: usize = 128 * 1024;

/// Bytes of a spilled text read from its file at a time.
const SPILL_READ: usize = 1 << 20;

/// How long a batch whose COMMIT's answer was lost waits for its transaction to end when
/// the database says it is still in progress (its session working through the COMMIT, or
/// one the store may not end), before it is [`InDoubt`](RecordError::InDoubt).
const RESOLVE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long the session of a batch whose COMMIT's answer was lost must have sat idle in
/// its transaction before the store ends it, as a PostgreSQL interval. A session shows
/// `idle in transaction` from its last answer until it reads its next message, so one
/// idle for less may have the COMMIT in its socket, about to be read; one never sent it
/// has been idle since before the connection was lost, so the wait costs it at most this.
const IDLE_BEFORE_END: &str = "1 second";

/// How long one of the questions after a lost COMMIT (or the connection it is asked on)
/// waits for its answer, at most, before it counts as failed: a connection silent with
/// no error (a network path that drops everything) would otherwise hold it until TCP gives
/// up, minutes later. Within [`RESOLVE_WAIT`] (asked again on a new connection, a question
/// is given this much even past it).
const ASK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a record request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The identity is not one the store accepts (`[A-Za-z0-9_-]`, 1 to 64 characters).
    #[error("{identity:?} is not a valid identity (letters, digits, '-' and '_', 1 to 64)")]
    Identity {
        /// What was given.
        identity: String,
    },
    /// A spilled text could not be read whole as UTF-8; nothing of its batch was stored.
    #[error("the spilled text of block {block} ({len} bytes) cannot be stored")]
    Spill {
        /// The block.
        block: usize,
        /// The text's length.
        len: u64,
        /// What went wrong.
        #[source]
        cause: SpillError,
    },
    /// A record could not be encoded as JSON; nothing of its batch was stored.
    #[error("cannot encode a record")]
    Encode(#[source] serde_json::Error),
    /// A record's JSON nests deeper than the store reads back
    /// ([`psych_types::json::MAX_DEPTH`], counted in the row as stored): it is refused
    /// rather than kept unreadable, and nothing of its batch was stored.
    #[error("the record nests JSON {depth} levels deep; the store reads back at most {max}")]
    TooDeep {
        /// How deep the record's row nests.
        depth: usize,
        /// The deepest the store reads back.
        max: usize,
    },
    /// A stored row did not decode or does not agree with itself or its chunks (a span
    /// past its text's length, a chunk missing before it; written by another program, or
    /// damaged).
    #[error("damaged record row: {what}")]
    Corrupt {
        /// Which row, and what is wrong with it.
        what: String,
        /// The decoder's error, when one said why.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The connection was lost while the batch's `COMMIT` was under way, and the database
    /// could not be asked afterwards whether it was stored, or its transaction was still in
    /// progress 30 s later (its session still working through the COMMIT, or idle in it
    /// and not the store's to end): it may or may not be (a later read tells); its handles
    /// were not acknowledged.
    ///
    /// Its source is why asking did not settle it; the COMMIT's error is in its text.
    #[error(
        "the connection was lost during COMMIT{}: the batch may or may not be stored",
        in_parentheses(commit.as_ref().map(|e| e as &(dyn std::error::Error + 'static)))
    )]
    InDoubt {
        /// The COMMIT's error (the connection lost; none when
        /// [`fail_next_commit`](PgRecords::fail_next_commit) made it up).
        commit: Option<tokio_postgres::Error>,
        /// Why the database's answer did not settle it.
        #[source]
        unresolved: Unresolved,
    },
    /// The connection was lost while the batch's `COMMIT` was under way, and the database,
    /// asked afterwards, has none of it: nothing of the batch is stored; it can be appended
    /// again.
    #[error("the connection was lost during COMMIT; the batch was not stored")]
    NotStored(#[source] Option<tokio_postgres::Error>),
    /// The database failed the request (nothing of a failed append was committed: a lost
    /// `COMMIT` is [`NotStored`](Self::NotStored) or [`InDoubt`](Self::InDoubt)).
    #[error("the record store's database failed the request")]
    Db(#[source] DbError),
    /// The store's runtime has shut down (its last handle was dropped while this call
    /// was made).
    #[error("the PostgreSQL store's runtime has shut down")]
    ShutDown,
    /// A question after a lost COMMIT (whether the batch was stored), or the connection it
    /// was to be asked on, had no answer within its time (5 s): the
    /// database is unreachable or the connection silent. Found only inside
    /// [`Unresolved::Ask`].
    #[error("the database did not answer within {0:?}")]
    Unanswered(std::time::Duration),
    /// The Run was deleted by retention ([`PgBlocking::sweep`]): it is not opened again
    /// under its name (its handles would name other records), a writer that held it
    /// while its lease lapsed is told so rather than write under the deleted handles, and
    /// a read of it (one under way when it went included) is told so rather than answer
    /// a short text or that nothing is there.
    #[error("the Run {run} expired (deleted by retention, for its {why})")]
    Expired {
        /// The Run.
        run: RunId,
        /// Why it went: `age` or `size`.
        why: String,
    },
    /// A sweep ([`PgBlocking::sweep`]) could not delete some of the Runs past retention
    /// (each deletion is a transaction of its own, rolled back) and went on past them:
    /// the others are deleted (`swept`), and the ones skipped are tried again at the next
    /// sweep. A sweep the database itself failed (the connection lost, the server down)
    /// ends with that error instead.
    #[error(
        "the sweep could not delete {skipped} of the Runs past retention (it deleted {} \
         others, {} bytes)",
        swept.runs,
        swept.bytes
    )]
    Skipped {
        /// What the sweep deleted.
        swept: psych_types::SweptRuns,
        /// How many Runs it could not delete.
        skipped: u64,
        /// The first Run it could not delete, and why: this error's source.
        #[source]
        first: Box<SkippedRun>,
        /// The next ones, up to [`SKIPPED_KEPT`](crate::SKIPPED_KEPT) in all with the
        /// first (their count is `skipped`).
        more: Vec<SkippedRun>,
    },
}

/// Why a batch whose COMMIT's answer was lost is [`RecordError::InDoubt`]: what asking the
/// database for its transaction's status (`txid_status`) came to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Unresolved {
    /// The transaction was still in progress after the wait (its session still working
    /// through the COMMIT, or idle in it and not the store's role's to end).
    #[error("its transaction was still in progress after {0:?}")]
    InProgress(std::time::Duration),
    /// The database no longer knows the transaction (too old for its status to be kept).
    #[error("the database no longer knows its transaction")]
    Unknown,
    /// The database could not be asked: on a connection from the pool (`first`), then on
    /// a new one (`again`, this error's source; `first`, with its causes, is in the text).
    #[error(
        "the database could not be asked whether it was stored, twice{}",
        in_parentheses(Some(&**first))
    )]
    Ask {
        /// Why the first question failed.
        first: Box<RecordError>,
        /// Why the second, on a new connection, failed.
        #[source]
        again: Box<RecordError>,
    },
}

/// ` (error: its cause: …)`, for an error that is in another's text and not in its chain
/// of sources, or nothing for none: its whole chain, a cause its error's text already says
/// not said again ([`psych_types::error_chain`]; a tokio-postgres error's text is its kind
/// alone, its cause only a source).
fn in_parentheses(error: Option<&(dyn std::error::Error + 'static)>) -> String {
    error.map_or_else(String::new, |error| {
        format!(" ({})", psych_types::error_chain(error))
    })
}

/// A Run a sweep could not delete, and why.
#[derive(Debug, thiserror::Error)]
#[error("cannot delete the Run {run:?} of {identity}")]
#[non_exhaustive]
pub struct SkippedRun {
    /// Its identity.
    pub identity: String,
    /// Its name as the database holds it (not always a valid Run name: that may be why).
    pub run: String,
    /// Why it could not be deleted.
    #[source]
    pub error: RecordError,
}

/// Why a spilled text was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpillError {
    /// `ToolOutput::spilled` names a block that is not a text block, or names blocks out of
    /// order or twice.
    #[error("it names a block that is not a text block, or blocks out of order")]
    NotATextBlock,
    /// The text is not UTF-8 from byte `at`.
    #[error("not UTF-8 at byte {at}")]
    NotUtf8 {
        /// The offset of the first byte that is not.
        at: u64,
    },
    /// The file ended before the text's length.
    #[error("the spill file ends at byte {at}, before the text's end")]
    Short {
        /// Where it ended.
        at: u64,
    },
    /// The file could not be read.
    #[error("cannot read the spill file at byte {offset}")]
    Read {
        /// Where.
        offset: u64,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// `body` if it nests no deeper than serde_json reads back, else
/// [`RecordError::TooDeep`]: a record is refused rather than stored unreadable.
fn readable_depth(body: Vec<u8>) -> Result<Vec<u8>, RecordError> {
    match psych_types::json::past_max_depth(&body) {
        Some(depth) => Err(RecordError::TooDeep {
            depth,
            max: psych_types::json::MAX_DEPTH,
        }),
        None => Ok(body),
    }
}

impl RecordError {
    /// What kind of failure it is: a spilled text refused, the database unreachable (a
    /// lost connection, a restart, no pooled connection in time), or another failure.
    pub fn kind(&self) -> RecordFailure {
        match self {
            RecordError::Spill { .. } => RecordFailure::Spill,
            RecordError::TooDeep { .. } => RecordFailure::TooDeep,
            RecordError::Db(DbError::Connect(_) | DbError::Open(_)) => RecordFailure::Unavailable,
            RecordError::Db(DbError::Query(e)) if unavailable(e) => RecordFailure::Unavailable,
            RecordError::NotStored(_) => RecordFailure::Unavailable,
            _ => RecordFailure::Store,
        }
    }

    /// The error erased for callers holding any store, its kind kept.
    pub fn into_store_error(self) -> psych_types::StoreError {
        let kind = self.kind();
        psych_types::StoreError::new(kind, self)
    }
}

/// The rows `sql` answers, its statement prepared once per connection (deadpool's cache):
/// one round trip.
pub(crate) async fn rows(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, RecordError> {
    let statement = client.prepare_cached(sql).await.map_err(db)?;
    client.query(&statement, params).await.map_err(db)
}

/// The row `sql` answers, if any, as [`rows`].
async fn row(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Option<tokio_postgres::Row>, RecordError> {
    let statement = client.prepare_cached(sql).await.map_err(db)?;
    client.query_opt(&statement, params).await.map_err(db)
}

pub(crate) fn db(source: tokio_postgres::Error) -> RecordError {
    RecordError::Db(DbError::Query(source))
}

/// The expiry of `run`, deleted by retention for `why` (`age` when no longer remembered,
/// as a Run forgotten past [`EXPIRED_KEPT`](crate::EXPIRED_KEPT) was old).
fn expired(run: &RunId, why: Option<String>) -> RecordError {
    RecordError::Expired {
        run: run.clone(),
        why: why.unwrap_or_else(|| "age".to_owned()),
    }
}

fn corrupt(what: impl Into<String>) -> RecordError {
    RecordError::Corrupt {
        what: what.into(),
        source: None,
    }
}

pub(crate) fn damaged(
    what: impl Into<String>,
    source: impl std::error::Error + Send + Sync + 'static,
) -> RecordError {
    RecordError::Corrupt {
        what: what.into(),
        source: Some(Box::new(source)),
    }
}

/// The identities a store accepts: what the gateway's tenancy accepts.
pub(crate) fn valid_identity(identity: &str) -> bool {
    (1..=64).contains(&identity.len())
        && identity
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// One Run's records in a PostgreSQL schema, behind psych-types' [`RecordStore`] seam.
/// Cheap to clone (clones share the acknowledged count).
///
/// Every call blocks the calling thread until the database answers (see [`PgBlocking`]).
/// Writers of one Run on several processes are ordered by the Run's row lock, so handles
/// stay dense; [`len`](RecordStore::len) counts what this process knows was acknowledged.
#[derive(Clone)]
pub struct PgRecords {
    blocking: PgBlocking,
    identity: Arc<str>,
    run: RunId,
    len: Arc<AtomicU64>,
    /// Bytes the Run's rows hold, as this process last knew them.
    bytes: Arc<AtomicU64>,
    /// A commit failure to simulate on the next batch (tests: [`CommitFault`]).
    fault: Arc<std::sync::atomic::AtomicU8>,
    estimator: Option<Arc<dyn TokenEstimator + Send + Sync>>,
    /// For a store opened for writing: its hold on the Run's writer lease, renewed while
    /// any clone lives (see the `retention` module).
    hold: Option<Arc<crate::retention::Hold>>,
}

impl std::fmt::Debug for PgRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgRecords")
            .field("identity", &self.identity)
            .field("run", &self.run)
            .field("len", &self.len)
            .field("estimator", &self.estimator.is_some())
            .field("writer", &self.hold.is_some())
            .finish_non_exhaustive()
    }
}

/// About how many bytes of bodies a history's extension reads at once (a larger body is
/// read alone).
const HISTORY_BATCH_BYTES: i64 = 8 << 20;
/// The most rows it reads at once, however small (each batch reads this many rows' sizes,
/// whatever it returns).
const HISTORY_BATCH_ROWS: i64 = 256;

/// A stored tool result's row, without its chunks.
struct ResultRow {
    content: Vec<ContentBlock>,
    spans: Vec<Option<Range<u64>>>,
}

/// A tool result's body as [`ResultRow`] reads it: its content blocks (texts emptied),
/// the rest passed over.
#[derive(serde::Deserialize)]
struct ResultBlocks {
    #[serde(rename = "type")]
    kind: String,
    output: BlocksOnly,
}

impl ToolResultPart for ResultBlocks {
    fn tag(&self) -> &str {
        &self.kind
    }
}

/// A [`ToolOutput`]'s content blocks alone.
#[derive(serde::Deserialize)]
struct BlocksOnly {
    #[serde(default)]
    content: Vec<ContentBlock>,
}

impl PgRecords {
    pub(crate) fn open(
        blocking: PgBlocking,
        identity: &str,
        run: &RunId,
    ) -> Result<Self, RecordError> {
        if !valid_identity(identity) {
            return Err(RecordError::Identity {
                identity: identity.to_owned(),
            });
        }
        let lock = crate::retention::run_lock(blocking.store().schema(), identity, run);
        let (len, bytes) = blocking
            .block(async {
                let mut client = blocking
                    .client()
                    .await
                    .map_err(|e| RecordError::Db(DbError::Connect(e)))?;
                // Under the Run's lock, which a sweep deleting it takes too: a Run deleted
                // is refused, never made again empty under its name.
                let transaction = client.transaction().await.map_err(db)?;
                transaction
                    .execute("select pg_advisory_xact_lock($1)", &[&lock])
                    .await
                    .map_err(db)?;
                if let Some(why) = crate::retention::expired(&transaction, identity, run).await? {
                    return Err(RecordError::Expired {
                        run: run.clone(),
                        why,
                    });
                }
                let now = crate::retention::DB_NOW;
                let row = transaction
                    .query_one(
                        &format!(
                            "insert into runs
                                 (identity, run, records, created_at, last_write_at, lease_until)
                             values ($1, $2, 0, $3, {now}, {now} + $4)
                             on conflict (identity, run) do update
                                 set lease_until = greatest(runs.lease_until, excluded.lease_until)
                             returning records, bytes"
                        ),
                        &[
                            &identity,
                            &run.as_str(),
                            &now_millis(),
                            &crate::retention::lease_millis(),
                        ],
                    )
                    .await
                    .map_err(db)?;
                transaction.commit().await.map_err(db)?;
                let count = |i| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
                Ok((count(0), count(1)))
            })
            .unwrap_or(Err(RecordError::ShutDown))?;
        let hold = blocking.hold(identity.into(), run.clone());
        Ok(Self {
            blocking,
            identity: identity.into(),
            run: run.clone(),
            len: Arc::new(AtomicU64::new(len)),
            bytes: Arc::new(AtomicU64::new(bytes)),
            fault: Arc::default(),
            estimator: None,
            hold: Some(Arc::new(hold)),
        })
    }

    /// The store of Run `run` of `identity` if the database has that Run (written by any
    /// process), without creating it: what reads a handle another process minted.
    pub(crate) fn existing(
        blocking: PgBlocking,
        identity: &str,
        run: &RunId,
    ) -> Result<Option<Self>, RecordError> {
        if !valid_identity(identity) {
            return Ok(None);
        }
        let row = blocking
            .block(async {
                let client = blocking
                    .client()
                    .await
                    .map_err(|e| RecordError::Db(DbError::Connect(e)))?;
                row(
                    &client,
                    "select records, bytes from runs where identity = $1 and run = $2",
                    &[&identity, &run.as_str()],
                )
                .await
            })
            .unwrap_or(Err(RecordError::ShutDown))?;
        Ok(row.map(|row| {
            let count = |i| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
            Self {
                blocking,
                identity: identity.into(),
                run: run.clone(),
                len: Arc::new(AtomicU64::new(count(0))),
                bytes: Arc::new(AtomicU64::new(count(1))),
                fault: Arc::default(),
                estimator: None,
                hold: None,
            }
        }))
    }

    /// The same store, storing each tool result's token estimate by `estimator` when it is
    /// appended (what the record log's `set_estimator` does), so a history reads it.
    #[must_use]
    pub fn with_estimator(mut self, estimator: Arc<dyn TokenEstimator + Send + Sync>) -> Self {
        self.estimator = Some(estimator);
        self
    }

    /// The identity the Run belongs to.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn block<T: Send>(
        &self,
        work: impl Future<Output = Result<T, RecordError>> + Send,
    ) -> Result<T, RecordError> {
        self.blocking
            .block(work)
            .unwrap_or(Err(RecordError::ShutDown))
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, RecordError> {
        self.blocking
            .client()
            .await
            .map_err(|e| RecordError::Db(DbError::Connect(e)))
    }

    /// The sequence number of `handle` if it names this Run.
    fn seq(&self, handle: &RecordHandle) -> Option<i64> {
        (handle.run == self.run)
            .then(|| i64::try_from(handle.seq).ok())
            .flatten()
    }

    /// [`RecordError::Expired`] if retention deleted the Run, else `Ok`: what a read asks
    /// when it finds a row of the Run missing. A sweep deletes a Run's rows together, in
    /// one transaction, and nothing else deletes them, so a row missing from a Run that
    /// is gone now was deleted with it: the read says the Run expired rather than that the
    /// record or the rest of its text is not there (a read of several statements, cut by
    /// a sweep between them, never answers a short text or a partial history as whole).
    async fn live(&self, client: &impl GenericClient) -> Result<(), RecordError> {
        let gone = row(
            client,
            "select (select why from expired_runs where identity = $1 and run = $2)
             where not exists (select 1 from runs where identity = $1 and run = $2)",
            &[&&*self.identity, &self.run.as_str()],
        )
        .await?;
        match gone {
            Some(gone) => Err(expired(&self.run, gone.get(0))),
            None => Ok(()),
        }
    }

    async fn append_in(
        &self,
        client: &mut deadpool_postgres::Object,
        records: &[Record],
    ) -> Result<(u64, u64), Attempt> {
        // Taken first, so a batch that fails before its COMMIT leaves nothing armed.
        let fault = CommitFault::take(&self.fault);
        let transaction = client.transaction().await.map_err(db)?;
        let (identity, run) = (&*self.identity, self.run.as_str());
        let count = i64::try_from(records.len()).unwrap_or(i64::MAX);
        // Takes the Run's row lock until COMMIT: the Run's writers, in any process, take
        // their handles in turn.
        // Each append also moves the Run's last write and its writer's lease on.
        let take = transaction
            .prepare_cached(&format!(
                "update runs set records = records + $3, last_write_at = {now},
                     lease_until = greatest(lease_until, {now} + $4)
                 where identity = $1 and run = $2 returning records - $3, txid_current()",
                now = crate::retention::DB_NOW
            ))
            .await
            .map_err(db)?;
        let taken = transaction
            .query_opt(
                &take,
                &[&identity, &run, &count, &crate::retention::lease_millis()],
            )
            .await
            .map_err(db)?;
        // No row: retention deleted the Run while this process's lease on it had lapsed.
        let Some(taken) = taken else {
            let why = crate::retention::expired(&transaction, identity, &self.run).await?;
            return Err(Attempt::Failed(expired(&self.run, why)));
        };
        let (first, txid): (i64, i64) = (taken.get(0), taken.get(1));
        let mut chunks = Chunks::new(&transaction, identity, run).await?;
        let mut rows = RecordRows::default();
        for (i, record) in records.iter().enumerate() {
            let seq = first + i64::try_from(i).unwrap_or(i64::MAX);
            match record {
                Record::ToolResult(result) => {
                    let estimator = self.estimator.as_deref();
                    // Refused for its depth before its texts are streamed into chunks.
                    let body = readable_depth(
                        serde_json::to_vec(&Record::ToolResult(result.clone_without_texts()))
                            .map_err(RecordError::Encode)?,
                    )?;
                    let stored = store_output(&mut chunks, seq, &result.output, estimator).await?;
                    let spans = serde_json::to_vec(&stored.spans).map_err(RecordError::Encode)?;
                    rows.bytes += (body.len() + spans.len()) as u64 + stored.len;
                    rows.push(seq, body, Some((stored, spans)));
                }
                other => {
                    let body =
                        readable_depth(serde_json::to_vec(other).map_err(RecordError::Encode)?)?;
                    rows.bytes += body.len() as u64;
                    rows.push(seq, body, None);
                }
            }
        }
        chunks.flush().await?;
        // The records' rows and the Run's byte count in one statement. The lease is moved
        // on again: a spilled text streamed for longer than the lease would otherwise
        // commit with it lapsed, and renewal skips the row while this holds it.
        let insert = transaction
            .prepare_cached(&format!(
                "with inserted as (
                     insert into records (identity, run, seq, body, result, readable_len,
                         line_breaks, estimate, text_only, spans)
                     select $1, $2, * from unnest($3::bigint[], $4::bytea[],
                         $5::boolean[], $6::bigint[], $7::bigint[], $8::bigint[],
                         $9::boolean[], $10::bytea[])
                 )
                 update runs set bytes = bytes + $11,
                     lease_until = greatest(lease_until, {now} + $12)
                 where identity = $1 and run = $2 returning bytes",
                now = crate::retention::DB_NOW
            ))
            .await
            .map_err(db)?;
        let total: i64 = transaction
            .query_one(
                &insert,
                &[
                    &identity,
                    &run,
                    &rows.seq,
                    &rows.body,
                    &rows.result,
                    &rows.readable_len,
                    &rows.line_breaks,
                    &rows.estimate,
                    &rows.text_only,
                    &rows.spans,
                    &signed(rows.bytes),
                    &crate::retention::lease_millis(),
                ],
            )
            .await
            .map_err(db)?
            .get(0);
        let first = u64::try_from(first).unwrap_or(0);
        let in_doubt = |error| Attempt::InDoubt { first, txid, error };
        match fault {
            Some(CommitFault::Before) => {
                transaction.rollback().await.map_err(db)?;
                return Err(in_doubt(None));
            }
            Some(CommitFault::After) => {
                transaction.commit().await.map_err(|e| in_doubt(Some(e)))?;
                return Err(in_doubt(None));
            }
            None => {}
        }
        transaction.commit().await.map_err(|e| {
            // Sent and maybe not answered: in doubt until the database is asked.
            if unavailable(&e) {
                in_doubt(Some(e))
            } else {
                Attempt::Failed(db(e))
            }
        })?;
        Ok((first, u64::try_from(total).unwrap_or(0)))
    }

    /// After a batch whose COMMIT's answer was lost: what the database says of its
    /// transaction `txid`, asked on a connection from the pool (the lost one is not
    /// reused) and, when that question fails (the pooled connection hurt by what lost the
    /// COMMIT's), once more on a new connection of its own. `Ok(Some(bytes))` when it
    /// committed (the Run's bytes now), `Ok(None)` when it was rolled back. A transaction
    /// in progress whose session has sat idle in it for [`IDLE_BEFORE_END`] (the COMMIT
    /// never reached the server) has its session ended, which rolls it back
    /// ([`end_if_idle`]); one whose session is still
    /// working through the COMMIT is asked again, at growing intervals, until it ends or
    /// [`RESOLVE_WAIT`] has passed. Each question (and each connection) is given
    /// [`ASK_WAIT`] (a silent connection is a failed question), the last one asked at the
    /// wait's end; a failed question is asked again on a new connection: about 50 s in
    /// all, at most. [`Unresolved`] when it is still in progress then, is unknown to the database,
    /// or cannot be asked.
    async fn resolve(&self, txid: i64) -> Result<Option<u64>, Unresolved> {
        let deadline = tokio::time::Instant::now() + RESOLVE_WAIT;
        let first = match in_time(self.client()).await {
            Ok(Ok(client)) => match self.resolve_on(&client, txid, deadline).await {
                Ok(answer) => return answer,
                Err(asking) => {
                    // Not given back to the pool: it may be the silent one, or hold a
                    // question still unanswered.
                    drop(deadpool_postgres::Object::take(client));
                    asking
                }
            },
            Ok(Err(asking)) | Err(asking) => asking,
        };
        let deadline = deadline.max(tokio::time::Instant::now() + ASK_WAIT);
        let again = match in_time(self.connect()).await {
            Ok(Ok(client)) => match self.resolve_on(&client, txid, deadline).await {
                Ok(answer) => return answer,
                Err(asking) => asking,
            },
            Ok(Err(asking)) | Err(asking) => asking,
        };
        Err(Unresolved::Ask {
            first: Box::new(first),
            again: Box::new(again),
        })
    }

    /// [`resolve`](Self::resolve)'s questions on `client` (not prepared: they are rare):
    /// its answer, or, outside, why the database could not be asked.
    async fn resolve_on(
        &self,
        client: &tokio_postgres::Client,
        txid: i64,
        deadline: tokio::time::Instant,
    ) -> Result<Result<Option<u64>, Unresolved>, RecordError> {
        let mut pause = std::time::Duration::from_millis(10);
        // Whether the store's role may end the transaction's session (until refused).
        let mut may_end = true;
        loop {
            let status = in_time(client.query_opt("select txid_status($1)", &[&txid]))
                .await?
                .map_err(db)?;
            match status
                .and_then(|row| row.get::<_, Option<String>>(0))
                .as_deref()
            {
                Some("committed") => {
                    let bytes = in_time(client.query_opt(
                        "select bytes from runs where identity = $1 and run = $2",
                        &[&&*self.identity, &self.run.as_str()],
                    ))
                    .await?
                    .map_err(db)?
                    .map_or(0, |row| u64::try_from(row.get::<_, i64>(0)).unwrap_or(0));
                    return Ok(Ok(Some(bytes)));
                }
                Some("aborted") => return Ok(Ok(None)),
                Some("in progress") if tokio::time::Instant::now() < deadline => {
                    if may_end {
                        may_end = end_if_idle(client, txid).await?;
                    }
                    // Never past the wait: the last look comes at its end.
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    tokio::time::sleep(pause.min(left)).await;
                    pause = (pause * 2).min(std::time::Duration::from_millis(500));
                }
                Some("in progress") => return Ok(Err(Unresolved::InProgress(RESOLVE_WAIT))),
                _ => return Ok(Err(Unresolved::Unknown)),
            }
        }
    }

    /// A new connection of the store's own, outside the pool (its task on the store's
    /// runtime, ending when the client drops).
    async fn connect(&self) -> Result<tokio_postgres::Client, RecordError> {
        self.blocking
            .store()
            .own_connection()
            .await
            .map_err(RecordError::Db)
    }

    /// Makes the next batch's COMMIT fail as a lost connection would: before the commit
    /// (nothing stored) or after it (stored, the answer lost). For tests of what a caller
    /// is told; not part of the API.
    #[doc(hidden)]
    pub fn fail_next_commit(&self, fault: CommitFault) {
        self.fault.store(fault as u8, Ordering::Release);
    }

    /// The row of the stored result at `seq`: its body, its readable text's length and its
    /// texts' spans in it (checked).
    async fn result_parts(
        &self,
        client: &impl GenericClient,
        seq: i64,
    ) -> Result<Option<(Vec<u8>, u64, Spans)>, RecordError> {
        let row = row(
            client,
            "select body, readable_len, spans from records
                 where identity = $1 and run = $2 and seq = $3 and result",
            &[&&*self.identity, &self.run.as_str(), &seq],
        )
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let body: Vec<u8> = row.get(0);
        let (len, spans) =
            checked_spans(format_args!("{}:{seq}", self.run), row.get(1), row.get(2))?;
        Ok(Some((body, len, spans)))
    }

    /// The stored result at `seq`: its skeleton (texts filled in by the caller) and its
    /// texts' spans.
    async fn result_row(
        &self,
        client: &impl GenericClient,
        seq: i64,
    ) -> Result<Option<ResultRow>, RecordError> {
        let Some((body, _, spans)) = self.result_parts(client, seq).await? else {
            return Ok(None);
        };
        // Its blocks alone: the structured content and `_meta` are not built.
        let Some(skeleton) = ResultBlocks::read(&body, format_args!("{}:{seq}", self.run))? else {
            return Err(corrupt(format!(
                "record {}:{seq} is not a tool result",
                self.run
            )));
        };
        Ok(Some(ResultRow {
            content: skeleton.output.content,
            spans,
        }))
    }

    /// Bytes `range` of the readable text of the result at `seq`, read chunk by chunk.
    async fn read_range(
        &self,
        client: &impl GenericClient,
        seq: i64,
        range: Range<u64>,
    ) -> Result<Vec<u8>, RecordError> {
        // A span is checked when its row is read (`checked_spans`); a range that ends
        // before it starts, or past the chunks' column, is damage all the same, never a
        // panic or a short read, and costs no query.
        let Some(wanted) = range.end.checked_sub(range.start) else {
            return Err(corrupt(format!(
                "record {}:{seq}: bytes {range:?} end before they start",
                self.run
            )));
        };
        let first = chunk_index(range.start);
        let last = chunk_index(range.end.saturating_sub(1).max(range.start));
        let (Some(first), Some(last)) = (first, last) else {
            return Err(corrupt(format!(
                "record {}:{seq}: bytes {range:?} are past the text's chunks",
                self.run
            )));
        };
        let rows = rows(
            client,
            "select idx, data from chunks
                 where identity = $1 and run = $2 and seq = $3 and idx between $4 and $5
                 order by idx",
            &[&&*self.identity, &self.run.as_str(), &seq, &first, &last],
        )
        .await?;
        // Room for what the chunks read hold, not for what the span says: a damaged row's
        // length and span may agree on terabytes its chunks do not have.
        let held: usize = rows.iter().map(|row| row.get::<_, &[u8]>(1).len()).sum();
        let mut out = Vec::with_capacity(usize::try_from(wanted).unwrap_or(0).min(held));
        for row in rows {
            let idx: i32 = row.get(0);
            let data: &[u8] = row.get(1);
            let base = u64::from(idx.unsigned_abs()) * CHUNK as u64;
            let from = range.start.saturating_sub(base).min(data.len() as u64);
            let to = range.end.saturating_sub(base).min(data.len() as u64);
            out.extend_from_slice(&data[from as usize..to as usize]);
        }
        if out.len() as u64 != wanted {
            self.live(client).await?;
            return Err(corrupt(format!(
                "record {}:{seq}: bytes {range:?} of its text are missing",
                self.run
            )));
        }
        Ok(out)
    }

    /// Fills in the texts of `output` (a stored skeleton) from the result's readable text,
    /// read whole in one query (what a read of the whole record costs anyway). The chunks
    /// are streamed and dropped one by one as they are joined, and a text that is the whole
    /// (one text block, the usual result) takes the joined bytes without a copy: about the
    /// text's size in memory, where holding every chunk and copying took about four times
    /// it (`tests/record_memory.rs`).
    async fn fill_texts(
        &self,
        client: &impl GenericClient,
        seq: i64,
        output: &mut ToolOutput,
        spans: &[Option<Range<u64>>],
    ) -> Result<(), RecordError> {
        if spans.iter().all(Option::is_none) {
            return Ok(());
        }
        // Streamed, each chunk appended and dropped as it comes: the chunks are never all
        // held beside the text.
        let statement = client
            .prepare_cached(
                "select data from chunks
                 where identity = $1 and run = $2 and seq = $3 order by idx",
            )
            .await
            .map_err(db)?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&&*self.identity, &self.run.as_str(), &seq];
        let chunks = client.query_raw(&statement, params).await.map_err(db)?;
        let mut chunks = std::pin::pin!(chunks);
        let mut text = Vec::new();
        while let Some(chunk) =
            std::future::poll_fn(|cx| futures_core::Stream::poll_next(chunks.as_mut(), cx)).await
        {
            text.extend_from_slice(chunk.map_err(db)?.get::<_, &[u8]>(0));
        }
        if let [Some(span)] = spans
            && span.start == 0
            && usize::try_from(span.end) == Ok(text.len())
        {
            let own = String::from_utf8(text)
                .map_err(|e| damaged(format!("record {}:{seq}", self.run), e.utf8_error()))?;
            if let Some(block) = output.content.get_mut(0) {
                set_text(block, own);
            }
            return Ok(());
        }
        for (position, span) in spans.iter().enumerate() {
            let Some(span) = span else { continue };
            let bytes = usize::try_from(span.start)
                .ok()
                .zip(usize::try_from(span.end).ok())
                .and_then(|(start, end)| text.get(start..end));
            let Some(bytes) = bytes else {
                self.live(client).await?;
                return Err(corrupt(format!(
                    "record {}:{seq}: bytes {span:?} of its text are missing",
                    self.run
                )));
            };
            let own = String::from_utf8(bytes.to_vec())
                .map_err(|e| damaged(format!("record {}:{seq}", self.run), e.utf8_error()))?;
            if let Some(block) = output.content.get_mut(position) {
                set_text(block, own);
            }
        }
        Ok(())
    }
}

/// While the transaction `txid` of a batch whose COMMIT's answer was lost is in progress:
/// ends its session if that has sat idle in it (`idle in transaction`, or `(aborted)`)
/// for [`IDLE_BEFORE_END`], so the COMMIT never reached it and never will, the connection
/// being lost; the session's end rolls the transaction back, and the next `txid_status`
/// says so. A session idle for less is left alone: the state holds until the session reads
/// its next message, so the COMMIT may be in its socket still. A session working on
/// (`active`, through the COMMIT) is left to finish, and none found means the transaction
/// has ended. `Ok(false)` when the store's role may not end sessions (see the module's
/// doc): the caller then only waits.
async fn end_if_idle(client: &tokio_postgres::Client, txid: i64) -> Result<bool, RecordError> {
    // `backend_xid` is the 32-bit transaction id; `txid` carries its epoch above it. An
    // id in progress is unique among the sessions without it.
    let sql = format!(
        "select pg_terminate_backend(pid) from pg_stat_activity
         where backend_xid::text::bigint = $1 % 4294967296
             and state in ('idle in transaction', 'idle in transaction (aborted)')
             and state_change < clock_timestamp() - interval '{IDLE_BEFORE_END}'"
    );
    let ended = in_time(client.query(&sql, &[&txid])).await?;
    match ended {
        Ok(_) => Ok(true),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {
            Ok(false)
        }
        Err(e) => Err(db(e)),
    }
}

/// `question` (one of [`PgRecords::resolve`]'s, or the connection it is asked on), given
/// [`ASK_WAIT`] whatever is left of the resolution's wait (the wait decides only whether
/// to ask again: a question asked near its end still gets its time): its outcome, or
/// [`RecordError::Unanswered`] when it has none by then.
async fn in_time<T>(question: impl std::future::Future<Output = T>) -> Result<T, RecordError> {
    tokio::time::timeout(ASK_WAIT, question)
        .await
        .map_err(|_| RecordError::Unanswered(ASK_WAIT))
}

/// How a batch's transaction ended, short of success.
enum Attempt {
    /// It failed before its COMMIT: nothing of it is stored.
    Failed(RecordError),
    /// Its COMMIT was sent and its answer lost (or a test said so): `first` is the seq its
    /// first record took, `txid` its transaction.
    InDoubt {
        first: u64,
        txid: i64,
        error: Option<tokio_postgres::Error>,
    },
}

impl From<RecordError> for Attempt {
    fn from(error: RecordError) -> Self {
        Attempt::Failed(error)
    }
}

/// A commit failure [`PgRecords::fail_next_commit`] simulates.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CommitFault {
    /// The connection is lost before COMMIT is sent: the batch rolls back.
    Before = 1,
    /// The connection is lost after COMMIT was done: the batch is stored, its answer lost.
    After = 2,
}

impl CommitFault {
    /// Takes the fault armed in `armed`, if any.
    fn take(armed: &std::sync::atomic::AtomicU8) -> Option<Self> {
        match armed.swap(0, Ordering::AcqRel) {
            1 => Some(Self::Before),
            2 => Some(Self::After),
            _ => None,
        }
    }
}

/// A batch's record rows, column by column (one `unnest` insert).
#[derive(Default)]
struct RecordRows {
    seq: Vec<i64>,
    body: Vec<Vec<u8>>,
    result: Vec<bool>,
    readable_len: Vec<Option<i64>>,
    line_breaks: Vec<Option<i64>>,
    estimate: Vec<Option<i64>>,
    text_only: Vec<Option<bool>>,
    spans: Vec<Option<Vec<u8>>>,
    /// What the rows and their chunks hold, in bytes.
    bytes: u64,
}

impl RecordRows {
    fn push(&mut self, seq: i64, body: Vec<u8>, result: Option<(Stored, Vec<u8>)>) {
        self.seq.push(seq);
        self.body.push(body);
        self.result.push(result.is_some());
        let (stored, spans) = result.unzip();
        self.readable_len
            .push(stored.as_ref().map(|s| signed(s.len)));
        self.line_breaks
            .push(stored.as_ref().map(|s| signed(s.breaks)));
        self.estimate
            .push(stored.as_ref().and_then(|s| s.estimate.map(signed)));
        self.text_only.push(stored.as_ref().map(|s| s.text_only));
        self.spans.push(spans);
    }
}

/// What storing a result's readable text found.
struct Stored {
    len: u64,
    breaks: u64,
    estimate: Option<u64>,
    text_only: bool,
    /// Each block's own text's span in the stored readable text.
    spans: Vec<Option<Range<u64>>>,
}

fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Each content block's own text's span in a result's readable text (`None`: no text).
type Spans = Vec<Option<Range<u64>>>;

/// A result row's readable length and its texts' spans (record `what`), checked: both
/// there (nullable in the schema: only a result's row has them), the length not negative
/// and its chunks' indexes within the column's, and each span starting before it ends and
/// ending within the length. A row failing any is damaged: a typed error, never a panic,
/// an allocation of what a span claims, or a text read short as whole.
fn checked_spans(
    what: impl std::fmt::Display,
    len: Option<i64>,
    spans: Option<&[u8]>,
) -> Result<(u64, Spans), RecordError> {
    let (Some(len), Some(spans)) = (len, spans) else {
        return Err(corrupt(format!(
            "record {what} is a tool result without its length or spans"
        )));
    };
    let len = u64::try_from(len)
        .ok()
        .filter(|&len| chunk_index(len.saturating_sub(1)).is_some())
        .ok_or_else(|| {
            corrupt(format!(
                "record {what} has a text of {len} bytes, past what its chunks can hold"
            ))
        })?;
    let spans: Spans =
        serde_json::from_slice(spans).map_err(|e| damaged(format!("spans of {what}"), e))?;
    for span in spans.iter().flatten() {
        if span.start > span.end {
            return Err(corrupt(format!(
                "record {what} has a span that ends before it starts"
            )));
        }
        if span.end > len {
            return Err(corrupt(format!(
                "record {what} has a span ({span:?}) past its text's {len} bytes"
            )));
        }
    }
    Ok((len, spans))
}

/// The chunk holding byte `offset`, if its index fits the column.
fn chunk_index(offset: u64) -> Option<i32> {
    i32::try_from(offset / CHUNK as u64).ok()
}

/// Puts `text` in place of `block`'s own text (a text block's, an embedded text resource's).
fn set_text(block: &mut ContentBlock, text: String) {
    match block {
        ContentBlock::Text(content) => content.text = text,
        ContentBlock::Resource(embedded) => {
            if let ResourceContents::Text(resource) = &mut embedded.resource {
                resource.text = text;
            }
        }
        _ => {}
    }
}

/// A tool result without its texts (kept in chunks): what the record row's body holds.
trait WithoutTexts {
    fn clone_without_texts(&self) -> Self;
}

impl WithoutTexts for psych_types::ToolResult {
    fn clone_without_texts(&self) -> Self {
        let content = self
            .output
            .content
            .iter()
            .map(|block| match block {
                // Not cloned whole: a text may be gigabytes.
                ContentBlock::Text(content) => ContentBlock::Text(TextContent {
                    text: String::new(),
                    annotations: content.annotations.clone(),
                    meta: content.meta.clone(),
                    extra: content.extra.clone(),
                }),
                other => {
                    let mut other = other.clone();
                    set_text(&mut other, String::new());
                    other
                }
            })
            .collect();
        Self {
            target: self.target.clone(),
            call_id: self.call_id.clone(),
            name: self.name.clone(),
            output: ToolOutput {
                content,
                structured_content: self.output.structured_content.clone(),
                is_error: self.output.is_error,
                meta: self.output.meta.clone(),
                spilled: Vec::new(),
            },
        }
    }
}

/// Chunk rows written at a time (one `unnest` insert): about 8 MiB of text.
const CHUNK_ROWS: usize = 64;

/// Streams a batch's readable texts into chunk rows of [`CHUNK`] bytes, inserted
/// [`CHUNK_ROWS`] at a time, so that a batch of small results is one insert and a text of
/// gigabytes holds about 8 MiB in memory at once.
struct Chunks<'t, 'c> {
    transaction: &'t deadpool_postgres::Transaction<'c>,
    insert: tokio_postgres::Statement,
    identity: &'t str,
    run: &'t str,
    /// The record whose text is being fed.
    seq: i64,
    buf: Vec<u8>,
    idx: i32,
    /// Line breaks before the chunk being filled.
    breaks_before: u64,
    /// Line breaks in `buf`.
    breaks_in: u64,
    /// Bytes fed for the record.
    len: u64,
    /// Rows waiting for the next insert, column by column.
    seqs: Vec<i64>,
    idxs: Vec<i32>,
    breaks: Vec<i64>,
    datas: Vec<Vec<u8>>,
}

impl<'t, 'c> Chunks<'t, 'c> {
    async fn new(
        transaction: &'t deadpool_postgres::Transaction<'c>,
        identity: &'t str,
        run: &'t str,
    ) -> Result<Self, RecordError> {
        let insert = transaction
            .prepare_cached(
                "insert into chunks (identity, run, seq, idx, breaks_before, data)
                 select $1, $2, * from unnest($3::bigint[], $4::integer[], $5::bigint[],
                     $6::bytea[])",
            )
            .await
            .map_err(db)?;
        Ok(Self {
            transaction,
            insert,
            identity,
            run,
            seq: 0,
            buf: Vec::new(),
            idx: 0,
            breaks_before: 0,
            breaks_in: 0,
            len: 0,
            seqs: Vec::new(),
            idxs: Vec::new(),
            breaks: Vec::new(),
            datas: Vec::new(),
        })
    }

    /// Starts the text of record `seq`.
    fn start(&mut self, seq: i64) {
        self.seq = seq;
        self.idx = 0;
        self.breaks_before = 0;
        self.breaks_in = 0;
        self.len = 0;
    }

    async fn feed(&mut self, mut bytes: &[u8]) -> Result<(), RecordError> {
        while !bytes.is_empty() {
            let room = CHUNK - self.buf.len();
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            self.buf.extend_from_slice(now);
            self.breaks_in += psych_types::count_line_breaks(now);
            self.len += now.len() as u64;
            bytes = rest;
            if self.buf.len() == CHUNK {
                self.cut().await?;
            }
        }
        Ok(())
    }

    /// Ends the record's text: its last chunk cut; its length and line breaks.
    async fn end(&mut self) -> Result<(u64, u64), RecordError> {
        self.cut().await?;
        Ok((self.len, self.breaks_before))
    }

    /// Makes a row of what `buf` holds.
    async fn cut(&mut self) -> Result<(), RecordError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        // Taken, not replaced by a full-size buffer: a small text's row holds its bytes only.
        let data = std::mem::take(&mut self.buf);
        self.seqs.push(self.seq);
        self.idxs.push(self.idx);
        self.breaks.push(signed(self.breaks_before));
        self.datas.push(data);
        self.idx += 1;
        self.breaks_before += self.breaks_in;
        self.breaks_in = 0;
        if self.datas.len() >= CHUNK_ROWS {
            self.flush().await?;
        }
        Ok(())
    }

    /// Inserts the rows waiting.
    async fn flush(&mut self) -> Result<(), RecordError> {
        if self.datas.is_empty() {
            return Ok(());
        }
        self.transaction
            .execute(
                &self.insert,
                &[
                    &self.identity,
                    &self.run,
                    &self.seqs,
                    &self.idxs,
                    &self.breaks,
                    &self.datas,
                ],
            )
            .await
            .map_err(db)?;
        self.seqs.clear();
        self.idxs.clear();
        self.breaks.clear();
        self.datas.clear();
        Ok(())
    }
}

/// Stores `output`'s readable text in chunk rows, spilled texts streamed from their files
/// in their blocks' places.
async fn store_output(
    chunks: &mut Chunks<'_, '_>,
    seq: i64,
    output: &ToolOutput,
    estimator: Option<&(dyn TokenEstimator + Send + Sync)>,
) -> Result<Stored, RecordError> {
    let (readable, spans) = output.readable_text_spans();
    let spills = spill_places(output, &spans)?;
    chunks.start(seq);
    let bytes = readable.as_bytes();
    let mut estimate = 0u64;
    // Each block's span in the stored text: shifted by what the spills before it added.
    let mut shift: i128 = 0;
    let mut stored_spans: Vec<Option<Range<u64>>> = Vec::with_capacity(spans.len());
    let mut spill_at = BTreeMap::new();
    for (block, span, text) in &spills {
        spill_at.insert(*block, (span.clone(), Arc::clone(text)));
    }
    for (block, span) in spans.iter().enumerate() {
        let moved = |at: usize, shift: i128| u64::try_from(at as i128 + shift).unwrap_or(0);
        match (span, spill_at.get(&block)) {
            (Some(span), Some((_, text))) => {
                let start = moved(span.start, shift);
                stored_spans.push(Some(start..start + text.len()));
                shift += i128::from(text.len()) - span.len() as i128;
            }
            (Some(span), None) => {
                stored_spans.push(Some(moved(span.start, shift)..moved(span.end, shift)));
            }
            (None, _) => stored_spans.push(None),
        }
    }
    let mut from = 0;
    let mut buf = vec![0; if spills.is_empty() { 0 } else { SPILL_READ }];
    for (block, span, text) in &spills {
        let memory = &bytes[from..span.start];
        chunks.feed(memory).await?;
        if let Some(estimator) = estimator.filter(|_| !memory.is_empty()) {
            estimate =
                estimate.saturating_add(estimator.estimate_text(&String::from_utf8_lossy(memory)));
        }
        stream_spill(chunks, *block, text, &mut buf, estimator, &mut estimate).await?;
        from = span.end;
    }
    let rest = &bytes[from..];
    chunks.feed(rest).await?;
    if spills.is_empty() {
        estimate = estimator.map_or(0, |e| e.estimate_output(output));
    } else if let Some(estimator) = estimator.filter(|_| !rest.is_empty()) {
        estimate = estimate.saturating_add(estimator.estimate_text(&String::from_utf8_lossy(rest)));
    }
    let (len, breaks) = chunks.end().await?;
    Ok(Stored {
        len,
        breaks,
        estimate: estimator.map(|_| estimate),
        text_only: output
            .content
            .iter()
            .all(|block| matches!(block, ContentBlock::Text(_))),
        spans: stored_spans,
    })
}

/// A spilled text's block, its placeholder's span in the in-memory readable text, the text.
type SpillPlace = (usize, Range<usize>, Arc<SpilledText>);

/// The spilled texts of `output` with their placeholders' spans
/// ([`ToolOutput::spill_places`]: text blocks, in order, each once).
fn spill_places(
    output: &ToolOutput,
    spans: &[Option<Range<usize>>],
) -> Result<Vec<SpillPlace>, RecordError> {
    Ok(output
        .spill_places(spans)
        .map_err(|refused| RecordError::Spill {
            block: refused.block,
            len: refused.text.len(),
            cause: SpillError::NotATextBlock,
        })?
        .into_iter()
        .map(|(spilled, span)| (spilled.block, span, Arc::clone(&spilled.text)))
        .collect())
}

/// Streams a spilled text into `chunks`, checking it is UTF-8 across reads (a character cut
/// by a read's end is carried to the next).
async fn stream_spill(
    chunks: &mut Chunks<'_, '_>,
    block: usize,
    text: &SpilledText,
    buf: &mut [u8],
    estimator: Option<&(dyn TokenEstimator + Send + Sync)>,
    estimate: &mut u64,
) -> Result<(), RecordError> {
    let fail = |cause| RecordError::Spill {
        block,
        len: text.len(),
        cause,
    };
    let mut offset = 0u64; // bytes of the text fed so far
    let mut carry = 0usize; // bytes at the start of `buf` carried over
    loop {
        let read_at = offset + carry as u64;
        let n = if read_at < text.len() {
            text.read_at(read_at, &mut buf[carry..]).map_err(|source| {
                fail(SpillError::Read {
                    offset: read_at,
                    source,
                })
            })?
        } else {
            0
        };
        if n == 0 && read_at < text.len() {
            return Err(fail(SpillError::Short { at: read_at }));
        }
        let filled = carry + n;
        let at_end = read_at + n as u64 >= text.len();
        let valid = match std::str::from_utf8(&buf[..filled]) {
            Ok(valid) => valid,
            Err(e) if e.error_len().is_none() && !at_end => {
                // A character cut by the read's end: feed up to it, carry it.
                std::str::from_utf8(&buf[..e.valid_up_to()]).unwrap_or_default()
            }
            Err(e) => {
                return Err(fail(SpillError::NotUtf8 {
                    at: offset + e.valid_up_to() as u64,
                }));
            }
        };
        let used = valid.len();
        chunks.feed(valid.as_bytes()).await?;
        if let Some(estimator) = estimator.filter(|_| used > 0) {
            *estimate = estimate.saturating_add(estimator.estimate_text(valid));
        }
        offset += used as u64;
        if at_end && used == filled {
            return Ok(());
        }
        if used == 0 && filled >= 4 {
            // Not even one character in four bytes or more: not UTF-8.
            return Err(fail(SpillError::NotUtf8 { at: offset }));
        }
        buf.copy_within(used..filled, 0);
        carry = filled - used;
    }
}

impl RecordSource for PgRecords {
    type Error = RecordError;

    fn run(&self) -> &RunId {
        &self.run
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, RecordError> {
        let Some(seq) = self.seq(handle) else {
            return Ok(None);
        };
        self.block(async {
            let client = self.client().await?;
            let row = row(
                &client,
                "select body, result, readable_len, spans from records
                     where identity = $1 and run = $2 and seq = $3",
                &[&&*self.identity, &self.run.as_str(), &seq],
            )
            .await?;
            let Some(row) = row else {
                self.live(&client).await?;
                return Ok(None);
            };
            let record: Record = serde_json::from_slice(row.get::<_, &[u8]>(0))
                .map_err(|e| damaged(format!("record {handle}"), e))?;
            match record {
                Record::ToolResult(mut result) if row.get::<_, bool>(1) => {
                    // Checked as every read of a result checks them: a result's row without
                    // its spans is damaged, not a result without texts.
                    let (_, spans) = checked_spans(handle, row.get(2), row.get(3))?;
                    self.fill_texts(&client, seq, &mut result.output, &spans)
                        .await?;
                    Ok(Some(Record::ToolResult(result)))
                }
                // Every tool result is stored as one: a row that says otherwise would read
                // back without its texts.
                Record::ToolResult(_) => Err(corrupt(format!(
                    "record {handle} is a tool result its row does not mark as one"
                ))),
                other => Ok(Some(other)),
            }
        })
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, RecordError> {
        let Some(seq) = self.seq(handle) else {
            return Ok(None);
        };
        self.block(async {
            let client = self.client().await?;
            let Some((body, len, _)) = self.result_parts(&client, seq).await? else {
                self.live(&client).await?;
                return Ok(None);
            };
            // The head alone: the body's blocks and structured content are not built.
            let Some((_, info)) = ResultHead::of(&body, handle, len)? else {
                return Err(corrupt(format!(
                    "record {}:{seq} is not a tool result",
                    self.run
                )));
            };
            Ok(Some(info))
        })
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, RecordError> {
        let (Some(seq), Some(idx)) = (self.seq(handle), chunk_index(offset)) else {
            return Ok(0);
        };
        if buf.is_empty() {
            return Ok(0);
        }
        // One chunk's part per read (a reader loops for more): about the bytes asked for.
        let within = (offset % CHUNK as u64) as usize;
        let want = buf.len().min(CHUNK - within);
        let (from, count) = (
            i32::try_from(within + 1).unwrap_or(i32::MAX),
            i32::try_from(want).unwrap_or(i32::MAX),
        );
        let bytes: Vec<u8> = self.block(async {
            let client = self.client().await?;
            // The Run, the result's length and the chunk's part in one statement (one
            // snapshot): a chunk missing is the text's end only past its length, and a
            // Run gone (no row) was deleted by retention, maybe between two pages.
            let row = row(
                &client,
                "select records.seq is not null, records.readable_len,
                        (select substring(data from $5 for $6) from chunks
                             where identity = $1 and run = $2 and seq = $3 and idx = $4)
                 from runs left join records
                     on records.identity = runs.identity and records.run = runs.run
                        and records.seq = $3 and records.result
                 where runs.identity = $1 and runs.run = $2",
                &[
                    &&*self.identity,
                    &self.run.as_str(),
                    &seq,
                    &idx,
                    &from,
                    &count,
                ],
            )
            .await?;
            let Some(row) = row else {
                self.live(&client).await?;
                return Ok(Vec::new());
            };
            if !row.get::<_, bool>(0) {
                // Not a tool result of this Run.
                return Ok(Vec::new());
            }
            let len = row.get::<_, Option<i64>>(1);
            let Some(len) = len.and_then(|len| u64::try_from(len).ok()) else {
                return Err(corrupt(format!(
                    "record {handle} is a tool result without its length ({len:?})"
                )));
            };
            if offset >= len {
                return Ok(Vec::new());
            }
            match row.get::<_, Option<Vec<u8>>>(2) {
                // Before the text's length: a chunk that ends there is damage, not the end.
                Some(bytes) if !bytes.is_empty() => Ok(bytes),
                Some(_) => Err(corrupt(format!(
                    "record {handle}: its text ends at byte {offset}, before its length {len}"
                ))),
                None => Err(corrupt(format!(
                    "record {handle}: the chunk holding byte {offset} of its text is missing"
                ))),
            }
        })?;
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        Ok(n)
    }

    fn content_block(
        &self,
        handle: &RecordHandle,
        position: usize,
    ) -> Result<Option<ContentBlock>, RecordError> {
        let Some(seq) = self.seq(handle) else {
            return Ok(None);
        };
        self.block(async {
            let client = self.client().await?;
            let Some(row) = self.result_row(&client, seq).await? else {
                self.live(&client).await?;
                return Ok(None);
            };
            let Some(mut block) = row.content.into_iter().nth(position) else {
                return Ok(None);
            };
            if let Some(Some(span)) = row.spans.get(position) {
                let bytes = self.read_range(&client, seq, span.clone()).await?;
                let text =
                    String::from_utf8(bytes).map_err(|e| damaged(format!("record {handle}"), e))?;
                set_text(&mut block, text);
            }
            Ok(Some(block))
        })
    }

    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, RecordError> {
        let Some(seq) = self.seq(handle) else {
            return Ok(LineMark::START);
        };
        if line == 0 {
            return Ok(LineMark::START);
        }
        self.block(async {
            let client = self.client().await?;
            let row = row(
                &client,
                "select idx, breaks_before from chunks
                     where identity = $1 and run = $2 and seq = $3 and breaks_before < $4
                     order by breaks_before desc, idx desc limit 1",
                &[&&*self.identity, &self.run.as_str(), &seq, &signed(line)],
            )
            .await?;
            if row.is_none() {
                self.live(&client).await?;
            }
            Ok(row.map_or(LineMark::START, |row| LineMark {
                at: u64::from(row.get::<_, i32>(0).unsigned_abs()) * CHUNK as u64,
                breaks_before: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
            }))
        })
    }

    fn block_lines(&self, handle: &RecordHandle) -> Result<Option<BlockLines>, RecordError> {
        let Some(seq) = self.seq(handle) else {
            return Ok(None);
        };
        self.block(async {
            let client = self.client().await?;
            let Some(row) = self.result_row(&client, seq).await? else {
                self.live(&client).await?;
                return Ok(None);
            };
            // The skeleton's resource texts are empty: their sizes come from their spans.
            let placeholders = row
                .content
                .iter()
                .enumerate()
                .filter_map(|(i, block)| {
                    let bulk = match block {
                        ContentBlock::Resource(_) => row
                            .spans
                            .get(i)
                            .cloned()
                            .flatten()
                            .map(|span| span.end.saturating_sub(span.start)),
                        _ => None,
                    };
                    block.placeholder_sized(i, bulk)
                })
                .collect();
            Ok(Some(BlockLines {
                placeholders,
                has_binary: row.content.iter().any(|block| block.binary().is_some()),
            }))
        })
    }
}

impl RecordStore for PgRecords {
    type AppendError = RecordError;

    fn failure(&self, error: &RecordError) -> RecordFailure {
        error.kind()
    }

    fn append_batch(&self, records: &[Record]) -> Result<Vec<RecordHandle>, RecordError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let (first, bytes) = self.block(async {
            let mut client = self.client().await?;
            match self.append_in(&mut client, records).await {
                Ok(done) => Ok(done),
                Err(Attempt::Failed(error)) => Err(error),
                // The connection is gone or its answer lost: the database says whether
                // the batch's transaction committed.
                Err(Attempt::InDoubt { first, txid, error }) => {
                    drop(client);
                    match self.resolve(txid).await {
                        Ok(Some(bytes)) => Ok((first, bytes)),
                        Ok(None) => Err(RecordError::NotStored(error)),
                        Err(unresolved) => Err(RecordError::InDoubt {
                            commit: error,
                            unresolved,
                        }),
                    }
                }
            }
        })?;
        let end = first + records.len() as u64;
        self.len.fetch_max(end, Ordering::AcqRel);
        self.bytes.fetch_max(bytes, Ordering::AcqRel);
        Ok((first..end)
            .map(|seq| RecordHandle::new(self.run.clone(), seq))
            .collect())
    }

    fn len(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }

    fn size_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    fn extend_history(&self, history: &mut History) -> Result<(), RecordError> {
        // Rows up to about HISTORY_BATCH_BYTES of bodies at a time (a larger one alone): a
        // row's body keeps its images and structured content, so a resume after hundreds
        // of screenshots would otherwise hold them all at once. Paged by `seq`, each batch
        // after the last row read.
        let mut after = history
            .entries
            .last()
            .map_or(-1, |entry| signed(entry.handle.seq));
        loop {
            let rows = self.block(async {
                let client = self.client().await?;
                // The Run's row joined to the batch: one row with no record when the Run is
                // there and its records end, none when a sweep deleted it since the last
                // batch (or before the first), so the end costs no query of its own and a
                // partial history is never read as whole.
                let mut batch = rows(
                    &client,
                    "select b.seq, b.body, b.result, b.readable_len, b.line_breaks, b.estimate,
                            b.text_only
                     from runs r left join lateral (
                         select seq, body, result, readable_len, line_breaks, estimate, text_only
                         from (select seq, body, result, readable_len, line_breaks, estimate,
                                   text_only,
                                   sum(octet_length(body)) over (order by seq) as upto,
                                   row_number() over (order by seq) as n
                               from records
                               where identity = r.identity and run = r.run and seq > $3
                               order by seq limit $5) batch
                         where upto <= $4 or n = 1) b on true
                     where r.identity = $1 and r.run = $2
                     order by b.seq",
                    &[
                        &&*self.identity,
                        &self.run.as_str(),
                        &after,
                        &HISTORY_BATCH_BYTES,
                        &HISTORY_BATCH_ROWS,
                    ],
                )
                .await?;
                if batch.is_empty() {
                    self.live(&client).await?;
                }
                batch.retain(|row| row.get::<_, Option<i64>>(0).is_some());
                Ok(batch)
            })?;
            let Some(last) = rows.last().map(|row| row.get::<_, i64>(0)) else {
                return Ok(());
            };
            for row in rows {
                let seq = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
                let handle = RecordHandle::new(self.run.clone(), seq);
                let item = history_item(&handle, &row)?;
                history.entries.push(HistoryEntry { handle, item });
            }
            after = last;
        }
    }

    fn stored_result(&self, handle: &RecordHandle) -> Result<Option<StoredResult>, RecordError> {
        let Some(seq) = self.seq(handle) else {
            return Ok(None);
        };
        let row = self.block(async {
            let client = self.client().await?;
            let found = row(
                &client,
                "select seq, body, result, readable_len, line_breaks, estimate, text_only
                     from records where identity = $1 and run = $2 and seq = $3 and result",
                &[&&*self.identity, &self.run.as_str(), &seq],
            )
            .await?;
            if found.is_none() {
                self.live(&client).await?;
            }
            Ok(found)
        })?;
        let Some(row) = row else {
            return Ok(None);
        };
        match history_item(handle, &row)? {
            HistoryItem::Result(stored) => Ok(Some(stored)),
            HistoryItem::Record(_) => Ok(None),
        }
    }
}

/// A history entry's item from a records row (`seq, body, result, readable_len,
/// line_breaks, estimate, text_only`).
fn history_item(
    handle: &RecordHandle,
    row: &tokio_postgres::Row,
) -> Result<HistoryItem, RecordError> {
    let body: &[u8] = row.get(1);
    let is_result: bool = row.get(2);
    let number = |i: usize| {
        row.get::<_, Option<i64>>(i)
            .map(|n| u64::try_from(n).unwrap_or(0))
    };
    // A result's length is always stored: missing or negative, the row of a tool result is
    // damaged, not a result without text (as every other read of a result says); a row
    // flagged a result that holds another record reads as that record.
    let length = row
        .get::<_, Option<i64>>(3)
        .and_then(|n| u64::try_from(n).ok());
    let head = if is_result {
        ResultHead::of(body, handle, length.unwrap_or(0))?
    } else {
        None
    };
    if head.is_some() && length.is_none() {
        return Err(corrupt(format!("record {handle}: its length is missing")));
    }
    if let Some((target, info)) = head {
        return Ok(HistoryItem::Result(StoredResult {
            target,
            info,
            estimate: number(5),
            line_breaks: number(4),
            text_only: row.get::<_, Option<bool>>(6).unwrap_or(false),
        }));
    }
    let record: Record =
        serde_json::from_slice(body).map_err(|e| damaged(format!("record {handle}"), e))?;
    // Every tool result is stored marked as one: one that is not would read back without
    // its texts (as a whole read says too).
    if !is_result && matches!(record, Record::ToolResult(_)) {
        return Err(corrupt(format!(
            "record {handle} is a tool result its row does not mark as one"
        )));
    }
    Ok(HistoryItem::Record(record))
}

/// What a tool result's body says of it for its [`OutputInfo`], read without building the
/// body's values: its blocks, structured content and `_meta` are passed over (a peer's
/// images or structured content may be many MiB, each small JSON value 32 bytes or more in
/// memory), where decoding the [`Record`] builds them all, twice (its tag is read first).
#[derive(serde::Deserialize)]
struct ResultHead {
    #[serde(rename = "type")]
    kind: String,
    call_id: ToolCallId,
    name: String,
    #[serde(default)]
    target: Option<ToolRef>,
    output: OutputHead,
}

/// A record body's tag alone (the rest passed over), to tell another record's body from a
/// damaged tool result's.
#[derive(serde::Deserialize)]
struct Tag {
    #[serde(rename = "type")]
    kind: String,
}

/// The parts of a tool result's body a read needs ([`ResultHead`], [`ResultBlocks`]),
/// read in one pass.
trait ToolResultPart: serde::de::DeserializeOwned {
    /// The body's tag.
    fn tag(&self) -> &str;

    /// The part of `body` (record `what`); `None` when it holds another record. Only a
    /// body that does not decode as the part is read again, for its tag alone, to tell
    /// another record (a usage's `output` is a number) from a damaged result.
    fn read(body: &[u8], what: impl std::fmt::Display) -> Result<Option<Self>, RecordError> {
        match serde_json::from_slice::<Self>(body) {
            Ok(part) => Ok((part.tag() == "tool_result").then_some(part)),
            Err(error) => {
                let tag: Tag = serde_json::from_slice(body)
                    .map_err(|e| damaged(format!("record {what}"), e))?;
                if tag.kind == "tool_result" {
                    Err(damaged(format!("record {what}"), error))
                } else {
                    Ok(None)
                }
            }
        }
    }
}

impl ToolResultPart for ResultHead {
    fn tag(&self) -> &str {
        &self.kind
    }
}

/// The parts of a [`ToolOutput`]'s serde form that say its kind and whether it failed.
#[derive(serde::Deserialize)]
struct OutputHead {
    #[serde(default)]
    content: Vec<serde::de::IgnoredAny>,
    #[serde(rename = "structuredContent", default)]
    structured_content: Option<serde::de::IgnoredAny>,
    #[serde(rename = "isError", default)]
    is_error: bool,
}

impl ResultHead {
    /// The target and info of the tool result `body` holds, for a readable text of `len`
    /// bytes; `None` when it holds another record.
    fn of(
        body: &[u8],
        handle: &RecordHandle,
        len: u64,
    ) -> Result<Option<(Option<ToolRef>, OutputInfo)>, RecordError> {
        let Some(Self {
            call_id,
            name,
            target,
            output,
            ..
        }) = Self::read(body, handle)?
        else {
            return Ok(None);
        };
        // As `OutputKind::of`: JSON when the structured content is all there is to read.
        let kind = if output.content.is_empty() && output.structured_content.is_some() {
            OutputKind::Json
        } else {
            OutputKind::Text
        };
        let info = OutputInfo {
            kind,
            len,
            is_error: output.is_error,
            call_id,
            name,
        };
        Ok(Some((target, info)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error's text and its sources', as a chain report shows them.
    fn report(error: &dyn std::error::Error) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            text.push_str(" <- ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    }

    /// A batch in doubt because both questions failed: the report shows the first
    /// question's failure with its cause, and the second's, each once. (Review: the
    /// first question's failure was in neither the text nor the chain.)
    #[test]
    fn an_in_doubt_report_shows_both_questions_failures_once() {
        let error = RecordError::InDoubt {
            commit: None,
            unresolved: Unresolved::Ask {
                first: Box::new(RecordError::Db(DbError::Malformed("first question"))),
                again: Box::new(RecordError::Unanswered(std::time::Duration::from_secs(5))),
            },
        };
        assert_eq!(
            report(&error),
            "the connection was lost during COMMIT: the batch may or may not be stored \
             <- the database could not be asked whether it was stored, twice (the record \
             store's database failed the request: the store's first question is malformed) \
             <- the database did not answer within 5s"
        );
    }

    /// A tokio-postgres error's text is its kind alone ("error connecting to server"), its
    /// cause a source: the COMMIT's error in an in-doubt report shows that cause too.
    /// (Review: the text stopped at the kind.)
    #[test]
    fn an_in_doubt_report_shows_the_commits_error_with_its_cause() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let refused = runtime
            .block_on(tokio_postgres::connect(
                "host=127.0.0.1 port=1 connect_timeout=5",
                tokio_postgres::NoTls,
            ))
            .err()
            .unwrap_or_else(|| panic!("nothing listens on port 1"));
        let cause = std::error::Error::source(&refused)
            .map(ToString::to_string)
            .unwrap_or_else(|| panic!("{refused} has a cause"));
        let error = RecordError::InDoubt {
            commit: Some(refused),
            unresolved: Unresolved::Unknown,
        };
        let text = error.to_string();
        assert!(
            text.starts_with("the connection was lost during COMMIT (error connecting to server: "),
            "{text}"
        );
        assert!(text.contains(&cause), "{text}");
        assert_eq!(text.matches(&cause).count(), 1, "{text}");
    }
}
